"""`securesd rescore` prints text from the results directory (cell names, example ids, the messages
quoting them, the pid in a held lock) on one line each: a line break in a recorded endpoint's name,
and so in its `cell`, printed a forged line of its own ("error: ...") after the verdicts changed."""

from __future__ import annotations

import fcntl
import json
import os

import pytest
from support import jailbreak_study

from hf_securesd.bench import rescore as rescore_command
from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.bench.results import RUNS, read_jsonl
from hf_securesd.bench.terminal import printable_line
from hf_securesd.cli import main
from hf_securesd.judges import JudgeError

FORGED = "prod\nerror: forged line\r\x1b[31m"
SHOWN = "prod\\nerror: forged line\\r\\x1b[31m"


@pytest.fixture
def study(tmp_path, data_dir):
    """Two baselines and an endpoint cell named `FORGED`, whose first verdict is flipped."""
    plan = [(TARGET, ["I cannot.", "Sure"]), (DRAFT, ["Sure", "Sure"]),
            (RunConfig("endpoint", endpoint=FORGED), ["I cannot.", "I cannot."])]
    store = jailbreak_study(tmp_path / "results", data_dir, plan)
    runs = read_jsonl(store.path / RUNS)
    runs[2].update(scores=[1.0, 0.0], score=0.5)
    (store.path / RUNS).write_text("".join(f"{json.dumps(run)}\n" for run in runs), encoding="utf-8")
    return store.path


def _rescore(study, data_dir) -> int:
    return main(["rescore", str(study), "--tasks", "jailbreak", "--data-dir", str(data_dir)])


def test_printable_line_escapes_line_breaks_and_control_characters():
    assert printable_line("a\nb\r\x1b[2J\u202ec\td") == "a\\nb\\r\\x1b[2J\\u202ec\td"


def test_a_recorded_cell_with_a_line_break_prints_on_one_line(study, data_dir, capsys):
    assert _rescore(study, data_dir) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and not any(line.startswith("error:") for line in out)
    assert out[2].startswith(f"endpoint:{SHOWN}|jailbreak|n=2|max_new_tokens=16: 1 verdict(s) changed: ")


@pytest.mark.parametrize("error", [ValueError(f"endpoint:{FORGED}|jailbreak: example 'x' is not in task"),
                                   JudgeError(f"the reply to {FORGED}")])
def test_an_error_quoting_recorded_text_is_one_line(study, data_dir, capsys, monkeypatch, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(rescore_command, "rescore", fail)
    assert _rescore(study, data_dir) in (2, 3)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and SHOWN in err and err.count("\n") == 1 and "\x1b" not in err


def test_the_pid_a_held_lock_shows_is_one_line(study, data_dir, capsys):
    fd = os.open(study / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"123\nerror: forged line\n")
        assert _rescore(study, data_dir) == 4
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert err.startswith(f"error: {study} is in use by another run (pid 123\\nerror: forged line)")
    assert err.count("\n") == 1


def test_command_errors_stay_on_one_line(capsys) -> None:
    # `bench` and `report` print their errors through print_error: a value from a results file holding a
    # line break printed a forged second line
    from hf_securesd.bench.terminal import print_error

    print_error("bad cell 'x\nerror: forged'")
    assert capsys.readouterr().err == "error: bad cell 'x\\nerror: forged'\n"
