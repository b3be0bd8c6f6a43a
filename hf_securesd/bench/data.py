"""Where benchmark data comes from: the Hugging Face Hub through `datasets` by default, or a local
data directory (`--data-dir`, or the `SECURESD_DATA_DIR` environment variable) holding copies of
the upstream files. The expected local layout is documented in docs/benchmarks.md.

Local files are read with the standard library (they are small), so a local run needs neither
network nor a `datasets` cache.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence, TypeVar

ENV_VAR = "SECURESD_DATA_DIR"

T = TypeVar("T")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local data directory to use, as an absolute path: `data_dir` if given, else
    `$SECURESD_DATA_DIR`, else None (load from the Hub). A relative path is taken from the current
    directory now, so it stays valid when it is passed on (symlinks, subprocesses, other working
    directories). Raises if the chosen directory does not exist."""
    chosen = data_dir if data_dir not in (None, "") else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return None
    path = Path(chosen).expanduser()
    if not path.is_dir():
        origin = "--data-dir" if data_dir not in (None, "") else f"${ENV_VAR}"
        raise FileNotFoundError(f"benchmark data directory {path} (from {origin}) does not exist; "
                                f"point it at a folder laid out as in docs/benchmarks.md, or unset it "
                                f"to load from the Hugging Face Hub")
    return path.resolve()


def local_file(data_dir: Path, *candidates: str) -> Path:
    """The first of `candidates` (paths relative to `data_dir`) that exists."""
    for relative in candidates:
        path = data_dir / relative
        if path.is_file():
            return path
    expected = " or ".join(str(data_dir / relative) for relative in candidates)
    raise FileNotFoundError(f"missing benchmark file: expected {expected}. See docs/benchmarks.md "
                            f"for the local data layout, or unset --data-dir/${ENV_VAR} to load "
                            f"from the Hugging Face Hub")


class BenchmarkDataUnavailable(FileNotFoundError):
    """A benchmark's data could be read neither from the Hugging Face Hub nor from a local copy. A
    FileNotFoundError, so whatever reports a missing local file reports this the same way."""


def load_hub(dataset_id: str, config: str | None = None, split: str = "test",
             **kwargs: Any) -> list[dict[str, Any]]:
    """Rows of a Hub dataset split, as dicts. Errors explain the offline alternative."""
    import datasets

    try:
        dataset = datasets.load_dataset(dataset_id, config, split=split, **kwargs)
    except Exception as error:
        raise BenchmarkDataUnavailable(
            f"could not load {dataset_id!r} (config={config!r}, split={split!r}) from the Hugging "
            f"Face Hub: {error}. Without network access (or with HF_HUB_OFFLINE=1 and no cache), "
            f"pass --data-dir or set ${ENV_VAR} to a local copy laid out as in docs/benchmarks.md"
        ) from error
    return [dict(row) for row in dataset]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file, gzip-compressed when the name ends in `.gz`."""
    opener = gzip.open if path.suffix == ".gz" else open
    with _named_errors(path), opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_csv(path: Path, delimiter: str = ",", quoting: int = csv.QUOTE_MINIMAL) -> list[dict[str, str]]:
    """Rows of a CSV/TSV file with a header line (a UTF-8 byte-order mark is tolerated)."""
    with _named_errors(path), open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle, delimiter=delimiter, quoting=quoting))


def read_lines(path: Path) -> list[str]:
    """Lines of a text file without their line endings (CRLF tolerated)."""
    with _named_errors(path), open(path, encoding="utf-8") as handle:
        return [line.rstrip("\r\n") for line in handle]


@contextmanager
def _named_errors(path: Path) -> Iterator[None]:
    """A local benchmark file that is not UTF-8, not valid JSON lines or not valid CSV raises a ValueError
    naming the file (the parsers' own messages say only where in it)."""
    try:
        yield
    except (UnicodeDecodeError, json.JSONDecodeError, csv.Error, EOFError, gzip.BadGzipFile) as error:
        raise ValueError(f"benchmark file {path} could not be read: {error}") from None


def seeded_sample(items: Sequence[T], n: int, seed: int) -> list[T]:
    """`n` items drawn without replacement in a random order fixed by `seed` (all of them,
    shuffled, when `n >= len(items)`)."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[index] for index in order[:n]]
