"""The results directory of a study: its manifest, the per-example generation journal and the
finished cells. Everything is append-only JSON lines, so a killed run loses at most the example
it was generating, and a rerun into the same directory redoes nothing that is recorded.

What is written is standard JSON: a NaN (a score the judge's ``unparsed=exclude`` policy left out)
is written as null, and `ResultsDir.runs` reads a null score back as NaN. The API keys a run uses
(`ResultsDir` ``secrets``, and the values `hf_securesd.judges.secrets.known_secrets` knows) are
redacted from every string written, model names and answers a server echoed them in included.

```
RESULTS/
  study.json          settings that every record depends on (models, dtype, device, k, seed, judge,
                      the judge's model and endpoint, the endpoints' URLs; for the openai engine its
                      API, baseline endpoints, prompt tokenizer and --token-ids)
  .lock               held (fcntl.flock) by the one run writing here; holds its pid
  generations.jsonl   one line per generated example: cell, example id, response, seconds, stats
  failures.jsonl      one line per prompt the engine could not answer (cell, example id, error);
                      never scored, and retried by the next run (an answer in generations wins)
  runs.jsonl          one line per finished cell (configuration x task): scores, AR, SPD, PRR
  report/             written by `securesd report`
```

The lock and the journals are written in place, never through a symbolic link at their names (a link
in a results directory received from someone else could point at any file of the user's): such a link
is refused (`UnsafeResultsFileError`), as is a name that is not a regular file. Whole files are written
through a temporary file renamed into place (`write_text_atomic`), which replaces a link.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import inspect
import json
import math
import numbers
import os
import re
import shlex
import stat
import tempfile
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping

from hf_securesd.bench import json_input
from hf_securesd.bench.manifest_checks import manifest_problem
from hf_securesd.bench.run_records import (  # noqa: F401
    MAX_SECONDS,
    cell_key,
    fields_problem,
    run_problem,
    stats_problem,
)
from hf_securesd.bench.tasks import DEFAULT_SEED
from hf_securesd.http_deadline import has_lone_surrogate
from hf_securesd.judges.secrets import redact_value
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
    "api",
    "baseline_endpoint",
    "draft_baseline_endpoint",
    "thinking_trace",
)
# the value a binding setting stands for where a manifest records none (no key: written before the
# key existed; or null: the seed of a run without --seed, each task's own)
BINDING_DEFAULTS = {"engine": "hf", "seed": DEFAULT_SEED, "thinking_trace": "yes"}
# binding settings whose recorded absence the option must give as its value: leaving the option out picks
# another one (--thinking-trace auto reads the tokenizer), so a fix says "--thinking-trace yes"
GIVEN_DEFAULTS = ("thinking_trace",)
# the option that sets each binding setting (named in the fix of a clash)
BINDING_FLAGS = {"target": "--target", "draft": "--draft", "device": "--device", "dtype": "--dtype",
                 "num_assistant_tokens": "--num-assistant-tokens", "batch_size": "--batch-size", "seed": "--seed",
                 "judge": "--judge", "judge_options": "--judge-option", "engine": "--engine",
                 "api": "--chat", "baseline_endpoint": "--baseline", "draft_baseline_endpoint": "--draft-baseline",
                 "tokenizer": "--tokenizer", "token_ids": "--token-ids", "thinking_trace": "--thinking-trace"}
# binding settings an on/off option sets: key -> the value the option records (else it was left out)
SWITCH_VALUES = {"api": "chat/completions", "token_ids": True}
# what sets the target and draft an engine that generates on servers records
REMOTE_MODEL_FLAGS = {"target": "set by the --baseline endpoint's --endpoint-model, else --model, else --baseline "
                                "NAME as endpoint:NAME, else --base-url",
                      "draft": "set by --draft-baseline NAME as endpoint:NAME, else none"}
# bound only where both manifests record them (a manifest written before they were is not checked):
# the judge's model, and how the openai engine sends prompts (the tokenizer whose chat template builds
# them, null with --chat; whether they go as token ids)
RECORDED_BINDING_KEYS = ("judge_backend", "tokenizer", "token_ids")
# settings of this process's models (k: their draft tokens per round): not bound for an engine that
# generates on servers (which choose them; recorded as null)
LOCAL_KEYS = ("device", "dtype", "num_assistant_tokens")
REMOTE_ENGINES = frozenset({"openai"})
SAME_SETTINGS_FIX = "use a new --out directory or the same settings"
# how to resolve a clash of a key whose cells cannot simply be rerun with the recorded setting
CLASH_FIXES = {
    "judge_backend": "the recorded verdicts come from another judge: use a new --out directory, point "
                     "SECURESD_JUDGE_BASE_URL / SECURESD_JUDGE_MODEL back at the recorded judge, or rescore "
                     "the directory with this judge first (securesd rescore {path} --tasks TASKS --judge-base-url "
                     "URL --judge-model MODEL, naming every task the judge scored)",
    "endpoints": "an endpoint's cells hold one deployment's answers: give it its recorded URL, or give the "
                 "new deployment another --endpoint name",
    "thinking_trace": "or move the directory to the rule given now: securesd rescore {path} --tasks TASKS "
                      "--thinking-trace yes|no, naming every safety task it holds, rescores them by that rule "
                      "(--thinking-trace auto is yes only when the "
                      "target's tokenizer has </think> as one token; without a tokenizer, as for an openai "
                      "--chat endpoint, it is no)",
    "resolved_models": "a cell holds one model's answers: name the recorded model there again (with "
                       "--endpoint-model NAME=MODEL, or --model; without either, serve it first in its /models "
                       "list), or use a new --out directory",
}
# manifest keys that map names (of endpoints, of routes) to what a session bound to them: a later session
# keeps the names of the earlier ones and adds its own (`binding_clashes` checks the names both hold)
MERGED_KEYS = ("endpoints", "resolved_models")
# the fields every record of a journal holds, with their JSON types (what the readers rely on)
GENERATION_FIELDS: Mapping[str, type | tuple[type, ...]] = {"cell": str, "example_id": str, "response": str,
                                                            "seconds": (int, float), "new_tokens": int,
                                                            "session": str}
FAILURE_FIELDS: Mapping[str, type | tuple[type, ...]] = {"cell": str, "example_id": str}
Check = Callable[[dict[str, Any]], str | None]  # a record -> what is wrong with it, or None
CORRUPT_FIX = "securesd never writes this: restore the file from a backup, or start a new --out directory"
CORRUPT_LINE_FIX = ("securesd never writes such a line: restore the file from a backup (if a run was killed "
                    "while writing this line, deleting the line is enough), or start a new --out directory")
_UNREADABLE = object()  # what `_parse_json` gives for a line that is not JSON
UNREADABLE_JSON = "not valid JSON (or nested too deeply to read)"  # the problem named for `_UNREADABLE`
_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
# how JSON text spells half of a UTF-16 surrogate pair (a line without one holds no lone surrogate)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# why a lone surrogate is refused (one parses from a JSON escape without its pair's other half)
NOT_TEXT = "(a JSON escape such as \\ud800 without its pair's other half), which is not text"


def generation_problem(record: dict[str, Any]) -> str | None:
    """What keeps a journaled generation from being read back (its fields; its `seconds` and
    `new_tokens`, which a finished cell's record must accept; its `stats`: null or
    `SpeculativeStats.to_dict()`), or None."""
    return (fields_problem(record, GENERATION_FIELDS) or _generation_numbers_problem(record)
            or stats_problem(record.get("stats")))


def _generation_numbers_problem(record: dict[str, Any]) -> str | None:
    """A journaled `seconds` above MAX_SECONDS or negative (`fields_problem` has refused other types), a
    `cpu_seconds` that is neither absent, null nor such a time, or a negative `new_tokens`: the cell
    finished from it would be refused."""
    for name in ("seconds", "cpu_seconds"):
        value = record.get(name)
        if name == "cpu_seconds" and value is None:
            continue
        if not _is_time(value):
            return (f"a generation whose {name!r} is {value!r:.40}, not a time from 0 to {MAX_SECONDS:.0e} seconds "
                    "(about 32 years)")
    if record["new_tokens"] < 0:
        return f"a generation whose 'new_tokens' is {record['new_tokens']!r}, a negative count"
    return None


def _is_time(value: Any) -> bool:
    """Whether `value` is a number of seconds securesd writes: an int or float (not a bool) in [0,
    MAX_SECONDS]."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, int) or math.isfinite(value)) and 0 <= value <= MAX_SECONDS)


class CorruptResultsError(ValueError):
    """A results file holds something securesd never writes there (not a torn last line)."""


def json_ready(value: Any) -> Any:
    """`value` with every real number that is not an integer (numpy's included) as a float, each
    NaN or infinite one (at any depth) replaced by None, and tuples by lists: what `json.dumps`
    writes of it is standard JSON (null, never the NaN token)."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def json_text(value: Any, indent: int | None = None, default: Callable[[Any], Any] | None = None) -> str:
    """`value` as standard JSON (`json_ready`); `default` as for `json.dumps`."""
    return json.dumps(json_ready(value), indent=indent, allow_nan=False, default=default)


class UnsafeResultsFileError(ValueError):
    """A file securesd writes in place (the lock, a journal) is a symbolic link or not a regular file."""


def open_in_place(path: Path, flags: int) -> int:
    """A descriptor for the regular file `path` itself, opened with `flags` (`os.O_CREAT` creates it):
    never through a symbolic link at `path`, never a FIFO, device or folder there, never a file with other
    names (a hard link). A results directory received from someone else (or unpacked from an archive) may
    hold a link at a file's name pointing at any file of the user's, which appending, truncating a torn
    line or writing a pid would change: `UnsafeResultsFileError` instead."""
    fix = (f"securesd writes {path.name} in place and never through a link; remove it (securesd recreates "
           f"it) or start a new --out directory")
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeResultsFileError(f"{path} is a symbolic link: {fix}") from None
        if error.errno == errno.EISDIR:
            raise UnsafeResultsFileError(f"{path} is not a regular file: {fix}") from None
        raise
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise UnsafeResultsFileError(f"{path} is not a regular file: {fix}")
    if status.st_nlink > 1:  # a hard link shares its contents with a file elsewhere
        os.close(fd)
        raise UnsafeResultsFileError(
            f"{path} shares its contents with {status.st_nlink - 1} other name(s) (a hard link, as `cp -al` or "
            f"`rsync --link-dest` copies make), which writing it in place would change too; give it contents of "
            f"its own, keeping them: cp -p {shlex.quote(str(path))} {shlex.quote(str(path))}.own && "
            f"mv {shlex.quote(str(path))}.own {shlex.quote(str(path))}")
    return fd


def read_in_place(path: Path) -> bytes:
    """The contents of the regular file `path` itself: never through a symbolic link at `path` (a results
    directory received from someone else may hold one pointing at any file of the reader's, which a report
    or card would then show), never a FIFO or device (a read that never ends): `UnsafeResultsFileError`.
    A hard link is read (a `cp -al` backup of a results directory is the usual one)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeResultsFileError(
                f"{path} is a symbolic link: securesd reads results files only in place (a link could show "
                "any file of yours in a report); replace the link with the file itself if you trust it"
            ) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeResultsFileError(f"{path} is not a regular file; results files are regular files")
        return handle.read()


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record (standard JSON, `json_text`) and flush it to disk (a kill right after
    loses nothing). A line torn by an earlier kill is cut off first (a whole record that lacks only
    its newline gets it), so the file never holds a broken line that is not its last. The file is
    written in place only (`open_in_place`: never through a link)."""
    with os.fdopen(open_in_place(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+b") as handle:
        _mend_tail(handle)
        handle.write((json_text(record) + "\n").encode("utf-8"))
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
    UTF-8 JSON (or is nested too deeply to read)."""
    try:
        return json_input.loads(raw.decode("utf-8"))
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return _UNREADABLE


def _lone_surrogate(value: Any, raw: bytes) -> str | None:
    """Where the JSON `value`, parsed from `raw`, holds a lone surrogate (`NOT_TEXT`: no UTF-8 file or
    terminal can take it), as a path such as ``'responses'[0]`` (``the name 'details'[0]['\\udc80']``
    for an object's key), or None. Only a `raw` that spells a surrogate escape is searched (an escaped
    pair, e.g. of an emoji, parses to one character)."""
    return _surrogate_path(value, "") if _SURROGATE_ESCAPE.search(raw) else None


def _surrogate_path(value: Any, path: str) -> str | None:
    """The path in `value` below `path` of the first string or name holding a lone surrogate, or None."""
    if isinstance(value, str):
        return path if has_lone_surrogate(value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        inner = f"{path}[{key!r}]" if path else repr(key)
        if isinstance(key, str) and has_lone_surrogate(key):
            return f"the name {inner}"
        found = _surrogate_path(item, inner)
        if found:
            return found
    return None


def read_jsonl(path: Path, check: Check | None = None) -> list[dict[str, Any]]:
    """Records of a JSON-lines file, each a JSON object without a lone surrogate (`_lone_surrogate`)
    that `check` (record -> problem or None) accepts. Only a torn last line (no newline, not valid
    JSON: the writer was killed mid-write) is skipped; any other line that is not such a record raises
    `CorruptResultsError` naming the file and the line."""
    if not path.is_file():
        return []
    lines = read_in_place(path).split(b"\n")
    if lines[-1] == b"" or _parse_json(lines[-1]) is _UNREADABLE:
        lines.pop()  # nothing after the last newline, or a torn write
    records = []
    for number, raw in enumerate(lines, start=1):
        value = _parse_json(raw)
        problem = UNREADABLE_JSON if value is _UNREADABLE else _record_problem(value, check, raw)
        if problem:
            raise CorruptResultsError(f"{path}, line {number}: {problem}; {CORRUPT_LINE_FIX}")
        records.append(value)
    return records


def _record_problem(value: Any, check: Check | None, raw: bytes = b"") -> str | None:
    """What keeps `value` (parsed from `raw`) from being a record without a lone surrogate that `check`
    accepts, or None."""
    if not isinstance(value, dict):
        return f"a JSON {_JSON_TYPES.get(type(value), type(value).__name__)}, not a record (a JSON object)"
    where = _lone_surrogate(value, raw)
    if where:
        return f"a record with a lone surrogate in {where} {NOT_TEXT}"
    return None if check is None else check(value)


def _scores_as_read(run: dict[str, Any]) -> dict[str, Any]:
    """`run` with its null scores (written for NaN: a verdict left out) read back as NaN."""
    run["scores"] = [math.nan if score is None else score for score in run["scores"]]
    if run.get("score", math.nan) is None:
        run["score"] = math.nan
    return run


def effective_judge_options(judge: str | None, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options judge `judge` runs with, given `options`: every constructor argument, its default
    where not given, so that spelling out a default changes nothing. A string-matching judge
    (`describe_judge` None: nothing is loaded to build it) is built, and what it resolved an argument
    to replaces the argument (RefusalPrefixJudge's ``match``, None by default). An unknown judge, or
    options it refuses, give `options` with the defaults."""
    from hf_securesd.judges import JUDGES, describe_judge, get_judge

    if judge not in JUDGES:
        return dict(options)
    parameters = inspect.signature(JUDGES[judge]).parameters
    values = {key: parameter.default for key, parameter in parameters.items()
              if parameter.default is not parameter.empty}
    values.update(options)
    if describe_judge(judge, options) is not None:
        return values
    try:
        built = get_judge(judge, **dict(options))
    except (TypeError, ValueError):
        return values
    return {key: getattr(built, key, value) for key, value in values.items()}


def binding_value(values: dict[str, Any], key: str) -> Any:
    """What binding setting `key` of manifest `values` amounts to: its `BINDING_DEFAULTS` value where
    it records none; the judge options as the judge runs with them (`effective_judge_options`)."""
    value = values.get(key)
    value = BINDING_DEFAULTS.get(key) if value is None else value
    if key == "judge_options":
        return effective_judge_options(values.get("judge"), value or {})
    if key in REMOTE_MODEL_FLAGS and isinstance(value, str) and values.get("engine") in REMOTE_ENGINES:
        return value.rstrip("/")  # a server's URL with or without its trailing slash
    return value


def binding_clashes(existing: dict[str, Any], manifest: dict[str, Any]) -> dict[str, str]:
    """The binding settings that differ between the manifest of a results directory (`existing`)
    and that of a new run (`manifest`): key -> what differs. Settings are compared by what they
    amount to (`binding_value`: ``--seed 0`` is the default seed), and shown as recorded. `LOCAL_KEYS`
    are not bound for `REMOTE_ENGINES`, `RECORDED_BINDING_KEYS` only where both record them, and
    endpoints by name: an endpoint both name must have the same URL (new names add cells); so must the
    model a server's requests name without --model (`resolved_model_clash`)."""
    def setting(values: dict[str, Any], key: str) -> Any:
        return values.get(key, BINDING_DEFAULTS.get(key))

    remote = setting(manifest, "engine") in REMOTE_ENGINES
    keys = [key for key in BINDING_KEYS if not (remote and key in LOCAL_KEYS)]
    keys += [key for key in RECORDED_BINDING_KEYS if key in existing and key in manifest]
    clashes = {
        key: f"{key}: {setting(existing, key)!r} there, {setting(manifest, key)!r} now"
        for key in keys
        if binding_value(existing, key) != binding_value(manifest, key)
    }
    if "judge" in clashes and (existing.get("judge_options") or {}) == (manifest.get("judge_options") or {}):
        clashes.pop("judge_options", None)  # the same options, other defaults only because the judge changed
    before, now = existing.get("endpoints") or {}, manifest.get("endpoints") or {}
    moved = [f"endpoint {name!r}: {before[name]!r} there, {now[name]!r} now"
             for name in before.keys() & now.keys() if before[name].rstrip("/") != now[name].rstrip("/")]
    if moved:
        clashes["endpoints"] = "; ".join(sorted(moved))
    resolved = resolved_model_clash(named_values(existing, "resolved_models"),
                                    named_values(manifest, "resolved_models"))
    if resolved:
        clashes["resolved_models"] = resolved
    return clashes


def named_values(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    """The name -> value object `manifest` records under `key` (one of `MERGED_KEYS`), or {} where it
    records none (or not an object)."""
    values = manifest.get(key)
    return values if isinstance(values, dict) else {}


def resolved_model_clash(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What differs between the models two sessions' requests named (the ``openai`` engine's
    `resolved_models`: route -> its --endpoint-model, else --model, else the first its /models listed), for each route both
    record, naming both models; None when nothing does. Without this a resumed run would fill the
    gaps of a cell with another model's answers when its server lists another model first."""
    changed = [f"{route} {before[route]!r} there, {now[route]!r} now"
               for route in sorted(before.keys() & now.keys()) if before[route] != now[route]]
    if not changed:
        return None
    return ("the model each route's requests name (--endpoint-model, else --model, else the first its /models "
            "lists): " + "; ".join(changed))


def recorded_option(key: str, value: Any, engine: str | None = None) -> str:
    """The command-line form of binding setting `key` recorded as `value`: ``--dtype bf16``,
    ``--judge-option match=start``, ``--seed left out``, ``--chat`` (`SWITCH_VALUES`); for an engine that generates on servers the
    target and draft are what its server options name (`REMOTE_MODEL_FLAGS`)."""
    if engine in REMOTE_ENGINES and key in REMOTE_MODEL_FLAGS:
        return f"the {key} {value!r} ({REMOTE_MODEL_FLAGS[key]})"
    flag = BINDING_FLAGS[key]
    if value is None and key in GIVEN_DEFAULTS:  # written before the setting was recorded: give its value
        value = BINDING_DEFAULTS[key]
    if key in SWITCH_VALUES:
        return flag if value == SWITCH_VALUES[key] else f"{flag} left out"
    if value is None or value == {}:
        return f"{flag} left out"
    if key == "judge_options":
        return " ".join(f"{flag} {shlex.quote(f'{name}={option}')}" for name, option in value.items())
    return f"{flag} {shlex.quote(str(value))}"


def clash_fixes(clashes: Mapping[str, str], existing: dict[str, Any], path: Path) -> list[str]:
    """How to resolve `clashes` (`binding_clashes`) with the results directory `path` whose manifest
    is `existing`: a setting an option sets, by giving the recorded value again (or a new --out);
    the others as `CLASH_FIXES` says (the judge's model: `securesd rescore`), else `SAME_SETTINGS_FIX`."""
    engine = existing.get("engine")
    recorded = [recorded_option(key, existing.get(key), engine) for key in clashes if key in BINDING_FLAGS]
    fixes = [f"give the recorded {'setting' if len(recorded) == 1 else 'settings'} again "
             f"({', '.join(recorded)}) or use a new --out directory"] if recorded else []
    fixes += [CLASH_FIXES[key].format(path=path) for key in clashes if key in CLASH_FIXES]
    return fixes or [SAME_SETTINGS_FIX]


def stats_from_dict(values: dict[str, Any]) -> SpeculativeStats:
    """Inverse of `SpeculativeStats.to_dict()` (derived fields are ignored)."""
    return SpeculativeStats(**{field.name: values[field.name] for field in fields(SpeculativeStats)})


class ResultsDirInUseError(RuntimeError):
    """Another run holds the results directory."""


def write_json_atomic(path: Path, value: Any) -> None:
    """Write `value` as standard JSON (`json_text`) atomically (`write_text_atomic`)."""
    write_text_atomic(path, json_text(value, indent=2) + "\n")


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
    holds it. The lock is released by `close()` or when the process ends, however it ends.
    `secrets` (the API keys the run sends) are redacted, with the keys `redact` always knows, from
    every record and manifest written here."""

    def __init__(self, path: str | os.PathLike, secrets: Iterable[str] = ()) -> None:
        self.path = Path(path).expanduser()
        self._lock_fd: int | None = None
        self._secrets = tuple(secrets)

    def redacted(self, record: Any) -> Any:
        """`record` with the known secrets redacted from every string in it (`redact_value`)."""
        return redact_value(record, self._secrets)

    def lock(self) -> None:
        """Take the directory's exclusive lock (no-op when this object holds it already)."""
        if self._lock_fd is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        fd = open_in_place(self.path / LOCK, os.O_RDWR | os.O_CREAT)
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
        """The manifest; raises if this is not a results directory (naming a file as such: `bench`
        refuses a file for --out, so its "run bench first" would not help)."""
        if self.path.exists() and not self.path.is_dir():
            raise FileNotFoundError(
                f"{self.path} is a file, not a results directory; pass the folder `securesd bench --out` "
                f"wrote (the one holding {MANIFEST})"
            )
        if not self.manifest_path.is_file():
            raise FileNotFoundError(
                f"{self.path} is not a results directory (no {MANIFEST}); "
                f"run `securesd bench --out {self.path}` first"
            )
        manifest = _parse_json(read_in_place(self.manifest_path))
        if not isinstance(manifest, dict):
            found = UNREADABLE_JSON if manifest is _UNREADABLE else _record_problem(manifest, None)
            raise CorruptResultsError(f"{self.manifest_path}: {found}; {CORRUPT_FIX}")
        problem = manifest_problem(manifest)
        if problem:
            raise CorruptResultsError(f"{self.manifest_path}: {problem}; {CORRUPT_FIX}")
        return manifest


    def open(self, manifest: dict[str, Any], session: dict[str, Any]) -> None:
        """Lock the directory (see the class docstring), create it or check that an existing one
        was written with the same settings (`binding_clashes`), then record this session (id,
        host, start time) in the manifest."""
        self.lock()
        manifest, session = self.redacted(manifest), self.redacted(session)
        if self.manifest_path.is_file():
            existing = self.read_manifest()
            clashes = binding_clashes(existing, manifest)
            if clashes:
                raise ValueError(f"{self.path} holds results for other settings ({'; '.join(clashes.values())}); "
                                 + "; ".join(clash_fixes(clashes, existing, self.path)))
            merged = {key: {**named_values(existing, key), **named_values(manifest, key)}
                      for key in MERGED_KEYS}
            manifest = {**existing, **{key: value for key, value in manifest.items() if key != "sessions"}}
            manifest.update({key: values for key, values in merged.items() if values})
            manifest["sessions"] = [*existing.get("sessions", []), session]
        else:
            manifest = {**manifest, "sessions": [session]}
        write_json_atomic(self.manifest_path, manifest)

    def generations(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Journaled generations: cell key -> example id -> record."""
        journal: dict[str, dict[str, dict[str, Any]]] = {}
        for record in read_jsonl(self.path / GENERATIONS, generation_problem):
            journal.setdefault(record["cell"], {})[record["example_id"]] = record
        return journal

    def add_generation(self, record: dict[str, Any]) -> dict[str, Any]:
        """Journal one generation; returns the record as written (secrets redacted), which is what
        a later session reads back and scores."""
        written = self.redacted(record)
        append_jsonl(self.path / GENERATIONS, written)
        return written

    def add_failure(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / FAILURES, self.redacted(record))

    def failures(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Prompts still without an answer: cell key -> example id -> the last failure record."""
        answered = self.generations()
        pending: dict[str, dict[str, dict[str, Any]]] = {}
        for record in read_jsonl(self.path / FAILURES, partial(fields_problem, expected=FAILURE_FIELDS)):
            if record["example_id"] not in answered.get(record["cell"], {}):
                pending.setdefault(record["cell"], {})[record["example_id"]] = record
        return pending

    def runs(self) -> list[dict[str, Any]]:
        """Finished cells, the last record of each cell winning (null scores read as NaN)."""
        records = read_jsonl(self.path / RUNS, run_problem)
        return [_scores_as_read(record) for record in {record["cell"]: record for record in records}.values()]

    def add_run(self, record: dict[str, Any]) -> None:
        """Append a finished cell's record (a later record of the same cell replaces it)."""
        append_jsonl(self.path / RUNS, self.redacted(record))

    def replace_runs(self, records: Iterable[dict[str, Any]]) -> None:
        """Rewrite runs.jsonl with `records` (one per cell), atomically; the caller holds the lock."""
        lines = [json_text(self.redacted(record)) + "\n" for record in records]
        write_text_atomic(self.path / RUNS, "".join(lines))

    def update_manifest(self, changes: dict[str, Any]) -> None:
        """Set `changes` in the manifest, atomically; the caller holds the lock."""
        write_json_atomic(self.manifest_path, {**self.read_manifest(), **self.redacted(changes)})


def results_path(text: str) -> Path:
    """argparse type of a RESULTS argument: refuses an empty path (which would name the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("RESULTS is empty; name the results directory `securesd bench --out` wrote")
    return Path(text)


def baselines(runs: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, baseline id) -> the target-only or draft-only cell; the baseline id names the task,
    size and length, so it pairs each cell with the baselines it is compared against."""
    return {
        (run["config"]["kind"], run["baseline_id"]): run
        for run in runs
        if run["config"]["kind"] in ("target", "draft")
    }
