"""Files a results directory is written through in place (the lock, the journals) are never opened
through a symbolic link: a directory received from someone else may hold a link at such a name pointing
at any file of the user's, which taking the lock (truncate, write the pid) or appending a record (after
cutting a torn last line) would overwrite. A FIFO or a folder at such a name is refused too. Files that
are only read (runs.jsonl, study.json, card.json) are not read through a link either."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hf_securesd.bench.results import FAILURES, GENERATIONS, LOCK, RUNS, ResultsDir, UnsafeResultsFileError, append_jsonl

SECRET = "hf_SECRETTOKEN-must-survive"  # a one-line file without a newline: what a torn record looks like


def victim(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "token"
    path.write_text(SECRET)
    return path


def test_a_link_at_the_lock_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    results_path, target = tmp_path / "results", victim(tmp_path)
    results_path.mkdir()
    (results_path / LOCK).symlink_to(target)
    with pytest.raises(UnsafeResultsFileError, match=r"\.lock is a symbolic link: .*never through a link; remove it"):
        ResultsDir(results_path).lock()
    assert target.read_text() == SECRET


@pytest.mark.parametrize("name", [GENERATIONS, FAILURES, RUNS])
def test_a_link_at_a_journal_is_refused_and_its_target_kept(tmp_path: Path, name: str) -> None:
    results_path, target = tmp_path / "results", victim(tmp_path)
    results_path.mkdir()
    (results_path / name).symlink_to(target)
    with pytest.raises(UnsafeResultsFileError, match=rf"{name} is a symbolic link"):
        append_jsonl(results_path / name, {"cell": "c", "id": 1})
    assert target.read_text() == SECRET


def test_a_dangling_link_is_refused_without_creating_its_target(tmp_path: Path) -> None:
    results_path = tmp_path / "results"
    results_path.mkdir()
    (results_path / GENERATIONS).symlink_to(tmp_path / "created-elsewhere")
    with pytest.raises(UnsafeResultsFileError, match="symbolic link"):
        append_jsonl(results_path / GENERATIONS, {"id": 1})
    assert not (tmp_path / "created-elsewhere").exists()


@pytest.mark.parametrize("name", [LOCK, GENERATIONS])
def test_a_hard_link_at_the_name_is_refused_and_its_target_kept(tmp_path: Path, name: str) -> None:
    results_path, target = tmp_path / "results", victim(tmp_path)
    results_path.mkdir()
    os.link(target, results_path / name)
    with pytest.raises(UnsafeResultsFileError, match=rf"{name} shares its contents with 1 other name\(s\) \(a hard "
                       r"link.*keeping them: cp -p .* && mv ") as caught:
        if name == LOCK:
            ResultsDir(results_path).lock()
        else:
            append_jsonl(results_path / name, {"id": 1})
    assert target.read_text() == SECRET
    # the fix the message gives keeps the contents and breaks the link; the file is then written in place
    fix = str(caught.value).split("keeping them: ")[1]
    subprocess.run(fix, shell=True, check=True)
    assert (results_path / name).read_text() == SECRET and os.stat(results_path / name).st_nlink == 1


def test_a_fifo_or_a_folder_at_the_name_is_refused_without_blocking(tmp_path: Path) -> None:
    results_path = tmp_path / "results"
    results_path.mkdir()
    os.mkfifo(results_path / LOCK)
    with pytest.raises(UnsafeResultsFileError, match=r"\.lock is not a regular file"):
        ResultsDir(results_path).lock()
    os.mkfifo(results_path / FAILURES)
    with pytest.raises(UnsafeResultsFileError, match="failures.jsonl is not a regular file"):
        append_jsonl(results_path / FAILURES, {"id": 1})
    (results_path / GENERATIONS).mkdir()
    with pytest.raises(UnsafeResultsFileError, match="generations.jsonl is not a regular file"):
        append_jsonl(results_path / GENERATIONS, {"id": 1})


def test_plain_files_are_still_appended_and_locked(tmp_path: Path) -> None:
    results = ResultsDir(tmp_path)
    results.lock()
    try:
        assert (tmp_path / LOCK).read_text() == f"{os.getpid()}\n"
        append_jsonl(tmp_path / GENERATIONS, {"id": 1})
        (tmp_path / GENERATIONS).write_bytes((tmp_path / GENERATIONS).read_bytes() + b'{"id": 2')  # torn
        append_jsonl(tmp_path / GENERATIONS, {"id": 3})
        assert (tmp_path / GENERATIONS).read_text() == '{"id": 1}\n{"id": 3}\n'
    finally:
        results.close()


@pytest.mark.parametrize("name", [RUNS, "study.json", "card.json"])
def test_report_reads_no_results_file_through_a_link(tmp_path: Path, data_dir: Path, capsys, name: str) -> None:
    # A results directory from someone else may hold a link at runs.jsonl, study.json or card.json to
    # any file of the reader's (another study's records, a private card), which the report and card
    # showed; the link is refused, nothing is written, and a hard link (a `cp -al` backup) is still read.
    from support import jailbreak_study

    from hf_securesd.bench.plan import DRAFT, TARGET
    from hf_securesd.cli import main

    results = jailbreak_study(tmp_path / "results", data_dir,
                              [(TARGET, ["I cannot.", "Sure"]), (DRAFT, ["Sure", "Sure"])]).path
    (results / "card.json").write_text('{"output": "card.md", "title": "Card"}', encoding="utf-8")
    private = tmp_path / "private"
    private.mkdir()
    os.replace(results / name, private / name)
    (results / name).symlink_to(private / name)
    assert main(["report", str(results)]) == 2
    error = capsys.readouterr().err
    assert f"{name} is a symbolic link" in error and error.count("\n") == 1
    assert not (results / "card.md").exists()
    assert name == "card.json" or not (results / "report").exists()  # (the card is read after the report)
    (results / name).unlink()
    os.link(private / name, results / name)
    assert main(["report", str(results)]) == 0
