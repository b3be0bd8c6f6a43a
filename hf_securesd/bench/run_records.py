"""What a finished cell of runs.jsonl must hold for `bench`, `report`, `rescore` and `calibrate` to
read it: every field those readers use, with its JSON type (numbers finite and within float range,
`finite_real`), per-example lists aligned with the example ids, times, counts and speed-ups never
negative, times no longer than `MAX_SECONDS` (so that sums of them stay finite), no example
accepting more draft tokens than it drafted, scores that are verdicts (0 or 1, null for an excluded
one) whose mean is the cell's score, ``n`` equal to the number of examples, an acceptance rate in
[0, 1] that its statistics make (`acceptance_problem`), a PRR interval of two ordered bounds, speculative
statistics whose counts are counts up to `MAX_COUNT` and whose TV sums lie within their verified counts
(`stats_problem`, also the journal's), and identity
fields that agree (`identity_problem`: cells are told apart by ``cell`` and baselines by
``baseline_id``, so a record relabelled would take another cell's place).

`run_problem` names the first thing wrong with a record (`results.read_jsonl` turns it into one
error line naming the file and the line); it never raises.
"""

from __future__ import annotations

import math
import sys
from dataclasses import fields
from typing import Any, Mapping

from hf_securesd.stats import SpeculativeStats

TypeSpec = type | tuple[type, ...]
_NUMBER = (int, float)
_NUMBER_OR_NULL = (int, float, type(None))
KINDS = ("target", "draft", "speculative", "endpoint")
# the fields every record holds, with their JSON types (`seconds` and `sessions`: what the report
# computes each cell's SPD from, `analysis.derived_fields`)
RUN_FIELDS: Mapping[str, TypeSpec] = {
    "cell": str, "config_key": str, "config": dict, "task": str, "task_kind": str, "metric": str,
    "baseline_id": str, "n": int, "max_new_tokens": int, "example_ids": list, "scores": list,
    "score": _NUMBER_OR_NULL, "responses": list, "wall_time": _NUMBER, "spd_same_session": bool,
    "seconds": list, "sessions": list,
}
# fields of a record that the readers use where present, with their JSON types
OPTIONAL_RUN_FIELDS: Mapping[str, TypeSpec] = {
    "acceptance_rate": _NUMBER_OR_NULL, "spd": _NUMBER_OR_NULL, "prr": _NUMBER_OR_NULL,
    "prr_ci": (list, type(None)), "cpu_time": _NUMBER_OR_NULL, "stats": (dict, type(None)), "details": list,
    "schedule_label": (str, type(None)), "knob_value": _NUMBER_OR_NULL, "new_tokens": list,
    "drafted": (list, type(None)), "accepted": (list, type(None)), "stats_examples": int,
    "examples_digest": str,
}
# the fields a speculative cell holds besides (its sweep's knob and its schedule)
SPECULATIVE_FIELDS = ("knob_value", "schedule_label")
# per-example lists of a record, aligned with its example_ids, with the JSON types of their items
RUN_LIST_ITEMS: Mapping[str, TypeSpec] = {
    "scores": _NUMBER_OR_NULL, "responses": str, "details": dict, "seconds": _NUMBER, "new_tokens": int,
    "drafted": _NUMBER_OR_NULL, "accepted": _NUMBER_OR_NULL,  # null: the reply carried no statistics
}
# numbers of a record that are times, counts or speed-ups, and per-example lists of them: never negative
NON_NEGATIVE_FIELDS = ("wall_time", "cpu_time", "stats_examples", "spd")
NON_NEGATIVE_ITEMS = ("seconds", "new_tokens", "drafted", "accepted")
# times of a record, and per-example lists of them: at most MAX_SECONDS each
DURATION_FIELDS = ("wall_time", "cpu_time")
DURATION_ITEMS = ("seconds",)
# the longest time a record may hold: about 32 years, far above any real run, and small enough that
# the report's sums and ratios of times stay finite (a time of 1e308 overflows them)
MAX_SECONDS = 1e9
# sizes of a record: at least 1 (a cell holds examples, each of at least one new token)
POSITIVE_FIELDS = ("n", "max_new_tokens")
# how far a recorded score may be from the mean of its verdicts (float summation order)
SCORE_TOLERANCE = 1e-9
# lists of `SpeculativeStats` that run in step: (counts, what is counted among them, never more)
PAIRED_STATS = (("drafted_per_round", "accepted_per_round"), ("position_drafted", "position_accepted"),
                ("position_verified", "position_tv_sum"))
# how far a position's TV sum may exceed its verified count (each TV, at most 1, is a float32 sum)
TV_TOLERANCE = 1e-3


def baseline_key(task: str, n_examples: int, max_new_tokens: int) -> str:
    """Identifier of the baselines of a cell (its ``baseline_id``): the task, size and length."""
    return f"{task}|n={n_examples}|max_new_tokens={max_new_tokens}"


def cell_key(config_key: str, task: str, n_examples: int, max_new_tokens: int) -> str:
    """Identifier of one cell: a decoding configuration on a task at a size and length."""
    return f"{config_key}|{baseline_key(task, n_examples, max_new_tokens)}"


def finite_real(value: Any) -> bool:
    """Whether `value` is a JSON number securesd could have written: an int or float (not a boolean)
    that is finite and within float range (an integer such as 10**400 overflows float arithmetic)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and abs(value) <= sys.float_info.max)


def _is(value: Any, kind: TypeSpec) -> bool:
    """`isinstance`, except that a JSON boolean is not a number and a number must be `finite_real`."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, (int, float)):
        return isinstance(value, kinds) and finite_real(value)
    return isinstance(value, kinds)


def fields_problem(record: dict[str, Any], expected: Mapping[str, TypeSpec]) -> str | None:
    """The fields of `expected` (name -> Python type) that `record` lacks or holds with another type."""
    wrong = [name for name, kind in expected.items() if name not in record or not _is(record[name], kind)]
    return f"a record without a valid {', '.join(map(repr, wrong))}" if wrong else None


def optional_fields_problem(record: dict[str, Any], expected: Mapping[str, TypeSpec]) -> str | None:
    """The fields of `expected` (name -> Python type) that `record` holds with another type."""
    wrong = [name for name, kind in expected.items() if name in record and not _is(record[name], kind)]
    return f"a record with an invalid {', '.join(map(repr, wrong))}" if wrong else None


MAX_COUNT = 2**53  # a count securesd writes stays exact as a float, and sums over many cells stay finite


def _count(value: Any) -> bool:
    """Whether `value` is a count securesd writes: an integer from 0 to MAX_COUNT (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def stats_problem(values: Any) -> str | None:
    """What keeps a run's `stats` (null or `SpeculativeStats.to_dict()`) from being read back, or None:
    a field missing or of another type, or items securesd never writes there (`stats_items_problem`)."""
    if values is None:
        return None
    if not isinstance(values, dict):
        return "a record whose 'stats' is neither null nor an object"
    wrong = [field.name for field in fields(SpeculativeStats)
             if not _is(values.get(field.name), list if "list" in str(field.type) else _NUMBER)]
    if wrong:
        return f"a run whose 'stats' lack a valid {', '.join(map(repr, wrong))}"
    return stats_items_problem(values)


def stats_items_problem(values: dict[str, Any]) -> str | None:
    """Items of `stats` (their fields typed) that securesd never writes: a count that is not a count
    (`_count`), a TV sum that is not a finite number, lists of `PAIRED_STATS` of unequal lengths, or an
    item counting more than its pair does (more tokens accepted than drafted, a TV sum above the number
    of verified positions it sums over: each TV is at most 1)."""
    counted = [field.name for field in fields(SpeculativeStats) if "int" in str(field.type)]
    miscounted = [name for name in counted
                  if not all(map(_count, values[name] if isinstance(values[name], list) else [values[name]]))]
    if miscounted:
        names = " and ".join(map(repr, miscounted))
        return f"a run whose 'stats' {names} hold other than counts (integers from 0 to 2**53)"
    if not all(finite_real(value) and value >= 0 for value in values["position_tv_sum"]):
        return "a run whose 'stats' 'position_tv_sum' hold an item that is not a finite number >= 0"
    for whole, part in PAIRED_STATS:
        if len(values[whole]) != len(values[part]):
            return f"a run whose 'stats' {whole!r} and {part!r} are not of one length"
        ceiling = 1 + TV_TOLERANCE if part == "position_tv_sum" else 1
        above = [index for index, (total, value) in enumerate(zip(values[whole], values[part]))
                 if value > total * ceiling]
        if above:
            return (f"a run whose 'stats' {part!r} item {above[0]} ({values[part][above[0]]!r}) exceeds its "
                    f"{whole!r} ({values[whole][above[0]]!r})")
    return None


def config_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with the record's `config` (and, for a speculative cell, its knob and schedule)."""
    from hf_securesd.verifiers import VERIFIERS

    config = record["config"]
    if config.get("kind") not in KINDS:
        return f"a run whose config 'kind' is {config.get('kind')!r}, not one of {', '.join(KINDS)}"
    if config["kind"] != "speculative":
        return None
    verifier = config.get("verifier")
    name = verifier.get("verifier") if isinstance(verifier, dict) else None
    if not isinstance(name, str) or name not in VERIFIERS:
        return (f"a speculative run whose config 'verifier' is {verifier!r}, not a verifier of "
                f"{', '.join(VERIFIERS)}")
    missing = [name for name in SPECULATIVE_FIELDS if name not in record]
    if missing:
        return f"a speculative run without {' and '.join(map(repr, missing))}"
    return None


def lists_problem(record: dict[str, Any]) -> str | None:
    """Per-example lists that are not aligned with the example ids, or hold an item of another type."""
    lists = [name for name in RUN_LIST_ITEMS if isinstance(record.get(name), list)]
    uneven = [name for name in lists if len(record[name]) != len(record["example_ids"])]
    if uneven:
        return f"a run whose {' and '.join(uneven)} do not match its example_ids"
    strings = [name for name in ("example_ids", "sessions")
               if not all(isinstance(item, str) for item in record.get(name) or [])]
    if strings:
        return f"a run whose {' and '.join(map(repr, strings))} hold an item that is not a string"
    mistyped = [name for name in lists if not all(_is(item, RUN_LIST_ITEMS[name]) for item in record[name])]
    if mistyped:
        return (f"a run whose {' and '.join(map(repr, mistyped))} hold an item of another type "
                "(securesd writes no NaN, Infinity or true/false there)")
    return None


def negative_problem(record: dict[str, Any]) -> str | None:
    """Times, counts or speed-ups of a record (`NON_NEGATIVE_FIELDS`, `NON_NEGATIVE_ITEMS`) that are
    negative, and examples that accepted more draft tokens than they drafted."""
    negative = [name for name in NON_NEGATIVE_FIELDS if (record.get(name) or 0) < 0]
    negative += [name for name in NON_NEGATIVE_ITEMS
                 if any(item is not None and item < 0 for item in record.get(name) or [])]
    if negative:
        return f"a run whose {' and '.join(map(repr, negative))} hold a negative time, count or speed-up"
    pairs = enumerate(zip(record.get("drafted") or [], record.get("accepted") or []))
    above = [index for index, (drafted, accepted) in pairs
             if (drafted is None) != (accepted is None) or (drafted is not None and accepted > drafted)]
    if above:
        first = above[0]
        return (f"a run whose example {first} has 'accepted' {record['accepted'][first]!r} of 'drafted' "
                f"{record['drafted'][first]!r}; an example holds both counts or neither, and accepts at "
                "most the tokens it drafted")
    return None


def duration_problem(record: dict[str, Any]) -> str | None:
    """Times of a record (`DURATION_FIELDS`, `DURATION_ITEMS`) longer than `MAX_SECONDS`."""
    long = [name for name in DURATION_FIELDS if (record.get(name) or 0) > MAX_SECONDS]
    long += [name for name in DURATION_ITEMS if any(item > MAX_SECONDS for item in record.get(name) or [])]
    if long:
        return (f"a run whose {' and '.join(map(repr, long))} hold a time above {MAX_SECONDS:.0e} seconds "
                "(about 32 years), which no run takes")
    return None


def interval_problem(record: dict[str, Any]) -> str | None:
    """A `prr_ci` that is neither null nor two bounds (each a number, or null where it was undefined),
    the lower above the upper."""
    interval = record.get("prr_ci")
    if interval is None:
        return None
    if len(interval) != 2 or not all(bound is None or finite_real(bound) for bound in interval):
        return f"a run whose 'prr_ci' is {interval!r}, not null or two bounds (numbers or null)"
    if None not in interval and interval[0] > interval[1]:
        return f"a run whose 'prr_ci' {interval!r} has its lower bound above its upper one"
    return None


def numbers_problem(record: dict[str, Any]) -> str | None:
    """Numbers that disagree with the rest of the record: `n` and the example count, verdicts that
    are not 0, 1 or null, a `score` that is not their mean, an acceptance rate outside [0, 1]."""
    if record["n"] != len(record["example_ids"]):
        return f"a run whose 'n' is {record['n']} but which holds {len(record['example_ids'])} examples"
    odd = [score for score in record["scores"] if score is not None and score not in (0, 1)]
    if odd:
        return f"a run whose 'scores' hold {odd[0]!r}; each verdict is 0, 1 or null (excluded)"
    verdicts = [score for score in record["scores"] if score is not None]
    mean = math.fsum(verdicts) / len(verdicts) if verdicts else None
    score = record["score"]
    if (mean is None) != (score is None) or (mean is not None and abs(score - mean) > SCORE_TOLERANCE):
        return (f"a run whose 'score' {score!r} is not the mean of its 'scores' "
                f"({'null: none is scored' if mean is None else mean!r})")
    rate = record.get("acceptance_rate")
    if rate is not None and not 0 <= rate <= 1:
        return f"a run whose 'acceptance_rate' {rate!r} lies outside [0, 1]"
    return None


def configuration(config: dict[str, Any]) -> tuple[Any, str] | None:
    """`RunConfig.from_dict(config)` and the key securesd writes for it (`RunConfig.key`), or None where
    `config` builds no configuration."""
    from hf_securesd.bench.plan import RunConfig

    try:
        run_config = RunConfig.from_dict(config)
        return run_config, run_config.key
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None


def labels_problem(record: dict[str, Any], run_config: Any) -> str | None:
    """A `knob_value` or `schedule_label` other than the ones securesd writes for the record's
    configuration (a relabelled record would be reported under another setting)."""
    from hf_securesd.bench.plan import knob_value, schedule_label
    from hf_securesd.bench.results import json_ready

    verifier, schedule = run_config.verifier, run_config.schedule
    for name, expected in (("knob_value", None if verifier is None else json_ready(knob_value(verifier))),
                           ("schedule_label", None if schedule is None else schedule_label(schedule))):
        if name in record and record[name] != expected:
            return (f"a run whose {name!r} is {record[name]!r}, not {expected!r}, which its 'config' "
                    "makes")
    return None


def task_problem(record: dict[str, Any]) -> str | None:
    """A task securesd does not run, or a `task_kind` or `metric` other than the task's own."""
    from hf_securesd.bench.tasks import get_task, task_names

    if record["task"] not in task_names():
        return f"a run of the task {record['task']!r}, none of securesd's ({', '.join(task_names())})"
    task = get_task(record["task"])
    if (record["task_kind"], record["metric"]) != (task.kind, task.metric):
        return (f"a run of {task.name} whose 'task_kind' and 'metric' are {record['task_kind']!r} and "
                f"{record['metric']!r}, not the task's {task.kind!r} and {task.metric!r}")
    return None


def identity_problem(record: dict[str, Any]) -> str | None:
    """Identity fields that disagree: a size or length below 1 (`POSITIVE_FIELDS`), a task's kind or
    metric (`task_problem`), a `config_key` that is not the key of `config`, a `cell` or `baseline_id`
    other than `cell_key` and `baseline_key` of the record's configuration, task, size and length, labels
    other than the configuration's (`labels_problem`)."""
    small = [name for name in POSITIVE_FIELDS if record[name] < 1]
    if small:
        return f"a run whose {' and '.join(map(repr, small))} {'is' if len(small) == 1 else 'are'} below 1"
    problem = task_problem(record)
    if problem:
        return problem
    built = configuration(record["config"])
    if built is None:
        return f"a run whose 'config' {record['config']!r} names no configuration securesd runs"
    run_config, key = built
    if record["config_key"] != key:
        return f"a run whose 'config_key' is {record['config_key']!r}, not {key!r}, the key of its 'config'"
    sizes = (record["task"], record["n"], record["max_new_tokens"])
    for name, expected, source in (("cell", cell_key(key, *sizes), "'config_key', 'task'"),
                                   ("baseline_id", baseline_key(*sizes), "'task'")):
        if record[name] != expected:
            return (f"a run whose {name!r} is {record[name]!r}, not {expected!r}, which its {source}, 'n' "
                    "and 'max_new_tokens' make")
    return labels_problem(record, run_config)


def run_problem(record: dict[str, Any]) -> str | None:
    """What keeps `record` from being a finished cell of runs.jsonl (see the module docstring), or None."""
    return (fields_problem(record, RUN_FIELDS) or optional_fields_problem(record, OPTIONAL_RUN_FIELDS)
            or config_problem(record) or lists_problem(record) or negative_problem(record)
            or duration_problem(record) or interval_problem(record) or numbers_problem(record)
            or stats_problem(record.get("stats")) or acceptance_problem(record) or identity_problem(record))


def acceptance_problem(record: dict[str, Any]) -> str | None:
    """An `acceptance_rate` other than the one its `stats` (read back by `stats_problem`) make: accepted /
    drafted tokens, null where nothing was drafted or there are no statistics. The report bins and ranks
    settings by it, so a rate written apart from its counts would move a cell where its counts do not."""
    stats, rate = record.get("stats"), record.get("acceptance_rate")
    drafted = math.fsum(stats["drafted_per_round"]) if stats is not None else 0
    expected = math.fsum(stats["accepted_per_round"]) / drafted if drafted else None
    if (rate is None) == (expected is None) and (rate is None or math.isclose(rate, expected, rel_tol=1e-9)):
        return None
    made = "null: nothing was drafted" if stats is not None and expected is None else (
        "null: the run has no statistics" if expected is None else repr(expected))
    return f"a run whose 'acceptance_rate' {rate!r} is not the one its 'stats' make ({made})"
