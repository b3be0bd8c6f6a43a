"""Hostile chunk wheels and GGUF headers end in a clear `AssemblyError` of their step, with nothing
written and memory and time bounded: never a raw zip, csv, zlib or struct error, a hang or a
recursion error. Synthetic files only."""

from __future__ import annotations

import errno
import hashlib
import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from test_model_resolution import gguf_file, make_spec, record_hash  # noqa: F401

from hf_securesd.models import gguf_header, pypi_assembly
from hf_securesd.models.gguf_header import GGUFFormatError, read_gguf_header
from hf_securesd.models.pypi_assembly import AssemblyError
from hf_securesd.models.registry import ChunkWheel

CHUNK = ChunkWheel("tiny-model-part1", "1.0.0", "tiny_model_part1/data/part01.bin")
RECORD = "tiny_model_part1-1.0.0.dist-info/RECORD"
DATA = b"hello world chunk " * 50
RIGHT_ROW = f"{CHUNK.member},{record_hash(DATA)},{len(DATA)}\n"


class NullProgress:
    def update(self, count: int) -> None:
        pass


def append(wheel: Path, budget: int = 1 << 30) -> tuple[bytes, AssemblyError]:
    """What a refused `append_chunk` wrote, and its error."""
    out = io.BytesIO()
    with pytest.raises(AssemblyError) as caught:
        pypi_assembly.append_chunk(wheel, CHUNK, out, hashlib.sha256(), NullProgress(), budget)
    assert caught.value.step == "chunk check"
    return out.getvalue(), caught.value


def wheel_with(path: Path, *, record: str | None = None,
               member_compression: int = zipfile.ZIP_STORED) -> Path:
    """A wheel holding `DATA` as the chunk member and `record` (default: the right row) as RECORD."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(CHUNK.member, DATA, compress_type=member_compression)
        archive.writestr(RECORD, RIGHT_ROW if record is None else record)
    return path


def patched(wheel: Path, edit) -> Path:
    """`wheel` with its bytes changed by `edit(bytearray, member_header_offset, central_offset)`."""
    data = bytearray(wheel.read_bytes())
    edit(data, 0, data.find(b"PK\x01\x02"))
    wheel.write_bytes(bytes(data))
    return wheel


# ---- chunk wheels ------------------------------------------------------------------------------


def test_a_well_formed_wheel_is_appended(tmp_path: Path) -> None:
    out = io.BytesIO()
    size = pypi_assembly.append_chunk(wheel_with(tmp_path / "a.whl"), CHUNK, out, hashlib.sha256(),
                                      NullProgress(), 1 << 30)
    assert size == len(DATA) and out.getvalue() == DATA


def test_a_record_field_over_the_csv_limit(tmp_path: Path) -> None:
    record = "x" * 200_000 + "\n" + RIGHT_ROW
    written, error = append(wheel_with(tmp_path / "a.whl", record=record))
    assert written == b"" and "field limit" in str(error)


def test_an_encrypted_member_is_refused_before_it_is_read(tmp_path: Path) -> None:
    def encrypt(data: bytearray, local: int, central: int) -> None:
        data[local + 6] |= 1
        data[central + 8] |= 1

    written, error = append(patched(wheel_with(tmp_path / "a.whl"), encrypt))
    assert written == b"" and "is encrypted" in str(error)


@pytest.mark.parametrize("method", [zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA, 99])
def test_compression_other_than_stored_or_deflated_is_refused(tmp_path: Path, method: int) -> None:
    if method == 99:
        def method_99(data: bytearray, local: int, central: int) -> None:
            struct.pack_into("<H", data, local + 8, 99)
            struct.pack_into("<H", data, central + 10, 99)

        wheel = patched(wheel_with(tmp_path / "a.whl"), method_99)
    else:
        wheel = wheel_with(tmp_path / "a.whl", member_compression=method)
    written, error = append(wheel)
    assert written == b"" and f"compression method {method}" in str(error)


def test_a_corrupt_deflate_stream(tmp_path: Path) -> None:
    wheel = wheel_with(tmp_path / "a.whl", member_compression=zipfile.ZIP_DEFLATED)

    def corrupt(data: bytearray, local: int, central: int) -> None:
        start = local + 30 + len(CHUNK.member)
        data[start:start + 12] = b"\xff" * 12

    written, error = append(patched(wheel, corrupt))
    assert written == b"" and "decompressing" in str(error)


def test_a_write_error_is_not_reported_as_a_damaged_wheel(tmp_path: Path) -> None:
    class FullDisk(io.BytesIO):
        def write(self, block: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        pypi_assembly.append_chunk(wheel_with(tmp_path / "a.whl"), CHUNK, FullDisk(), hashlib.sha256(),
                                   NullProgress(), 1 << 30)


def test_a_record_over_its_cap_is_refused_before_it_is_read(tmp_path: Path, monkeypatch) -> None:
    rows = "a,b,c\n" * ((pypi_assembly.RECORD_MAX_BYTES // 6) + 1) + RIGHT_ROW
    wheel = tmp_path / "a.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(CHUNK.member, DATA)
        archive.writestr(RECORD, rows)
    assert wheel.stat().st_size < 100_000  # compressed small, declared over 4 MiB
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda *args, **kwargs: pytest.fail("RECORD was opened"))
    written, error = append(wheel)
    assert written == b"" and f"more than the {pypi_assembly.RECORD_MAX_BYTES}" in str(error)


def test_a_wheel_larger_than_the_model_is_refused_before_it_is_opened(tmp_path: Path, monkeypatch) -> None:
    wheel = tmp_path / "big.whl"
    wheel.write_bytes(b"\0" * (pypi_assembly.WHEEL_OVERHEAD + 1025))
    monkeypatch.setattr(pypi_assembly.zipfile, "ZipFile", lambda *args: pytest.fail("the wheel was opened"))
    written, error = append(wheel, budget=1024)
    assert written == b"" and "more than the 1024 bytes left of the pinned model size" in str(error)


# ---- GGUF headers ------------------------------------------------------------------------------

U8, U32, STRING, ARRAY = 0, 4, 8, 9


def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def entry(key: str | bytes, value_type: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", value_type) + payload


def tensor(name: str, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return (gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", ggml_type, offset))


def preamble(tensor_count: int, entry_count: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensor_count, entry_count)


def gguf(entries: list[bytes], tensors: list[bytes], data: bytes = b"") -> bytes:
    head = preamble(len(tensors), len(entries)) + b"".join(entries) + b"".join(tensors)
    return head + b"\0" * (-len(head) % 32) + data


ONE_TENSOR = [tensor("t", [8])]  # f32, 8 values: 32 bytes of data
HOSTILE = {
    "short header": b"GGUF\x03\0\0\0\0\0",
    "repeated key": gguf([entry("a", U32, b"\1\0\0\0"), entry("a", U32, b"\2\0\0\0")], ONE_TENSOR,
                         b"\0" * 32),
    "arrays nested 3000 deep": gguf([entry("a", ARRAY, struct.pack("<IQ", ARRAY, 1) * 3000
                                           + struct.pack("<IQ", U8, 0))], ONE_TENSOR, b"\0" * 32),
    "2**40 items at the end": preamble(1, 1) + entry("a", ARRAY, struct.pack("<IQ", U8, 2**40)),
    "strings past the end": preamble(1, 1) + entry("a", ARRAY, struct.pack("<IQ", STRING, 2**20)),
    "too many array items": gguf([entry("a", ARRAY, struct.pack("<IQ", U8, gguf_header.MAX_ARRAY_ITEMS + 1)
                                        + b"\0" * (gguf_header.MAX_ARRAY_ITEMS + 1))],
                                 ONE_TENSOR, b"\0" * 32),
    "2**63 entries": preamble(1, 2**63),
    "key of 2**63 bytes": preamble(1, 1) + struct.pack("<Q", 2**63) + b"abc" * 8,
    "unknown value type": gguf([entry("a", 77, b"")], ONE_TENSOR, b"\0" * 32),
    "key not UTF-8": gguf([entry(b"\xff\xfe", U32, b"\1\0\0\0")], ONE_TENSOR, b"\0" * 32),
    "alignment 3": gguf([entry("general.alignment", U32, struct.pack("<I", 3))], ONE_TENSOR, b"\0" * 32),
    "repeated tensor": gguf([], [tensor("t", [8]), tensor("t", [8], offset=32)], b"\0" * 64),
    "unknown ggml type": gguf([], [tensor("t", [8], ggml_type=250)], b"\0" * 32),
    "five dimensions": gguf([], [tensor("t", [1, 1, 1, 1, 8])], b"\0" * 32),
    "tensor data past the end": gguf([], [tensor("t", [8], offset=2**62)], b"\0" * 32),
    "dimensions overflowing": gguf([], [tensor("t", [2**40, 2**40])], b"\0" * 32),
}


def test_a_well_formed_header_passes(tmp_path: Path) -> None:
    path = tmp_path / "one.gguf"
    path.write_bytes(gguf([entry("a", U32, b"\1\0\0\0"), entry("s", ARRAY, struct.pack("<IQ", STRING, 2)
                                                           + gstr("x") + gstr(""))], ONE_TENSOR, b"\0" * 32))
    pypi_assembly.check_gguf_layout(path, make_spec(path.read_bytes(), 1))


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_header_is_a_gguf_check_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE[name])
    with pytest.raises(AssemblyError) as error:
        pypi_assembly.check_gguf_layout(path, make_spec(HOSTILE[name], 1))
    assert error.value.step == "GGUF check"


def test_the_reader_agrees_with_gguf_on_a_real_file(gguf_file, tmp_path: Path) -> None:
    from gguf import GGUFReader

    data, count = gguf_file
    path = tmp_path / "tiny.gguf"
    path.write_bytes(data)
    header, reader = read_gguf_header(path), GGUFReader(path)
    assert header.tensor_count == count == len(reader.tensors)
    assert (header.data_start, header.alignment) == (reader.data_offset, reader.alignment)
    assert header.data_end == max(t.data_offset + t.n_bytes for t in reader.tensors)
    assert header.scalars["tokenizer.ggml.eos_token_id"] == (U32, 258)


def test_the_eos_token_is_read_with_the_bounded_reader(gguf_file, tmp_path: Path) -> None:
    data, _ = gguf_file
    path = tmp_path / "tiny.gguf"
    path.write_bytes(data)
    assert pypi_assembly._gguf_eos_token_id(path) == 258
    path.write_bytes(HOSTILE["repeated key"])
    with pytest.raises(GGUFFormatError, match="appears more than once"):
        pypi_assembly._gguf_eos_token_id(path)


def test_an_array_of_many_small_strings_is_walked_without_materializing_it(tmp_path: Path) -> None:
    count = 300_000  # a large vocabulary's worth
    items = np.zeros(count, dtype="<u8").tobytes()  # each an empty string: its u64 length only
    path = tmp_path / "vocab.gguf"
    path.write_bytes(gguf([entry("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, count) + items)],
                          ONE_TENSOR, b"\0" * 32))
    assert read_gguf_header(path).tensor_count == 1


def _needs_zip_version(data: bytearray, _member: int, central: int) -> None:
    """The chunk member's central entry asks for zip version 9.9 (zipfile: NotImplementedError)."""
    struct.pack_into("<H", data, central + 6, 99)


def _negative_member_offset(data: bytearray, _member: int, central: int) -> None:
    """The end record places the central directory 31 bytes later than it is and every other entry's
    offset is raised to match, so zipfile reads the chunk member's local header at offset -31 (EINVAL)."""
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<I", data, end + 16, central + 31)
    position = central
    while data[position : position + 4] == b"PK\x01\x02":
        name_size, extra_size, comment_size = struct.unpack_from("<HHH", data, position + 28)
        if bytes(data[position + 46 : position + 46 + name_size]).decode() != CHUNK.member:
            struct.pack_into("<I", data, position + 42, struct.unpack_from("<I", data, position + 42)[0] + 31)
        position += 46 + name_size + extra_size + comment_size


@pytest.mark.parametrize("edit", [_needs_zip_version, _negative_member_offset])
def test_a_wheel_zipfile_cannot_read_is_a_chunk_check_naming_it(tmp_path: Path, edit) -> None:
    """These read faults escaped as a bare NotImplementedError, or as an OSError blamed on the disk."""
    written, error = append(patched(wheel_with(tmp_path / "a.whl"), edit))
    assert written == b"" and "a.whl" in str(error) and "the wheel is damaged" in str(error)
