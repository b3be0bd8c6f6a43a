"""One verification step for every engine: a ragged round in, accepted counts and the next tokens out.

The `generate` loop (`decoding.py`) and the vLLM plugin (`vllm/sampler.py`) both build a
`VerificationRound` and call `verify_step`; neither carries a rule of its own. The step owns, once:

* grouping rows by verifier and by greedy/sampled decoding (each group is one `RoundInputs`);
* the eta default (no schedule = the relaxed verifier unchanged, eta = 1) and the schedules' weights,
  evaluated once per distinct schedule (`schedules.schedule_weights`);
* the no-usable-draft rule: a row with 0 usable drafts draws its next token from q at its first
  position, which is exact (every draft rejected);
* the bonus policy: once a row's drafts are all accepted, its next token is drawn from q at the
  position after them (R^ = q for every verifier here), by this step and with the row's generator;
* per-request random generators: with `RowSpec.generator` set, every draw of that row comes from it.

A round on a CPU whose rows are all greedy and lossless (the rule is "accept the drafts that equal the
target's argmax x*, then take x*") is decided on the host from x* and the drafts as lists: at a
few hundred entries that is several times cheaper than the same decision as torch operations, and it
is the same integer decision (`_greedy_lossless_on_host`).

The round is checked before it is verified, each check naming the field and the fix: every tensor's
shape against (B, k, V); draft_counts within [0, k]; every usable draft id (entries past a row's count are
ignored) within [0, V), except in a greedy lossless round, whose rule accepts a draft only when it equals
x* (an id outside the vocabulary is rejected like any other mismatch, and V may be unknown there); and the
target's distribution at every position (NaN, +inf at T > 0, or every token masked raise
`UnusableTargetError`, where q or x* is computed). Shapes are read from Python attributes. The host path
checks the counts on the lists it builds and not the target's logits: it reads x* alone, as the engines
give it (vLLM) or after they checked the logits (generate raises NonFiniteLogitsError first). A tensor
round's ranges cost one read on the host (`_checked`; adapters that build their rounds from their engine's
own ids skip it with `check_ranges=False`). A round of no rows gives a `StepOutput` of no rows.

Example (two rows, different verifiers, one-hot drafts):

```python
>>> round = VerificationRound(
...     rows=[RowSpec(MARS(theta=0.5)), RowSpec(Lossless(), Step(L=1))],
...     draft_tokens=drafts, draft_counts=torch.tensor([3, 1]), starts=torch.tensor([0, 7]),
...     target_logits=processed, target_raw_logits=raw, greedy=torch.tensor([True, True]))
>>> out = verify_step(round)
>>> out.accepted, out.next_tokens
```
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Sequence

import torch

from .argmax import vocab_argmax
from .host_values import long_tensor
from .mixing import greedy_deviation, one_step_output, total_variation, verify_round
from .schedules import Linear, Power, Schedule, Step, schedule_weights
from .segments import Segments
from .verifiers.base import RoundInputs, UnusableTargetError, Verifier


@dataclass(frozen=True, eq=False)
class RowSpec:
    """What one row (request) is verified with.

    Args:
        verifier: the rule.
        schedule: SecureSD weights by response position (None: the relaxed rule unchanged).
        generator: the row's own random generator (None: torch's global one).
    """

    verifier: Verifier
    schedule: Schedule | None = None
    generator: torch.Generator | None = None


@dataclass(eq=False)
class VerificationRound:
    """One ragged round of B rows with up to k drafts each.

    Args:
        rows: [B] one `RowSpec` per row (the same object for every row is the cheap common case).
        draft_tokens: [B, k] long; entries past a row's count are ignored.
        draft_counts: [B] long, drafts each row may keep (0..k); None means k for every row.
        starts: [B] long, 0-based response position of each row's first draft.
        target_logits: [B, k+1, V] processed target logits (processors, constraints, temperature,
            top-k/top-p); index n of row b is where its next token is drawn when it accepts n drafts, so
            index draft_counts[b] is its bonus position.
        target_raw_logits: [B, k+1, V] raw target logits (the relaxed rules read them, masked by the
            constraints of `target_logits`).
            Both may be None when every row is greedy and verified losslessly (that rule reads the
            target's argmax x* alone) and `target_argmax` is given; any other row then raises.
        greedy: [B] bool (or one bool for all rows): temperature 0.
        draft_logits: [B, k, V] the distribution the drafts were sampled from, or None for a
            deterministic proposer (one-hot drafts).
        draft_raw_logits: [B, k, V] raw draft logits, or None when the proposer has none.
        responses: per row, the response tokens committed before this round; needed only by schedules
            that read tokens (`Schedule.reads_tokens`, e.g. segment schedules).
        target_argmax: [B, k+1] long, the argmax of `target_logits` over the vocabulary when the engine
            has it (it is not recomputed), or None.
        draft_probs: [B, k, V] softmax(draft_logits), the probabilities the drafts were drawn from, when the
            proposer has them (they are not recomputed), or None.

    The [..., V] tensors are float32 or float64; half-precision ones (float16, bfloat16) are verified in
    float32.
    """

    rows: Sequence[RowSpec]
    draft_tokens: torch.Tensor
    draft_counts: torch.Tensor | None
    starts: torch.Tensor
    target_logits: torch.Tensor | None
    target_raw_logits: torch.Tensor | None
    greedy: torch.Tensor | bool
    draft_logits: torch.Tensor | None = None
    draft_raw_logits: torch.Tensor | None = None
    responses: Sequence[Sequence[int]] | None = None
    target_argmax: torch.Tensor | None = None
    draft_probs: torch.Tensor | None = None


class StepOutput:
    """What verification decided for each row.

    Args:
        accepted: [B] long, drafts accepted (0..draft_counts); None when given as `host` lists.
        next_tokens: [B] long, the token that ends the round (recovered at the first rejection, else
            the bonus token); None when given as `host` lists.
        alpha: [B, k] mixed acceptance probability of each drafted token, or a function returning it
            (a round decided on the host builds it only when it is first read).
        eta: [B, k] schedule weight of each drafted position, or a function returning it: a round whose
            rule reads no weight (greedy lossless, with no schedule or a built-in position schedule)
            evaluates the schedules only when `eta` is first read, from the round as it is then.
        deviation: [B, k] exact TV(out_i, q_i) of the one-step output (Theorem 1) at each drafted
            position, when asked for; None otherwise.
        host: (accepted, next_tokens) as Python lists when the round was decided on the host, so an
            adapter that writes them out reads no tensor back (`host_lists`) and the tensors are built
            only if read.
    """

    def __init__(
        self,
        accepted: torch.Tensor | None,
        next_tokens: torch.Tensor | None,
        alpha: torch.Tensor | Callable[[], torch.Tensor],
        eta: torch.Tensor | Callable[[], torch.Tensor],
        deviation: torch.Tensor | None = None,
        host: tuple[list[int], list[int]] | None = None,
    ) -> None:
        if (accepted is None or next_tokens is None) and host is None:
            raise ValueError("StepOutput needs accepted and next_tokens, as tensors or as host lists")
        self._accepted, self._next_tokens, self.deviation = accepted, next_tokens, deviation
        self._alpha, self._eta, self._host = alpha, eta, host

    @property
    def accepted(self) -> torch.Tensor:
        """[B] long, drafts accepted (built from the host lists on first read when decided there)."""
        if self._accepted is None:
            self._accepted = long_tensor(self._host[0])
        return self._accepted

    @property
    def next_tokens(self) -> torch.Tensor:
        """[B] long, the token that ends each row's round (built from the host lists on first read)."""
        if self._next_tokens is None:
            self._next_tokens = long_tensor(self._host[1])
        return self._next_tokens

    @property
    def alpha(self) -> torch.Tensor:
        """[B, k] mixed acceptance probability of each drafted token (built on first read when deferred)."""
        if not isinstance(self._alpha, torch.Tensor):
            self._alpha = self._alpha()
        return self._alpha

    @property
    def eta(self) -> torch.Tensor:
        """[B, k] schedule weight of each drafted position (evaluated on first read when deferred)."""
        if not isinstance(self._eta, torch.Tensor):
            self._eta = self._eta()
        return self._eta

    def host_lists(self) -> tuple[list[int], list[int]]:
        """(accepted [B], next_tokens [B]) as Python lists."""
        if self._host is None:
            self._host = (self._accepted.tolist(), self._next_tokens.tolist())
        return self._host


def _grouping_key(schedule: Schedule | None) -> object:
    """What rows must share to be weighed by one schedule evaluation: the schedule, and for `Segments` the
    token ids its boundaries were resolved to (two equal schedules, the same text resolved by different
    tokenizers, find different boundaries)."""
    if isinstance(schedule, Segments):
        return schedule, schedule.token_boundaries
    return schedule


def round_weights(round_: VerificationRound) -> torch.Tensor:
    """eta [B, k] of the round, each distinct schedule evaluated once over its rows."""
    rows = round_.rows
    first = rows[0].schedule if rows else None
    if all(spec.schedule is first for spec in rows):
        return schedule_weights(first, round_.starts, round_.draft_tokens, round_.responses)
    eta = torch.empty(round_.draft_tokens.shape, dtype=torch.float32, device=round_.starts.device)
    by_schedule: dict[object, tuple[Schedule | None, list[int]]] = {}
    for index, spec in enumerate(rows):
        by_schedule.setdefault(_grouping_key(spec.schedule), (spec.schedule, []))[1].append(index)
    for schedule, indices in by_schedule.values():
        chosen = torch.tensor(indices, device=round_.starts.device)
        responses = [round_.responses[i] for i in indices] if round_.responses is not None else None
        eta[chosen] = schedule_weights(schedule, round_.starts[chosen], round_.draft_tokens[chosen], responses)
    return eta


def verify_step(
    round_: VerificationRound, collect_deviation: bool = False, check_ranges: bool = True
) -> StepOutput:
    """Verify every row of `round_` with its own verifier, schedule and generator (see the module doc).

    collect_deviation: also return the exact per-position TV deviation (closed form at T = 0; at T > 0
    a vocabulary-wide evaluation of the rule, so ask only when it is reported).
    check_ranges: check draft_counts and the usable draft ids on a tensor round (`_checked`: a few small
    operations and a read on the host). The engines' adapters pass False: they build every round from
    their own engine's token ids and counts, and the check would cost each step that read; shapes and
    the target's distribution are always checked.

    Raises ValueError naming the field for a round that breaks `VerificationRound`'s contract, and
    `UnusableTargetError` (a ValueError) naming the row and position where the target gives no distribution."""
    batch, k, vocab = _round_shape(round_)
    round_ = _at_least_float32(round_)
    device = round_.draft_tokens.device
    if batch == 0:
        return _empty_output(k, device, collect_deviation)
    groups = _groups(round_)
    if len(groups) == 1:
        (verifier, greedy), _ = next(iter(groups.items()))
        greedy_lossless = greedy and verifier.is_lossless
        if greedy_lossless and _weights_cannot_fail(round_):
            # The rule reads no weight: eta is evaluated only if the caller reads it.
            if device.type == "cpu" and not collect_deviation:
                _check_target_given(round_, verifier, greedy)
                return _greedy_lossless_on_host(round_, partial(round_weights, round_))
            if check_ranges:
                round_ = _checked(round_, k, vocab, drafts_too=False)
            return _verify_group(round_, verifier, greedy, None, partial(round_weights, round_), collect_deviation)
        if check_ranges:
            round_ = _checked(round_, k, vocab, drafts_too=not greedy_lossless)
        return _verify_group(round_, verifier, greedy, None, round_weights(round_), collect_deviation)
    if check_ranges:
        round_ = _checked(round_, k, vocab, drafts_too=True)
    eta = round_weights(round_)
    accepted = torch.zeros(batch, dtype=torch.long, device=device)
    next_tokens = torch.zeros(batch, dtype=torch.long, device=device)
    alpha = torch.zeros(batch, k, dtype=torch.float32, device=device)
    deviation = torch.zeros(batch, k, dtype=torch.float32, device=device) if collect_deviation else None
    for (verifier, greedy), indices in groups.items():
        index = torch.tensor(indices, device=device)
        part = _verify_group(round_, verifier, greedy, index, eta[index], collect_deviation)
        accepted[index], next_tokens[index], alpha[index] = part.accepted, part.next_tokens, part.alpha
        if deviation is not None and part.deviation is not None:
            deviation[index] = part.deviation.to(deviation.dtype)
    return StepOutput(accepted, next_tokens, alpha, eta, deviation)


def _greedy_lossless_on_host(round_: VerificationRound, eta: Callable[[], torch.Tensor]) -> StepOutput:
    """A CPU round of greedy lossless rows, decided on the host: row b accepts its drafts while they equal
    x*_b (up to its draft count) and ends the round with x*_b at the first index it did not accept.
    The same decision as `mixing.verify_round`'s (alpha = 1[x = x*], accepted = the leading matches
    capped at the count, next = x*[accepted]) for every input."""
    batch, k = round_.draft_tokens.shape
    x_star = round_.target_argmax
    if x_star is None:
        x_star = vocab_argmax(round_.target_logits)
    if round_.draft_counts is None:
        counts = [k] * batch
    else:
        counts = round_.draft_counts.tolist()
        if min(counts) < 0 or max(counts) > k:
            _raise_bad_count(counts, k)
    if k == 0:  # no drafts: every row takes x* at its first position
        no_alpha = partial(_no_alpha, batch, x_star.device)
        return StepOutput(None, None, no_alpha, eta, host=([0] * batch, x_star[:, 0].tolist()))
    accepted, next_tokens = [], []
    for drafts, best, count in zip(round_.draft_tokens.tolist(), x_star.tolist(), counts):
        kept = 0
        while kept < count and drafts[kept] == best[kept]:
            kept += 1
        accepted.append(kept)
        next_tokens.append(best[kept])

    def alpha() -> torch.Tensor:
        return (round_.draft_tokens == x_star[:, :k]).float()

    return StepOutput(None, None, alpha, eta, host=(accepted, next_tokens))


def _no_alpha(batch: int, device: torch.device) -> torch.Tensor:
    """alpha [B, 0] of a round without drafts."""
    return torch.zeros(batch, 0, dtype=torch.float32, device=device)


def _round_shape(round_: VerificationRound) -> tuple[int, int, int | None]:
    """(B, k, V) of `round_` (V None when no tensor has a vocabulary), once every field agrees with them
    (Python attribute reads only); ValueError naming the field and the shape it must have otherwise."""
    drafts = round_.draft_tokens
    if drafts.dim() != 2 or drafts.dtype.is_floating_point or drafts.dtype == torch.bool:
        raise ValueError(
            f"VerificationRound.draft_tokens must be a [B, k] tensor of token ids, got {drafts.dtype} of shape "
            f"{tuple(drafts.shape)}"
        )
    batch, k = drafts.shape
    if len(round_.rows) != batch:
        raise ValueError(
            f"VerificationRound.rows holds {len(round_.rows)} RowSpecs but draft_tokens has {batch} rows; give "
            "one RowSpec per row"
        )
    vocab = None
    for name in _VOCABULARY_FIELDS:  # V from the first tensor that has a vocabulary (a loop: each call counts)
        tensor = getattr(round_, name)
        if tensor is not None:
            vocab = tensor.shape[-1]
            break
    for name, shape in _expected_shapes(batch, k, vocab):
        tensor = getattr(round_, name)
        if isinstance(tensor, torch.Tensor) and tensor.shape != shape:
            raise ValueError(
                f"VerificationRound.{name} has shape {tuple(tensor.shape)}, but the round has B={batch} rows, "
                f"k={k} drafts{'' if vocab is None else f' and V={vocab} tokens'}: give {name} of shape {shape} "
                "(see VerificationRound)"
            )
    if round_.responses is not None and len(round_.responses) != batch:
        raise ValueError(
            f"VerificationRound.responses holds {len(round_.responses)} rows but the round has {batch}; give "
            "each row's committed response tokens, or None"
        )
    return batch, k, vocab


def _at_least_float32(round_: VerificationRound) -> VerificationRound:
    """`round_` with half-precision (float16 / bfloat16) logits and probabilities as float32, where the
    rules compute (float32 and float64 ones as they are); ValueError naming a field that is not floating."""
    changes = {}
    for name in _VOCABULARY_FIELDS:
        tensor = getattr(round_, name)
        if tensor is None or tensor.dtype in (torch.float32, torch.float64):
            continue
        if not tensor.dtype.is_floating_point:
            raise ValueError(
                f"VerificationRound.{name} must hold floating-point values, got {tensor.dtype}; give the model's "
                "logits (float32, float64 or half precision)"
            )
        changes[name] = tensor.float()
    return replace(round_, **changes) if changes else round_


_VOCABULARY_FIELDS = ("target_logits", "target_raw_logits", "draft_logits", "draft_raw_logits", "draft_probs")


def _expected_shapes(batch: int, k: int, vocab: int | None) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(field, shape) of every optional tensor field of a round of B rows, k drafts and V tokens."""
    per_row = (("starts", (batch,)), ("draft_counts", (batch,)), ("greedy", (batch,)),
               ("target_argmax", (batch, k + 1)))
    if vocab is None:
        return per_row
    return per_row + (
        ("target_logits", (batch, k + 1, vocab)), ("target_raw_logits", (batch, k + 1, vocab)),
        ("draft_logits", (batch, k, vocab)), ("draft_raw_logits", (batch, k, vocab)),
        ("draft_probs", (batch, k, vocab)),
    )


def _empty_output(k: int, device: torch.device, collect_deviation: bool) -> StepOutput:
    """The output of a round of no rows: accepted and next_tokens [0], alpha, eta (and deviation) [0, k]."""
    none = torch.zeros(0, dtype=torch.long, device=device)
    per_draft = torch.zeros(0, k, dtype=torch.float32, device=device)
    return StepOutput(none, none, per_draft, per_draft, per_draft if collect_deviation else None)


def _checked(round_: VerificationRound, k: int, vocab: int | None, drafts_too: bool) -> VerificationRound:
    """`round_` once draft_counts [B] lie within [0, k] and, with `drafts_too` (and V known), every usable
    draft id within [0, V); then the round with its ignored entries (past a row's count) set to token 0, so
    no rule reads an id such as -1 there (a greedy lossless rule compares drafts with x* only: its round is
    returned as is). At most one minimum/maximum per tensor, read on the host at once. ValueError naming the
    first row that breaks a range."""
    counts = round_.draft_counts
    drafts = round_.draft_tokens if drafts_too and vocab is not None and round_.draft_tokens.numel() else None
    if counts is not None and drafts is not None:
        drafts = torch.where(torch.arange(k, device=counts.device) < counts[:, None], drafts, 0)
    bounds = [bound for tensor in (counts, drafts) if tensor is not None for bound in torch.aminmax(tensor)]
    if not bounds:
        return round_
    values = torch.stack(bounds).tolist()
    if counts is not None and (values[0] < 0 or values[1] > k):
        _raise_bad_count(counts.tolist(), k)
    if drafts is None:
        return round_
    if values[-2] < 0 or values[-1] >= vocab:
        _raise_bad_draft(drafts, vocab)
    return round_ if drafts is round_.draft_tokens else replace(round_, draft_tokens=drafts)


def _raise_bad_count(counts: list[int], k: int) -> None:
    """Raise ValueError naming the first row whose draft count lies outside [0, k]."""
    row, count = next((row, count) for row, count in enumerate(counts) if not 0 <= count <= k)
    raise ValueError(
        f"VerificationRound.draft_counts[{row}] = {count}, outside [0, k] with k = {k} (draft_tokens' columns): "
        "give each row the number of its drafts that may be kept, or None for k in every row"
    )


def _raise_bad_draft(drafts: torch.Tensor, vocab: int) -> None:
    """Raise ValueError naming the first usable draft of drafts [B, k] (the ignored entries already 0) whose
    id lies outside [0, V)."""
    row, position = ((drafts < 0) | (drafts >= vocab)).nonzero()[0].tolist()
    raise ValueError(
        f"VerificationRound.draft_tokens[{row}, {position}] = {int(drafts[row, position])} is a usable draft "
        f"(within the row's draft count) but not a token id of the V = {vocab} vocabulary: give ids in [0, V), "
        "or a draft count that stops before an invalid draft (entries past it are ignored)"
    )


def _check_target_given(round_: VerificationRound, verifier: Verifier, greedy: bool) -> None:
    """Raise ValueError when the round holds neither the target's logits nor, for greedy lossless rows,
    its argmax."""
    argmax_alone = greedy and verifier.is_lossless and round_.target_argmax is not None
    if round_.target_logits is None and not argmax_alone:
        raise ValueError(
            f"VerificationRound.target_logits is None, but rows verified with {verifier.to_dict()} "
            f"(greedy={greedy}) read the target's distribution: give target_logits and target_raw_logits "
            "(only greedy lossless rows may be verified from target_argmax alone)"
        )


_DEFERRABLE_SCHEDULES = (type(None), Step, Linear, Power)


def _weights_cannot_fail(round_: VerificationRound) -> bool:
    """Every row has no schedule or one of the built-in position schedules, whose weights always lie in
    [0, 1]: deferring them cannot hide an error (another schedule is evaluated, and checked, at once)."""
    rows = round_.rows
    first = rows[0].schedule
    if type(first) in _DEFERRABLE_SCHEDULES and all(spec.schedule is first for spec in rows):
        return True
    return all(type(spec.schedule) in _DEFERRABLE_SCHEDULES for spec in rows)


def _groups(round_: VerificationRound) -> dict[tuple[Verifier, bool], list[int]]:
    """Row indices by (verifier, greedy)."""
    greedy, rows = round_.greedy, round_.rows
    first = rows[0].verifier
    if isinstance(greedy, bool):
        if all(spec.verifier is first for spec in rows):
            return {(first, greedy): list(range(len(rows)))}
        flags = [greedy] * len(rows)
    else:
        flags = [bool(flag) for flag in greedy.tolist()]
        if all(spec.verifier is first for spec in rows) and len(set(flags)) == 1:
            return {(first, flags[0]): list(range(len(rows)))}
    groups: dict[tuple[Verifier, bool], list[int]] = defaultdict(list)
    for index, (spec, flag) in enumerate(zip(round_.rows, flags)):
        groups[(spec.verifier, bool(flag))].append(index)
    return groups


def _verify_group(
    round_: VerificationRound,
    verifier: Verifier,
    greedy: bool,
    index: torch.Tensor | None,
    eta: torch.Tensor | Callable[[], torch.Tensor],
    collect_deviation: bool,
) -> StepOutput:
    """Rows `index` (None: all rows) share a verifier and greedy flag: one RoundInputs for them. eta [G, k]
    may be deferred (a function) only for a greedy lossless group, whose rule does not read it."""

    def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return tensor if tensor is None or index is None else tensor[index]

    _check_target_given(round_, verifier, greedy)
    specs = round_.rows if index is None else [round_.rows[i] for i in index.tolist()]
    generators = [spec.generator for spec in specs]
    round_inputs = RoundInputs(
        draft_tokens=pick(round_.draft_tokens),
        target_logits=pick(round_.target_logits),
        draft_logits=pick(round_.draft_logits),
        target_raw_logits=pick(round_.target_raw_logits),
        draft_raw_logits=pick(round_.draft_raw_logits),
        greedy=greedy,
        draft_lengths=pick(round_.draft_counts),
        generators=generators if any(generator is not None for generator in generators) else None,
        given_target_argmax=pick(round_.target_argmax),
        given_draft_probs=pick(round_.draft_probs),
    )
    weights = eta if isinstance(eta, torch.Tensor) else None
    try:
        accepted, next_tokens, alpha = verify_round(verifier, round_inputs, weights)
    except UnusableTargetError as error:
        if index is None:
            raise
        raise error.in_round(index.tolist()) from None
    deviation = None
    if collect_deviation and round_inputs.num_draft_tokens:
        deviation = (
            greedy_deviation(round_inputs, alpha)
            if greedy
            else _sampled_deviation(verifier, round_inputs, eta)
        )
    return StepOutput(accepted, next_tokens, alpha, eta, deviation)


def _sampled_deviation(verifier: Verifier, round_inputs: RoundInputs, eta: torch.Tensor) -> torch.Tensor:
    """TV(out_i, q_i) [G, k] at T > 0 (Theorem 1), summed over the vocabulary in floating point. Where the
    mixed rule is the lossless one (eta = 0, or a verifier at its lossless setting) out = q exactly, so the
    deviation is 0 there rather than the sum's rounding (~1e-8)."""
    if verifier.is_lossless:
        return torch.zeros(eta.shape, dtype=torch.float32, device=eta.device)
    deviation = total_variation(one_step_output(verifier, round_inputs, eta), round_inputs.verified_target_probs())
    return deviation.masked_fill(eta == 0, 0.0)
