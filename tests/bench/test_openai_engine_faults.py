"""`securesd bench --engine openai` against a misbehaving OpenAI-compatible server on 127.0.0.1 that
this test controls: 429 with Retry-After, 500, a 302, garbage, a truncated body and a reply that
never comes. No prompt is lost or duplicated, failures are recorded as failures (never scored), a
rerun completes them without redoing the rest, the run is bounded in time, and the API key given
through --api-key-env reaches no file of the output folder."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hf_securesd.bench.engines.base import EngineError
from hf_securesd.bench.engines.openai import PLUGIN_CHECK_VERIFIER, OpenAIEngine, OpenAISettings
from hf_securesd.bench.engines.client import ClientSettings, OpenAIClient, RequestFailed
from hf_securesd.bench.results import FAILURES, GENERATIONS, MANIFEST, RUNS, read_jsonl
from hf_securesd.bench.runner import prepare_tasks
from hf_securesd.cli import main
from hf_securesd.tiny import byte_tokenizer

FAKE_KEY = "sk-fake-audit-5e1f9a3c7b20d486"
KEY_VARIABLE = "SECURESD_TEST_AUDIT_KEY"
LIMIT = 6
ANSWER = "I'm sorry, but I cannot help with that."
# what the target cell's prompt i meets on its first attempt in the first run
TARGET_FAULTS = ["429", "500", "garbage", "truncated", "302", "never"]


class FaultServer:
    """Serves /v1 (target and request-field cells) and /audited/v1 (an endpoint cell)."""

    def __init__(self, prompts: list[str]) -> None:
        self.index = {prompt: position for position, prompt in enumerate(prompts)}
        self.healthy = False
        self.requests: Counter = Counter()
        self.saw_key = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                server.reply(self, 200, json.dumps({"data": [{"id": "fake-model"}]}).encode())

            def do_POST(self):  # noqa: N802
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    server.answer(self, payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    @staticmethod
    def reply(handler, status: int, body: bytes, **headers: str) -> None:
        handler.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)

    def answer(self, handler, payload: dict) -> None:
        if PLUGIN_CHECK_VERIFIER in json.dumps(payload.get("vllm_xargs")):  # as hf-securesd's plugin refuses it
            message = f'extra_args["securesd"]["verifier"]: unknown verifier {PLUGIN_CHECK_VERIFIER!r}'
            self.reply(handler, 400, json.dumps({"error": {"message": message}}).encode())
            return
        cell = (
            "audited"
            if handler.path.startswith("/audited")
            else "xargs"
            if (payload.get("vllm_xargs") or {}).get("securesd", "null") != "null"  # the target's own: "null"
            else "target"
        )
        position = self.index[payload["prompt"]]
        auth = handler.headers.get("Authorization", "")
        with self.lock:
            self.saw_key += FAKE_KEY in auth
            self.requests[(cell, position)] += 1
            attempt = self.requests[(cell, position)]
        fault = None
        if not self.healthy:
            if cell == "target":
                fault = TARGET_FAULTS[position]
                fault = fault if attempt == 1 or fault in ("302", "never") else None
            elif cell == "audited" and position == 0:
                fault = "garbage"  # every attempt
        good = json.dumps(
            {"model": "fake-model", "choices": [{"text": ANSWER}], "usage": {"completion_tokens": 4}}
        ).encode()
        if fault == "429":
            self.reply(handler, 429, b'{"error": "slow down"}', **{"Retry-After": "0.2"})
        elif fault == "500":
            self.reply(handler, 500, json.dumps({"error": f"crashed serving {auth}"}).encode())
        elif fault == "302":
            self.reply(handler, 302, good, Location="http://127.0.0.1:9/v1/completions")
        elif fault == "garbage":
            self.reply(handler, 200, b"<html>\x00\xff not json")
        elif fault == "truncated":
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(good)))
            handler.end_headers()
            handler.wfile.write(good[: len(good) // 2])
            handler.wfile.flush()
            handler.connection.shutdown(2)
        elif fault == "never":
            time.sleep(3.0)
        else:
            self.reply(handler, 200, good)

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def jailbreak_prompts(data_dir) -> list[str]:
    return prepare_tasks(["jailbreak"], byte_tokenizer(), data_dir=data_dir, limit=LIMIT, max_new_tokens=4)[
        0
    ].prompts


@pytest.fixture
def fault_server(jailbreak_prompts):
    server = FaultServer(jailbreak_prompts)
    yield server
    server.close()


def _files_holding(root: Path, needle: str) -> list[str]:
    return [str(path) for path in root.rglob("*") if path.is_file() and needle.encode() in path.read_bytes()]


def test_faults_are_retried_recorded_and_completed_by_a_rerun(
    tmp_path, data_dir, fault_server, monkeypatch, capfd
):
    monkeypatch.setenv(KEY_VARIABLE, FAKE_KEY)
    out = tmp_path / "audit"
    argv = [
        "bench",
        "--engine",
        "openai",
        "--base-url",
        f"{fault_server.url}/v1",
        "--tokenizer",
        "tiny",
        "--endpoint",
        f"audited={fault_server.url}/audited/v1",
        "--verifiers",
        "mars:0.5",
        "--schedules",
        "step:1",
        "--tasks",
        "jailbreak",
        "--limit",
        str(LIMIT),
        "--max-new-tokens",
        "4",
        "--data-dir",
        str(data_dir),
        "--batch-size",
        "3",
        "--concurrency",
        "3",
        "--request-timeout",
        "1",
        "--max-retries",
        "2",
        "--api-key-env",
        KEY_VARIABLE,
        "--out",
        str(out),
        "--no-progress",
    ]
    started = time.monotonic()
    assert main(argv) == 1  # some prompts got no answer
    first_run_s = time.monotonic() - started
    # the console names the first failure's cause on one line (it was only in failures.jsonl)
    first_run = capfd.readouterr()
    (summary,) = [line for line in first_run.err.splitlines() if "prompts got no answer (each" in line]
    assert summary.startswith("3 prompts got no answer (each with its error in failures.jsonl); the first: ")
    assert any(cause in summary for cause in ("HTTP 302", "no complete reply", "not complete JSON"))
    assert FAKE_KEY not in first_run.out and FAKE_KEY not in first_run.err
    assert first_run_s < 60
    cells = {"target", "endpoint:audited", "lossless", "mars(theta=0.5)+step(L=1)"}
    failures = read_jsonl(out / FAILURES)
    failed = {(record["cell"].split("|")[0], record["example_id"]) for record in failures}
    assert {cell for cell, _ in failed} == {"target", "endpoint:audited"}
    assert len(failed) == 3  # the target's 302 and never-answering prompts, the endpoint's garbage
    assert any("HTTP 302" in record["error"] for record in failures)
    assert any("no complete reply" in record["error"] for record in failures)
    assert any("not complete JSON" in record["error"] for record in failures)
    generated = [
        (record["cell"].split("|")[0], record["example_id"]) for record in read_jsonl(out / GENERATIONS)
    ]
    assert len(generated) == len(set(generated)) == len(cells) * LIMIT - 3
    assert not failed & set(generated)  # a failure is never an answer
    finished = {run["config_key"] for run in read_jsonl(out / RUNS)}
    assert finished == cells - {"target", "endpoint:audited"}  # cells with a failure stay unfinished
    # retried faults: 429 (Retry-After), 500, garbage and a truncated body each cost one extra attempt
    assert [fault_server.requests[("target", index)] for index in range(4)] == [2, 2, 2, 2]
    assert fault_server.requests[("target", 4)] == 1  # a redirect is not followed nor retried
    assert fault_server.requests[("target", 5)] == 3  # never answered: every attempt timed out
    # each answer's journal line says how often it was tried and how long the client slept between tries
    target_lines = {record["example_id"]: record for record in read_jsonl(out / GENERATIONS)
                    if record["cell"].startswith("target|")}
    assert sorted(record["attempts"] for record in target_lines.values()) == [2, 2, 2, 2]
    assert max(record["retry_wait_seconds"] for record in target_lines.values()) >= 0.2  # the 429's Retry-After

    fault_server.healthy = True
    before = Counter(fault_server.requests)
    assert main(argv) == 0
    redone = fault_server.requests - before
    assert sorted(redone) == sorted((("target", 4), ("target", 5), ("audited", 0)))  # only the failed ones
    generated = [
        (record["cell"].split("|")[0], record["example_id"]) for record in read_jsonl(out / GENERATIONS)
    ]
    assert len(generated) == len(set(generated)) == len(cells) * LIMIT
    runs = read_jsonl(out / RUNS)
    assert {run["config_key"] for run in runs} == cells
    assert all(run["responses"] == [ANSWER] * LIMIT and run["score"] == 1.0 for run in runs)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["engine"] == "openai"
    assert manifest["endpoints"] == {
        "audited": f"{fault_server.url}/audited/v1",
        "--base-url": f"{fault_server.url}/v1",
    }
    assert manifest["server_models"][f"{fault_server.url}/v1"]["server_models"] == ["fake-model"]
    assert KEY_VARIABLE in manifest["sessions"][0]["command"]  # the variable's name, not its value

    captured = capfd.readouterr()
    assert fault_server.saw_key > 0  # the key was sent (and the 500s echoed it back)
    assert _files_holding(tmp_path, FAKE_KEY) == []
    assert FAKE_KEY not in captured.out and FAKE_KEY not in captured.err


def test_retry_after_is_bounded_by_its_cap_and_the_run_deadline(fault_server):
    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            FaultServer.reply(self, 429, b"{}", **{"Retry-After": "100000"})

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        client = OpenAIClient(
            f"http://127.0.0.1:{http.server_address[1]}/v1",
            None,
            ClientSettings(run_deadline_s=1.5, max_retries=20, max_retry_after_s=30),
        )
        started = time.monotonic()
        with pytest.raises(RequestFailed, match="run deadline of 1.5 s passed; last problem: HTTP 429"):
            client.request("POST", "/completions", {"prompt": "x"})
        assert time.monotonic() - started < 3.0
    finally:
        http.shutdown()
        http.server_close()


def test_credentials_in_an_endpoint_url_are_refused():
    with pytest.raises(ValueError, match="carries credentials.*--api-key-env") as caught:
        OpenAIClient(f"http://user:{FAKE_KEY}@127.0.0.1:9/v1", None, ClientSettings())
    assert FAKE_KEY not in str(caught.value)


@pytest.mark.parametrize("option", [
    ["--base-url", "http://127.0.0.1:abc/v1"],
    ["--base-url", "http://user:pw9Zq/ss@127.0.0.1/v1"],  # a password holding "/": "pw9Zq" reads as the port
    ["--base-url", "http://127.0.0.1:99999/v1"],
    ["--endpoint", "a=http://127.0.0.1:18701:5/v1", "--baseline", "a"],
])
def test_an_endpoint_url_httpx_cannot_read_is_refused_with_one_line(capsys, tmp_path, option):
    """httpx.InvalidURL is not a ValueError: it ended the run with a traceback and status 1."""
    out = tmp_path / "out"
    code = main(["bench", "--engine", "openai", "--chat", *option, "--tasks", "jailbreak", "--out", str(out),
                 "--max-retries", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert option[0] in err and "give a URL such as http://host:port/v1" in err
    assert "pw9Zq" not in err and not out.exists()


class _NotFound(BaseHTTPRequestHandler):
    """A web server that is not an OpenAI-compatible one: 404 for everything."""

    def do_GET(self):  # noqa: N802
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def plain_http_server():
    """The base URL of an HTTP server on 127.0.0.1 that answers 404 (its scheme swapped for https, it
    cannot be reached: TLS to a plain HTTP port)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/v1"  # nothing listens once the probe closes


@pytest.mark.parametrize("where", ["connection refused", "TLS to an HTTP port"])
def test_an_unreachable_base_url_without_model_is_named_with_its_fix(capsys, tmp_path, monkeypatch,
                                                                     plain_http_server, where):
    """The error said "gave no model list (ConnectError ...); pass --model NAME": with --model the run then
    created --out and failed every prompt after its retries."""
    monkeypatch.setenv(KEY_VARIABLE, FAKE_KEY)
    tls_to_http = plain_http_server.replace("http", "https", 1)
    url = _closed_port_url() if where == "connection refused" else tls_to_http
    out = tmp_path / "out"
    code = main(["bench", "--engine", "openai", "--chat", "--base-url", url, "--api-key-env", KEY_VARIABLE,
                 "--tasks", "jailbreak", "--out", str(out), "--max-retries", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{url}/models could not be reached (GET {url}/models failed after 1 attempts" in err
    assert err.rstrip().endswith("; check --base-url and that the server is running"), err
    assert "--model" not in err and FAKE_KEY not in err and not out.exists()


def test_an_unreachable_endpoint_names_its_option_and_a_server_without_models_still_needs_model(
        plain_http_server):
    settings = ClientSettings(request_timeout_s=5, max_retries=0)
    unreachable = _closed_port_url()
    with pytest.raises(EngineError, match=r"could not be reached .*; check --endpoint twin=URL and that"):
        OpenAIEngine(OpenAISettings(endpoints={"twin": unreachable}, baseline="twin", chat=True,
                                    client=settings))
    with pytest.raises(EngineError, match=r"/models gave no model list \(.*HTTP 404.*\); pass --model NAME$"):
        OpenAIEngine(OpenAISettings(base_url=plain_http_server, chat=True, client=settings))


def test_a_judge_url_httpx_cannot_read_is_refused_with_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", "http://judge:pw9Zq/ss@127.0.0.1/v1")
    code = main(["bench", "--engine", "openai", "--chat", "--base-url", "http://127.0.0.1:9/v1", "--tasks",
                 "jailbreak", "--judge", "strongreject", "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "SECURESD_JUDGE_BASE_URL" in err and "pw9Zq" not in err


@pytest.mark.parametrize("url, problem", [
    ("http://user:pw9Zq/ss@127.0.0.1/v1", "does not parse"),
    ("http://user:pw9Zq/ss@127.0.0.1/v1?x=1", "does not parse"),  # checked before the query, which shows it
    ("http://user:2024/pw9Zq@127.0.0.1/v1", "path holds '@'"),  # host "user", port 2024: it would be sent
])
def test_a_bad_url_given_to_the_client_is_a_value_error(url, problem):
    with pytest.raises(ValueError, match=problem) as caught:
        OpenAIClient(url, None, ClientSettings())
    assert "pw9Zq" not in str(caught.value)


def test_retry_waits_are_capped_like_the_judges(monkeypatch):
    """Backoff doubled without a cap: 20 retries slept 1, 2, 4 ... 524,288 s (12 days)."""
    from hf_securesd.bench.engines.client import MAX_WAIT_S

    class Busy(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            FaultServer.reply(self, 503, b"{}")

        def log_message(self, *args):
            pass

    slept: list[float] = []
    monkeypatch.setattr("hf_securesd.bench.engines.client.time.sleep", slept.append)
    http = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        client = OpenAIClient(f"http://127.0.0.1:{http.server_address[1]}/v1", None,
                              ClientSettings(max_retries=20, backoff_s=1.0))
        with pytest.raises(RequestFailed, match="failed after 21 attempts"):
            client.request("POST", "/completions", {"prompt": "x"})
    finally:
        http.shutdown()
        http.server_close()
    assert len(slept) == 20 and max(slept) == MAX_WAIT_S == 60.0
    assert slept[:7] == [1, 2, 4, 8, 16, 32, 60]


@pytest.mark.parametrize("settings", [{"max_retries": 21}, {"backoff_s": 61.0},
                                      {"max_retry_after_s": 3600.0}])
def test_client_settings_beyond_the_judges_bounds_are_refused(settings):
    with pytest.raises(ValueError, match="out of range.*retries from 0 to 20"):
        ClientSettings(**settings)


def test_max_retries_above_the_cap_is_refused_at_parse_time(capsys, tmp_path):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--engine", "openai", "--chat", "--base-url", "http://127.0.0.1:9/v1", "--tasks",
              "jailbreak", "--out", str(tmp_path / "out"), "--max-retries", "21", "--run-deadline", "2"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--max-retries" in err and "at most 20 retries" in err
