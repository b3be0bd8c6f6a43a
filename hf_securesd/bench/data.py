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
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from hf_securesd.bench import json_input
from hf_securesd.paths import path_kind, too_long_path

ENV_VAR = "SECURESD_DATA_DIR"
DATA_DIR_FIX = ("point it at a folder laid out as in docs/benchmarks.md, or unset it to load from the Hugging "
                "Face Hub")

T = TypeVar("T")


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local data directory to use, as an absolute path: `data_dir` if given, else
    `$SECURESD_DATA_DIR`, else None (load from the Hub). A relative path is taken from the current
    directory now, so it stays valid when it is passed on (symlinks, subprocesses, other working
    directories). A FileNotFoundError, naming the option or variable it came from, if the chosen path
    is not a folder: it does not exist, is a file, or is too long for the file system."""
    chosen = data_dir if data_dir not in (None, "") else os.environ.get(ENV_VAR) or None
    if chosen is None:
        return None
    path = Path(chosen).expanduser()
    origin = "--data-dir" if data_dir not in (None, "") else f"${ENV_VAR}"
    kind = path_kind(path)
    if kind == "too long":
        raise FileNotFoundError(f"{too_long_path(origin, path)}, or unset it to load from the Hugging Face Hub")
    if kind != "folder":
        problem = "is a file, not a folder" if kind == "file" else "does not exist"
        raise FileNotFoundError(f"benchmark data directory {path} (from {origin}) {problem}; {DATA_DIR_FIX}")
    return path.resolve()


def local_file(data_dir: Path, *candidates: str) -> Path:
    """The first of `candidates` (paths relative to `data_dir`) that is a file; a FileNotFoundError
    naming the first that is a folder, else every candidate, when none is."""
    paths = [data_dir / relative for relative in candidates]
    for path in paths:
        if path.is_file():
            return path
    folder = next((path for path in paths if path.is_dir()), None)
    if folder is not None:
        raise FileNotFoundError(f"benchmark file {folder} is a folder, where a file belongs; put the file "
                                f"there (see docs/benchmarks.md for the local data layout), or unset "
                                f"--data-dir/${ENV_VAR} to load from the Hugging Face Hub")
    expected = " or ".join(map(str, paths))
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


DATA_FIX = (f"point --data-dir (or ${ENV_VAR}) at an intact copy of the benchmark data, laid out as in "
            f"docs/benchmarks.md")
HUB_FIX = (f"pass --data-dir (or set ${ENV_VAR}) to load an intact local copy of the benchmark data "
           f"instead, laid out as in docs/benchmarks.md")
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}

Row = TypeVar("Row")


class BenchmarkDataError(ValueError):
    """A local benchmark file that cannot be used; the message names the file, where in it, the problem
    and the fix. A ValueError, so the commands report it as one line with exit code 2."""


def data_error(path: Path, where: str, problem: str, fix: str = DATA_FIX) -> BenchmarkDataError:
    """The error for `problem` found at `where` (a line or row) of the local file `path`."""
    return BenchmarkDataError(f"benchmark file {path} could not be read: {where}: {problem}; {fix}")


def json_type(value: Any) -> str:
    """The JSON name of `value`'s type ("object", "array", "string", ...)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def row_problem(row: Any, fields: Sequence[str]) -> str | None:
    """What keeps `row` from being a record (an object) holding each of `fields` as a string, or None."""
    if not isinstance(row, dict):
        return f"a JSON {json_type(row)}, not an object"
    for name in fields:
        if row.get(name) is None:
            return f"missing field {name!r}"
        if not isinstance(row[name], str):
            return f"field {name!r} is a JSON {json_type(row[name])}, not a string"
    return None


def integer_field(row: dict[str, Any], name: str) -> int:
    """`row[name]` as an integer (a number, or its text); a ValueError naming the field otherwise."""
    try:
        return int(row[name])
    except (TypeError, ValueError):
        raise ValueError(f"field {name!r} is {row[name]!r}, not an integer") from None


def parse_rows(path: Path, located: Iterable[tuple[str, Row]], parse: Callable[[Row], T],
               fix: str = DATA_FIX, *, unique: str | None = None) -> list[T]:
    """`parse` applied to each row of `located` ((where, row) pairs read from `path`). A row that
    `parse` refuses (ValueError, or KeyError for a field it lacks) raises `BenchmarkDataError` naming
    the file, the row's place, the problem and `fix`. `unique`: a field of the parsed rows (mappings)
    that names an example (its id comes from it); a row holding the same value as an earlier one
    raises `BenchmarkDataError` naming both rows and the value."""
    parsed = []
    seen: dict[Any, str] = {}
    for where, row in located:
        try:
            parsed.append(parse(row))
        except KeyError as error:
            raise data_error(path, where, f"missing field {error.args[0]!r}", fix) from None
        except ValueError as error:
            raise data_error(path, where, str(error), fix) from None
        if unique is not None:
            value = parsed[-1][unique]
            if value in seen:
                raise data_error(path, where, f"{unique!r} is {value!r}, as on {seen[value]}: it names the "
                                 f"example, so no two rows may share it", fix)
            seen[value] = where
    return parsed


def unique_values(rows: Sequence[dict[str, Any]], name: str, origin: str) -> None:
    """Refuse rows (from `origin`, a Hub dataset described in words) of which two hold the same
    `name`, the field an example id comes from: a ValueError naming both rows, the value and the fix."""
    seen: dict[Any, int] = {}
    for number, row in enumerate(rows, start=1):
        value = row[name]
        if value in seen:
            raise BenchmarkDataError(f"{origin} holds {name!r} {value!r} in rows {seen[value]} and {number}: "
                                     f"it names the example, so no two rows may share it; {HUB_FIX}")
        seen[value] = number


def too_few(source: Path | str, count: int, needed: int, noun: str,
            fix: str | None = None) -> BenchmarkDataError:
    """The error for a benchmark source holding `count` `noun` ("problems", "rows") where `needed`
    are expected: `source` is a local file (a copy cut short) or, as text, a Hub dataset."""
    held = "no" if count == 0 else f"only {count:,}"
    if isinstance(source, Path):
        return BenchmarkDataError(f"benchmark file {source} holds {held} {noun}, {needed:,} expected (is the "
                                  f"copy cut short?); {fix or DATA_FIX}")
    return BenchmarkDataError(f"{source} holds {held} {noun}, {needed:,} expected; {fix or HUB_FIX}")


def with_fields(fields: Sequence[str], parse: Callable[[dict[str, Any]], T]) -> Callable[[Any], T]:
    """`parse`, run after checking that the row is an object holding `fields` as strings (`row_problem`;
    a ValueError naming the problem otherwise)."""
    def checked(row: Any) -> T:
        problem = row_problem(row, fields)
        if problem is not None:
            raise ValueError(problem)
        return parse(row)
    return checked


def read_jsonl(path: Path, fields: Sequence[str] = (),
               parse: Callable[[dict[str, Any]], T] = dict, *, unique: str | None = None) -> list[T]:
    """Rows of a JSON-lines file (gzip-compressed when the name ends in `.gz`; blank lines skipped),
    each an object holding `fields` as strings, passed through `parse`. Any other line, one that
    `parse` refuses, one repeating an earlier row's `unique` field (see `parse_rows`) or a file
    without rows raises `BenchmarkDataError` naming the file, the line and the problem."""
    opener = gzip.open if path.suffix == ".gz" else open
    with _named_errors(path), opener(path, "rt", encoding="utf-8") as handle:
        rows = parse_rows(path, _json_lines(path, handle), with_fields(fields, parse), unique=unique)
    return _some(path, rows)


def _some(path: Path, rows: list[T]) -> list[T]:
    """`rows`, read from the local file `path`; `BenchmarkDataError` naming the file when there are none."""
    if not rows:
        raise BenchmarkDataError(f"benchmark file {path} holds no rows (an empty or cut-short copy?); "
                                 f"{DATA_FIX}")
    return rows


def _json_lines(path: Path, handle: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """("line N", value) for each non-blank line of `handle`; invalid JSON raises `BenchmarkDataError`
    with the line of the file and the column in it."""
    for number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json_input.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as error:
            raise data_error(path, f"line {number} column {error.colno}",
                             f"not valid JSON ({error.msg})") from None


def read_csv(path: Path, fields: Sequence[str] = (), parse: Callable[[dict[str, Any]], T] = dict, *,
             delimiter: str = ",", quoting: int = csv.QUOTE_MINIMAL, unique: str | None = None) -> list[T]:
    """Rows of a CSV/TSV file with a header line (a UTF-8 byte-order mark is tolerated), as dicts
    holding `fields`, passed through `parse` (see `parse_csv`; `unique` as in `parse_rows`); a file
    without rows raises `BenchmarkDataError` naming it."""
    with _named_errors(path), open(path, encoding="utf-8-sig", newline="") as handle:
        return _some(path, parse_csv(path, handle, fields, parse, delimiter=delimiter, quoting=quoting,
                                     unique=unique))


def parse_csv(path: Path, handle: Iterable[str], fields: Sequence[str] = (),
              parse: Callable[[dict[str, Any]], T] = dict, *, delimiter: str = ",",
              quoting: int = csv.QUOTE_MINIMAL, fix: str = DATA_FIX, unique: str | None = None) -> list[T]:
    """The rows of the CSV text `handle` (read from `path`), as {column: value} dicts passed through
    `parse` (empty rows skipped). A header without one of `fields`, a row cut short (fewer values than
    the header has columns), a row with more values than it has columns (a delimiter inside a value
    that is not quoted), a row `parse` refuses or one repeating an earlier row's `unique` column (see
    `parse_rows`) raises `BenchmarkDataError` naming the file, the row and its line, the problem and `fix`."""
    reader = csv.reader(handle, delimiter=delimiter, quoting=quoting)
    header = next(reader, None) or []
    absent = [name for name in fields if name not in header]
    if absent:
        columns = ", ".join(map(repr, header)) if header else "none: the file is empty"
        raise data_error(path, "line 1 (header)", f"no column {absent[0]!r} (its columns: {columns})", fix)
    checked = with_fields(fields, parse)
    return parse_rows(path, _csv_rows(reader), lambda values: checked(_csv_row(header, values, delimiter)), fix,
                      unique=unique)


def _csv_rows(reader: Any) -> Iterator[tuple[str, list[str]]]:
    """("row N (line L)", values) for each non-empty row of `reader` after the header, L being the
    file line the row starts on."""
    number = 0
    start = reader.line_num + 1
    for values in reader:
        if values:
            number += 1
            yield f"row {number} (line {start})", values
        start = reader.line_num + 1


_DELIMITER_NAMES = {",": "comma", "\t": "tab", ";": "semicolon"}


def _csv_row(header: list[str], values: list[str], delimiter: str = ",") -> dict[str, str]:
    """{column: value} of a CSV row; a ValueError for a row with fewer values than `header` has columns,
    or more (a `delimiter` inside a value that is not quoted: the value would be cut there)."""
    if len(values) < len(header):
        raise ValueError(f"the row is cut short: {len(values)} of the header's {len(header)} columns, no value "
                         f"for column {header[len(values)]!r}")
    if len(values) > len(header):
        name = _DELIMITER_NAMES.get(delimiter, repr(delimiter))
        raise ValueError(f"the row has {len(values)} values, the header {len(header)} columns (a {name} "
                         f"inside a value that is not quoted, which would cut the value there?)")
    return dict(zip(header, values))


def read_lines(path: Path, parse: Callable[[str], T] = str) -> list[T]:
    """The non-blank lines of a text file without their line endings (CRLF tolerated), passed through
    `parse`; a line it refuses, or a file without any, raises `BenchmarkDataError` naming the file (and
    the line)."""
    with _named_errors(path), open(path, encoding="utf-8") as handle:
        lines = [(f"line {number}", line.rstrip("\r\n")) for number, line in enumerate(handle, start=1)]
    return _some(path, parse_rows(path, [(where, line) for where, line in lines if line.strip()], parse))


@contextmanager
def _named_errors(path: Path) -> Iterator[None]:
    """A local benchmark file that is not UTF-8, not valid CSV or not gzip raises a ValueError naming
    the file (the parsers' own messages say only where in it) and the fix."""
    try:
        yield
    except (UnicodeDecodeError, csv.Error, EOFError, gzip.BadGzipFile) as error:
        raise ValueError(f"benchmark file {path} could not be read: {error}; {DATA_FIX}") from None


def seeded_sample(items: Sequence[T], n: int, seed: int) -> list[T]:
    """`n` items drawn without replacement in a random order fixed by `seed` (all of them,
    shuffled, when `n >= len(items)`)."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[index] for index in order[:n]]
