"""HumanEval without a usable bubblewrap: `bench`, `calibrate` and `rescore` stop with one line
naming the cause and the fix, status 2, before a model is loaded or a result read (it was a
traceback and status 1). `rescore --unsafe-no-isolation` scores it anyway, like `bench`'s flag:
it warns, and each example records ``"isolation": "unsafe-none"``; `rescore` takes the
``--two_words`` spellings like `bench`. An unknown task is printed plainly, not as a KeyError repr."""

from __future__ import annotations

import json

import pytest

from hf_securesd.bench import sandbox
from hf_securesd.bench.results import RUNS
from hf_securesd.cli import main

SMOKE = ("--profile", "smoke", "--limit", "1", "--max-new-tokens", "2", "--no-progress")
MISSING = "bubblewrap (`bwrap`) is not installed: install bubblewrap"


@pytest.fixture
def no_bwrap(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda python=None: MISSING)


def one_line_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_without_bubblewrap_the_run_is_refused_before_loading(no_bwrap, capsys, tmp_path, data_dir, monkeypatch,
                                                               command):
    monkeypatch.setattr("hf_securesd.bench.cli_bench.machine_settings",
                        lambda *args: pytest.fail("models were set up"))
    out = tmp_path / "out"
    assert main([command, *SMOKE, "--tasks", "humaneval", "--data-dir", str(data_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: refusing to run generated code without isolation") and MISSING in err
    assert "--unsafe-no-isolation" in err and not out.exists()


def test_rescore_needs_bubblewrap_or_the_unsafe_flag(no_bwrap, capsys, tmp_path, data_dir):
    out = tmp_path / "out"
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        assert main(["bench", *SMOKE, "--tasks", "humaneval", "--verifiers", "mars:0.5", "--schedules", "none",
                     "--no-report", "--unsafe-no-isolation", "--data-dir", str(data_dir), "--out", str(out)]) == 0
    before = (out / RUNS).read_bytes()
    capsys.readouterr()
    assert main(["rescore", str(out), "--tasks", "humaneval", "--data_dir", str(data_dir)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert MISSING in err and "--unsafe-no-isolation" in err and (out / RUNS).read_bytes() == before
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        assert main(["rescore", str(out), "--tasks", "humaneval", "--data_dir", str(data_dir),
                     "--unsafe_no_isolation"]) == 0
    runs = [json.loads(line) for line in (out / RUNS).read_text().splitlines()]
    assert runs and all(detail["isolation"] == "unsafe-none" for run in runs for detail in run["details"])


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_an_unknown_task_is_printed_plainly(capsys, tmp_path, data_dir, command):
    assert main([command, *SMOKE, "--tasks", "nosuch", "--data-dir", str(data_dir), "--out", str(tmp_path / "o")]) == 2
    assert one_line_error(capsys).startswith("error: unknown benchmark task 'nosuch'; available:")
