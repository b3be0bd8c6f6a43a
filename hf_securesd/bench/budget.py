"""Time budget of a study: measured decoding rates, the estimate printed before a run starts, and
the ETA shown while it runs.

A rate is wall seconds per example per requested new token, by decoding kind (``target``,
``draft``, ``speculative``), at the study's batch size. It comes from the generations already
journaled for this plan, else from a short timed probe. Estimates charge every pending example its
full `max_new_tokens`, so they are upper bounds: replies that stop early (refusals) are shorter.
While running, the ETA rescales the remaining estimate by how the finished work compared with
its own estimate (a busy machine slows everything alike).

>>> budget = Budget({"target": 0.2, "draft": 0.05, "speculative": 0.25})
>>> budget.seconds([("target", 10, 16), ("speculative", 10, 16)])
72.0
>>> format_duration(4000)
'1 h 07 min'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

KINDS = ("target", "draft", "speculative")

Work = tuple[str, int, int]  # (decoding kind, examples, max_new_tokens)


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``1 h 07 min``."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass
class Budget:
    """Rates (seconds per example per requested new token, by kind) and the progress against them.
    `sources` says where each rate came from (``journal`` or ``probe``)."""

    rates: dict[str, float]
    sources: dict[str, str] = field(default_factory=dict)
    estimated_done: float = 0.0
    elapsed_done: float = 0.0

    def seconds(self, work: Iterable[Work]) -> float:
        """Estimated wall seconds for `work` (an upper bound, see the module docstring)."""
        return sum(self.rates[kind] * examples * tokens for kind, examples, tokens in work)

    def record(self, work: Work, elapsed: float) -> None:
        """`work` finished in `elapsed` wall seconds."""
        self.estimated_done += self.seconds([work])
        self.elapsed_done += elapsed

    def eta(self, remaining: Iterable[Work]) -> float:
        """Seconds left: the estimate for `remaining`, scaled by elapsed / estimated so far."""
        scale = self.elapsed_done / self.estimated_done if self.estimated_done > 0 else 1.0
        return self.seconds(remaining) * scale

    def describe(self, work: list[Work], batch_size: int) -> str:
        """One line for the start of a run: size, rates and the estimate."""
        examples = sum(n for _, n, _ in work)
        tokens = sum(n * t for _, n, t in work)
        rates = ", ".join(
            f"{kind} {self.rates[kind]:.3g} s ({self.sources.get(kind, '?')})"
            for kind in KINDS
            if kind in self.rates and any(k == kind for k, _, _ in work)
        )
        return (
            f"budget: {examples} generations, at most {tokens:,} new tokens; measured per example "
            f"and new token at batch {batch_size}: {rates}; estimate {format_duration(self.seconds(work))} "
            f"at most (replies that stop early are shorter)"
        )
