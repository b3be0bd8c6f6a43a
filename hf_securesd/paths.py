"""What a path given on the command line names, for messages that state the actual problem."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def path_kind(path: Path) -> str:
    """What `path` names: ``folder``, ``file`` (anything else that exists), ``missing`` (nothing there, a
    broken link, or a file where a folder on the way belongs), or ``too long`` (a name or the whole path
    is longer than the file system takes: ENAMETOOLONG). Other OS errors (a folder on the way that
    cannot be searched) are raised. Read with `os.stat`, whose errors every Python release reports
    (pathlib's `exists` and `is_dir` stopped raising ENAMETOOLONG in 3.14)."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            raise
        return "too long"
    return "folder" if stat.S_ISDIR(mode) else "file"


def too_long_path(what: str, path: Path) -> str:
    """The one-line error for `what` (an option or argument) naming `path`, which the file system refuses
    as too long (`path_kind`)."""
    return (f"{what} {path}: the path is too long for the file system (each name in it takes at most 255 "
            f"bytes, the whole path 4,096); give a shorter path")
