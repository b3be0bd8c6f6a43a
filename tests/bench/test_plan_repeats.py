"""`--verifiers`, `--schedules` and calibrate's `--verifier` / `--L` refuse a setting named twice,
not only a whole value repeated: within one value (``mars:0.5,0.5``), across values
(``mars:0.5,0.9 mars:0.9``; ``mars mars:0.5``, whose sweep holds 0.5); and a schedule with L = 0,
which is ``none`` under another name. Each is one line, status 2, before anything is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_securesd.bench.plan import check_no_repeats, parse_schedule, schedule_key, verifier_key
from support import SMOKE_CLI, cli_refusal



@pytest.mark.parametrize("specs, setting", [
    (["mars:0.5,0.5"], "mars(theta=0.5) (in 'mars:0.5,0.5')"),
    (["mars:0.5,0.9", "mars:0.9"], "mars(theta=0.9) ('mars:0.5,0.9' and 'mars:0.9')"),
    (["mars", "mars:0.5"], "mars(theta=0.5) ('mars' and 'mars:0.5')"),
])
def test_a_setting_named_twice_inside_or_across_values_is_refused(specs, setting):
    with pytest.raises(ValueError, match="names the same setting twice") as raised:
        check_no_repeats("--verifiers", specs, verifier_key)
    assert setting in str(raised.value)


def test_different_settings_pass():
    check_no_repeats("--verifiers", ["mars:0.5,0.9", "bild"], verifier_key)
    check_no_repeats("--schedules", ["none", "step:2", "linear:2", "power:2:2.0", "step:1"], schedule_key)


SEGMENTS = '{{"schedule": "segments", "boundary": "</think>", "before": {before}, "after": {after}}}'


@pytest.mark.parametrize("specs", [
    ["step:1", "linear:1"],
    ["power:4:1.0", "linear:4"],
    ["power:1:3.0", "step:1"],
    [SEGMENTS.format(before="null", after='{"schedule": "step", "L": 1}'),
     SEGMENTS.format(before="null", after='{"schedule": "linear", "L": 1}')],
    ["none", SEGMENTS.format(before="null", after="null")],
])
def test_schedules_that_weigh_every_position_alike_are_one_setting(specs):
    """Two spellings of the same weights would run the same cells twice under two labels."""
    with pytest.raises(ValueError, match="names the same setting twice"):
        check_no_repeats("--schedules", specs, schedule_key)


@pytest.mark.parametrize("values", [["mars:0.5,0.5"], ["mars:0.5,0.9", "mars:0.9"], ["mars", "mars:0.5"]])
def test_bench_refuses_overlapping_verifier_values(capsys, tmp_path: Path, data_dir, values):
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["bench", *SMOKE_CLI, "--no-report", "--data-dir", str(data_dir), "--out", str(out),
                             "--verifiers", *values])
    assert "--verifiers names the same setting twice: mars(theta=" in error and not out.exists()


@pytest.mark.parametrize("values", [["mars:0.5,0.5"], ["mars:0.5,0.9", "mars:0.9"]])
def test_calibrate_refuses_overlapping_verifier_values(capsys, tmp_path: Path, data_dir, values):
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--verifier", *values, "--L", "1", "--data-dir", str(data_dir),
                             "--out", str(out)])
    assert "--verifier names the same setting twice" in error and not out.exists()


def test_calibrate_refuses_an_l_named_twice(capsys, tmp_path: Path, data_dir):
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--L", "2", "2", "--data-dir", str(data_dir), "--out", str(out)])
    assert "--L names the same setting twice: L=2" in error and not out.exists()


@pytest.mark.parametrize("spec", ["step:0", "linear:0", "power:0:2", '{"schedule": "step", "L": 0}'])
def test_a_schedule_with_l_0_is_refused_as_none(spec):
    with pytest.raises(ValueError, match="L=0 verifies no token losslessly.*give it as none"):
        parse_schedule(spec)


def test_bench_refuses_step_0_and_calibrate_l_0(capsys, tmp_path: Path, data_dir):
    out = tmp_path / "out"
    error = cli_refusal(capsys, ["bench", *SMOKE_CLI, "--no-report", "--data-dir", str(data_dir), "--out", str(out),
                             "--schedules", "none", "step:0"])
    assert "relaxed verifier alone; give it as none" in error
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--L", "0", "1", "--data-dir", str(data_dir), "--out", str(out)])
    assert "--L 0:" in error and "relaxed verifier alone" in error and not out.exists()
