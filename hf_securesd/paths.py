"""What a path given on the command line names, for messages that state the actual problem."""

from __future__ import annotations

import errno
import os
import shlex
import stat
from pathlib import Path


def path_kind(path: Path) -> str:
    """What `path` names: ``folder``, ``file`` (anything else that exists), ``missing`` (nothing there, a
    broken link: dangling or a loop of links, ELOOP; or a file where a folder on the way belongs), or
    ``too long`` (a name or the whole path is longer than the file system takes: ENAMETOOLONG). Other OS
    errors (a folder on the way that cannot be searched) are raised. Read with `os.stat`, whose errors
    every Python release reports (pathlib's `exists` and `is_dir` stopped raising ENAMETOOLONG in 3.14).
    `broken_link` tells a missing path that a broken link makes impossible to create."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "missing"
        if error.errno != errno.ENAMETOOLONG:
            raise
        return "too long"
    return "folder" if stat.S_ISDIR(mode) else "file"


def nearest_existing(path: Path) -> Path:
    """`path` made absolute, or else the nearest folder above it, that exists as a name: a symbolic link
    counts, even one that leads nowhere (`os.path.lexists`)."""
    absolute = path.absolute()
    return next(entry for entry in (absolute, *absolute.parents) if os.path.lexists(entry))


def broken_link(path: Path) -> Path | None:
    """The symbolic link that leads nowhere (dangling, or a loop of links) at `path` or at the nearest
    folder above it that exists (`nearest_existing`), which makes `path` impossible to create; None
    when there is none."""
    entry = nearest_existing(path)
    return entry if entry.is_symlink() and path_kind(entry) == "missing" else None


def broken_link_text(what: str, path: Path, link: Path) -> str:
    """The one-line error for `what` (an option) naming `path`, which the broken symbolic link `link`
    (`broken_link`) makes impossible to use."""
    where = "is" if link == path.absolute() else f"is below {link}, which is"
    return (f"{what} {path} {where} a symbolic link that leads nowhere (to {os.readlink(link)!r}: a missing "
            f"target or a loop of links); remove or fix the link (rm {shlex.quote(str(link))}), or give another path")


def too_long_path(what: str, path: Path) -> str:
    """The one-line error for `what` (an option or argument) naming `path`, which the file system refuses
    as too long (`path_kind`)."""
    return (f"{what} {path}: the path is too long for the file system (each name in it takes at most 255 "
            f"bytes, the whole path 4,096); give a shorter path")
