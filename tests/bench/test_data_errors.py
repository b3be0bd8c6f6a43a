"""Damaged local benchmark files: every task loader reports the file, the line (or CSV row), the problem
and the fix as a `BenchmarkDataError` (a ValueError: one line and exit code 2 from the commands), never a
traceback. Copies of the shared data are damaged under tmp_path; the shared data is only read."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from support import record_cells

from hf_securesd.bench.data import DATA_FIX, BenchmarkDataError, read_jsonl, read_lines
from hf_securesd.bench.plan import TARGET
from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.runner import TaskRun
from hf_securesd.bench.tasks import get_task, jailbreak, prompt_injection
from hf_securesd.cli import main

GSM8K = "gsm8k/test.jsonl"
GOOD_PROBLEM = {"question": "What is 1 + 2?", "answer": "1 + 2 = 3\n#### 3"}


def _write_gsm8k(root: Path, lines: list[str]) -> Path:
    """A gsm8k/test.jsonl under `root` holding `lines`; its path."""
    path = root / GSM8K
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _load_error(load: Callable[[Path], object], root: Path) -> str:
    """The message of the BenchmarkDataError that `load(root)` raises."""
    with pytest.raises(BenchmarkDataError) as caught:
        load(root)
    return str(caught.value)


def _gsm8k(root: Path) -> object:
    return get_task("gsm8k").examples(data_dir=root)


@pytest.mark.parametrize(("second_line", "where", "problem"), [
    ('["a"]', "line 2", "a JSON array, not an object"),
    ('{"question": "q"}', "line 2", "missing field 'answer'"),
    ('{"question": "q", "answer": 3}', "line 2", "field 'answer' is a JSON number, not a string"),
    ('{bad json', "line 2 column 2", "not valid JSON (Expecting property name enclosed in double quotes)"),
    ("[" * 5000 + "]" * 5000, "line 2 column 1", "not valid JSON (nested too deeply to read)"),
    ('{"question": "q", "answer": "no number here"}', "line 2",
     "GSM8K reference solution without a final number: 'no number here'"),
])
def test_gsm8k_rows_name_the_file_the_line_and_the_problem(tmp_path, second_line, where, problem) -> None:
    path = _write_gsm8k(tmp_path, [json.dumps(GOOD_PROBLEM), second_line])
    message = _load_error(_gsm8k, tmp_path)
    assert message == f"benchmark file {path} could not be read: {where}: {problem}; {DATA_FIX}"
    assert "docs/benchmarks.md" in message and "--data-dir" in message


def test_json_lines_count_the_blank_lines_of_the_file(tmp_path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": "1"}\n\n   \n{"a": \n', encoding="utf-8")
    with pytest.raises(BenchmarkDataError, match=r": line 4 column 7: not valid JSON"):
        read_jsonl(path, ("a",))


def test_humaneval_rows_need_every_field(tmp_path, data_dir) -> None:
    with gzip.open(data_dir / "humaneval/HumanEval.jsonl.gz", "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle][:3]
    del rows[2]["test"]
    path = tmp_path / "humaneval/HumanEval.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    message = _load_error(lambda root: get_task("humaneval").examples(data_dir=root), tmp_path)
    assert f"benchmark file {path} could not be read: line 3: missing field 'test'; {DATA_FIX}" == message


def _copy(data_dir: Path, root: Path, relative: str) -> Path:
    """A copy of the shared file `relative` under `root`; its path."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_dir / relative, path)
    return path


CSV_SOURCES = [  # (loader of a data directory, file, a column the loader needs)
    (jailbreak.SOURCES["advbench"], "advbench/harmful_behaviors.csv", "goal"),
    (jailbreak.SOURCES["jailbreakbench"], "jailbreakbench/behaviors.csv", "Goal"),
    (jailbreak.SOURCES["harmbench"], "harmbench/harmbench_behaviors_text_all.csv", "FunctionalCategory"),
    (prompt_injection.INJECTION_TASKS["duplicate_sentence_detection"].read,
     "open_prompt_injection/raw/mrpc/msr_paraphrase_test.txt", "Quality"),
    (prompt_injection.INJECTION_TASKS["natural_language_inference"].read,
     "open_prompt_injection/raw/rte/train.tsv", "label"),
    (prompt_injection.INJECTION_TASKS["hate_detection"].read,
     "open_prompt_injection/raw/hsol/labeled_data.csv", "class"),
]


@pytest.mark.parametrize(("load", "relative", "column"), CSV_SOURCES)
def test_a_header_without_a_needed_column_is_named(tmp_path, data_dir, load, relative, column) -> None:
    path = _copy(data_dir, tmp_path, relative)
    header, rest = path.read_text(encoding="utf-8-sig").split("\n", 1)
    path.write_text(header.replace(column, "renamed", 1) + "\n" + rest, encoding="utf-8")
    message = _load_error(load, tmp_path)
    assert message.startswith(f"benchmark file {path} could not be read: line 1 (header): no column {column!r} "
                              "(its columns: ")
    assert "'renamed'" in message and message.endswith(DATA_FIX)


@pytest.mark.parametrize(("load", "relative", "column"), [
    (jailbreak.SOURCES["jailbreakbench"], "jailbreakbench/behaviors.csv", "Goal"),
    (prompt_injection.INJECTION_TASKS["duplicate_sentence_detection"].read,
     "open_prompt_injection/raw/mrpc/msr_paraphrase_test.txt", "#1 ID"),
    (prompt_injection.INJECTION_TASKS["natural_language_inference"].read,
     "open_prompt_injection/raw/rte/train.tsv", "sentence2"),
    (prompt_injection.INJECTION_TASKS["hate_detection"].read,
     "open_prompt_injection/raw/hsol/labeled_data.csv", "count"),
])
def test_a_row_cut_short_names_its_row_line_and_missing_column(tmp_path, data_dir, load, relative, column) -> None:
    """Three good rows, then the fourth cut after its first column (as a truncated copy ends)."""
    path = _copy(data_dir, tmp_path, relative)
    lines = path.read_text(encoding="utf-8-sig").splitlines()[:5]
    delimiter = "\t" if "\t" in lines[0] else ","
    path.write_text("\n".join(lines[:4] + [lines[4].split(delimiter)[0]]) + "\n", encoding="utf-8")
    message = _load_error(load, tmp_path)
    columns = len(lines[0].split(delimiter))
    assert message == (f"benchmark file {path} could not be read: row 4 (line 5): the row is cut short: 1 of the "
                       f"header's {columns} columns, no value for column {column!r}; {DATA_FIX}")


def test_a_label_that_is_not_a_number_is_named(tmp_path, data_dir) -> None:
    path = _copy(data_dir, tmp_path, "open_prompt_injection/raw/rte/train.tsv")
    header, first, rest = path.read_text(encoding="utf-8").split("\n", 2)
    values = first.split("\t")
    values[2] = "yes"
    path.write_text("\n".join([header, first, "\t".join(values), rest]), encoding="utf-8")
    message = _load_error(prompt_injection.INJECTION_TASKS["natural_language_inference"].read, tmp_path)
    assert f"{path} could not be read: row 2 (line 3): field 'label' is 'yes', not an integer; " in message


def test_an_sms_line_without_a_label_is_named(tmp_path) -> None:
    path = tmp_path / "open_prompt_injection/raw/sms_spam/SMSSpamCollection"
    path.parent.mkdir(parents=True)
    path.write_text("ham\tHello\n\nFree entry, no label\n", encoding="utf-8")
    message = _load_error(prompt_injection.INJECTION_TASKS["spam_detection"].read, tmp_path)
    assert f"{path} could not be read: line 3: expected \"ham\" or \"spam\", a tab and the message, " \
           "not 'Free entry, no label'; " in message


def test_lines_skip_blank_ones(tmp_path) -> None:
    path = tmp_path / "dev.src"
    path.write_text("one\r\n\n  \ntwo\n", encoding="utf-8")
    assert read_lines(path) == ["one", "two"]


def test_bench_reports_a_damaged_row_in_one_line_with_exit_code_2(tmp_path, capsys) -> None:
    path = _write_gsm8k(tmp_path / "data", [json.dumps(GOOD_PROBLEM), '["a"]'])
    argv = ["bench", "--target", "tiny", "--draft", "tiny", "--no-progress", "--no-report", "--max-new-tokens", "4",
            "--verifiers", "lossysd", "--tasks", "gsm8k", "--limit", "1", "--data-dir", str(tmp_path / "data"),
            "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"error: benchmark file {path} could not be read: line 2: a JSON array, not an object; " in error
    assert "Traceback" not in error


def test_rescore_names_the_file_and_line_of_a_gold_answer_without_a_number(tmp_path, data_dir, capsys) -> None:
    path = _copy(data_dir, tmp_path / "data", GSM8K)
    task = get_task("gsm8k")
    examples = task.examples(data_dir=path.parents[1], limit=2)
    store = ResultsDir(tmp_path / "results")
    store.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s", "threads": 1})
    record_cells(store, TaskRun(task, examples, ["#### 1"] * 2, 16), [(TARGET, ["#### 1"] * 2)])
    store.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[6] = json.dumps({"question": "q", "answer": "no number here"})
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["rescore", str(tmp_path / "results"), "--tasks", "gsm8k", "--data-dir", str(path.parents[1])]) == 2
    error = capsys.readouterr().err
    assert f"benchmark file {path} could not be read: line 7: GSM8K reference solution without a final " \
           "number: 'no number here'; point --data-dir" in error


def test_wildjailbreak_needs_its_data_type_column(tmp_path) -> None:
    path = tmp_path / jailbreak.WILDJAILBREAK_PATHS[0]
    path.parent.mkdir(parents=True)
    path.write_text("adversarial\tlabel\nsome request\t1\n", encoding="utf-8")
    message = _load_error(jailbreak.SOURCES["wildjailbreak"], tmp_path)
    assert f"{path} could not be read: line 1 (header): no column 'data_type' (its columns: 'adversarial', " \
           "'label'); " in message
