"""Reading JSON that comes from outside: results files, benchmark data, command-line options."""

from __future__ import annotations

import json
from typing import Any

from hf_securesd.http_deadline import json_integer

MAX_DEPTH = 100
"""How deeply arrays and objects may nest in JSON read from outside. The files securesd writes nest
at most 7 levels (a report's summary.json; study.json 5, runs.jsonl 3); values nested deeper, even in
a field no check reads, would later overflow the recursion of the code that copies, redacts or writes
them (a `RecursionError` at 600 levels, which Python's reader still takes)."""
TOO_DEEP = "nested too deeply to read"


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` levels in `value` (a bare array or object is
    one level), found with a stack, not by recursion."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`, except that what Python's JSON reader cannot hold, or what nests arrays and
    objects more than `MAX_DEPTH` levels, raises `json.JSONDecodeError` like any other unreadable text,
    so that every caller's handling of it applies: a value nested deeper than the limit (a few hundred
    bytes of brackets; beyond about 1,000 levels the reader itself fails with a `RecursionError`), an
    integer longer than Python converts (4,300 digits: named as "a number of about N digits",
    `json_integer`) or bytes that are not UTF-8 (other `ValueError`s)."""
    try:
        value = json.loads(text, parse_int=json_integer)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        reason = TOO_DEEP
    except ValueError as error:
        reason = str(error).split(";")[0]
    else:
        if not _nested_deeper(value, MAX_DEPTH):
            return value
        reason = f"{TOO_DEEP} (more than {MAX_DEPTH} levels of arrays and objects)"
    raise json.JSONDecodeError(reason, text if isinstance(text, str) else "", 0) from None
