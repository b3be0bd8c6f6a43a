"""Paths `securesd calibrate` is given, refused with one line (exit 2) before any model is loaded: an --out,
an --out below, or a --data-dir that is a symbolic link leading nowhere (a loop of links, ELOOP, used to
escape as a traceback; a dangling --out failed only after loading, "File exists"), and an --out whose
calibration.json or calibration.md calibrate could not or should not replace (a folder there; the user's
own files in a folder that is no results directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import SMOKE_CLI, cli_refusal

from hf_securesd.bench import cli_bench
from hf_securesd.paths import path_kind


def links(tmp_path: Path) -> dict[str, Path]:
    """A loop of two links and a dangling link in `tmp_path`."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    return {"loop": tmp_path / "loop1", "dangling": tmp_path / "dangling"}


def test_path_kind_calls_a_loop_of_links_missing(tmp_path) -> None:
    assert path_kind(links(tmp_path)["loop"]) == "missing"
    assert path_kind(tmp_path / "loop1" / "below") == "missing"


@pytest.mark.parametrize("below", [False, True], ids=["the-link", "below-the-link"])
@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_an_out_that_is_a_broken_link_is_refused_before_loading(capsys, tmp_path, data_dir, no_loading,
                                                                  kind, below) -> None:
    link = links(tmp_path)[kind]
    out = link / "sub" if below else link
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--L", "1", "--data-dir", str(data_dir), "--out", str(out)])
    assert error.startswith(f"error: --out {out} ") and "symbolic link that leads nowhere" in error
    assert f"rm {link}" in error


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_check_out_dir_refuses_a_broken_link_for_bench_too(tmp_path, kind) -> None:
    with pytest.raises(ValueError, match="symbolic link that leads nowhere"):
        cli_bench.check_out_dir(links(tmp_path)[kind])


def test_a_data_dir_that_is_a_loop_of_links_is_refused_before_loading(capsys, tmp_path, no_loading) -> None:
    loop = links(tmp_path)["loop"]
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--L", "1", "--data-dir", str(loop),
                                 "--out", str(tmp_path / "out")])
    assert error.startswith(f"error: benchmark data directory {loop} (from --data-dir)")


@pytest.mark.parametrize("name", ["calibration.json", "calibration.md"])
def test_a_folder_where_a_calibration_file_belongs_is_refused_before_loading(capsys, tmp_path, data_dir,
                                                                              no_loading, name) -> None:
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--L", "1", "--data-dir", str(data_dir), "--out", str(out)])
    assert f"{out / name} is a folder, where calibrate writes its recommendation" in error


def test_the_users_own_calibration_file_is_not_replaced(capsys, tmp_path, data_dir, no_loading) -> None:
    """A folder that is no results directory (no study.json) holding a calibration.md: the user's own."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "calibration.md").write_text("my notes")
    error = cli_refusal(capsys, ["calibrate", *SMOKE_CLI, "--L", "1", "--data-dir", str(data_dir), "--out", str(out)])
    assert f"--out {out} holds calibration.md but is no results directory (no study.json)" in error
    assert (out / "calibration.md").read_text() == "my notes"
