"""A bounded reader of a GGUF file's header: its metadata and tensor directory.

`gguf.GGUFReader` trusts the counts a file declares: an array declaring 2**40 items at the end of
the file makes it loop while it eats memory, arrays nested thousands deep exhaust the recursion
limit, a repeated key raises KeyError, and a million small strings take it seconds. This reader
walks the same layout in time and memory linear in the header, checking every count before it
acts on it, and raises `GGUFFormatError` naming the problem:

- every count times the smallest size of its items must fit in the bytes left in the file;
- at most `MAX_ENTRIES` metadata entries, `MAX_ARRAY_ITEMS` array items in all (nested arrays
  included), arrays nested at most `MAX_ARRAY_DEPTH` deep, `MAX_TENSORS` tensors of 1 to
  `MAX_DIMS` dimensions, keys and tensor names of at most `MAX_NAME_BYTES` UTF-8 bytes, none
  repeated. Released models are far below these (a 262,144-token vocabulary with scores and types
  is under 800,000 array items);
- ``general.alignment``, when present, is a u32 power of two; every tensor has a known ggml type,
  an innermost dimension that is a whole number of that type's blocks, and its data inside the file.

Layout (little-endian, versions 2 and 3): magic ``GGUF``, u32 version, u64 tensor count, u64
metadata count; each metadata entry a string key, a u32 value type and the value; each tensor a
string name, u32 dimension count, u64 dimensions, u32 ggml type and u64 offset; then the tensor
data, from the next multiple of the alignment (default 32). A string is a u64 byte length and
its bytes; an array a u32 item type, a u64 count and the items.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ENTRIES = 4096
MAX_ARRAY_ITEMS = 1 << 21
MAX_ARRAY_DEPTH = 4
MAX_TENSORS = 1 << 16
MAX_DIMS = 4
MAX_NAME_BYTES = 65_535

UINT32, STRING, ARRAY = 4, 8, 9
INTEGER_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)  # u8 i8 u16 i16 u32 i32 u64 i64
_SCALARS = {code: struct.Struct(fmt) for code, fmt in (
    (0, "<B"), (1, "<b"), (2, "<H"), (3, "<h"), (4, "<I"), (5, "<i"), (6, "<f"), (7, "<?"),
    (10, "<Q"), (11, "<q"), (12, "<d"))}
_U32, _U64 = _SCALARS[4], _SCALARS[10]
_PREAMBLE = 24  # magic, version, tensor count, metadata count
_MIN_ENTRY = 8 + 4 + 1  # empty key, value type, one-byte value
_MIN_TENSOR = 8 + 4 + 8 + 4 + 8  # empty name, one dimension, type, offset
_MIN_ITEM = {STRING: 8, ARRAY: 4 + 8}


class GGUFFormatError(ValueError):
    """The file is not a well-formed GGUF within the reader's limits."""


@dataclass(frozen=True)
class GGUFHeader:
    """What the header declares. `scalars` maps each metadata key with a number or bool value to
    its (value type, value); strings and arrays are checked but not kept."""

    version: int
    tensor_count: int
    scalars: dict[str, tuple[int, int | float | bool]]
    alignment: int
    data_start: int
    data_end: int  # the end of the last tensor's data (`data_start` without tensors)


def read_gguf_header(path: Path) -> GGUFHeader:
    """Read and check the header of the GGUF file at `path` (see the module docstring).

    Raises:
        GGUFFormatError: the header is malformed or beyond the limits.
        OSError: the file cannot be read.
        ImportError: the `gguf` package (for the ggml types' block sizes) is not installed.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        magic = handle.read(len(MAGIC))
        if magic != MAGIC:
            raise GGUFFormatError(f"magic is {magic!r}, expected {MAGIC!r}")
        if size < _PREAMBLE:
            raise GGUFFormatError(f"the file has {size} bytes, fewer than the {_PREAMBLE} of a GGUF header")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return _HeaderParser(view, size).header()


def _block_sizes() -> dict[int, tuple[int, int]]:
    """(elements per block, bytes per block) of each ggml type, by its number."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(kind): sizes for kind, sizes in GGML_QUANT_SIZES.items()}


class _HeaderParser:
    """Walks a GGUF header in `view` (`size` bytes), never reading past the end."""

    def __init__(self, view: mmap.mmap, size: int) -> None:
        self.view, self.size, self.pos = view, size, len(MAGIC)
        self.items_left = MAX_ARRAY_ITEMS

    def header(self) -> GGUFHeader:
        """Parse the whole header."""
        version = self.unpack(_U32, "the format version")
        if version not in VERSIONS:
            raise GGUFFormatError(f"format version {version} is not one of {VERSIONS}")
        tensor_count = self.unpack(_U64, "the tensor count")
        entry_count = self.unpack(_U64, "the metadata count")
        scalars = self.metadata(entry_count)
        tensors = self.tensors(tensor_count)
        alignment = _alignment(scalars)
        data_start = -(-self.pos // alignment) * alignment
        data_end = data_start
        for name, end in tensors:
            if data_start + end > self.size:
                raise GGUFFormatError(f"tensor {name!r} ends at byte {data_start + end}, past the end of "
                                      f"the file ({self.size} bytes)")
            data_end = max(data_end, data_start + end)
        return GGUFHeader(version, tensor_count, scalars, alignment, data_start, data_end)

    def need(self, count: int, what: str) -> None:
        """Fail unless `count` more bytes are left for `what`."""
        if count > self.size - self.pos:
            raise GGUFFormatError(f"{what} needs {count} bytes at byte {self.pos}, but only "
                                  f"{self.size - self.pos} are left in the file")

    def unpack(self, layout: struct.Struct, what: str) -> int | float | bool:
        """Read one value laid out as `layout`."""
        self.need(layout.size, what)
        value = layout.unpack_from(self.view, self.pos)[0]
        self.pos += layout.size
        return value

    def skip_string(self, what: str) -> None:
        """Step over a string."""
        length = self.unpack(_U64, what)
        self.need(length, what)
        self.pos += length

    def name(self, what: str) -> str:
        """Read a key or tensor name: at most `MAX_NAME_BYTES` bytes of UTF-8."""
        length = self.unpack(_U64, what)
        if length > MAX_NAME_BYTES:
            raise GGUFFormatError(f"{what} is {length} bytes long, more than {MAX_NAME_BYTES}")
        self.need(length, what)
        raw = self.view[self.pos:self.pos + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise GGUFFormatError(f"{what} {raw[:64]!r} is not UTF-8") from error

    def metadata(self, count: int) -> dict[str, tuple[int, int | float | bool]]:
        """Walk `count` metadata entries; return the numeric and boolean ones."""
        if count > MAX_ENTRIES:
            raise GGUFFormatError(f"the header declares {count} metadata entries, more than {MAX_ENTRIES}")
        self.need(count * _MIN_ENTRY, f"the metadata ({count} entries)")
        seen: set[str] = set()
        scalars: dict[str, tuple[int, int | float | bool]] = {}
        for _ in range(count):
            key = self.name("a metadata key")
            if key in seen:
                raise GGUFFormatError(f"metadata key {key!r} appears more than once")
            seen.add(key)
            value_type = self.unpack(_U32, f"the type of {key!r}")
            if value_type in _SCALARS:
                scalars[key] = (value_type, self.unpack(_SCALARS[value_type], f"the value of {key!r}"))
            elif value_type == STRING:
                self.skip_string(f"the value of {key!r}")
            elif value_type == ARRAY:
                self.skip_array(key, depth=1)
            else:
                raise GGUFFormatError(f"metadata key {key!r} has unknown value type {value_type}")
        return scalars

    def skip_array(self, key: str, depth: int) -> None:
        """Step over an array (the value of `key`, nested `depth` deep), within the item budget."""
        if depth > MAX_ARRAY_DEPTH:
            raise GGUFFormatError(f"metadata key {key!r} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        item_type = self.unpack(_U32, f"the item type of {key!r}")
        count = self.unpack(_U64, f"the length of {key!r}")
        if count > self.items_left:
            raise GGUFFormatError(f"metadata key {key!r} declares {count} array items, more than the "
                                  f"{MAX_ARRAY_ITEMS} a GGUF header may hold in all")
        self.items_left -= count
        if item_type in _SCALARS:
            self.need(count * _SCALARS[item_type].size, f"the {count} items of {key!r}")
            self.pos += count * _SCALARS[item_type].size
            return
        if item_type not in _MIN_ITEM:
            raise GGUFFormatError(f"metadata key {key!r} has arrays of unknown item type {item_type}")
        self.need(count * _MIN_ITEM[item_type], f"the {count} items of {key!r}")
        for _ in range(count):
            if item_type == STRING:
                self.skip_string(f"an item of {key!r}")
            else:
                self.skip_array(key, depth + 1)

    def tensors(self, count: int) -> list[tuple[str, int]]:
        """Walk `count` tensor entries; return each tensor's name and the end of its data, counted
        from the start of the tensor data."""
        if count > MAX_TENSORS:
            raise GGUFFormatError(f"the header declares {count} tensors, more than {MAX_TENSORS}")
        self.need(count * _MIN_TENSOR, f"the tensor directory ({count} entries)")
        block_sizes = _block_sizes()
        seen: set[str] = set()
        ends = []
        for _ in range(count):
            name = self.name("a tensor name")
            if name in seen:
                raise GGUFFormatError(f"tensor {name!r} appears more than once")
            seen.add(name)
            ndims = self.unpack(_U32, f"the dimension count of tensor {name!r}")
            if not 1 <= ndims <= MAX_DIMS:
                raise GGUFFormatError(f"tensor {name!r} has {ndims} dimensions, expected 1 to {MAX_DIMS}")
            dims = [self.unpack(_U64, f"the dimensions of tensor {name!r}") for _ in range(ndims)]
            kind = self.unpack(_U32, f"the type of tensor {name!r}")
            offset = self.unpack(_U64, f"the offset of tensor {name!r}")
            if kind not in block_sizes:
                raise GGUFFormatError(f"tensor {name!r} has unknown ggml type {kind}")
            block, block_bytes = block_sizes[kind]
            if dims[0] % block:
                raise GGUFFormatError(f"tensor {name!r}: innermost dimension {dims[0]} is not a multiple "
                                      f"of its type's {block}-element blocks")
            ends.append((name, offset + math.prod(dims) // block * block_bytes))
        return ends


def _alignment(scalars: dict[str, tuple[int, int | float | bool]]) -> int:
    """The data alignment: ``general.alignment`` (a u32 power of two) or the default."""
    if "general.alignment" not in scalars:
        return DEFAULT_ALIGNMENT
    value_type, value = scalars["general.alignment"]
    if value_type != UINT32 or value < 1 or value & (value - 1):
        raise GGUFFormatError(f"general.alignment must be a u32 power of two, got {value!r} "
                              f"(value type {value_type})")
    return int(value)
