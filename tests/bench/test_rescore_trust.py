"""`securesd rescore` on a results directory from someone else: study.json must not choose where the
user's judge API key, the recorded responses or the user's files go (`bench/rescore_judge.py`)."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from support import send_reply, serve_locally, stop_servers

from hf_securesd.cli import main

KEY = "sk-VICTIM-SECRET-123"
JUDGE_REPLY = json.dumps({"choices": [{"message": {"role": "assistant",
                                                    "content": "#scores\n1.b 1\n2.b 1\n3.b 1\n"},
                                       "finish_reason": "stop"}]}).encode()


@pytest.fixture(scope="module")
def clean(tmp_path_factory, data_dir) -> Path:
    """A results directory of the tiny pair on three jailbreak prompts (refusal judge)."""
    out = tmp_path_factory.mktemp("trust") / "clean"
    argv = ["bench", "--profile", "smoke", "--tasks", "jailbreak", "--limit", "3", "--max-new-tokens", "4",
            "--verifiers", "mars:0.5", "--schedules", "none", "--data-dir", str(data_dir), "--out", str(out),
            "--no-progress", "--no-report"]
    assert main(argv) == 0
    return out


@pytest.fixture
def server():
    """A fake judge endpoint recording each request's Authorization header and body."""
    seen: list[tuple[str | None, str]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            with lock:
                seen.append((self.headers.get("Authorization"), body))
            send_reply(self, 200, JUDGE_REPLY, **{"Content-Type": "application/json"})

        def log_message(self, *args):
            pass

    running, url = serve_locally(Handler)
    yield url, seen
    stop_servers([running])


def _strongreject_copy(clean: Path, tmp_path: Path, options: dict, judge_backend: dict | None = None) -> Path:
    path = tmp_path / "theirs"
    shutil.copytree(clean, path, ignore=shutil.ignore_patterns(".lock"))
    manifest = json.loads((path / "study.json").read_text())
    manifest.update(judge="strongreject", judge_options=options, judge_backend=judge_backend)
    (path / "study.json").write_text(json.dumps(manifest))
    return path


def _endpoint_flag(backend: str, url: str) -> list[str]:
    """--judge-base-url URL for a judge whose `backend` sends requests (openai); a local one takes none."""
    return ["--judge-base-url", url] if backend == "openai" else []


@pytest.fixture
def user_env(monkeypatch):
    monkeypatch.setenv("SECURESD_JUDGE_API_KEY", KEY)
    monkeypatch.delenv("SECURESD_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("SECURESD_JUDGE_MODEL", raising=False)


@pytest.mark.parametrize("where", ["backend_kwargs", "judge_backend"])
def test_a_recorded_endpoint_never_receives_the_key(clean, tmp_path, server, user_env, data_dir, capsys, where):
    url, seen = server
    options = {"backend": "openai", "backend_kwargs": {"base_url": url, "model": "gpt-4o-mini"}}
    recorded = None
    if where == "judge_backend":
        options, recorded = {"backend": "openai"}, {"kind": "openai", "model": "gpt-4o-mini", "endpoint": url}
    path = _strongreject_copy(clean, tmp_path, options, recorded)
    before = (path / "runs.jsonl").read_bytes()
    assert main(["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir)]) == 2
    error = capsys.readouterr().err
    assert seen == []  # nothing was sent: neither the key nor the recorded responses
    assert f"'{url}'" in error and "'https://api.openai.com/v1'" in error and f"--judge-base-url {url}" in error
    assert KEY not in error and (path / "runs.jsonl").read_bytes() == before


def test_the_environment_endpoint_does_not_lose_to_the_recorded_one(clean, tmp_path, server, user_env,
                                                                  data_dir, monkeypatch, capsys):
    url, seen = server
    path = _strongreject_copy(clean, tmp_path, {"backend": "openai", "backend_kwargs": {"base_url": url}})
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")
    assert main(["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir)]) == 2
    assert seen == [] and "(SECURESD_JUDGE_BASE_URL)" in capsys.readouterr().err


def test_the_user_names_the_endpoint_and_the_recorded_files_are_not_read(clean, tmp_path, server, user_env,
                                                                        data_dir, capsys):
    """Accepted by --judge-base-url, the key goes to that endpoint only, with the user's rubric: the
    data_dir that study.json records (a file of the user's that the attacker wants) is not read."""
    url, seen = server
    planted = tmp_path / "planted" / "strongreject"
    planted.mkdir(parents=True)
    (planted / "judge_rubric_prompt.txt").write_text("PLANTED-FILE {forbidden_prompt} {response}")
    options = {"backend": "openai", "data_dir": str(planted.parent),
               "backend_kwargs": {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-THEIRS", "timeout": 5}}
    path = _strongreject_copy(clean, tmp_path, options)
    argv = ["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir), "--judge-base-url", url]
    assert main(argv) == 0, capsys.readouterr().err
    assert len(seen) == 12 and {auth for auth, _ in seen} == {f"Bearer {KEY}"}
    assert not any("PLANTED-FILE" in body for _, body in seen)


@pytest.mark.parametrize("backend, name, value, allowed", [
    ("openai", "backoff", 1e9, "a number in [0, 60.0]"), ("openai", "max_retries", 10**9, "an integer in [0, 20]"),
    ("openai", "timeout", 1e12, "a number in [0.001, 3600]"), ("openai", "timeout", "60", "a number in"),
    ("openai", "max_response_bytes", 2**60, "an integer in [1, 1073741824]"),
    ("openai", "concurrency", 0, "an integer in [1, 256]"), ("openai", "max_tokens", 1.5, "an integer in"),
    ("transformers", "max_new_tokens", 10**9, "an integer in [1, 32768]"),
])
def test_recorded_backend_settings_out_of_range_are_refused(clean, tmp_path, server, user_env, data_dir, capsys,
                                                            backend, name, value, allowed):
    """Recorded numeric settings are kept, within their ranges: a planted `backoff: 1e9` made rescore
    sleep for decades on the judge's first HTTP 429."""
    url, seen = server
    path = _strongreject_copy(clean, tmp_path, {"backend": backend, "backend_kwargs": {name: value}})
    before = (path / "runs.jsonl").read_bytes()
    argv = ["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir), *_endpoint_flag(backend, url),
            "--judge-model", "m"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert f"study.json: judge option 'backend_kwargs' {name!r}: {value!r} is not {allowed}" in lines[0]
    assert seen == [] and (path / "runs.jsonl").read_bytes() == before


@pytest.mark.parametrize("backend", ["openai", "transformers"])
def test_a_recorded_backend_setting_the_backend_does_not_take_is_refused(clean, tmp_path, server, user_env, data_dir,
                                                                         capsys, backend):
    url, seen = server
    path = _strongreject_copy(clean, tmp_path, {"backend": backend, "backend_kwargs": {"foo": 1}})
    argv = ["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir), *_endpoint_flag(backend, url),
            "--judge-model", "m"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"'backend_kwargs' has 'foo', which the {backend} judge backend does not take" in lines[0]
    assert seen == []


def test_a_recorded_transformers_model_needs_the_flag(clean, tmp_path, user_env, data_dir, capsys):
    options = {"backend": "transformers", "backend_kwargs": {"model": "/home/victim/some-folder"}}
    path = _strongreject_copy(clean, tmp_path, options)
    assert main(["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir)]) == 2
    assert "--judge-model" in capsys.readouterr().err


def test_rescore_of_an_absent_or_repeated_task_is_an_error(clean, tmp_path, data_dir, capsys, monkeypatch):
    import hf_securesd.bench.rescore as rescore_module

    monkeypatch.setattr(rescore_module, "check_isolation", lambda names, isolation: None)  # bubblewrap or not
    path = tmp_path / "copy"
    shutil.copytree(clean, path, ignore=shutil.ignore_patterns(".lock"))
    before = (path / "runs.jsonl").read_bytes()
    assert main(["rescore", str(path), "--tasks", "humaneval", "--data-dir", str(data_dir)]) == 2
    error = capsys.readouterr().err
    assert "no cell of task(s) humaneval" in error and "its tasks: jailbreak" in error
    assert main(["rescore", str(path), "--tasks", "jailbreak", "jailbreak", "--data-dir", str(data_dir)]) == 2
    assert "more than once" in capsys.readouterr().err
    assert (path / "runs.jsonl").read_bytes() == before


def test_every_setting_a_backend_takes_passes_the_recorded_settings_check():
    """`device` of a local (transformers) judge is a real setting with no numeric range: a directory
    scored with it must stay rescorable."""
    from hf_securesd.bench.rescore_judge import _check_recorded_settings

    _check_recorded_settings("transformers", {"device": "cpu", "max_new_tokens": 256, "batch_size": 4})
    _check_recorded_settings("openai", {"timeout": 30, "max_retries": 2, "backoff": 1.0, "max_tokens": 512,
                                        "concurrency": 4, "max_response_bytes": 1024})


@pytest.mark.parametrize("judge, options, flag, users", [
    ("refusal_prefix", {}, "--judge-model", "strongreject"),
    ("refusal_prefix", {}, "--judge-base-url", "strongreject with the openai backend"),
    ("refusal_prefix_exact", {"prefix_list": "gcg_evaluate"}, "--judge-model", "strongreject"),
    ("strongreject", {"backend": "transformers"}, "--judge-base-url", "strongreject with the openai backend"),
])
def test_judge_flags_the_recorded_judge_does_not_use_are_refused(clean, tmp_path, user_env, data_dir, capsys,
                                                                judge, options, flag, users):
    """As `judge-validate` refuses options its judge does not use, rescore refuses a judge flag that the
    recorded judge would silently ignore (the user would think the verdicts came from that model)."""
    path = _strongreject_copy(clean, tmp_path, options)
    manifest = json.loads((path / "study.json").read_text()) | {"judge": judge}
    (path / "study.json").write_text(json.dumps(manifest))
    before = (path / "runs.jsonl").read_bytes()
    argv = ["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir), flag, "http://x.invalid/v1"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    backend = f" with the {options['backend']} backend" if judge == "strongreject" else ""
    assert lines == [f"error: {flag} is used only by {users}, not by the recorded judge {judge}{backend} "
                     "(study.json); leave it out; nothing was rewritten"]
    assert (path / "runs.jsonl").read_bytes() == before


def test_the_refusal_judge_rescores_without_judge_flags(clean, tmp_path, data_dir, capsys):
    path = tmp_path / "copy"
    shutil.copytree(clean, path, ignore=shutil.ignore_patterns(".lock"))
    argv = ["rescore", str(path), "--tasks", "jailbreak", "--data-dir", str(data_dir)]
    assert main(argv) == 0, capsys.readouterr().err
