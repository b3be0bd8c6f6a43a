"""Number and table formatting shared by the report's sections."""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table; "–" when missing or not finite."""
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def fmt_ci(
    value: float | None, ci: Sequence[float] | None, digits: int = 3, missing: str = "undefined"
) -> str:
    """``0.744 [0.61, 0.86]``; the interval is left out when there is none; `missing` stands for
    a value that is absent or not finite."""
    if value is None or not math.isfinite(value):
        return missing
    return fmt(value, digits) + ("" if not ci else f" [{fmt(ci[0], 2)}, {fmt(ci[1], 2)}]")


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
