"""What a finished cell of runs.jsonl must hold for `bench`, `report`, `rescore` and `calibrate` to
read it: every field those readers use, with its JSON type (numbers finite and within float range,
`finite_real`), per-example lists aligned with the example ids, times and counts never negative,
scores that are verdicts (0 or 1, null for an excluded one) whose mean is the cell's score, ``n``
equal to the number of examples, an acceptance rate in [0, 1] and a PRR interval of two bounds.

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
# the fields every record holds, with their JSON types
RUN_FIELDS: Mapping[str, TypeSpec] = {
    "cell": str, "config_key": str, "config": dict, "task": str, "task_kind": str, "metric": str,
    "baseline_id": str, "n": int, "max_new_tokens": int, "example_ids": list, "scores": list,
    "score": _NUMBER_OR_NULL, "responses": list, "wall_time": _NUMBER, "spd_same_session": bool,
}
# fields of a record that the readers use where present, with their JSON types
OPTIONAL_RUN_FIELDS: Mapping[str, TypeSpec] = {
    "acceptance_rate": _NUMBER_OR_NULL, "spd": _NUMBER_OR_NULL, "prr": _NUMBER_OR_NULL,
    "prr_ci": (list, type(None)), "cpu_time": _NUMBER_OR_NULL, "stats": (dict, type(None)), "details": list,
    "sessions": list, "schedule_label": (str, type(None)), "knob_value": _NUMBER_OR_NULL,
    "seconds": list, "new_tokens": list, "drafted": (list, type(None)), "accepted": (list, type(None)),
    "stats_examples": int, "examples_digest": str,
}
# the fields a speculative cell holds besides (its sweep's knob and its schedule)
SPECULATIVE_FIELDS = ("knob_value", "schedule_label")
# per-example lists of a record, aligned with its example_ids, with the JSON types of their items
RUN_LIST_ITEMS: Mapping[str, TypeSpec] = {
    "scores": _NUMBER_OR_NULL, "responses": str, "details": dict, "seconds": _NUMBER, "new_tokens": int,
    "drafted": _NUMBER_OR_NULL, "accepted": _NUMBER_OR_NULL,  # null: the reply carried no statistics
}
# numbers of a record that are times or counts, and per-example lists of them: never negative
NON_NEGATIVE_FIELDS = ("wall_time", "cpu_time", "stats_examples")
NON_NEGATIVE_ITEMS = ("seconds", "new_tokens", "drafted", "accepted")
# how far a recorded score may be from the mean of its verdicts (float summation order)
SCORE_TOLERANCE = 1e-9


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


def stats_problem(values: Any) -> str | None:
    """What keeps a run's `stats` (null or `SpeculativeStats.to_dict()`) from being read back, or None."""
    if values is None:
        return None
    if not isinstance(values, dict):
        return "a record whose 'stats' is neither null nor an object"
    wrong = [field.name for field in fields(SpeculativeStats)
             if not _is(values.get(field.name), list if "list" in str(field.type) else _NUMBER)]
    return f"a run whose 'stats' lack a valid {', '.join(map(repr, wrong))}" if wrong else None


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
    """Times or counts of a record (`NON_NEGATIVE_FIELDS`, `NON_NEGATIVE_ITEMS`) that are negative."""
    negative = [name for name in NON_NEGATIVE_FIELDS if (record.get(name) or 0) < 0]
    negative += [name for name in NON_NEGATIVE_ITEMS
                 if any(item is not None and item < 0 for item in record.get(name) or [])]
    if negative:
        return f"a run whose {' and '.join(map(repr, negative))} hold a negative time or count"
    return None


def interval_problem(record: dict[str, Any]) -> str | None:
    """A `prr_ci` that is neither null nor two bounds (each a number, or null where it was undefined)."""
    interval = record.get("prr_ci")
    if interval is None:
        return None
    if len(interval) == 2 and all(bound is None or finite_real(bound) for bound in interval):
        return None
    return f"a run whose 'prr_ci' is {interval!r}, not null or two bounds (numbers or null)"


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


def run_problem(record: dict[str, Any]) -> str | None:
    """What keeps `record` from being a finished cell of runs.jsonl (see the module docstring), or None."""
    return (fields_problem(record, RUN_FIELDS) or optional_fields_problem(record, OPTIONAL_RUN_FIELDS)
            or config_problem(record) or lists_problem(record) or negative_problem(record)
            or interval_problem(record) or numbers_problem(record) or stats_problem(record.get("stats")))
