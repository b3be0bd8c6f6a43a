"""`paths.path_kind`: what a path given on the command line names, read with `os.stat` (so a path too
long for the file system is named as such on every Python release)."""

from __future__ import annotations

import pytest

from hf_securesd.paths import path_kind


@pytest.mark.parametrize("name, kind", [("folder", "folder"), ("file", "file"), ("missing", "missing"),
                                        ("a" * 5000, "too long"), ("file/below", "missing")],
                         ids=["folder", "file", "missing", "too-long", "below-a-file"])
def test_path_kind_names_what_a_path_is(tmp_path, name, kind) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    assert path_kind(tmp_path / name) == kind
