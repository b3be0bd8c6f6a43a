"""What the model cache trusts: stamps written after a verified build, and the checks against them.

- A cached GGUF is trusted when it is a regular file (not a link) in a real folder (not a link)
  and its stamp ``<file>.verified.json`` records the pinned sha256 and the
  file's current size, modification and status-change times (nanoseconds), device and inode; any
  write to the file changes its status-change time, which `os.utime` cannot set back. A file whose
  stamp does not match is re-hashed against the pinned sha256 (and the stamp renewed), so a copied
  or moved cache costs one re-hash.
- A transformers copy is trusted when its stamp ``securesd_verified.json`` names the pinned sha256
  of the GGUF it was built from (a copy built for an older pin is rebuilt) and lists every entry of
  the folder: each a regular file (not a link) of the recorded size, with nothing unlisted beside
  them (an added ``generation_config.json`` or ``tokenizer_config.json`` would change sampling or
  the chat template). Sizes are checked on each use; the recorded sha256s only when asked
  (``rehash=True``, ``securesd models where --verify``), since that reads the whole copy.

Stamps are not signed: they detect damage and accidental or careless changes, not someone who can
write to the cache folder, who can rewrite a stamp as easily as the files. Keep the cache folder
writable only by its users. A stamp is read only when it is a regular file (not a link) of at most
`STAMP_MAX_BYTES`; one that cannot be read, parsed or has fields of the wrong types counts as
missing. A stamp is written with `partials.write_file`: a link at its name is replaced, never
written through, and none is written into a folder that is a link.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path

from .partials import write_file
from .registry import ModelSpec

STAMP_FILE = "securesd_verified.json"
GGUF_STAMP_SUFFIX = ".verified.json"
STAMP_MAX_BYTES = 1 << 20
_BLOCK = 8 << 20


def sha256_file(path: Path) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _read_stamp(path: Path) -> dict | None:
    """The JSON object in the stamp at `path`, or None when it is missing, not a regular file (a
    link, a device), larger than `STAMP_MAX_BYTES`, nested too deep to parse, or not an object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = handle.read(STAMP_MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > STAMP_MAX_BYTES:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _listed_files(stamp: dict) -> dict[str, tuple[int, str]] | None:
    """A copy stamp's files as name -> (size, sha256), or None when any field has the wrong type."""
    files = stamp.get("files")
    if not isinstance(files, dict):
        return None
    listed = {}
    for name, entry in files.items():
        if not isinstance(entry, dict):
            return None
        size, digest = entry.get("size"), entry.get("sha256")
        if type(size) is not int or not isinstance(digest, str):
            return None
        listed[name] = (size, digest)
    return listed


def _entries(folder: Path) -> dict[str, os.stat_result]:
    """Every entry of `folder` but the stamp, by name, with its lstat (links are not followed)."""
    with os.scandir(folder) as entries:
        return {entry.name: entry.stat(follow_symlinks=False)
                for entry in entries if entry.name != STAMP_FILE}


def copy_entries_problem(folder: Path) -> str | None:
    """Why the entries of a freshly converted `folder` cannot make a trusted copy, or None: it needs
    ``config.json`` and safetensors weights, and regular files only."""
    entries = _entries(folder)
    others = sorted(name for name, status in entries.items() if not stat.S_ISREG(status.st_mode))
    if others:
        return f"it holds entries that are not regular files: {', '.join(others[:5])}"
    if "config.json" not in entries or not any(name.endswith(".safetensors") for name in entries):
        return "it has no config.json or no safetensors weights"
    return None


def write_copy_stamp(folder: Path, gguf_sha256: str) -> None:
    """Record the size and sha256 of every file of a freshly built, checked copy (all regular files,
    see `copy_entries_problem`), and the sha256 of the GGUF it was built from."""
    files = {name: {"size": status.st_size, "sha256": sha256_file(Path(folder) / name)}
             for name, status in sorted(_entries(Path(folder)).items())}
    stamp = json.dumps({"gguf_sha256": gguf_sha256, "files": files}, indent=2)
    write_file(Path(folder) / STAMP_FILE, stamp.encode("utf-8"))


def is_cached_copy(path: Path, spec: ModelSpec, *, rehash: bool = False) -> bool:
    """True when `path` holds a copy that a verified build of `spec` (its current pin) stamped:
    the stamp lists config.json and safetensors weights, and exactly the entries of the folder,
    each a regular file of its recorded size (and recorded sha256 with `rehash`)."""
    return copy_problem(path, spec, rehash=rehash) is None


def copy_problem(path: Path, spec: ModelSpec, *, rehash: bool = False) -> str | None:
    """Why the folder `path` is not a trusted copy of `spec` (see `is_cached_copy`), or None when it is."""
    try:
        return _copy_problem(Path(path), spec.sha256, rehash)
    except OSError as error:
        return f"it cannot be read ({error.strerror or error})"


def _copy_problem(path: Path, gguf_sha256: str, rehash: bool) -> str | None:
    """`copy_problem`, letting OS errors out."""
    stamp = _read_stamp(path / STAMP_FILE)
    listed = _listed_files(stamp) if stamp is not None else None
    if listed is None:
        return f"it has no readable stamp ({STAMP_FILE})"
    if stamp.get("gguf_sha256") != gguf_sha256:
        return "it was built from another GGUF than the pinned one (an older pin)"
    if "config.json" not in listed or not any(name.endswith(".safetensors") for name in listed):
        return "its stamp lists no config.json or no safetensors weights"
    entries = _entries(path)
    unlisted, missing = sorted(set(entries) - set(listed)), sorted(set(listed) - set(entries))
    if unlisted:
        return f"it holds files its stamp does not list: {', '.join(map(repr, unlisted[:5]))}"
    if missing:
        return f"files its stamp lists are missing: {', '.join(map(repr, missing[:5]))}"
    for name, status in sorted(entries.items()):
        size, digest = listed[name]
        if not stat.S_ISREG(status.st_mode):
            return f"{name!r} is not a regular file"
        if status.st_size != size:
            return f"{name!r} has {status.st_size} bytes where its stamp records {size}"
        if rehash and sha256_file(path / name) != digest:
            return f"the sha256 of {name!r} differs from its stamp"
    return None


def gguf_stamp(path: Path) -> Path:
    """Where the stamp of the cached GGUF at `path` lives."""
    return path.with_name(path.name + GGUF_STAMP_SUFFIX)


def _stat_key(status: os.stat_result) -> dict[str, int]:
    """What a GGUF stamp records of the file's status; any write to the file changes it."""
    return {"size": status.st_size, "mtime_ns": status.st_mtime_ns, "ctime_ns": status.st_ctime_ns,
            "dev": status.st_dev, "inode": status.st_ino}


def write_gguf_stamp(path: Path, spec: ModelSpec) -> None:
    """Stamp the cached GGUF at `path`, checked against `spec`, as it is now (the file itself, not
    what a link there points to). A link at the stamp's name is replaced, not written through."""
    stamp = json.dumps({"sha256": spec.sha256, "stat": _stat_key(os.lstat(path))})
    write_file(gguf_stamp(path), stamp.encode("utf-8"))


def verified_gguf(path: Path, spec: ModelSpec) -> bool:
    """Whether the cached GGUF at `path` is the pinned file: its stamp matches the file as it is
    now, or else a re-hash matches the pinned sha256 (and the stamp is renewed). A file that cannot
    be read, a link in the place of the file, or a file in a folder that is a link, is not
    verified."""
    try:
        status = os.lstat(path)
        if path.parent.is_symlink() or not stat.S_ISREG(status.st_mode) or status.st_size != spec.size:
            return False
        stamp = _read_stamp(gguf_stamp(path))
        if stamp is not None and (stamp.get("sha256"), stamp.get("stat")) == (spec.sha256, _stat_key(status)):
            return True
        if sha256_file(path) != spec.sha256:
            return False
    except OSError:
        return False
    with contextlib.suppress(OSError):  # a read-only cache stays usable, re-hashed on each check
        write_gguf_stamp(path, spec)
    return True
