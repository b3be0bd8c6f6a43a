"""`securesd rescore` compared scores only: a new judge that could parse none of the replies (each then
scored as a successful attack under the default ``unparsed=success``) printed "0 verdict(s) changed"
for compliant replies, as if it agreed with the old judge on every one. A verdict whose parsed state
changed now counts as changed, and each cell's line says how many verdicts the judge could not parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import jailbreak_study, send_reply, serve_locally, stop_servers

from hf_securesd.bench.plan import TARGET
from hf_securesd.bench.results import MANIFEST, RUNS, read_jsonl
from hf_securesd.cli import main

COMPLIANT = ["Sure, here is how to do it: step 1", "Sure, step 1: mix them"]
CELL = "target|jailbreak|n=2|max_new_tokens=16"
NO_RUBRIC = json.dumps({"choices": [{"message": {"role": "assistant", "content": "I would rather not."},
                                     "finish_reason": "stop"}]}).encode()


@pytest.fixture
def study(tmp_path, data_dir) -> Path:
    """A target cell of two compliant replies, judged by the refusal judge (parsed: attacks succeeded)."""
    return jailbreak_study(tmp_path / "results", data_dir, [(TARGET, COMPLIANT)]).path


@pytest.fixture
def judge_url():
    """A judge endpoint whose replies hold no StrongREJECT rubric scores (never parsed)."""
    from http.server import BaseHTTPRequestHandler

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            send_reply(self, 200, NO_RUBRIC, **{"Content-Type": "application/json"})

        def log_message(self, *args):
            pass

    running, url = serve_locally(Handler)
    yield url
    stop_servers([running])


def test_a_judge_that_parses_no_reply_changes_every_verdict(study, data_dir, judge_url, monkeypatch, capsys):
    if not (data_dir / "strongreject").is_dir():
        pytest.skip(f"no StrongREJECT data at {data_dir / 'strongreject'}")
    monkeypatch.setenv("SECURESD_JUDGE_API_KEY", "sk-test-judge-key-123456")
    manifest = json.loads((study / MANIFEST).read_text())
    manifest.update(judge="strongreject", judge_options={"backend": "openai"})
    (study / MANIFEST).write_text(json.dumps(manifest))
    ids = read_jsonl(study / RUNS)[0]["example_ids"]
    argv = ["rescore", str(study), "--tasks", "jailbreak", "--data-dir", str(data_dir),
            "--judge-base-url", judge_url, "--judge-model", "fake-judge"]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{CELL}: 2 verdict(s) changed: {', '.join(ids)}; the judge could not parse 2 verdict(s)"]
    run = read_jsonl(study / RUNS)[0]
    assert run["scores"] == [0.0, 0.0] and all(detail["unparsed"] for detail in run["details"])


def test_a_verdict_the_new_judge_parses_where_the_old_could_not_is_changed(study, data_dir, capsys):
    runs = read_jsonl(study / RUNS)
    runs[0]["details"][1]["unparsed"] = True  # the old judge could not parse it: scored 0.0 all the same
    (study / RUNS).write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")
    assert main(["rescore", str(study), "--tasks", "jailbreak", "--data-dir", str(data_dir)]) == 0
    changed = runs[0]["example_ids"][1]
    assert capsys.readouterr().out.splitlines() == [f"{CELL}: 1 verdict(s) changed: {changed}"]
