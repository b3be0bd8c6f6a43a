"""Partial files and folders of the model cache: written under a hidden name, locked while they are
written, renamed into place when done, and swept once their writer is gone.

The partial of ``<folder>/<name>`` is ``<folder>/.<name>.<pid>.<random>.partial``: a file (a GGUF
being assembled) or a folder (a transformers copy being converted), ``<pid>`` being the writer's
process id and ``<random>`` tempfile's letters, digits and underscores. From the moment it creates
the partial until it has renamed it into place (or removed it), the writer holds an exclusive
`fcntl.flock` on the partial itself: on the file, or on a descriptor of the folder. The kernel
drops that lock when the writer dies, however it dies and whatever PID namespace (container) it
ran in, so the lock, not the pid, says whether a partial is still being written.

`sweep_partials` is told which final names it may sweep for, and removes an entry of the folder
only when all of these hold:

- its name is exactly ``.<name>.<pid>.<random>.partial`` for one of those names, the pid right
  after the name, in ASCII digits and in the range of process ids (nothing else in the folder, such
  as a user's ``.notes.2024.partial``, is ever touched);
- no process with that pid is alive in the sweeper's PID namespace;
- it was last modified at least `MIN_AGE_S` ago (covering the instant between creating a partial
  and locking it);
- the sweeper can take its lock (a file is opened read-write, a folder read-only, neither through
  a symbolic link); a partial whose lock cannot be taken at all, as on network file systems that
  refuse `flock` on folders, is left for the user to delete.

The writer never creates symbolic links or special files under these names; one found with such
a name is unlinked, never followed. Only removals that happened are reported.

Small files (the stamps, the provenance record) are written with `write_file`: into a new partial
created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` in the folder opened without following a link, then
renamed over the final name, so a symbolic link placed at that name is replaced, never written
through, and a folder that is a link is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from ..processes import MAX_PID, pid_alive

SUFFIX = ".partial"
MIN_AGE_S = 60.0
_TAIL = re.compile(r"([0-9]{1,10})\.[a-z0-9_]+" + re.escape(SUFFIX))


def _prefix(final: Path) -> str:
    """The start of the name of every partial this process writes for `final`."""
    return f".{final.name}.{os.getpid()}."


def _try_lock(fd: int) -> bool:
    """Take an exclusive `flock` on `fd` without waiting; False when it is held or refused."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def exclusive(path: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold the exclusive lock named `path` (a lock file, created when missing, never through a
    symbolic link) for the block; `on_wait` is called once when another process holds it, before
    waiting for it. The file is removed on the way out, while the lock is still held, so a waiter
    may find it has locked a file no longer at `path`: it then opens the new one and waits again.
    Where the file system refuses locks, the block runs unlocked."""
    warned = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            locked = _lock_waiting(fd, (lambda: None) if warned else on_wait)
            warned = True
            if not locked or _still_named(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def _lock_waiting(fd: int, on_wait: Callable[[], None]) -> bool:
    """Take an exclusive `flock` on `fd`, calling `on_wait` first when that means waiting; False
    (unlocked) where the file system refuses locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        on_wait()
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_EX)
    return True


def _still_named(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd`."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def partial_file(final: Path) -> Iterator[tuple[Path, BinaryIO]]:
    """A new, locked, empty partial file beside `final` and a binary handle writing it.

    The partial is removed on the way out unless it was renamed into place (`publish`) first; the
    lock is released after that. Where the file system refuses the lock, the file is written
    unlocked: the sweep cannot lock it either, so it never removes it."""
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=_prefix(final), suffix=SUFFIX)
    path = Path(name)
    handle = os.fdopen(fd, "wb")
    try:
        _try_lock(fd)
        yield path, handle
    finally:
        try:
            path.unlink(missing_ok=True)  # while the lock is still held
        finally:
            handle.close()


@contextlib.contextmanager
def partial_dir(final: Path) -> Iterator[Path]:
    """A new, locked, empty partial folder beside `final`.

    The folder is removed on the way out unless it was renamed into place (`publish`) first;
    whatever cannot be removed is left, unlocked, for a later sweep. Locking works as in
    `partial_file`, on a read-only descriptor of the folder."""
    path = Path(tempfile.mkdtemp(dir=final.parent, prefix=_prefix(final), suffix=SUFFIX))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        _try_lock(fd)
        yield path
    finally:
        try:
            shutil.rmtree(path, ignore_errors=True)  # while the lock is still held
        finally:
            os.close(fd)


def current_umask() -> int:
    """The process umask: read from ``/proc/self/status`` where the kernel reports it (Linux 4.7
    and later), since reading it with `os.umask` means setting it for a moment, for every thread.
    Elsewhere it is read that way, setting the strictest mask (0o077) for that moment."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def publish(partial: Path, final: Path, mode: int) -> None:
    """Give `partial` (created private) the permissions `mode` less the umask, as a file or folder
    created normally would have, and rename it to `final` (a link at `final` is replaced, not
    followed). A link in the place of `partial` is refused (an OSError), never followed."""
    fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        os.fchmod(fd, mode & ~current_umask())
    finally:
        os.close(fd)
    os.replace(partial, final)


def open_folder(folder: Path) -> int:
    """A read-only descriptor of the real folder `folder`. A symbolic link there is not followed:
    it is an OSError (ELOOP) naming the folder, as is anything else that is not a folder."""
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:
        if os.path.islink(folder):
            message = ("is a symbolic link; the model cache writes only into real folders (remove the "
                       "link, or choose another cache folder)")
            raise OSError(errno.ELOOP, message, str(folder)) from error
        raise


def write_file(path: Path, data: bytes) -> None:
    """Write `data` as the file `path`, never through a symbolic link (see the module docstring).
    The file gets the permissions a new file normally has (0o666 less the umask)."""
    write_files({path: data})


def write_files(contents: Mapping[Path, bytes]) -> None:
    """Write each file of `contents` (path -> bytes) as `write_file` does, all or nothing: every file
    is first written to a new partial in its folder, and only when all are written are they renamed
    into place. A failure before that removes the partials written so far and renames nothing; its
    OSError names the file that could not be written, not its partial."""
    folders: list[int] = []
    written: list[tuple[int, str, Path]] = []  # (folder descriptor, partial name, final path), not yet renamed
    try:
        for path, data in contents.items():
            folders.append(folder := open_folder(path.parent))
            name = f"{_prefix(path)}{secrets.token_hex(8)}{SUFFIX}"
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=folder)
                written.append((folder, name, path))
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
            except OSError as error:
                raise _naming(error, path) from error
        while written:
            folder, name, path = written[0]
            os.replace(name, path.name, src_dir_fd=folder, dst_dir_fd=folder)
            written.pop(0)
    finally:
        for folder, name, _ in written:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
        for folder in folders:
            os.close(folder)


def _naming(error: OSError, path: Path) -> OSError:
    """`error` (raised for a partial of `path`) as the same error about `path`."""
    return type(error)(error.errno, error.strerror or str(error), str(path))


def _writer_pid(name: str, finals: Iterable[str]) -> int | None:
    """The writer's pid when `name` is the name of a partial of one of the names `finals`, else None."""
    if not name.endswith(SUFFIX):
        return None
    for final in finals:
        prefix = f".{final}."
        match = _TAIL.fullmatch(name[len(prefix):]) if name.startswith(prefix) else None
        if match and 0 < int(match[1]) <= MAX_PID:
            return int(match[1])
    return None


def _remove_locked(path: Path, flags: int, remove: Callable[[Path], None]) -> bool:
    """Open `path` with `flags` (never through a link), take its lock and remove it; True if done."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if not _try_lock(fd):
            return False
        remove(path)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _remove_abandoned(path: Path, status: os.stat_result) -> bool:
    """Remove the abandoned partial `path` (`status`: its lstat): a folder or file only under its
    lock, anything else (a symbolic link, say) by unlinking the name; True if it is gone."""
    if stat.S_ISDIR(status.st_mode):
        return _remove_locked(path, os.O_RDONLY | os.O_DIRECTORY, shutil.rmtree)
    if stat.S_ISREG(status.st_mode):
        return _remove_locked(path, os.O_RDWR | os.O_NONBLOCK, os.unlink)
    try:
        path.unlink()
    except OSError:
        return False
    return True


def sweep_partials(folder: Path, finals: Iterable[str], *, min_age_s: float = MIN_AGE_S) -> list[Path]:
    """Remove the abandoned partials of the names `finals` in `folder` (see the module docstring);
    returns those removed. A folder that does not exist has nothing to sweep."""
    folder, finals = Path(folder), tuple(finals)
    if not folder.is_dir():
        return []
    with os.scandir(folder) as entries:
        candidates = [(Path(entry.path), pid) for entry in entries
                      if (pid := _writer_pid(entry.name, finals)) is not None]
    removed = []
    for path, pid in candidates:
        if pid_alive(pid):
            continue
        try:
            status = path.lstat()
        except OSError:
            continue
        if time.time() - status.st_mtime >= min_age_s and _remove_abandoned(path, status):
            removed.append(path)
    return removed
