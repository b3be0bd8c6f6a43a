"""Speculative decoding statistics (SPEC.md §5): acceptance per round and per response position,
and the exact per-position deviation TV(out_j, q_j) of the verifier's one-step output from the target."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable


def _grow(values: list, length: int, fill: Any) -> None:
    if len(values) < length:
        values.extend([fill] * (length - len(values)))


@dataclass
class SpeculativeStats:
    """Counts for one generated sequence (or, after `merge`, several).

    Per-position lists are indexed by the 0-based response position j of the drafted token.
    """

    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    position_verified: list[int] = field(default_factory=list)
    position_tv_sum: list[float] = field(default_factory=list)
    new_tokens: int = 0

    def record_round(self, start: int, drafted: int, accepted: int, tv: Iterable[float] | None = None) -> None:
        """A round that drafted `drafted` tokens at positions start.. and accepted the first `accepted`.
        `tv`: the one-step TV deviation at each verified position (accepted ones plus the rejected one)."""
        self.drafted_per_round.append(drafted)
        self.accepted_per_round.append(accepted)
        _grow(self.position_drafted, start + drafted, 0)
        _grow(self.position_accepted, start + drafted, 0)
        for offset in range(drafted):
            self.position_drafted[start + offset] += 1
            self.position_accepted[start + offset] += int(offset < accepted)
        if tv is not None:
            deviations = list(tv)
            _grow(self.position_verified, start + len(deviations), 0)
            _grow(self.position_tv_sum, start + len(deviations), 0.0)
            for offset, value in enumerate(deviations):
                self.position_verified[start + offset] += 1
                self.position_tv_sum[start + offset] += float(value)

    @property
    def rounds(self) -> int:
        return len(self.drafted_per_round)

    @property
    def drafted_tokens(self) -> int:
        return sum(self.drafted_per_round)

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted_per_round)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (NaN when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else math.nan

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else math.nan

    @property
    def position_acceptance_rate(self) -> list[float]:
        return [a / d if d else math.nan for a, d in zip(self.position_accepted, self.position_drafted)]

    @property
    def position_tv(self) -> list[float]:
        """Mean TV(out_j, q_j) at each response position j over the rounds that verified it."""
        return [s / n if n else math.nan for s, n in zip(self.position_tv_sum, self.position_verified)]

    @classmethod
    def merge(cls, parts: Iterable["SpeculativeStats"]) -> "SpeculativeStats":
        """Sum the counts of several sequences (e.g. a benchmark's prompts)."""
        total = cls()
        for part in parts:
            total.drafted_per_round += part.drafted_per_round
            total.accepted_per_round += part.accepted_per_round
            total.new_tokens += part.new_tokens
            for name, fill in (
                ("position_drafted", 0),
                ("position_accepted", 0),
                ("position_verified", 0),
                ("position_tv_sum", 0.0),
            ):
                mine, theirs = getattr(total, name), getattr(part, name)
                _grow(mine, len(theirs), fill)
                for index, value in enumerate(theirs):
                    mine[index] += value
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "rounds": self.rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
        }


class RoundRecorder:
    """Collects a batch's per-round outcomes as plain lists and turns them into one
    `SpeculativeStats` per row at the end, so recording a round costs no per-row Python work."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self._rounds: list[tuple] = []

    def record(
        self,
        rows: list[int],
        starts: list[int],
        drafted: list[int],
        accepted: list[int],
        committed: list[int],
        finished: list[int],
        deviation: list[list[float]] | None,
    ) -> None:
        """One round of rows `rows`: response position of their first draft, drafts proposed, drafts
        accepted, tokens committed, whether the row finished, and (optional) the TV deviation at each
        drafted position [A][k]. In a row's last round, drafts after its last committed token (after an
        EOS or a stopping criterion) were never part of its response: they count neither as drafted nor
        as accepted."""
        self._rounds.append((rows, starts, drafted, accepted, committed, finished, deviation))

    def finish(self) -> list[SpeculativeStats]:
        stats = [SpeculativeStats() for _ in range(self.batch)]
        for rows, starts, drafted, accepted, committed, finished, deviation in self._rounds:
            for a, row in enumerate(rows):
                cap = committed[a] if finished[a] else drafted[a]
                kept_drafts, kept_accepted = min(drafted[a], cap), min(accepted[a], cap)
                verified = min(accepted[a] + 1, kept_drafts)
                tv = None if deviation is None else deviation[a][:verified]
                stats[row].record_round(starts[a], kept_drafts, kept_accepted, tv)
                stats[row].new_tokens += committed[a]
        return stats
