"""`evaluate` metric modules shipped with hf-securesd.

Load them offline with `evaluate.load(hf_securesd.metrics.path("prr"))` (or `"afr"`); the same
folders can be published unchanged to the Hub as `securesd/prr` and `securesd/afr`.
"""

from __future__ import annotations

from pathlib import Path

METRICS: tuple[str, ...] = ("prr", "afr")


def path(name: str) -> str:
    """Folder of the `evaluate` module `name` ("prr" or "afr"), suitable for `evaluate.load`."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(METRICS)}.")
    return str(Path(__file__).resolve().parent / name)
