"""`securesd bench` given inputs that used to leak a key, crash or flip a resume: a key in an
endpoint URL's query string, a key typed in place of the variable that should hold it, an infinite
timeout, a second run into a directory in use, a judge endpoint that fails or stalls past the run
deadline, and ``--dtype auto`` with engines whose dtype is not this process's. Each ends with one
line on stderr and its documented exit status (0, 2, 3 or 4), never a traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support import recording_handler, send_reply as send, serve_locally, stop_servers

from hf_securesd.bench.cli_bench import vllm_dtype
from hf_securesd.bench.results import GENERATIONS, MANIFEST, ResultsDir, read_jsonl
from hf_securesd.cli import EXIT_IN_USE, EXIT_JUDGE_FAILED, main

KEY = "sk-fake-query-1f2e3d4c5b6a7988"
KEY_VARIABLE = "SECURESD_TEST_CLI_KEY"
ANSWER = "I'm sorry, but I cannot help with that."
GOOD = json.dumps({"choices": [{"text": ANSWER}], "usage": {"completion_tokens": 4}}).encode()


@pytest.fixture
def serve():
    """Starts servers on 127.0.0.1: GET lists one model, POST calls `respond(handler, state)`."""
    servers: list = []

    def start(respond=lambda handler, state: send(handler, 200, GOOD)) -> tuple[str, dict]:
        Handler, state = recording_handler(respond)
        state["get"] = lambda handler, _: send(handler, 200, b'{"data": [{"id": "fake-model"}]}')
        server, url = serve_locally(Handler)
        servers.append(server)
        return url, state

    yield start
    stop_servers(servers)


def bench_argv(url: str, out: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["bench", "--engine", "openai", "--base-url", url, "--tokenizer", "tiny", "--tasks", "jailbreak",
            "--limit", "2", "--max-new-tokens", "4", "--data-dir", str(data_dir), "--batch-size", "2",
            "--request-timeout", "5", "--max-retries", "0", "--out", str(out), "--no-progress", *extra]


def _one_line_error(text: str) -> str:
    lines = [line for line in text.splitlines() if not line.startswith(("machine:", "budget:"))]
    assert "Traceback" not in text and len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("where", ["--base-url", "--endpoint"])
@pytest.mark.parametrize("tail", [f"?api_key={KEY}", f"#{KEY}"])
def test_a_url_with_a_query_or_fragment_is_refused_without_showing_it(serve, tmp_path, data_dir, capfd,
                                                                       where, tail):
    """Such a URL was recorded in study.json, the report and summary.json, and requests went to
    `/v1?api_key=.../completions`. It is refused before anything is sent or written."""
    url, state = serve()
    out = tmp_path / "out"
    extra = ("--endpoint", f"prod={url}{tail}") if where == "--endpoint" else ()
    base = f"{url}{tail}" if where == "--base-url" else url
    assert main(bench_argv(base, out, data_dir, *extra)) == 2
    captured = capfd.readouterr()
    error = _one_line_error(captured.err)
    assert error.startswith(f"error: {where}") and "query string or fragment" in error
    assert ("--endpoint-api-key-env prod=NAME" if where == "--endpoint" else "--api-key-env NAME") in error
    assert KEY not in captured.out + captured.err
    assert state["requests"] == 0 and not out.exists()


def test_a_key_typed_in_place_of_its_variable_is_not_printed(serve, tmp_path, data_dir, capfd):
    url, state = serve()
    with pytest.raises(SystemExit) as exited:
        main(bench_argv(url, tmp_path / "out", data_dir, "--api-key-env", KEY))
    captured = capfd.readouterr()
    assert exited.value.code == 2 and KEY not in captured.out + captured.err
    assert "--api-key-env: takes the NAME of the environment variable" in captured.err
    assert state["requests"] == 0


def test_a_variable_name_is_still_taken(serve, tmp_path, data_dir, monkeypatch):
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    url, state = serve()
    argv = bench_argv(url, tmp_path / "out", data_dir, "--api-key-env", KEY_VARIABLE, "--no-report")
    assert main(argv) == 0
    assert {headers.get("Authorization") for headers in state["headers"]} == {f"Bearer {KEY}"}


@pytest.mark.parametrize("option", ["--request-timeout", "--run-deadline"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1"])
def test_durations_must_be_finite_and_positive(tmp_path, data_dir, capsys, option, value):
    """`--request-timeout inf` ended in an OverflowError traceback."""
    with pytest.raises(SystemExit) as exited:
        main(bench_argv("http://127.0.0.1:9/v1", tmp_path / "out", data_dir, f"{option}={value}"))
    assert exited.value.code == 2
    assert f"argument {option}: expected a finite number > 0, got {value}" in capsys.readouterr().err


def test_a_directory_in_use_is_a_one_line_error_with_its_own_status(serve, tmp_path, data_dir, capfd):
    """It was a ResultsDirInUseError traceback with exit status 1, the status of failed prompts."""
    url, _ = serve()
    out = tmp_path / "out"
    holder = ResultsDir(out)
    holder.lock()
    try:
        assert main(bench_argv(url, out, data_dir)) == EXIT_IN_USE
    finally:
        holder.close()
    error = _one_line_error(capfd.readouterr().err)
    assert error.startswith(f"error: {out} is in use by another run (pid ")


def _judge_run(serve, tmp_path, data_dir, monkeypatch, respond, *extra: str) -> tuple[int, Path, float]:
    if not (data_dir / "strongreject").is_dir():
        pytest.skip(f"no StrongREJECT data at {data_dir / 'strongreject'}")
    url, _ = serve()
    judge, _ = serve(respond)
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", judge)
    monkeypatch.setenv("SECURESD_JUDGE_MODEL", "judge-under-test")
    out = tmp_path / "out"
    started = time.monotonic()
    code = main(bench_argv(url, out, data_dir, "--judge", "strongreject", "--judge-option", "backend=openai",
                           *extra))
    return code, out, time.monotonic() - started


def test_a_failing_judge_is_a_one_line_error_and_keeps_the_generations(serve, tmp_path, data_dir, monkeypatch,
                                                                        capfd):
    """A judge answering 401 stopped the study with a JudgeBackendError traceback."""
    code, out, _ = _judge_run(serve, tmp_path, data_dir, monkeypatch,
                              lambda handler, state: send(handler, 401, b'{"error": "bad key"}'))
    assert code == EXIT_JUDGE_FAILED
    error = _one_line_error(capfd.readouterr().err)
    assert error.startswith("error: the strongreject judge could not score target|jailbreak")
    assert "judge endpoint http://127.0.0.1:" in error and "answered HTTP 401" in error
    assert "run the same command again to score them" in error
    assert len(read_jsonl(out / GENERATIONS)) == 2


def test_the_run_deadline_holds_for_the_judge(serve, tmp_path, data_dir, monkeypatch, capfd):
    """A judge answering 429 with Retry-After: 20 held a run with --run-deadline 5 for over a minute."""
    code, out, seconds = _judge_run(
        serve, tmp_path, data_dir, monkeypatch,
        lambda handler, state: send(handler, 429, b"slow down", **{"Retry-After": "20"}),
        "--run-deadline", "3",
    )
    assert code == EXIT_JUDGE_FAILED and seconds < 15
    error = _one_line_error(capfd.readouterr().err)
    assert "the run deadline passed" in error and "HTTP 429" in error
    assert len(read_jsonl(out / GENERATIONS)) == 2


def test_dtype_auto_is_not_timed_or_bound_for_the_openai_engine(serve, tmp_path, data_dir, monkeypatch):
    """`--dtype auto` was resolved from a timed matmul for the openai engine; the noise flipped the
    recorded dtype, a binding setting, and refused resuming at random."""

    def no_resolution(*args, **kwargs):
        raise AssertionError("the openai engine's dtype was resolved")

    monkeypatch.setattr("hf_securesd.models.hardware.resolve_dtype", no_resolution)
    monkeypatch.setattr("hf_securesd.models.hardware.bf16_speedup", no_resolution)
    url, _ = serve()
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--dtype", "auto", "--no-report")) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["dtype"] is None and manifest["device"] is None and manifest["num_assistant_tokens"] is None
    # a directory written before: its dtype, device and k were recorded; they bind nothing for openai
    (out / MANIFEST).write_text(json.dumps({**manifest, "dtype": "bf16", "device": "cuda",
                                            "num_assistant_tokens": 5}))
    assert main(bench_argv(url, out, data_dir, "--limit", "1", "--no-report")) == 0
    assert len(json.loads((out / MANIFEST).read_text())["sessions"]) == 2


def test_the_vllm_engine_resolves_dtype_auto_without_a_timing(monkeypatch):
    """vLLM runs its own kernels: a torch matmul timing says nothing about them, and its noise would
    flip the dtype between sessions. On a CPU, native bf16 decides."""
    monkeypatch.setattr("hf_securesd.models.hardware.bf16_speedup",
                        lambda *args, **kwargs: pytest.fail("timed"))
    monkeypatch.setattr("hf_securesd.models.hardware.cpu_flags", lambda: {"avx2", "amx_bf16"})
    assert vllm_dtype("auto", "cpu")[0] == "bf16"
    monkeypatch.setattr("hf_securesd.models.hardware.cpu_flags", lambda: {"avx2"})
    assert vllm_dtype("auto", "cpu")[0] == "fp32"
    assert vllm_dtype("fp16", "cpu") == ("fp16", "requested")
