"""SecureSD verification of one vLLM step: vLLM's flattened tensors in, the shared verification step
(`step.verify_step`) in the middle, vLLM's output buffer out.

vLLM lays a verification step out request by request: B requests, request b with n_b drafted tokens,
`num_tokens = sum n_b`. This adapter builds one `VerificationRound` from the SecureSD rows of such a
step (ragged rows padded, their usable draft counts, response positions, generators and, for schedules
that read tokens, their committed responses) and writes the `StepOutput` into vLLM's output buffer
[B, max_spec_len + 1]: accepted drafts, then the token that ends the round, then -1 placeholders.
Everything else is the core's, once for every engine: grouping rows by verifier, the eta default, the
no-usable-draft rule, the bonus token (drawn from q at the position after the accepted drafts, with
the row's generator) and per-request generators. vLLM's own bonus tokens are read in two places only:
a greedy round takes a greedy row's as x* at its bonus position (vLLM's sampler took the argmax of the
same processed logits there, so the [B, V] logits are not reduced twice), and the fallback below gives
it to a row that drafted nothing when the bonus logits are missing. A row without draft
logits verifies no draft unless its proposer is one-hot (n-gram: `RowPlan.one_hot`).

A failure while verifying (a rule raising on some logits, a schedule failing at some position) never
leaves this module: the round is verified again row by row, and a row that still fails gets its token
from the target alone, as if every draft were rejected (`target_only_token`). That is lossless (the
token follows q exactly), so the request goes on with a correct, if slower, answer, and the engine and
every other request are untouched; the error is logged with the row, once per request (`FailureLog`: a
request whose every step fails cannot flood the server's log). Failing the request instead is
not possible from here: vLLM 0.32's runner has no per-request abort, and an exception in the sampler
stops the engine core with every request on it.
Nothing here imports vLLM.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Callable, NamedTuple, Sequence, overload

import numpy as np
import torch

from .. import step as core_step
from ..argmax import host_argmax, vocab_argmax
from ..host_values import long_tensor
from ..step import RowSpec, StepOutput, VerificationRound
from ..verifiers.base import Verifier
from .request import SecureSDRequest

PLACEHOLDER = -1
logger = logging.getLogger(__name__)


class FailureLog:
    """The log of verification failures, bounded per request: a client whose request fails every step
    (constraints or penalties that leave the target no distribution) must not write a line per token.

    A request's first failure is logged in full (ERROR: the row, its configuration, the error); its later
    failures are counted, and the counts come out as one WARNING line at most every `interval_s` seconds
    (at the first step that verifies SecureSD rows once that time has passed), naming the requests that
    failed most. A failure without a request id (a row outside an engine) is logged in full every time.
    `remember` bounds the request ids kept (the oldest are forgotten; one failing again is logged again)."""

    def __init__(
        self, interval_s: float = 60.0, remember: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self.remember = remember
        self.clock = clock
        self._logged: OrderedDict[str, None] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._pending = 0
        self._since = clock()

    def failed(self, plan: RowPlan, error: BaseException) -> None:
        """Record that `plan`'s row failed with `error` and fell back to the target alone."""
        key = plan.req_id
        if key is None or key not in self._logged:
            logger.error(
                "SecureSD verification of batch row %d (%s%s) failed: %r; its token comes from the target "
                "alone (lossless) this step%s", plan.row, plan.request.to_dict(),
                "" if key is None else f", request {key}", error,
                "" if key is None else "; this request's further failures are only counted",
            )
            if key is not None:
                self._logged[key] = None
                if len(self._logged) > self.remember:
                    self._logged.popitem(last=False)
        else:
            self._logged.move_to_end(key)
            if key in self._counts or len(self._counts) < self.remember:
                self._counts[key] = self._counts.get(key, 0) + 1
            self._pending += 1
        self.report()

    def report(self) -> None:
        """Log the failures counted since the last report, if any, once `interval_s` has passed."""
        if not self._pending:
            return
        now = self.clock()
        if now - self._since < self.interval_s:
            return
        top = sorted(self._counts.items(), key=lambda item: -item[1])[:3]
        logger.warning(
            "SecureSD: %d more verification failures in the last %.0f s, of %d request(s) whose first failure "
            "was logged (most: %s); each of those tokens came from the target alone (lossless)",
            self._pending, now - self._since, len(self._counts), ", ".join(f"{key} {count}" for key, count in top),
        )
        self._pending, self._counts, self._since = 0, {}, now


FAILURES = FailureLog()


@dataclass(eq=False, slots=True)
class RowPlan:
    """A SecureSD row of the step.

    Args:
        row: the request's index in the batch.
        request: its verifier and schedule.
        position: 0-based response position of its first drafted token.
        draft_raw_logits: [m, V] raw draft logits at the proposed positions (m >= the drafts that
            reached verification), or None when the drafter kept none.
        draft_logits: [m, V] the draft logits the drafts were sampled from (raw / T, then top-k/top-p);
            the raw tensor itself for greedy rows.
        generator: the request's own generator (vLLM's, from its `seed`), or None.
        response: the response tokens committed before this step (only for schedules that read tokens).
        one_hot: the proposer gives no draft distribution (n-gram): the drafts are verified as
            one-hot proposals. Otherwise a row without draft logits verifies no draft.
        proposed: for a round that reads no draft logits (`reads_draft_logits` false), the proposals the
            drafter recorded for the row, given instead of its logits (which are then not stacked); None:
            the rows of `draft_raw_logits`.
        req_id: vLLM's request id, which bounds the failures logged for the request (`FailureLog`); None
            outside an engine.
    """

    row: int
    request: SecureSDRequest
    position: int
    draft_raw_logits: torch.Tensor | None
    draft_logits: torch.Tensor | None
    generator: torch.Generator | None = None
    response: Sequence[int] | None = None
    one_hot: bool = False
    proposed: int | None = None
    req_id: str | None = None

    @property
    def recorded(self) -> int:
        """Proposals recorded for the row with their draft logits (kept or counted): the most it may verify
        when its proposer is not one-hot."""
        if self.proposed is not None:
            return self.proposed
        return 0 if self.draft_raw_logits is None else self.draft_raw_logits.shape[0]


class RowResult(NamedTuple):
    """What verification did for one row: drafts it verified and how many it accepted."""

    row: int
    position: int
    verified: int
    accepted: int


class RowResults(Sequence[RowResult]):
    """A step's `RowResult`s, one per plan, built on first read (the engine reads none; the tests trace
    them). Equal to any sequence of the same results."""

    __slots__ = ("_plans", "_counts", "_accepted", "_built")

    def __init__(self, plans: Sequence[RowPlan], counts: list[int], accepted: list[int]) -> None:
        self._plans, self._counts, self._accepted = plans, counts, accepted
        self._built: list[RowResult] | None = None

    def _results(self) -> list[RowResult]:
        if self._built is None:
            self._built = [
                RowResult(plan.row, plan.position, n, a) for plan, n, a in zip(self._plans, self._counts, self._accepted)
            ]
        return self._built

    @overload
    def __getitem__(self, index: int) -> RowResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[RowResult]: ...

    def __getitem__(self, index: int | slice) -> RowResult | list[RowResult]:
        return self._results()[index]

    def __len__(self) -> int:
        return len(self._plans)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return self._results() == list(other)

    __hash__ = None  # type: ignore[assignment]  (mutable-looking, compared by value)

    def __repr__(self) -> str:
        return repr(self._results())


def verify_rows(
    plans: Sequence[RowPlan],
    output_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    target_raw_logits: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    greedy: Sequence[bool],
) -> Sequence[RowResult]:
    """Verify the rows in `plans` and write their tokens into `output_token_ids` (in place); what was done
    for each row is returned (`RowResult`s, one per plan).

    Args:
        output_token_ids: [B, max_spec_len + 1] int output buffer; other rows are left untouched.
        draft_token_ids: [num_tokens] drafted tokens, request by request (-1 marks an invalid draft).
        num_draft_tokens: [B] drafts per request.
        target_raw_logits: [num_tokens + B, V] raw target logits, request by request: its n_b drafted
            positions followed by its bonus position.
        target_logits: [num_tokens, V] processed target logits at the drafted positions (vLLM's
            constraints and penalties, then temperature and top-k/top-p; unscaled for greedy rows).
        bonus_logits: [B, V] processed target logits at each request's bonus position, the same way.
        bonus_token_ids: [B] (or [B, 1]) vLLM's bonus tokens. A greedy row's is vLLM's argmax of its bonus
            logits (its sampler takes the argmax of the same processed logits, `Sampler.greedy_sample`), so
            a greedy lossless round reads it as x* at the bonus positions instead of reducing the [B, V]
            logits again; a row that falls back (`target_only_token`) having drafted nothing without
            bonus logits takes it as its token.
        greedy: [B] whether each request decodes at temperature 0.
    """
    if not plans:
        return []
    FAILURES.report()
    layout = _Layout(num_draft_tokens)
    counts = _usable_counts(plans, draft_token_ids, layout)
    round_ = _round(
        plans, counts, layout, draft_token_ids, target_raw_logits, target_logits, bonus_logits, bonus_token_ids,
        greedy,
    )
    try:
        output = core_step.verify_step(round_, check_ranges=False)  # vLLM's own ids, counts from its layout
    except Exception as error:  # noqa: BLE001 - one request's failure must not stop the engine (module doc)
        if len(plans) == 1:
            return fall_back_rows(
                plans, output_token_ids, num_draft_tokens, target_logits, bonus_token_ids, greedy, error,
                bonus_logits,
            )
        results = []
        for plan in plans:
            results += verify_rows(
                [plan], output_token_ids, draft_token_ids, num_draft_tokens, target_raw_logits, target_logits,
                bonus_logits, bonus_token_ids, greedy,
            )
        return results
    return _write(plans, counts, round_, output, output_token_ids)


@dataclass(frozen=True)
class _Layout:
    """Where request b's entries sit in vLLM's flattened tensors."""

    counts: list[int]
    starts: list[int]

    def __init__(self, num_draft_tokens: Sequence[int]) -> None:
        counts = list(map(int, num_draft_tokens))
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "starts", [0, *accumulate(counts)][:-1])


def _usable_counts(plans: Sequence[RowPlan], draft_token_ids: torch.Tensor, layout: _Layout) -> list[int]:
    """Drafts of each row that can be verified: up to its first invalid one (-1), no more than it has draft
    logits for, and none without them unless the proposer is one-hot. One check for the whole step finds
    whether any draft is invalid; only then are the rows searched one by one."""
    counts = []
    for plan in plans:
        count = layout.counts[plan.row]
        if count and not plan.one_hot:
            count = min(count, plan.recorded)
        counts.append(count)
    if draft_token_ids.numel() == 0:
        return counts
    if int(_smallest(draft_token_ids)) >= 0:
        return counts
    for i, (plan, count) in enumerate(zip(plans, counts)):
        start = layout.starts[plan.row]
        invalid = (draft_token_ids[start : start + count] < 0).nonzero()
        counts[i] = int(invalid[0, 0]) if invalid.numel() else count
    return counts


_HOST_MIN_BELOW = 2048  # entries below which a CPU tensor's minimum is taken over its list (see `_smallest`)


def _smallest(values: torch.Tensor) -> int | torch.Tensor:
    """The minimum of a non-empty integer tensor [n]. On a CPU and below `_HOST_MIN_BELOW` entries the Python
    list's (NumPy's `min` over vLLM's int32 ids costs ~3x more at a step's few dozen drafts)."""
    if values.is_cpu and values.numel() < _HOST_MIN_BELOW:
        return min(values.tolist())
    return values.numpy().min() if values.is_cpu else values.min()


def _gather_lists(
    rows: tuple[int, ...], counts: tuple[int, ...], layout_counts: tuple[int, ...]
) -> tuple[list[int], list[int], list[int]]:
    """(draft [G*k], processed [G*(k+1)], raw [G*(k+1)]) indices of a round's entries in vLLM's flattened
    tensors, for rows `rows` with usable `counts` in a step whose requests drafted `layout_counts`
    (k = max(counts) > 0).

    Slots past a row's count repeat its last valid entry (the core ignores them). Processed logits at
    index n (where a row that accepts all n usable drafts draws its next token) are the bonus position's
    when n is every draft the row has, else the drafted position n itself (a row cut short by an invalid
    draft); processed indices point into cat(target_logits, bonus_logits)."""
    layout = _Layout(layout_counts)
    k, num_tokens = max(counts), sum(layout_counts)
    last_draft = num_tokens - 1  # >= 0: k > 0 means some row drafted
    draft_index: list[int] = []
    processed_index: list[int] = []
    raw_index: list[int] = []
    for row, n in zip(rows, counts):
        start = layout.starts[row]
        end = num_tokens + row if n == layout.counts[row] else start + n
        # A row without usable drafts (possibly the batch's last, whose start is past every draft) points
        # its ignored slots at any real draft.
        draft_index += [min(start + min(j, max(n - 1, 0)), last_draft) for j in range(k)]
        processed_index += [start + j if j < n else end for j in range(k + 1)]
        raw_index += [start + row + min(j, n) for j in range(k + 1)]
    return draft_index, processed_index, raw_index


@lru_cache(maxsize=256)
def _gather_index(
    rows: tuple[int, ...],
    counts: tuple[int, ...],
    layout_counts: tuple[int, ...],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_gather_lists` as tensors on `device`. A step repeats the same layout for many steps, so the
    indices are built once."""
    draft_index, processed_index, raw_index = _gather_lists(rows, counts, layout_counts)
    index = torch.tensor(draft_index + processed_index + raw_index, device=device)
    return index.split([len(draft_index), len(processed_index), len(raw_index)])


@lru_cache(maxsize=256)
def _host_gather_index(
    rows: tuple[int, ...], counts: tuple[int, ...], layout_counts: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """`_gather_lists`' draft [G, k] and processed [G, k+1] indices as NumPy arrays (`_host_argmax_round`)."""
    draft_index, processed_index, _ = _gather_lists(rows, counts, layout_counts)
    size = len(rows)
    # intp: an empty index (k = 0, no row has a usable draft) must still index
    return (
        np.array(draft_index, dtype=np.intp).reshape(size, -1),
        np.array(processed_index, dtype=np.intp).reshape(size, -1),
    )


def reads_draft_logits(requests: Sequence[SecureSDRequest], greedy: Sequence[bool]) -> bool:
    """Whether a round of rows verified with `requests` ([G]; greedy: [G] temperature 0) reads draft logits
    (or the target's logits): every round but a greedy lossless one, whose rule reads the target's argmax
    x* alone. The runner asks it before the round to decide whether the recorded draft logits are
    stacked; `_round` asks it again to decide what the round carries."""
    return not (all(greedy) and all(request.verifier.is_lossless for request in requests))


def _round(
    plans: Sequence[RowPlan],
    counts: list[int],
    layout: _Layout,
    draft_token_ids: torch.Tensor,
    target_raw_logits: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    greedy: Sequence[bool],
) -> VerificationRound:
    """The SecureSD rows as one ragged round of G rows, k = max usable drafts.

    When every request of the step is a SecureSD row that verifies all of its k drafts (the common
    case), vLLM's tensors already have the round's layout and are viewed, not gathered: the raw logits
    [B * (k+1), V] as [B, k+1, V], the drafts [B * k] as [B, k]; only the processed logits are joined
    with the bonus position's. Otherwise each entry is gathered (`_gather_index`).

    A round whose rows are all greedy and lossless (the rule reads the target's argmax x* alone) gets
    x* [G, k+1] instead of logits: the argmax of vLLM's processed logits [num_tokens, V] and, at the bonus
    positions, vLLM's greedy bonus tokens (the argmax of the bonus logits [B, V], see `verify_rows`),
    arranged as the logits would be, and no draft logits (the rule never reads p); on CPU
    tensors it is arranged through NumPy (`_host_argmax_round`)."""
    device = target_logits.device
    k = max(counts)
    size, vocab = len(plans), target_logits.shape[-1]
    rows = tuple(plan.row for plan in plans)
    flags = [bool(greedy[row]) for row in rows]
    full = all(n == k for n in counts)
    viewed = full and rows == tuple(range(len(layout.counts))) and all(n == k for n in layout.counts)
    facts = _rows_facts(plans)
    lossless = facts.lossless
    argmax_round = lossless and all(flags)  # `reads_draft_logits` false: the rule reads x* alone
    argmax = processed = raw = None
    if argmax_round and target_logits.is_cpu and draft_token_ids.is_cpu and bonus_token_ids.is_cpu:
        drafts, argmax = _host_argmax_round(rows, counts, layout, viewed, draft_token_ids, target_logits, bonus_token_ids)
    else:
        index = None if viewed else _gather_index(rows, tuple(counts), tuple(layout.counts), device)
        drafts = draft_token_ids if draft_token_ids.device == device else draft_token_ids.to(device)
        if index is not None:
            drafts = drafts.index_select(0, index[0]).clamp_min(0)
        drafts = drafts.view(size, k).long()
        if argmax_round:
            argmax = _target_argmax(target_logits, bonus_token_ids, size, k, index)
        elif index is None:
            processed = torch.cat(
                [target_logits.view(size, k, vocab), bonus_logits.to(target_logits.dtype).view(size, 1, vocab)],
                dim=1,
            ).to(torch.float32)
        else:
            processed = torch.cat([target_logits, bonus_logits.to(target_logits.dtype)]).index_select(0, index[1])
            processed = processed.view(size, k + 1, vocab).to(torch.float32)
    if processed is not None:
        # Only relaxed rules read raw logits: rows that are all lossless (the mixer evaluates the lossless
        # rule alone for them) get the processed logits in their place, and nothing more is gathered.
        raw = processed
        if not lossless:
            raw_rows = target_raw_logits if index is None else target_raw_logits.index_select(0, index[2])
            raw = raw_rows.view(size, k + 1, vocab).to(torch.float32)
    draft_logits = draft_raw_logits = None
    if argmax is None and not plans[0].one_hot:
        draft_raw_logits = _draft_rows(plans, counts, k, vocab, device, processed=False)
        same = all(plan.draft_logits is plan.draft_raw_logits for plan in plans)
        draft_logits = draft_raw_logits
        if not same:
            draft_logits = _draft_rows(plans, counts, k, vocab, device, processed=True)
    # Rows that all keep k drafts need no counts (the core reads None as k for every row).
    starts = long_tensor([plan.position for plan in plans], device)
    draft_counts = None if full else long_tensor(counts, device)
    return VerificationRound(
        rows=facts.specs,
        draft_tokens=drafts,
        draft_counts=draft_counts,
        starts=starts,
        target_logits=processed,
        target_raw_logits=raw,
        greedy=flags[0] if len(set(flags)) == 1 else torch.tensor(flags, device=device),
        draft_logits=draft_logits,
        draft_raw_logits=draft_raw_logits,
        responses=[list(plan.response or ()) for plan in plans] if facts.reads_tokens else None,
        target_argmax=argmax,
    )


def _host_argmax_round(
    rows: tuple[int, ...],
    counts: list[int],
    layout: _Layout,
    viewed: bool,
    draft_token_ids: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts [G, k] long, x* [G, k+1] long) of a greedy lossless round on CPU tensors, arranged through
    NumPy: the same entries as the torch route (`_gather_index`, `_target_argmax`) with a few NumPy calls
    in place of a dozen small torch operations. draft_token_ids [num_tokens] (-1 marks an invalid draft:
    clamped to 0, past the row's usable count), target_logits [num_tokens, V], bonus_token_ids [B] or
    [B, 1]: x* at each request's bonus position (see `verify_rows`)."""
    size, k = len(rows), max(counts)
    at_bonus = bonus_token_ids.reshape(-1).numpy()
    if not draft_token_ids.numel():
        # A step without drafts (an n-gram step that matched nothing): each row's x* is its bonus position's.
        best = at_bonus if viewed else at_bonus[list(rows)]
        return torch.zeros(size, 0, dtype=torch.long), torch.from_numpy(best.astype(np.int64)).view(size, 1)
    at_drafts = host_argmax(target_logits)
    drafts = draft_token_ids.numpy()
    if viewed:
        best = np.concatenate([at_drafts.reshape(size, k), at_bonus.reshape(size, 1)], axis=1, dtype=np.int64)
        drafts = drafts.reshape(size, k)
    else:
        draft_index, processed_index = _host_gather_index(rows, tuple(counts), tuple(layout.counts))
        best = np.concatenate([at_drafts, at_bonus], dtype=np.int64)[processed_index]
        drafts = np.maximum(drafts[draft_index], 0)
    return torch.from_numpy(drafts.astype(np.int64, copy=False)), torch.from_numpy(best)


def _target_argmax(
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    size: int,
    k: int,
    index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """x* [G, k+1] long: the argmax of the processed logits the round would hold, taken over vLLM's
    tensors (target_logits [num_tokens, V]; at the bonus positions vLLM's greedy bonus tokens,
    bonus_token_ids [B] or [B, 1], see `verify_rows`) before arranging, so no [G, k+1, V] tensor is built.
    index: `_gather_index`'s, or None for the viewed layout."""
    at_drafts = vocab_argmax(target_logits)
    at_bonus = bonus_token_ids.reshape(-1).to(at_drafts.device, torch.long)
    if index is None:
        return torch.cat([at_drafts.view(size, k), at_bonus.view(size, 1)], dim=1)
    return torch.cat([at_drafts, at_bonus]).index_select(0, index[1]).view(size, k + 1)


@dataclass(frozen=True, slots=True)
class _RowsFacts:
    """What a round needs to know about its rows' requests: one RowSpec per row, whether every row's
    verifier is lossless and whether some row's schedule reads tokens."""

    specs: tuple[RowSpec, ...]
    lossless: bool
    reads_tokens: bool


# Facts of recent steps' rows, by the identities of their requests and generators. An entry holds those
# objects, so their ids cannot be reused while it exists; the table is emptied when it fills.
_ROWS_FACTS: dict[tuple[int, ...], tuple[tuple[object, ...], _RowsFacts]] = {}
_ROWS_FACTS_KEPT = 64


def _rows_facts(plans: Sequence[RowPlan]) -> _RowsFacts:
    """The rows' `_RowsFacts`. Requests whose verifiers are equal share one verifier object in the
    RowSpecs, so the core sees one group without comparing them row by row (its grouping by equality,
    the verifiers' hash and ==, gives the same groups). A batch of the same requests (the same
    `SecureSDRequest` objects, which the runner keeps per request, and generators) gets the facts built
    for it before."""
    owners = tuple([owner for plan in plans for owner in (plan.request, plan.generator)])
    key = tuple(map(id, owners))
    kept = _ROWS_FACTS.get(key)
    if kept is not None:
        return kept[1]
    shared: dict[Verifier, Verifier] = {}
    specs = tuple(
        RowSpec(shared.setdefault(plan.request.verifier, plan.request.verifier), plan.request.schedule,
                plan.generator)
        for plan in plans
    )
    facts = _RowsFacts(
        specs,
        lossless=all(verifier.is_lossless for verifier in shared),
        reads_tokens=any(getattr(plan.request.schedule, "reads_tokens", False) for plan in plans),
    )
    if len(_ROWS_FACTS) >= _ROWS_FACTS_KEPT:
        _ROWS_FACTS.clear()
    _ROWS_FACTS[key] = (owners, facts)
    return facts


def _draft_rows(
    plans: Sequence[RowPlan], counts: list[int], k: int, vocab: int, device: torch.device, processed: bool
) -> torch.Tensor:
    """[G, k, V] float32 draft logits of each row's first k proposals (zeros where it has none: a row
    without logits has 0 usable drafts), its last valid row repeated past its count. Rows that all have
    at least k proposals of one shape (the common case) are stacked at once."""
    for plan, n in zip(plans, counts):
        if n and plan.draft_raw_logits is None:
            raise ValueError(
                f"batch row {plan.row} verifies {n} drafts in a round that reads draft logits, but only "
                "their count was kept (RowPlan.proposed): give the row's draft logits for such a round"
            )
    tensors = [plan.draft_logits if processed else plan.draft_raw_logits for plan in plans]
    first = tensors[0]
    if (
        first is not None and first.shape[0] >= k and min(counts) == k
        and all(t is not None and t.shape == first.shape for t in tensors)
    ):
        return torch.stack(tensors)[:, :k, :vocab].to(device, torch.float32)
    out = torch.zeros(len(plans), k, vocab, dtype=torch.float32, device=device)
    for i, (logits, n) in enumerate(zip(tensors, counts)):
        if logits is None or n == 0:
            continue
        rows = logits[torch.arange(k).clamp(max=n - 1)] if n < k else logits[:k]
        out[i] = rows[:, :vocab].to(device, torch.float32)
    return out


def _write(
    plans: Sequence[RowPlan],
    counts: list[int],
    round_: VerificationRound,
    output: StepOutput,
    output_token_ids: torch.Tensor,
) -> RowResults:
    """Each row's accepted drafts, then its next token, then placeholders, into vLLM's buffer."""
    accepted, next_tokens = output.host_lists()
    rows = [plan.row for plan in plans]
    every_row = rows == list(range(output_token_ids.shape[0]))
    where = slice(None) if every_row else rows
    if output_token_ids.is_cpu and not any(accepted):
        # Every row ends at its first position (the common n-gram step): two NumPy writes.
        buffer = output_token_ids.numpy()
        buffer[where] = PLACEHOLDER
        buffer[where, 0] = next_tokens
        return RowResults(plans, counts, accepted)
    drafts = round_.draft_tokens.tolist() if any(accepted) else [[]] * len(accepted)  # (a read fewer)
    width = output_token_ids.shape[1]
    written = [
        (drafts[i][:a] + [next_tokens[i]] + [PLACEHOLDER] * width)[:width] for i, a in enumerate(accepted)
    ]
    if output_token_ids.is_cpu:  # NumPy writes the lists into the buffer's own memory, converting once
        output_token_ids.numpy()[where] = written
    elif every_row:
        output_token_ids.copy_(torch.from_numpy(np.array(written)))  # converts the dtype and device at once
    else:
        device = output_token_ids.device
        values = torch.from_numpy(np.array(written)).to(device, output_token_ids.dtype)
        output_token_ids[torch.tensor(rows, device=device)] = values
    return RowResults(plans, counts, accepted)


def target_only_token(
    plan: RowPlan,
    layout: _Layout,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: bool,
    bonus_logits: torch.Tensor | None = None,
) -> int:
    """The row's next token from the target alone, as if every draft were rejected: drawn from q at its
    first drafted position with its generator; a row that drafted nothing draws at its bonus position
    (or takes vLLM's bonus token, drawn there under the same constraints, without `bonus_logits`).
    Shapes as in `verify_rows`; `layout` is the step's `_Layout`. Never raises on finite or -inf logits
    (falls back to the argmax)."""
    if layout.counts[plan.row]:
        logits = target_logits[layout.starts[plan.row]]
    elif bonus_logits is not None:
        logits = bonus_logits[plan.row]
    else:
        return int(bonus_token_ids.reshape(-1)[plan.row])
    probs = logits.to(torch.float32).softmax(dim=-1)
    if is_greedy or not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        return int(logits.argmax())
    generator = plan.generator
    if generator is not None and generator.device != probs.device:
        generator = None
    return int(torch.multinomial(probs, 1, generator=generator)[0])


def fall_back_rows(
    plans: Sequence[RowPlan],
    output_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    greedy: Sequence[bool],
    error: BaseException | None = None,
    bonus_logits: torch.Tensor | None = None,
) -> list[RowResult]:
    """Every row in `plans` takes `target_only_token` (see the module doc), the failure `error` logged
    with each row (`FAILURES`: in full once per request); shapes as in `verify_rows`."""
    layout = _Layout(num_draft_tokens)
    results = []
    for plan in plans:
        if error is not None:
            FAILURES.failed(plan, error)
        token = target_only_token(
            plan, layout, target_logits, bonus_token_ids, bool(greedy[plan.row]), bonus_logits
        )
        output_token_ids[plan.row] = PLACEHOLDER
        output_token_ids[plan.row, 0] = token
        results.append(RowResult(plan.row, plan.position, 0, 0))
    return results
