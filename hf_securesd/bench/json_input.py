"""Reading JSON that comes from outside: results files, benchmark data, command-line options."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`, except that a value nested deeper than Python's JSON reader can recurse (a few
    kilobytes of brackets) raises `json.JSONDecodeError` like any other unreadable text, instead of a
    `RecursionError` that would escape every caller's handling as a traceback."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", text if isinstance(text, str) else "", 0) from None
