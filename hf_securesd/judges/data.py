"""Locate staged data files (rubrics, human-labelled judge comparisons) without copying them."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "SECURESD_DATA_DIR"


def data_file(relative: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """Path of `relative` inside `data_dir`, or inside `$SECURESD_DATA_DIR` when `data_dir` is None.

    Raises `FileNotFoundError` naming the missing file and how to point at the data folder.
    """
    root = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    if not root:
        raise FileNotFoundError(
            f"no data folder given for {relative}: pass data_dir=... (or --data-dir) or set "
            f"{DATA_DIR_ENV} to the folder that holds {relative}."
        )
    path = Path(root).expanduser() / relative
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: point data_dir or {DATA_DIR_ENV} at the folder that holds {relative}."
        )
    return path
