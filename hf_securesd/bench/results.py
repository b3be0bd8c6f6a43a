"""The results directory of a study: its manifest, the per-example generation journal and the
finished cells. Everything is append-only JSON lines, so a killed run loses at most the example
it was generating, and a rerun into the same directory redoes nothing that is recorded.

```
RESULTS/
  study.json          settings that every record depends on (models, dtype, device, k, seed, judge)
  .lock               held (fcntl.flock) by the one run writing here; holds its pid
  generations.jsonl   one line per generated example: cell, example id, response, seconds, stats
  failures.jsonl      one line per prompt the engine could not answer (cell, example id, error);
                      never scored, and retried by the next run (an answer in generations wins)
  runs.jsonl          one line per finished cell (configuration x task): scores, AR, SPD, PRR
  report/             written by `securesd report`
```
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping

from hf_securesd.stats import SpeculativeStats

MANIFEST = "study.json"
GENERATIONS = "generations.jsonl"
RUNS = "runs.jsonl"
FAILURES = "failures.jsonl"
LOCK = ".lock"
# manifest keys that must agree between runs written into the same directory
BINDING_KEYS = (
    "target",
    "draft",
    "device",
    "dtype",
    "num_assistant_tokens",
    "batch_size",
    "seed",
    "judge",
    "judge_options",
    "decoding",
    "engine",
)
# the value a manifest written before a key existed stands for
BINDING_DEFAULTS = {"engine": "hf"}
# the fields every record of a journal holds, with their JSON types (what the readers rely on)
GENERATION_FIELDS: Mapping[str, type | tuple[type, ...]] = {"cell": str, "example_id": str, "response": str,
                                                            "seconds": (int, float)}
FAILURE_FIELDS: Mapping[str, type | tuple[type, ...]] = {"cell": str, "example_id": str}
RUN_FIELDS: Mapping[str, type | tuple[type, ...]] = {
    "cell": str, "config_key": str, "config": dict, "task": str, "task_kind": str, "baseline_id": str,
    "n": int, "max_new_tokens": int, "example_ids": list, "scores": list, "responses": list,
}
# per-example lists of a run record, aligned with its example_ids
RUN_LISTS = ("scores", "responses")
Check = Callable[[dict[str, Any]], str | None]  # a record -> what is wrong with it, or None
CORRUPT_FIX = "securesd never writes this: restore the file from a backup, or start a new --out directory"
CORRUPT_LINE_FIX = ("securesd never writes such a line: restore the file from a backup (if a run was killed "
                    "while writing this line, deleting the line is enough), or start a new --out directory")
_UNREADABLE = object()  # what `_parse_json` gives for a line that is not JSON
_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


class CorruptResultsError(ValueError):
    """A results file holds something securesd never writes there (not a torn last line)."""


def cell_key(config_key: str, task: str, n_examples: int, max_new_tokens: int) -> str:
    """Identifier of one cell: a decoding configuration on a task at a size and length."""
    return f"{config_key}|{task}|n={n_examples}|max_new_tokens={max_new_tokens}"


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record and flush it to disk (a kill right after loses nothing). A line torn by
    an earlier kill is cut off first (a whole record that lacks only its newline gets it), so the
    file never holds a broken line that is not its last."""
    with open(path, "a+b") as handle:
        _mend_tail(handle)
        handle.write((json.dumps(record) + "\n").encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def _mend_tail(handle: BinaryIO) -> None:
    """End the file of `handle` with a newline: a last line without one is kept when it is JSON
    (a record whose newline was not written), else truncated (a write torn by a kill)."""
    size = handle.seek(0, os.SEEK_END)
    start = _last_line_start(handle, size)
    if start == size:
        return
    handle.seek(start)
    if _parse_json(handle.read(size - start)) is _UNREADABLE:
        handle.truncate(start)
    else:
        handle.write(b"\n")


def _last_line_start(handle: BinaryIO, size: int, block: int = 1 << 16) -> int:
    """Offset just past the file's last newline (0 without one; `size` when it ends in one)."""
    end = size
    while end > 0:
        begin = max(0, end - block)
        handle.seek(begin)
        newline = handle.read(end - begin).rfind(b"\n")
        if newline >= 0:
            return begin + newline + 1
        end = begin
    return 0


def _parse_json(raw: bytes) -> Any:
    """The JSON value of `raw` (a line, or a whole file), or `_UNREADABLE` when it is not valid
    UTF-8 JSON."""
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return _UNREADABLE


def read_jsonl(path: Path, check: Check | None = None) -> list[dict[str, Any]]:
    """Records of a JSON-lines file, each a JSON object that `check` (record -> problem or None)
    accepts. Only a torn last line (no newline, not valid JSON: the writer was killed mid-write) is
    skipped; any other line that is not such a record raises `CorruptResultsError` naming the file
    and the line."""
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    if lines[-1] == b"" or _parse_json(lines[-1]) is _UNREADABLE:
        lines.pop()  # nothing after the last newline, or a torn write
    records = []
    for number, raw in enumerate(lines, start=1):
        value = _parse_json(raw)
        problem = "not valid JSON" if value is _UNREADABLE else _record_problem(value, check)
        if problem:
            raise CorruptResultsError(f"{path}, line {number}: {problem}; {CORRUPT_LINE_FIX}")
        records.append(value)
    return records


def _record_problem(value: Any, check: Check | None) -> str | None:
    """What keeps `value` from being a record that `check` accepts, or None."""
    if not isinstance(value, dict):
        return f"a JSON {_JSON_TYPES.get(type(value), type(value).__name__)}, not a record (a JSON object)"
    return None if check is None else check(value)


def fields_problem(record: dict[str, Any], expected: Mapping[str, type | tuple[type, ...]]) -> str | None:
    """The fields of `expected` (name -> Python type) that `record` lacks or holds with another type."""
    wrong = [name for name, kind in expected.items() if not isinstance(record.get(name), kind)]
    return f"a record without a valid {', '.join(map(repr, wrong))}" if wrong else None


def run_problem(record: dict[str, Any]) -> str | None:
    """What keeps `record` from being a finished cell of runs.jsonl, or None."""
    problem = fields_problem(record, RUN_FIELDS)
    if problem:
        return problem
    if not isinstance(record["config"].get("kind"), str):
        return "a run whose config has no 'kind'"
    uneven = [name for name in RUN_LISTS if len(record[name]) != len(record["example_ids"])]
    return f"a run whose {' and '.join(uneven)} do not match its example_ids" if uneven else None


def stats_from_dict(values: dict[str, Any]) -> SpeculativeStats:
    """Inverse of `SpeculativeStats.to_dict()` (derived fields are ignored)."""
    return SpeculativeStats(**{field.name: values[field.name] for field in fields(SpeculativeStats)})


class ResultsDirInUseError(RuntimeError):
    """Another run holds the results directory."""


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as JSON atomically (`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(value, indent=2) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` through a temporary file of this writer's own, then rename it into place:
    readers see the old or the new file, never a mix, whoever else writes."""
    handle = tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                         delete=False, encoding="utf-8")
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, 0o644)
        os.replace(handle.name, path)
    finally:
        Path(handle.name).unlink(missing_ok=True)


class ResultsDir:
    """A study's results directory (created on first use). A run `lock()`s it (`open` does) for
    as long as it writes: a second run into the same directory fails at once, naming the pid that
    holds it. The lock is released by `close()` or when the process ends, however it ends."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Take the directory's exclusive lock (no-op when this object holds it already)."""
        if self._lock_fd is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ResultsDirInUseError(
                f"{self.path} is in use by another run (pid {holder}); wait for it to finish or "
                f"use another --out directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        """Release the lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> ResultsDir:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def read_manifest(self) -> dict[str, Any]:
        """The manifest; raises if this is not a results directory."""
        if not self.manifest_path.is_file():
            raise FileNotFoundError(
                f"{self.path} is not a results directory (no {MANIFEST}); "
                f"run `securesd bench --out {self.path}` first"
            )
        manifest = _parse_json(self.manifest_path.read_bytes())
        if not isinstance(manifest, dict):
            found = "not valid JSON" if manifest is _UNREADABLE else _record_problem(manifest, None)
            raise CorruptResultsError(f"{self.manifest_path}: {found}; {CORRUPT_FIX}")
        return manifest

    def open(self, manifest: dict[str, Any], session: dict[str, Any]) -> None:
        """Lock the directory (see the class docstring), create it or check that an existing one
        was written with the same settings, then record this session (id, host, start time) in
        the manifest."""
        self.lock()
        if self.manifest_path.is_file():
            existing = self.read_manifest()
            def setting(values: dict[str, Any], key: str) -> Any:
                return values.get(key, BINDING_DEFAULTS.get(key))

            clashes = [key for key in BINDING_KEYS if setting(existing, key) != setting(manifest, key)]
            if clashes:
                detail = "; ".join(
                    f"{key}: {setting(existing, key)!r} there, {setting(manifest, key)!r} now"
                    for key in clashes
                )
                raise ValueError(
                    f"{self.path} holds results for other settings ({detail}); "
                    f"use a new --out directory or the same settings"
                )
            manifest = {**existing, **{key: value for key, value in manifest.items() if key != "sessions"}}
            manifest["sessions"] = [*existing.get("sessions", []), session]
        else:
            manifest = {**manifest, "sessions": [session]}
        write_json_atomic(self.manifest_path, manifest)

    def generations(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Journaled generations: cell key -> example id -> record."""
        journal: dict[str, dict[str, dict[str, Any]]] = {}
        for record in read_jsonl(self.path / GENERATIONS, partial(fields_problem, expected=GENERATION_FIELDS)):
            journal.setdefault(record["cell"], {})[record["example_id"]] = record
        return journal

    def add_generation(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / GENERATIONS, record)

    def add_failure(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / FAILURES, record)

    def failures(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Prompts still without an answer: cell key -> example id -> the last failure record."""
        answered = self.generations()
        pending: dict[str, dict[str, dict[str, Any]]] = {}
        for record in read_jsonl(self.path / FAILURES, partial(fields_problem, expected=FAILURE_FIELDS)):
            if record["example_id"] not in answered.get(record["cell"], {}):
                pending.setdefault(record["cell"], {})[record["example_id"]] = record
        return pending

    def runs(self) -> list[dict[str, Any]]:
        """Finished cells, the last record of each cell winning."""
        return list({record["cell"]: record for record in read_jsonl(self.path / RUNS, run_problem)}.values())

    def add_run(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / RUNS, record)

    def replace_runs(self, records: Iterable[dict[str, Any]]) -> None:
        """Rewrite runs.jsonl with `records` (one per cell), atomically; the caller holds the lock."""
        write_text_atomic(self.path / RUNS, "".join(json.dumps(record) + "\n" for record in records))


def baselines(runs: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, baseline id) -> the target-only or draft-only cell; the baseline id names the task,
    size and length, so it pairs each cell with the baselines it is compared against."""
    return {
        (run["config"]["kind"], run["baseline_id"]): run
        for run in runs
        if run["config"]["kind"] in ("target", "draft")
    }
