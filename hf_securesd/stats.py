"""Speculative decoding statistics (README, *Statistics*): acceptance per round and per response position,
and the exact per-position deviation TV(out_j, q_j) of the verifier's one-step output from the target;
for a segment schedule (`segments.Segments`) also both by position within each segment (`SegmentStats`)."""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    import torch

    from .segments import Segments


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
        end, accepted_end = start + drafted, start + min(max(accepted, 0), drafted)
        _grow(self.position_drafted, end, 0)
        _grow(self.position_accepted, end, 0)
        self.position_drafted[start:end] = [count + 1 for count in self.position_drafted[start:end]]
        accepted_counts = self.position_accepted[start:accepted_end]
        self.position_accepted[start:accepted_end] = [count + 1 for count in accepted_counts]
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
        """Mean TV(out_j, q_j) at each response position j over the rounds that verified it: each round's
        value is exact (Theorem 1) given that round's drafted block. For a lookahead rule (FLy) the output
        at j depends on the later drafts of the block, so this mean of per-block TVs is not the TV of the
        marginal output at j."""
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


@dataclass
class PositionCounts:
    """Verification outcomes by position within a segment (0 = the segment's first token).

    `verified[s]`: drafted tokens at segment position s that were verified (every accepted draft and
    the first rejected one of a round; drafts after a rejection are never verified and are not counted,
    since their segment position depends on tokens that were never committed). `accepted[s]`: those
    accepted. `tv_verified[s]` / `tv_sum[s]`: how many carry the exact one-step deviation TV(out, q)
    (Theorem 1) and its sum (collected at T = 0 with `return_dict_in_generate`, at T > 0 with
    `output_deviation=True`)."""

    verified: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    tv_verified: list[int] = field(default_factory=list)
    tv_sum: list[float] = field(default_factory=list)

    def add(self, position: int, accepted: bool, tv: float | None) -> None:
        _grow(self.verified, position + 1, 0)
        _grow(self.accepted, position + 1, 0)
        self.verified[position] += 1
        self.accepted[position] += int(accepted)
        if tv is not None:
            _grow(self.tv_verified, position + 1, 0)
            _grow(self.tv_sum, position + 1, 0.0)
            self.tv_verified[position] += 1
            self.tv_sum[position] += tv

    def add_counts(self, other: "PositionCounts") -> None:
        for name, fill in (("verified", 0), ("accepted", 0), ("tv_verified", 0), ("tv_sum", 0.0)):
            mine, theirs = getattr(self, name), getattr(other, name)
            _grow(mine, len(theirs), fill)
            for index, value in enumerate(theirs):
                mine[index] += value

    @property
    def acceptance_rate(self) -> list[float]:
        """P(accepted | verified) at each segment position (NaN where nothing was verified)."""
        return [a / n if n else math.nan for a, n in zip(self.accepted, self.verified)]

    @property
    def tv(self) -> list[float]:
        """Mean TV(out, q) at each segment position over the verified drafts that carry it."""
        return [total / n if n else math.nan for total, n in zip(self.tv_sum, self.tv_verified)]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate, "tv": self.tv}


@dataclass
class SegmentStats:
    """Acceptance and deviation by position within the segments of a `Segments` schedule.

    `before`: the first segment (from response position 0); `after`: every segment that follows a
    boundary, pooled, positions counted from the token after the boundary. `segment_starts[row]`: the
    response positions at which that row's `after` segments start (just after each boundary; empty
    when the row never crossed one). One `SegmentStats` per row has one entry there; `merge` pools rows.
    """

    before: PositionCounts = field(default_factory=PositionCounts)
    after: PositionCounts = field(default_factory=PositionCounts)
    segment_starts: list[list[int]] = field(default_factory=list)

    @classmethod
    def merge(cls, parts: Iterable["SegmentStats"]) -> "SegmentStats":
        total = cls()
        for part in parts:
            total.before.add_counts(part.before)
            total.after.add_counts(part.after)
            total.segment_starts += part.segment_starts
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "segment_starts": [list(starts) for starts in self.segment_starts],
        }


def row_segment_stats(schedule: "Segments", response: Sequence[int], stats: SpeculativeStats) -> SegmentStats:
    """Segment statistics of one row from its response tokens and its per-round record.

    Rounds are replayed from `stats` (a round starts where the previous one's accepted drafts and
    next token end); the segment of a verified draft is read from the response, which is exact: every
    token before a verified draft was committed. `stats.position_tv_sum` holds at most one
    verification per position of a single row, so it gives each verified draft's deviation."""
    starts = schedule.segment_starts(response)
    result = SegmentStats(segment_starts=[starts])
    round_start = 0
    for drafted, accepted in zip(stats.drafted_per_round, stats.accepted_per_round):
        for offset in range(min(accepted + 1, drafted)):
            position = round_start + offset
            tv = None
            if position < len(stats.position_verified) and stats.position_verified[position]:
                tv = stats.position_tv_sum[position] / stats.position_verified[position]
            segment = bisect.bisect_right(starts, position)
            if segment:
                result.after.add(position - starts[segment - 1], offset < accepted, tv)
            else:
                result.before.add(position, offset < accepted, tv)
        round_start += accepted + 1
    return result


def segment_statistics(
    schedule: "Segments", sequences: "torch.Tensor", prompt_length: int, row_stats: Sequence[SpeculativeStats]
) -> list[SegmentStats]:
    """One `SegmentStats` per row. sequences: [B, prompt_length + new] as `generate` returns them (rows
    left-padded, so every response starts at column `prompt_length`)."""
    responses = [sequences[row, prompt_length : prompt_length + part.new_tokens].tolist() for row, part in
                 enumerate(row_stats)]
    return [row_segment_stats(schedule, response, part) for response, part in zip(responses, row_stats)]
