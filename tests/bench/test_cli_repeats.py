"""Options whose effect surprised: `calibrate --verifier NAME` without a value (the whole sweep, nine
times the run) and the same --verifiers / --schedules setting named twice are refused, with one line
naming the option and the fix, before anything is loaded or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import SMOKE_CLI, cli_refusal



@pytest.mark.parametrize("verifier", ["mars", "fly"])
def test_calibrate_asks_for_the_setting_instead_of_running_the_sweep(capsys, tmp_path: Path, data_dir,
                                                                    verifier):
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--verifier", verifier, "--L", "1", "--data-dir",
                             str(data_dir), "--out", str(out)])
    assert f"--verifier '{verifier}' names no setting" in error and f"{verifier}:VALUE" in error
    assert not out.exists()


@pytest.mark.parametrize("option, values", [
    ("--verifiers", ["mars:0.5", "mars:0.5"]),
    ("--verifiers", ["MARS:0.50", "mars:0.5"]),
    ("--schedules", ["none", "none"]),
    ("--schedules", ["step:1", "STEP:1"]),
])
def test_bench_refuses_a_setting_named_twice(capsys, tmp_path: Path, data_dir, option, values):
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["bench", *SMOKE_CLI, "--no-report", "--data-dir", str(data_dir), "--out", str(out),
                             option, *values])
    assert f"{option} names the same setting twice" in error and not out.exists()


def test_calibrate_refuses_a_verifier_named_twice(capsys, tmp_path: Path, data_dir):
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--verifier", "mars:0.5", "mars:0.5", "--L", "1",
                             "--data-dir", str(data_dir), "--out", str(tmp_path / "out")])
    assert "--verifier names the same setting twice" in error


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_a_task_named_twice_is_refused(capsys, tmp_path: Path, data_dir, command):
    out = tmp_path / "out"
    error = cli_refusal(capsys, [command, "--profile", "smoke", "--tasks", "gsm8k", "gsm8k", "--limit", "1",
                                 "--data-dir", str(data_dir), "--out", str(out)])
    assert "--tasks names the same setting twice: gsm8k" in error and not out.exists()
