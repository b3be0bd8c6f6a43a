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
from pathlib import Path
from typing import Any, Iterable

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


def cell_key(config_key: str, task: str, n_examples: int, max_new_tokens: int) -> str:
    """Identifier of one cell: a decoding configuration on a task at a size and length."""
    return f"{config_key}|{task}|n={n_examples}|max_new_tokens={max_new_tokens}"


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record and flush it to disk (a kill right after loses nothing). A line torn by
    an earlier kill is ended first, so it cannot swallow this record."""
    with open(path, "a+b") as handle:
        if handle.seek(0, os.SEEK_END):
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
        handle.write((json.dumps(record) + "\n").encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; a torn last line (the process was killed mid-write) is skipped."""
    if not path.is_file():
        return []
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


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
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

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
        for record in read_jsonl(self.path / GENERATIONS):
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
        for record in read_jsonl(self.path / FAILURES):
            if record["example_id"] not in answered.get(record["cell"], {}):
                pending.setdefault(record["cell"], {})[record["example_id"]] = record
        return pending

    def runs(self) -> list[dict[str, Any]]:
        """Finished cells, the last record of each cell winning."""
        return list({record["cell"]: record for record in read_jsonl(self.path / RUNS)}.values())

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
