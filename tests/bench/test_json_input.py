"""JSON read from outside (results files, command-line options) nested deeper than Python's JSON reader
can recurse (a few kilobytes of brackets) is refused like any other unreadable JSON: one line naming
the file or option, never a RecursionError traceback."""

from __future__ import annotations

import json

import pytest

from hf_securesd.bench.cli_bench import judge_options
from hf_securesd.bench.cli_engines import vllm_options
from hf_securesd.bench.json_input import loads
from hf_securesd.bench.plan import parse_schedule
from hf_securesd.bench.results import GENERATIONS, MANIFEST, RUNS, CorruptResultsError, ResultsDir
from hf_securesd.cli import main

DEEP = "[" * 5000 + "]" * 5000  # 10 kB; Python's reader gives up at about 1,000 levels
RECORD = {"cell": "target|t", "example_id": "t-0", "response": "ok", "seconds": 1.0, "new_tokens": 1,
          "session": "0123456789ab", "stats": None}


def test_loads_refuses_deep_nesting_as_a_json_decode_error() -> None:
    with pytest.raises(json.JSONDecodeError, match="nested too deeply to read"):
        loads(DEEP)
    with pytest.raises(json.JSONDecodeError, match="nested too deeply to read"):
        loads(DEEP.encode())
    assert loads('{"a": [[1]]}') == {"a": [[1]]}


def test_loads_refuses_what_python_cannot_convert_as_a_json_decode_error() -> None:
    too_long = "a number of about 5,000 digits, more than the 4,300"
    with pytest.raises(json.JSONDecodeError, match=too_long) as caught:
        loads('{"n": -' + "9" * 5000 + "}")  # longer than Python's int conversion takes
    assert "set_int_max_str_digits" not in str(caught.value)  # Python's advice: not the user's fix
    with pytest.raises(json.JSONDecodeError, match="can't decode"):
        loads(b'{"a": "\xff"}')


def test_a_deep_record_in_a_journal_names_the_file_and_line(tmp_path) -> None:
    deep_record = json.dumps(RECORD).replace('"stats": null', f'"stats": {DEEP}')
    (tmp_path / GENERATIONS).write_text(f"{json.dumps(RECORD)}\n{deep_record}\n", encoding="utf-8")
    with pytest.raises(CorruptResultsError, match=r"generations\.jsonl, line 2: not valid JSON \(or nested too deeply"):
        ResultsDir(tmp_path).generations()


def test_a_deep_manifest_is_named(tmp_path) -> None:
    (tmp_path / MANIFEST).write_text(f'{{"target": {DEEP}}}', encoding="utf-8")
    with pytest.raises(CorruptResultsError, match=f"{MANIFEST}: not valid JSON \\(or nested too deeply"):
        ResultsDir(tmp_path).read_manifest()


def test_report_on_a_deep_runs_journal_is_one_line(tmp_path, capsys) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"target": "t", "draft": "d"}), encoding="utf-8")
    (tmp_path / RUNS).write_text(DEEP + "\n", encoding="utf-8")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / RUNS}, line 1: not valid JSON (or nested too deeply to read)")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_deep_option_values_are_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="--judge-option prefixes: the JSON value is nested too deeply to read"):
        judge_options([f"prefixes={DEEP}"])
    with pytest.raises(ValueError, match="not valid JSON \\(nested too deeply to read"):
        parse_schedule(f'{{"schedule": {DEEP}}}')
    assert vllm_options([f"max_num_seqs={DEEP}"]) == {"max_num_seqs": DEEP}  # not JSON: passed on as text
