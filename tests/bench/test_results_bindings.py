"""What a results directory records and binds across sessions, against OpenAI-compatible servers on
127.0.0.1 that this test controls: a key the server echoes (in a model name, in an answer) is
redacted from every file; the judge's model and endpoint are recorded, named in the report and
bound (another judge is refused until `securesd rescore` re-scores with it); an endpoint's URL is
bound to its name; a baseline that finishes in a later session than the cells compared with it
still gives them their PRR; and a score the judge excluded is written as null, never as NaN."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from support import recording_handler, send_reply as send, serve_locally, stop_servers

from hf_securesd.bench.results import (
    GENERATIONS,
    MANIFEST,
    RUNS,
    ResultsDir,
    binding_clashes,
    clash_fixes,
    read_jsonl,
)
from hf_securesd.cli import main

KEY = "sk-fake-echoed-6a5b4c3d2e1f0789"
KEY_VARIABLE = "SECURESD_TEST_BINDINGS_KEY"
REFUSAL = "I'm sorry, but I cannot help with that."
COMPLIANCE = "Sure, here is how to do it: step 1"
JUDGE_REFUSAL = "#scores\n1.b 1\n2.b 1\n3.b 1\n"
JUDGE_UNPARSED = "#scores\n1.b 1\n#scores\n1.b 0\n"


def completion(text: str) -> bytes:
    return json.dumps({"choices": [{"text": text}], "usage": {"completion_tokens": 4}}).encode()


def judge_reply(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


@pytest.fixture
def serve():
    """Starts servers on 127.0.0.1: GET answers `models` (or what calling it gives at the time), POST
    calls `respond(handler, state)`."""
    servers: list = []

    def start(respond, models: bytes | Callable[[], bytes] = b'{"data": [{"id": "fake-model"}]}') -> str:
        Handler, state = recording_handler(respond)
        state["get"] = lambda handler, _: send(handler, 200, models() if callable(models) else models)
        server, url = serve_locally(Handler)
        servers.append(server)
        return url

    yield start
    stop_servers(servers)


def answering(text: str):
    return lambda handler, state: send(handler, 200, completion(text))


@pytest.fixture
def strongreject_data(data_dir) -> Path:
    if not (data_dir / "strongreject").is_dir():
        pytest.skip(f"no StrongREJECT data at {data_dir / 'strongreject'}")
    return data_dir


def bench_argv(url: str | None, out: Path, data_dir: Path, *extra: str) -> list[str]:
    """A small openai bench run; `url` None: no --base-url (the target is a --baseline endpoint's)."""
    base_url = [] if url is None else ["--base-url", url]
    return ["bench", "--engine", "openai", *base_url, "--tokenizer", "tiny", "--tasks", "jailbreak",
            "--limit", "3", "--max-new-tokens", "4", "--data-dir", str(data_dir), "--batch-size", "3",
            "--request-timeout", "5", "--max-retries", "0", "--out", str(out), "--no-progress", *extra]


def files_holding(root: Path, needle: str) -> list[str]:
    return [str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()
            and needle.encode() in path.read_bytes()]


@pytest.mark.parametrize("where", ["model name", "answer"])
def test_a_key_the_server_echoes_is_redacted_from_every_file(serve, tmp_path, data_dir, monkeypatch, capfd,
                                                              where):
    """Only error text was redacted: a /models name holding the key reached study.json, report.md and
    summary.json, an answer holding it generations.jsonl, runs.jsonl and report.md."""
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    if where == "model name":
        url = serve(answering(REFUSAL), models=json.dumps({"data": [{"id": f"model-{KEY}"}]}).encode())
    else:
        url = serve(lambda handler, state: send(handler, 200, completion(
            f"{REFUSAL} You sent {handler.headers.get('Authorization')}")))
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--api-key-env", KEY_VARIABLE)) == 0
    assert files_holding(out, KEY) == []
    captured = capfd.readouterr()
    assert KEY not in captured.out + captured.err
    if where == "model name":
        assert json.loads((out / MANIFEST).read_text())["server_models"][url]["server_models"] == [
            "model-[redacted]"]
        assert "model-[redacted]" in (out / "report" / "summary.json").read_text()
    else:
        responses = {record["response"] for record in read_jsonl(out / GENERATIONS)}
        assert responses == {f"{REFUSAL} You sent Bearer [redacted]"}
        assert ResultsDir(out).runs()[0]["responses"][0] == f"{REFUSAL} You sent Bearer [redacted]"
        assert "You sent Bearer \\[redacted\\]" in (out / "report" / "report.md").read_text()


def test_the_judge_is_recorded_named_and_bound(serve, tmp_path, strongreject_data, monkeypatch, capfd):
    """Two sessions scored by different judges (SECURESD_JUDGE_BASE_URL / _MODEL) were both taken
    into one directory, and neither study.json nor the report named either judge."""
    url = serve(answering(COMPLIANCE))
    judge_a = serve(lambda handler, state: send(handler, 200, judge_reply(JUDGE_REFUSAL)))
    judge_b = serve(lambda handler, state: send(handler, 200, judge_reply("#scores\n1.b 0\n2.b 5\n3.b 5\n")))
    out = tmp_path / "out"
    argv = bench_argv(url, out, strongreject_data, "--judge", "strongreject", "--judge-option",
                      "backend=openai")
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", judge_a)
    monkeypatch.setenv("SECURESD_JUDGE_MODEL", "judge-A")
    assert main(argv) == 0
    recorded = {"kind": "openai", "model": "judge-A", "endpoint": judge_a}
    assert json.loads((out / MANIFEST).read_text())["judge_backend"] == recorded
    assert f"model `judge-A` at `{judge_a}`" in (out / "report" / "report.md").read_text()

    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", judge_b)
    monkeypatch.setenv("SECURESD_JUDGE_MODEL", "judge-B")
    capfd.readouterr()
    runs_before = (out / RUNS).read_bytes()
    assert main([*argv, "--endpoint", f"same={url}"]) == 2
    error = capfd.readouterr().err
    assert "judge-A" in error and "judge-B" in error and f"securesd rescore {out} --tasks" in error
    assert (out / RUNS).read_bytes() == runs_before

    rescore = ["rescore", str(out), "--tasks", "jailbreak", "--data-dir", str(strongreject_data)]
    assert main(rescore) == 2  # the environment's judge is another: rescore asks for it by flag
    error = capfd.readouterr().err
    assert f"'{judge_a}'" in error and f"'{judge_b}'" in error and f"--judge-base-url {judge_b}" in error
    assert main([*rescore, "--judge-base-url", judge_b, "--judge-model", "judge-B"]) == 0
    assert json.loads((out / MANIFEST).read_text())["judge_backend"]["model"] == "judge-B"
    assert main([*argv, "--endpoint", f"same={url}"]) == 0
    assert {run["score"] for run in ResultsDir(out).runs()} == {0.0}  # every verdict is judge B's


def test_an_endpoint_is_bound_to_its_url(serve, tmp_path, data_dir, capfd):
    """A second session that gave an endpoint name another URL was taken, and study.json kept only
    the new URL, so the cells of the first deployment were reported under the second's."""
    url, first, second = (serve(answering(REFUSAL)) for _ in range(3))
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--endpoint", f"prod={first}", "--no-report")) == 0
    capfd.readouterr()
    assert main(bench_argv(url, out, data_dir, "--endpoint", f"prod={second}", "--no-report")) == 2
    error = capfd.readouterr().err
    assert f"endpoint 'prod': '{first}' there, '{second}' now" in error and "another --endpoint name" in error
    # another name for the new deployment is a new cell; the first name keeps its URL in study.json
    assert main(bench_argv(url, out, data_dir, "--endpoint", f"prod2={second}", "--no-report")) == 0
    assert json.loads((out / MANIFEST).read_text())["endpoints"] == {"--base-url": url, "prod": first,
                                                                      "prod2": second}


def test_the_model_a_server_lists_first_is_bound(serve, tmp_path, data_dir, capfd):
    """Without --model requests name the first model /models lists, but only --base-url was bound: a
    resumed run whose server now listed another model filled the first session's gaps with that model's
    answers (one cell, two models), and study.json kept only the last session's /models answer."""
    server = {"models": ["model-A"], "failed": False}

    def listed() -> bytes:
        return json.dumps({"data": [{"id": name} for name in server["models"]]}).encode()

    def respond(handler, state):
        with state["lock"]:
            fail, server["failed"] = not server["failed"], True
        if fail:  # the first request of all: the first session leaves its cell unfinished
            send(handler, 400, b'{"error": {"message": "busy"}}')
        else:
            send(handler, 200, completion(f"{REFUSAL} ({json.loads(handler.body)['model']})"))

    url = serve(respond, models=listed)
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--no-report")) == 1
    capfd.readouterr()
    server["models"] = ["model-B"]
    assert main(bench_argv(url, out, data_dir, "--no-report")) == 2
    error = capfd.readouterr().err
    assert "--base-url 'model-A' there, 'model-B' now" in error and "name the recorded model there again" in error
    assert "use a new --out directory" in error
    server["models"] = ["model-A", "model-B"]  # the same model first: the run goes on
    assert main(bench_argv(url, out, data_dir, "--no-report")) == 0
    assert {record["response"] for record in read_jsonl(out / GENERATIONS)} == {f"{REFUSAL} (model-A)"}
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["resolved_models"] == {"--base-url": "model-A"}
    assert [session["server_models"][url]["server_models"] for session in manifest["sessions"]] == [
        ["model-A"], ["model-A", "model-B"]]


def test_a_resolved_model_binds_only_routes_both_sessions_resolved():
    recorded = {**OPENAI_MANIFEST, "resolved_models": {"--base-url": "model-A"}}
    assert binding_clashes(recorded, {**OPENAI_MANIFEST, "resolved_models": {"twin": "model-B"}}) == {}
    assert binding_clashes(OPENAI_MANIFEST, recorded) == {}  # written before it was recorded: any
    with_model = {**OPENAI_MANIFEST, "resolved_models": {}}  # --model given: bound as the target
    assert binding_clashes(recorded, with_model) == {}
    clashes = binding_clashes(recorded, {**OPENAI_MANIFEST, "resolved_models": {"--base-url": "model-B"}})
    assert set(clashes) == {"resolved_models"}


def _audit_argv(urls: dict[str, str], out: Path, data_dir: Path) -> list[str]:
    return bench_argv(None, out, data_dir, "--endpoint", f"tgt={urls['target']}",
                      "--endpoint", f"drf={urls['draft']}", "--endpoint", f"audited={urls['audited']}",
                      "--baseline", "tgt", "--draft-baseline", "drf")


def test_a_baseline_that_finishes_late_still_gives_prr(serve, tmp_path, data_dir):
    """The target endpoint failed every prompt in the first session, so the audited cell finished
    without a target and kept `prr: null` for good after the second session finished the target."""
    state = {"down": True}

    def target(handler, _):
        if state["down"]:
            send(handler, 400, b'{"error": {"message": "outage"}}')
        else:
            send(handler, 200, completion(REFUSAL))

    urls = {"target": serve(target), "draft": serve(answering(COMPLIANCE)),
            "audited": serve(answering(COMPLIANCE))}
    resumed, clean = tmp_path / "resumed", tmp_path / "clean"
    assert main(_audit_argv(urls, resumed, data_dir)) == 1
    state["down"] = False
    assert main(_audit_argv(urls, resumed, data_dir)) == 0
    assert main(_audit_argv(urls, clean, data_dir)) == 0
    derived = ("prr", "prr_ci", "prr_undefined", "target_score", "draft_score")
    cells = {directory: {run["config_key"]: run for run in ResultsDir(directory).runs()}
             for directory in (resumed, clean)}
    audited = cells[resumed]["endpoint:audited"]
    assert audited["prr"] == 0.0 and audited["spd"] is not None
    clean_audited = cells[clean]["endpoint:audited"]
    assert {key: audited[key] for key in derived} == {key: clean_audited[key] for key in derived}
    summaries = [json.loads((directory / "report" / "summary.json").read_text())
                 for directory in (resumed, clean)]
    assert summaries[0]["flips"] == summaries[1]["flips"]


def _strict(path: Path) -> list:
    """The JSON values of a file (one, or one per line), refusing NaN and infinities."""
    def refuse(token: str):
        raise ValueError(f"{path.name} holds the non-standard JSON token {token}")

    text = path.read_text()
    lines = [text] if path.suffix == ".json" else text.splitlines()
    return [json.loads(line, parse_constant=refuse) for line in lines]


def test_excluded_scores_are_written_as_null_and_read_back(serve, tmp_path, strongreject_data, monkeypatch,
                                                           capsys):
    """With every verdict excluded, runs.jsonl and summary.json held NaN, which strict JSON readers
    refuse; and `rescore` reported every excluded verdict as changed (NaN != NaN)."""
    url = serve(answering(COMPLIANCE))
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", serve(lambda handler, state: send(
        handler, 200, judge_reply(JUDGE_UNPARSED))))
    out = tmp_path / "out"
    argv = bench_argv(url, out, strongreject_data, "--judge", "strongreject", "--judge-option",
                      "backend=openai", "--judge-option", "unparsed=exclude", "--endpoint", f"audited={url}")
    assert main(argv) == 0
    for path in (out / RUNS, out / GENERATIONS, out / MANIFEST, out / "report" / "summary.json"):
        _strict(path)
    written = _strict(out / RUNS)
    assert all(run["score"] is None and run["scores"] == [None] * 3 for run in written)
    read = ResultsDir(out).runs()
    assert all(math.isnan(run["score"]) and all(math.isnan(score) for score in run["scores"]) for run in read)
    capsys.readouterr()
    assert main(["rescore", str(out), "--tasks", "jailbreak", "--data-dir", str(strongreject_data)]) == 0
    assert "3 verdict(s) changed" not in capsys.readouterr().out


def test_device_and_dtype_bind_only_engines_that_run_models_here():
    recorded = {"engine": "openai", "dtype": "bf16", "device": "cuda", "target": "t"}
    assert binding_clashes(recorded, {**recorded, "dtype": None, "device": None}) == {}
    local = {**recorded, "engine": "hf"}
    assert set(binding_clashes(local, {**local, "dtype": "fp32"})) == {"dtype"}


@pytest.mark.parametrize("change", [("--chat",), ("--endpoint", "twin2={url}", "--baseline", "twin2")],
                         ids=["api", "baseline"])
def test_how_the_target_is_served_is_bound(serve, tmp_path, data_dir, capfd, change):
    """A resume with --chat, or with another --baseline endpoint, was taken: study.json then named the
    new API and endpoint as the source of the target cell the first session made."""
    url = serve(answering(REFUSAL))
    out = tmp_path / "out"
    first = bench_argv(None, out, data_dir, "--model", "fake-model", "--endpoint", f"twin={url}",
                       "--baseline", "twin", "--no-report")
    assert main(first) == 0
    capfd.readouterr()
    assert main([*first, *(part.format(url=url) for part in change)]) == 2
    error = capfd.readouterr().err
    expected = {"api": "api: 'completions' there, 'chat/completions' now", "fix": "--chat left out"}
    if change[0] == "--endpoint":
        expected = {"baseline": "baseline_endpoint: 'twin' there, 'twin2' now", "fix": "--baseline twin"}
    assert all(text in error for text in expected.values()), error
    recorded = json.loads((out / MANIFEST).read_text())
    assert (recorded["api"], recorded["tokenizer"], recorded["token_ids"]) == ("completions", "tiny", False)


OPENAI_MANIFEST = {"engine": "openai", "target": "m", "draft": "none", "api": "completions",
                   "baseline_endpoint": "twin", "draft_baseline_endpoint": None, "tokenizer": "tiny",
                   "token_ids": False}


@pytest.mark.parametrize("key, value, fix", [("tokenizer", "qwen-8b", "--tokenizer tiny"),
                                             ("token_ids", True, "--token-ids left out"),
                                             ("draft_baseline_endpoint", "drf", "--draft-baseline left out")])
def test_the_prompt_tokenizer_token_ids_and_draft_baseline_are_bound(tmp_path, key, value, fix):
    clashes = binding_clashes(OPENAI_MANIFEST, {**OPENAI_MANIFEST, key: value})
    assert set(clashes) == {key}
    assert f"give the recorded setting again ({fix})" in clash_fixes(clashes, OPENAI_MANIFEST, tmp_path)[0]


def test_a_directory_written_before_the_prompt_format_was_recorded_takes_any():
    older = {key: value for key, value in OPENAI_MANIFEST.items() if key not in ("tokenizer", "token_ids")}
    assert binding_clashes(older, {**OPENAI_MANIFEST, "tokenizer": "qwen-8b", "token_ids": True}) == {}
