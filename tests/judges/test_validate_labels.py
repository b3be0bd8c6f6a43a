"""`securesd judge-validate` reads the label columns of classifier_comparison.csv strictly: 1/0, or the same
numbers written 1.0/0.0 (a pandas round-trip), count as the same labels; any other value is a one-line
error (exit code 2) naming the file, the row, the column and the allowed values, never a silent "0"."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from hf_securesd.cli import main
from hf_securesd.judges.validate import COMPARISON_FILE, REFERENCE_JUDGES, load_comparison

LABEL_COLUMNS = ("human_majority", *REFERENCE_JUDGES)


def _rewritten(data_dir: Path, root: Path, change) -> Path:
    """The real comparison file under `root`, each row (a {column: value} dict) passed through `change`."""
    with (data_dir / COMPARISON_FILE).open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header, rows = reader.fieldnames, list(reader)
    out = io.StringIO()
    writer = csv.DictWriter(out, header, lineterminator="\n")
    writer.writeheader()
    for number, row in enumerate(rows, start=1):
        writer.writerow(change(number, dict(row)))
    path = root / COMPARISON_FILE
    path.parent.mkdir(parents=True)
    path.write_text(out.getvalue(), encoding="utf-8")
    return path


def _as_floats(columns):
    def change(number, row):
        return {**row, **{column: f"{float(row[column]):.1f}" for column in columns}}
    return change


@pytest.mark.parametrize("columns", [("human_majority",), LABEL_COLUMNS], ids=["human_majority", "all labels"])
def test_labels_written_as_floats_give_the_same_figures(tmp_path, data_dir, capsys, columns) -> None:
    assert main(["judge-validate", "--data-dir", str(data_dir)]) == 0
    original = capsys.readouterr().out
    _rewritten(data_dir, tmp_path, _as_floats(columns))
    assert main(["judge-validate", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == original
    assert " 0.000     nan" not in original  # the figures are not the all-negative ones


def test_load_comparison_writes_float_labels_as_1_and_0(tmp_path, data_dir) -> None:
    _rewritten(data_dir, tmp_path, _as_floats(LABEL_COLUMNS))
    assert [[row[c] for c in LABEL_COLUMNS] for row in load_comparison(str(tmp_path))] == \
        [[row[c] for c in LABEL_COLUMNS] for row in load_comparison(str(data_dir))]
    assert {row["human_majority"] for row in load_comparison(str(tmp_path))} == {"0", "1"}


@pytest.mark.parametrize("column", ["human_majority", "gpt_4", "GCG"])
@pytest.mark.parametrize("value", ["true", "2", "", "1.5", " 1", "yes"])
def test_any_other_label_is_a_one_line_error(tmp_path, data_dir, capsys, column, value) -> None:
    path = _rewritten(data_dir, tmp_path, lambda number, row: {**row, column: value} if number == 3 else row)
    assert main(["judge-validate", "--data-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err and captured.err.count("\n") == 1
    assert captured.err.startswith(f"judge-validate: benchmark file {path} could not be read: row 3 (line ")
    assert (f"column {column!r} holds {value!r}, not a label: the allowed values are 1 (jailbroken) and 0 (not), "
            "also written 1.0 and 0.0") in captured.err


def test_a_long_bad_value_is_shortened(tmp_path, data_dir, capsys) -> None:
    """A shifted column puts a response's text where a label belongs: shown cut, not whole."""
    _rewritten(data_dir, tmp_path, lambda number, row: {**row, "human_majority": "x" * 500} if number == 1 else row)
    assert main(["judge-validate", "--data-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"holds {'x' * 40!r}..., not a label" in error and "x" * 41 not in error


def test_load_comparison_refuses_a_bad_label(tmp_path, data_dir) -> None:
    _rewritten(data_dir, tmp_path, lambda number, row: {**row, "llama_guard": "unsafe"} if number == 7 else row)
    with pytest.raises(ValueError, match=r"row 7 \(line \d+\): column 'llama_guard' holds 'unsafe'"):
        load_comparison(str(tmp_path))
