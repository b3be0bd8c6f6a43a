"""Reading JSON that comes from outside: results files, benchmark data, command-line options."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`, except that what Python's JSON reader cannot hold raises `json.JSONDecodeError`
    like any other unreadable text, so that every caller's handling of it applies: a value nested deeper
    than the reader can recurse (a few kilobytes of brackets: a `RecursionError`), an integer longer than
    Python converts (4,300 digits) or bytes that are not UTF-8 (other `ValueError`s)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        reason = "nested too deeply to read"
    except ValueError as error:
        reason = str(error).split(";")[0]
    raise json.JSONDecodeError(reason, text if isinstance(text, str) else "", 0) from None
