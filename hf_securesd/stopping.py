"""The stopping criteria `generate` prepared, applied in a speculative round.

transformers merges the criteria a caller passes with the ones it builds from the generation config: a
caller's `MaxLengthCriteria` or `EosTokenCriteria` replaces the built one of its type (the others are
added). `limits` reads what the merged list asks for, so that the loop's own length and EOS checks
(per row, on the device, with no call per token) stop exactly where those criteria would; any other
criterion is called token by token (`first_stops`), as plain decoding calls it.
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .prefixes import TokenBuffer
from .validation import SecureSDConfigError


def limits(
    stopping_criteria: StoppingCriteriaList, max_length: int, eos_token_id: torch.Tensor | None
) -> tuple[int, torch.Tensor | None]:
    """(max_length, eos ids [n] or None) at which the criteria's `MaxLengthCriteria` and
    `EosTokenCriteria` stop a row: the smallest of their lengths and the union of their ids. Without a
    criterion of a type, the given value (the generation config's) stands for it. A subclass of either
    is a criterion like any other (transformers adds it beside its own, and it is called per token)."""
    lengths = [criterion.max_length for criterion in stopping_criteria if type(criterion) is MaxLengthCriteria]
    ids = [
        torch.as_tensor(criterion.eos_token_id).reshape(-1)
        for criterion in stopping_criteria
        if type(criterion) is EosTokenCriteria
    ]
    if ids:
        eos_token_id = torch.unique(torch.cat([tensor.to(ids[0].device) for tensor in ids]))
    return (min(lengths) if lengths else max_length), eos_token_id


def only_length_and_eos(stopping_criteria: StoppingCriteriaList) -> bool:
    """True when every criterion is a `MaxLengthCriteria` or an `EosTokenCriteria` (those classes, not a
    subclass, which may decide otherwise): then `limits` says all they do, and no criterion needs a call
    per token."""
    return all(type(criterion) in (MaxLengthCriteria, EosTokenCriteria) for criterion in stopping_criteria)


def first_stops(
    stopping_criteria: StoppingCriteriaList,
    buffer: TokenBuffer,
    host_rows: list[int],
    counts: list[int],
    scores_until: Callable[[int], tuple[torch.Tensor, ...]] | None = None,
) -> list[int | None]:
    """For each of `host_rows` whose next counts[a] tokens are written after its committed tokens: the
    smallest n <= counts[a] at which the criteria stop it, or None. Criteria are called with the batch's
    full shape, one call per distinct prefix length (as plain `generate` calls them, token by token).

    scores_until: with `output_scores` (a single row), n -> the processed scores of every token up to the
    n-th of this round, which the criteria then receive as plain decoding passes them; else None."""
    lengths = buffer.host_lengths
    batch = len(lengths)
    device = buffer.tokens.device
    everyone = torch.arange(batch, device=device)
    available = list(lengths)
    wanted: dict[tuple[int, int], tuple[int, int]] = {}
    for a, (row, count) in enumerate(zip(host_rows, counts)):
        available[row] += count
        wanted.update({(row, lengths[row] + n): (a, n) for n in range(1, count + 1)})
    stops: list[int | None] = [None] * len(host_rows)
    for length in sorted({length for _, length in wanted}):
        if None not in stops:  # every row has stopped: no call past it (plain decoding makes none)
            break
        prefix = torch.tensor([min(length, tokens) for tokens in available], device=device)
        scores = None if scores_until is None else scores_until(length - lengths[host_rows[0]])
        done = row_verdicts(stopping_criteria, buffer.views(everyone, prefix, length), scores).tolist()
        for row in range(batch):
            hit = wanted.get((row, length))
            if hit is not None and done[row] and stops[hit[0]] is None:
                stops[hit[0]] = hit[1]
    return stops


def row_verdicts(
    stopping_criteria: StoppingCriteriaList, input_ids: torch.Tensor, scores: tuple[torch.Tensor, ...] | None
) -> torch.Tensor:
    """stopping_criteria(input_ids [B, L], scores) -> [B] bool, as `StoppingCriteriaList` combines them, with
    each criterion's verdict checked: in a batch, one verdict for the whole batch (a bool, a 0-d or [1]
    tensor: the `StopOnTokens` idiom that reads one row) cannot be honoured. Plain decoding stops every row
    at the step it fires, but speculative rows advance at different speeds, so some rows would already
    hold tokens past it; `SecureSDConfigError` names the criterion and the fix instead."""
    batch = input_ids.shape[0]
    done = torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
    for criterion in stopping_criteria:
        verdict = criterion(input_ids, scores)
        if batch > 1 and not (isinstance(verdict, torch.Tensor) and tuple(verdict.shape) == (batch,)):
            shape = tuple(verdict.shape) if isinstance(verdict, torch.Tensor) else type(verdict).__name__
            raise SecureSDConfigError(
                f"the stopping criterion {type(criterion).__name__} returned one verdict for the whole batch "
                f"({shape}) where speculative decoding needs one per row: its rows advance at different speeds, "
                "so a batch-wide stop cannot land where plain decoding puts it. Return a [batch_size] bool "
                "tensor (row i's verdict from input_ids[i] alone), or generate one row at a time"
            )
        done = done | verdict
    return done
