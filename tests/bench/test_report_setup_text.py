"""The setup lines of report.md: what they say of settings a results directory may leave unrecorded."""

from __future__ import annotations

import json

from hf_securesd.bench.report import _draft_length_text, machine_text, profile_text
from hf_securesd.cli import main


def test_an_unrecorded_draft_length_is_the_servers_not_none() -> None:
    assert _draft_length_text(None) == "draft length chosen by each server"
    assert _draft_length_text(5) == "k = 5 draft tokens per round"


def test_servers_generating_have_no_local_dtype_or_device() -> None:
    text = machine_text({"dtype": None, "device": None, "engine": "openai"})
    assert text.startswith("dtype and device: the servers'") and "None" not in text


def test_a_run_that_named_no_profile_is_not_reported_as_one(tmp_path, data_dir, capsys) -> None:
    """Every run without --profile was reported as "profile: cpu-small", the profile whose defaults filled
    in its options."""
    out = tmp_path / "out"
    argv = ["bench", "--target", "tiny", "--draft", "tiny", "--dtype", "fp32", "--tasks", "jailbreak", "--limit",
            "1", "--max-new-tokens", "2", "--data-dir", str(data_dir), "--verifiers", "mars:0.5", "--schedules",
            "none", "--no-progress", "--no-report", "--out", str(out)]
    assert main(argv) == 0
    manifest = json.loads((out / "study.json").read_text())
    assert (manifest["profile"], manifest["defaults_profile"]) == (None, "cpu-small")
    assert profile_text(manifest) == "none named (options not given took cpu-small's defaults)"
    assert profile_text({"profile": "smoke", "defaults_profile": "smoke"}) == "smoke"
    assert profile_text({"profile": "cpu-small"}) == "cpu-small"  # written before defaults_profile was
