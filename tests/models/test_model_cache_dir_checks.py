"""A cache folder that is a file, below a file, or too long a path: `securesd models where` and `fetch`
refuse it in one line naming where it came from, exit 2, and read or fetch nothing (`where` said "not
cached" with exit 0 and suggested a fetch that then failed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hf_securesd.models import cli
from hf_securesd.models.cli import configure, run


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def no_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything is fetched."""
    def fetch(*args, **kwargs):
        raise AssertionError("fetched")

    monkeypatch.setattr(cli, "fetch", fetch)


@pytest.mark.parametrize("action", ["where", "fetch"])
@pytest.mark.parametrize("below", [False, True])
def test_a_cache_dir_that_is_a_file_is_refused(no_fetch, capsys, tmp_path: Path, action: str, below: bool) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    cache = afile / "sub" if below else afile
    assert run(parse(action, "--cache-dir", str(cache))) == 2
    captured = capsys.readouterr()
    expected = f"--cache-dir {cache}: {afile} is a file" if below else f"--cache-dir {afile} is a file"
    assert captured.err.startswith(f"error: {expected}, not a folder; give --cache-dir a folder")
    assert len(captured.err.splitlines()) == 1 and captured.out == ""


def test_a_models_dir_variable_that_is_a_file_is_named(no_fetch, capsys, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv("SECURESD_MODELS_DIR", str(afile))
    assert run(parse("where")) == 2
    assert capsys.readouterr().err.startswith(f"error: $SECURESD_MODELS_DIR {afile} is a file, not a folder")


def test_a_cache_dir_too_long_for_the_file_system_is_one_short_line(no_fetch, capsys) -> None:
    assert run(parse("where", "--cache-dir", "a" * 5000)) == 2
    err = capsys.readouterr().err
    assert "the path is too long for the file system" in err and "[5,000 characters]" in err and len(err) < 500
