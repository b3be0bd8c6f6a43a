"""Time budget of a study: measured decoding rates, the estimate printed before a run starts, and
the ETA shown while it runs.

A rate is wall seconds per example per requested new token, by decoding kind (``target``,
``draft``, ``speculative``, ``endpoint``), at the study's batch size. It comes from the generations already
journaled for this plan, else from a short timed probe. Estimates charge every pending example its
full `max_new_tokens`, so they are upper bounds: replies that stop early (refusals) are shorter.
While running, the ETA rescales the remaining estimate by how the finished work compared with
its own estimate (a busy machine slows everything alike). A kind without a rate (an engine that
cannot be probed, a failed probe) leaves no estimate (None) for work that includes it.

>>> budget = Budget({"target": 0.2, "draft": 0.05, "speculative": 0.25})
>>> budget.seconds([("target", 10, 16), ("speculative", 10, 16)])
72.0
>>> format_duration(4000)
'1 h 07 min'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

KINDS = ("target", "draft", "speculative", "endpoint")

Work = tuple[str, int, int]  # (decoding kind, examples, max_new_tokens)


def format_duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``1 h 07 min``; ``no estimate`` for None."""
    if seconds is None:
        return "no estimate"
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
    `sources` says where each rate came from (``journal`` or ``probe``), or why a kind has none."""

    rates: dict[str, float]
    sources: dict[str, str] = field(default_factory=dict)
    estimated_done: float = 0.0
    elapsed_done: float = 0.0

    def seconds(self, work: Iterable[Work]) -> float | None:
        """Estimated wall seconds for `work` (an upper bound, see the module docstring); None when a
        kind of it that has examples to run has no rate."""
        pending = [(kind, examples, tokens) for kind, examples, tokens in work if examples]
        if any(kind not in self.rates for kind, _, _ in pending):
            return None
        return sum(self.rates[kind] * examples * tokens for kind, examples, tokens in pending)

    def record(self, work: Work, elapsed: float) -> None:
        """`work` finished in `elapsed` wall seconds (work without an estimate counts for nothing)."""
        estimate = self.seconds([work])
        if estimate is not None:
            self.estimated_done += estimate
            self.elapsed_done += elapsed

    def eta(self, remaining: Iterable[Work]) -> float | None:
        """Seconds left: the estimate for `remaining`, scaled by elapsed / estimated so far (None
        without an estimate)."""
        estimate = self.seconds(remaining)
        scale = self.elapsed_done / self.estimated_done if self.estimated_done > 0 else 1.0
        return None if estimate is None else estimate * scale

    def describe(self, work: list[Work], batch_size: int) -> str:
        """One line for the start of a run: size, rates and the estimate."""
        examples = sum(n for _, n, _ in work)
        tokens = sum(n * t for _, n, t in work)
        rates = ", ".join(
            f"{kind} {self.rates[kind]:.3g} s ({self.sources.get(kind, '?')})" if kind in self.rates
            else f"{kind} ({self.sources.get(kind, 'no rate')})"
            for kind in KINDS
            if (kind in self.rates or kind in self.sources) and any(k == kind for k, _, _ in work)
        )
        estimate = self.seconds(work)
        total = ("no estimate" if estimate is None
                 else f"estimate {format_duration(estimate)} at most (replies that stop early are shorter)")
        return (
            f"budget: {examples} generations, at most {tokens:,} new tokens; measured per example "
            f"and new token at batch {batch_size}: {rates}; {total}"
        )
