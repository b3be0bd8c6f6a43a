"""Where `securesd report` writes: RESULTS/report/, a real folder (never a link to another one), and
each file in it written through a temporary file renamed into place, so a link planted at a
file's name is replaced, never followed, and readers see the old or the new file."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPORT_FOLDER = "report"


def report_folder(results_path: Path) -> Path:
    """RESULTS/report/, created when missing; `ValueError` naming the fix when that name is a link
    or a file."""
    out = results_path / REPORT_FOLDER
    if out.is_symlink():
        raise ValueError(f"{out} is a symbolic link to {os.readlink(out)!r}; `report` writes only into a "
                         f"folder of the results directory's own: remove the link (rm {out}) and rerun")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is not a folder; move that file away so `report` can write the report there")
    out.mkdir(exist_ok=True)
    return out


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A new temporary file beside `path` (same suffix) for the block to write; renamed onto `path`
    when the block succeeds (a link at `path` is replaced, not followed), removed otherwise."""
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(handle)
    try:
        yield Path(name)
        os.chmod(name, 0o644)
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)
