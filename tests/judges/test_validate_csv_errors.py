"""`securesd judge-validate` on a damaged or wrong classifier_comparison.csv: one line naming the file,
the row or header, the problem and the fix, exit code 2, no traceback (copies under tmp_path)."""

from __future__ import annotations

from pathlib import Path

from hf_securesd.cli import main
from hf_securesd.judges.validate import COMPARISON_FILE, COMPARISON_FIX


def _comparison(root: Path, content: bytes) -> Path:
    """`content` as the comparison file under `root`; its path."""
    path = root / COMPARISON_FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    return path


def _validate_error(root: Path, capsys) -> str:
    """judge-validate's stderr for the data folder `root`, after checking it exits with 2 and no traceback."""
    assert main(["judge-validate", "--data-dir", str(root)]) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and error.count("\n") == 1
    return error


def test_a_file_cut_mid_row_names_the_row_and_the_missing_column(tmp_path, data_dir, capsys) -> None:
    path = _comparison(tmp_path, (data_dir / COMPARISON_FILE).read_bytes()[:300])
    error = _validate_error(tmp_path, capsys)
    assert error == (f"judge-validate: benchmark file {path} could not be read: row 1 (line 2): the row is cut "
                     f"short: 3 of the header's 14 columns, no value for column 'target_response'; {COMPARISON_FIX}\n")


def test_a_file_without_the_columns_names_the_column(tmp_path, capsys) -> None:
    path = _comparison(tmp_path, b"a,b\n1,2\n")
    error = _validate_error(tmp_path, capsys)
    assert error == (f"judge-validate: benchmark file {path} could not be read: line 1 (header): no column "
                     f"'goal' (its columns: 'a', 'b'); {COMPARISON_FIX}\n")


def test_an_empty_file_says_it_has_no_header(tmp_path, capsys) -> None:
    _comparison(tmp_path, b"")
    assert "line 1 (header): no column 'goal' (its columns: none: the file is empty)" in _validate_error(tmp_path,
                                                                                                        capsys)


def test_a_later_row_cut_short_is_found_by_its_line(tmp_path, data_dir, capsys) -> None:
    """A row of the real file spans several lines (quoted newlines): the line is where it starts."""
    text = (data_dir / COMPARISON_FILE).read_text(encoding="utf-8")
    cut = text.index("\n1,") + 1  # the second data row starts here
    _comparison(tmp_path, (text[:cut] + "1,only a goal\n").encode())
    line = text[:cut].count("\n") + 1
    assert f"row 2 (line {line}): the row is cut short: 2 of the header's 14 columns, no value for column " \
           "'prompt'" in _validate_error(tmp_path, capsys)


def test_a_row_without_its_last_reference_label_is_refused(tmp_path, data_dir, capsys) -> None:
    """A row that ends before its last column (a reference judge's label) would count that judge as 'not
    jailbroken': refused like any other cut row."""
    header, first, rest = (data_dir / COMPARISON_FILE).read_text(encoding="utf-8").split("\n", 2)
    _comparison(tmp_path, f"{header}\n{first.rsplit(',', 1)[0]}\n".encode())
    assert "row 1 (line 2): the row is cut short: 13 of the header's 14 columns, no value for column 'gpt_4'" \
        in _validate_error(tmp_path, capsys)
