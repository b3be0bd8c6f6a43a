"""Small helpers shared by the task scorers."""

from __future__ import annotations

import re
from typing import Sequence


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean of a non-empty sequence."""
    return float(sum(values)) / len(values)


def normalize_text(text: str) -> str:
    """Lower-case `text`, turn every run of non-alphanumeric characters into one space and strip:
    the form used to compare prompts and to find echoed text inside responses."""
    return re.sub(r"[^0-9a-z]+", " ", text.lower()).strip()
