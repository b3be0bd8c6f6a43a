"""`report` writes report.md, summary.json, the two figures and the card together: a file that cannot be
written (a full disk, a read-only file system) left report.md new beside the old summary.json and figures;
now every file stays as it was."""

from __future__ import annotations

import json
import os

import pytest
from test_report_unfinished import results_with_a_failed_prompt

from hf_securesd.bench.report import write_report

FILES = ("report.md", "summary.json", "prr_vs_ar.png", "position_tv.png")


def full_disk_for(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make creating the partial of file `name` (``.<name>.<random>``, `partials.write_files`) fail as a full
    disk does, until `monkeypatch.undo()`."""
    real_open = os.open

    def full_disk(path, flags, *args, **kwargs):
        if str(path).startswith(f".{name}.") and flags & os.O_CREAT:
            raise OSError(28, "No space left on device", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_disk)


def test_a_file_that_cannot_be_written_leaves_the_earlier_report_whole(tmp_path, data_dir, monkeypatch):
    results = results_with_a_failed_prompt(tmp_path, data_dir)
    (tmp_path / "card.json").write_text(json.dumps({"output": "card.md", "title": "T"}))
    write_report(results.path)
    folder = tmp_path / "report"
    before = {name: (folder / name).read_bytes() for name in FILES} | {"card.md": (tmp_path / "card.md").read_bytes()}
    (folder / "report.md").write_text("an earlier report\n")
    before["report.md"] = b"an earlier report\n"
    full_disk_for(monkeypatch, "summary.json")
    with pytest.raises(OSError) as caught:
        write_report(results.path)
    monkeypatch.undo()
    assert caught.value.filename == str(folder / "summary.json")
    after = {name: (folder / name).read_bytes() for name in FILES} | {"card.md": (tmp_path / "card.md").read_bytes()}
    assert after == before
    assert sorted(path.name for path in folder.iterdir()) == sorted(FILES)  # no partial left behind
    write_report(results.path)
    assert (folder / "report.md").read_text() != "an earlier report\n"


def test_bench_says_in_one_line_that_its_report_could_not_be_written(tmp_path, data_dir, capsys, monkeypatch):
    """The report at the end of `bench` failing to write was a traceback after the whole study."""
    from hf_securesd.cli import main

    full_disk_for(monkeypatch, "report.md")
    out = tmp_path / "out"
    argv = ["bench", "--profile", "smoke", "--tasks", "jailbreak", "--limit", "1", "--max-new-tokens", "2",
            "--verifiers", "mars:0.5", "--schedules", "none", "--data-dir", str(data_dir), "--out", str(out),
            "--no-progress"]
    assert main(argv) == 2
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]  # after the study's own progress lines
    written = out / "report" / "report.md"
    assert last.startswith(f"error: the report could not be written (No space left on device: {written})")
    assert f"then run `securesd report {out}`" in last and not (out / "report" / "report.md").exists()
    assert main(["report", str(out)]) == 0 and (out / "report" / "report.md").is_file()
