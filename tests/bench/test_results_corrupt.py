"""A results directory is read whole or not at all: only a line torn by a killed writer (the last,
without its newline) is skipped; any other line securesd never writes, and a study.json that is not
an object, stop `report` and `rescore` with one line naming the file, the line and the fix."""

from __future__ import annotations

import json

import pytest

from hf_securesd.bench.results import (
    GENERATIONS,
    MANIFEST,
    RUNS,
    CorruptResultsError,
    ResultsDir,
    append_jsonl,
    read_jsonl,
)
from hf_securesd.cli import main

RECORD = {"cell": "target|t", "example_id": "t-0", "response": "ok", "seconds": 1.0, "new_tokens": 1,
          "session": "0123456789ab", "stats": None}


def _lines(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


def test_only_a_torn_last_line_is_skipped(tmp_path) -> None:
    path = tmp_path / GENERATIONS
    path.write_text(_lines(json.dumps(RECORD)) + '{"cell": "targ', encoding="utf-8")
    assert read_jsonl(path) == [RECORD]
    path.write_text(_lines(json.dumps(RECORD)) + json.dumps(RECORD), encoding="utf-8")  # newline not written
    assert read_jsonl(path) == [RECORD, RECORD]
    path.write_bytes(_lines(json.dumps(RECORD)).encode() + '{"response": "é'.encode()[:-1])  # cut inside a character
    assert read_jsonl(path) == [RECORD]


@pytest.mark.parametrize(
    "line, problem",
    [
        ('{"cell": "targ', "not valid JSON"),
        ("", "not valid JSON"),
        ("[1, 2]", "a JSON array, not a record"),
        ("null", "a JSON null, not a record"),
        ("{}", "a record without a valid 'cell', 'example_id', 'response', 'seconds', 'new_tokens', 'session'"),
        (json.dumps({**RECORD, "session": None}), "a record without a valid 'session'"),
        (json.dumps({**RECORD, "stats": "x"}), "a record whose 'stats' is neither null nor an object"),
        (json.dumps({**RECORD, "stats": {"drafted_per_round": [1]}}), "a run whose 'stats' lack a valid"),
    ],
)
def test_any_other_bad_line_names_the_file_the_line_and_the_fix(tmp_path, line, problem) -> None:
    (tmp_path / GENERATIONS).write_text(_lines(json.dumps(RECORD), line, json.dumps(RECORD)), encoding="utf-8")
    with pytest.raises(CorruptResultsError) as caught:
        ResultsDir(tmp_path).generations()
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / GENERATIONS}, line 2: {problem}")
    assert "restore the file from a backup" in message and "new --out" in message


def test_a_run_record_must_hold_one_score_and_response_per_example(tmp_path) -> None:
    run = {"cell": "target|jailbreak|n=2|max_new_tokens=4", "config_key": "target",
           "config": {"kind": "target"}, "task": "jailbreak", "task_kind": "safety", "metric": "afr",
           "baseline_id": "jailbreak|n=2|max_new_tokens=4", "n": 2, "max_new_tokens": 4,
           "example_ids": ["a", "b"], "scores": [1.0], "score": 1.0, "responses": ["x", "y"],
           "seconds": [0.5, 0.5], "sessions": ["s"], "wall_time": 1.0, "spd_same_session": True}
    (tmp_path / RUNS).write_text(_lines(json.dumps(run)), encoding="utf-8")
    with pytest.raises(CorruptResultsError, match="line 1: a run whose scores do not match its example_ids"):
        ResultsDir(tmp_path).runs()
    run["scores"].append(None)  # an excluded verdict (written as null) is a score
    (tmp_path / RUNS).write_text(_lines(json.dumps(run)), encoding="utf-8")
    assert len(ResultsDir(tmp_path).runs()) == 1


@pytest.mark.parametrize("name", [[], {"mars": 1}, 7, None])
def test_a_verifier_name_that_is_not_text_is_named(tmp_path, name) -> None:
    """A list or object as the verifier's name was an unhashable-type traceback in the check itself."""
    run = {"cell": "mars(theta=0.5)|jailbreak|n=1|max_new_tokens=4", "config_key": "mars(theta=0.5)",
           "config": {"kind": "speculative", "verifier": {"verifier": name, "theta": 0.5}},
           "task": "jailbreak", "task_kind": "safety", "metric": "afr",
           "baseline_id": "jailbreak|n=1|max_new_tokens=4", "n": 1,
           "max_new_tokens": 4, "example_ids": ["a"], "scores": [1.0], "score": 1.0, "responses": ["x"], "wall_time": 1.0,
           "seconds": [1.0], "sessions": ["s"], "spd_same_session": True, "knob_value": 0.5,
           "schedule_label": None}
    (tmp_path / RUNS).write_text(_lines(json.dumps(run)), encoding="utf-8")
    with pytest.raises(CorruptResultsError, match="line 1: a speculative run whose config 'verifier' is"):
        ResultsDir(tmp_path).runs()
    run["config"]["verifier"]["verifier"] = "mars"
    (tmp_path / RUNS).write_text(_lines(json.dumps(run)), encoding="utf-8")
    assert len(ResultsDir(tmp_path).runs()) == 1


def test_appending_cuts_off_a_torn_line_and_ends_a_whole_one(tmp_path) -> None:
    path = tmp_path / GENERATIONS
    path.write_text(_lines(json.dumps(RECORD)) + '{"cell": "targ', encoding="utf-8")
    append_jsonl(path, RECORD)
    assert path.read_text(encoding="utf-8") == _lines(json.dumps(RECORD), json.dumps(RECORD))
    path.write_text(json.dumps(RECORD), encoding="utf-8")
    append_jsonl(path, RECORD)
    assert read_jsonl(path) == [RECORD, RECORD]


@pytest.mark.parametrize("content, problem", [("[]", "a JSON array, not a record"), ("{", "not valid JSON")])
def test_a_manifest_that_is_not_an_object_is_named(tmp_path, content, problem) -> None:
    (tmp_path / MANIFEST).write_text(content, encoding="utf-8")
    with pytest.raises(CorruptResultsError, match=f"{MANIFEST}: {problem}.*; .*new --out directory"):
        ResultsDir(tmp_path).read_manifest()


def test_report_refuses_a_corrupt_directory_in_one_line(tmp_path, capsys) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"target": "t", "draft": "d"}), encoding="utf-8")
    (tmp_path / RUNS).write_text(_lines("{}"), encoding="utf-8")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / RUNS}, line 1: a record without a valid 'cell'")
    assert err.count("\n") == 1 and "Traceback" not in err
