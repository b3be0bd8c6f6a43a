"""`--engine openai` generates on its servers, which choose device, dtype and k: `--device`,
`--dtype` (other than auto) and `--num-assistant-tokens` were accepted and did nothing
(k was even recorded as 5 and bound the directory); they are refused with one line, status 2,
before anything is sent, and so is `--draft` (no draft runs here; `--draft-baseline` names the
endpoint serving it). The budget line of an engine that cannot be probed says "no estimate",
not "estimate 0 s at most"."""

from __future__ import annotations

import pytest

from hf_securesd.bench.budget import Budget, format_duration
from hf_securesd.cli import main


@pytest.mark.parametrize("option", [["--dtype", "bf16"], ["--device", "cpu"],
                                    ["--num-assistant-tokens", "3"], ["--num_assistant_tokens", "5"],
                                    ["--draft", "/nonexistent/draft"]])
def test_the_openai_engine_refuses_options_of_local_models(capsys, tmp_path, option):
    out = tmp_path / "out"
    assert main(["bench", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--tokenizer", "tiny",
                 "--tasks", "jailbreak", "--out", str(out), *option]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    flag = option[0].replace("_", "-")
    assert err.startswith(f"error: {flag} is not used by --engine openai") and f"drop {flag}" in err
    assert not out.exists()


@pytest.mark.parametrize("option", [["--device", "AUTO"], ["--dtype", "auto"], ["--threads", "2"]])
def test_the_openai_engine_takes_auto_in_any_case_and_threads_for_a_local_judge(capsys, tmp_path, option):
    """Past the local-model check (any spelling of auto; --threads sets a local judge model's threads),
    the run fails only on the unreachable server."""
    out = tmp_path / "out"
    code = main(["bench", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--tokenizer", "tiny",
                 "--tasks", "jailbreak", "--out", str(out), "--request-timeout", "1", "--max-retries", "0", *option])
    assert "is not used by --engine openai" not in capsys.readouterr().err and code != 0


def test_a_kind_without_a_rate_gives_no_estimate():
    budget = Budget({}, {"endpoint": "not probed (the openai engine); no estimate"})
    line = budget.describe([("endpoint", 4, 8)], 4)
    assert line.endswith("endpoint (not probed (the openai engine); no estimate); no estimate"), line
    assert "0 s" not in line
    assert budget.eta([("endpoint", 4, 8)]) is None and format_duration(None) == "no estimate"
    budget.record(("endpoint", 4, 8), 3.0)
    assert budget.elapsed_done == 0.0
    partial = Budget({"target": 0.5}, {"target": "journal"})
    assert partial.seconds([("target", 2, 10), ("speculative", 0, 10)]) == 10.0
    assert partial.seconds([("target", 2, 10), ("speculative", 1, 10)]) is None


def test_draft_with_the_openai_engine_points_to_the_draft_baseline(capsys, tmp_path):
    """--draft was silently ignored (study.json said draft "none"), while the options of local models
    were refused."""
    assert main(["bench", "--engine", "openai", "--chat", "--base-url", "http://127.0.0.1:9/v1", "--draft",
                 "qwen-0.5b", "--tasks", "jailbreak", "--out", str(tmp_path / "out")]) == 2
    assert "--draft-baseline NAME" in capsys.readouterr().err
