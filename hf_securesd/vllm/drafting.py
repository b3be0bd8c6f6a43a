"""Drafting for SecureSD rows inside vLLM's draft-model proposer: keep the raw draft logits of every
proposed token (also at T = 0, where FSD and BiLD read them) and draw the drafts the way the
`generate` path does.

The draft distribution is p = softmax(top-k/top-p(raw / T)), the request's own sampling parameters
applied to the draft as the `generate` path applies its processors to both models, the draft drawn
with the request's own generator when it has a `seed`; at T = 0 the draft is argmax(raw). vLLM's own
drafting differs: with its default `draft_sample_method="greedy"` it drafts argmax(raw) even at T > 0
and verifies against a one-hot p, and with `"probabilistic"` it samples from softmax(raw / T)
without top-k/top-p and keeps only those probabilities. Penalties, bad words, allowed token ids and
min_tokens reach the target only (as in vLLM): they change the acceptance rate, never what
verification may emit (a token they forbid is never accepted or drawn). Rows of plain requests keep
vLLM's drafting untouched; its draws for them leave SecureSD rows' generators alone.

A greedy proposal whose rows no verification round reads draft logits for (every SecureSD row greedy
and lossless: the rule reads the target's argmax alone) is vLLM's own drafting, which is argmax(raw)
as well: the plugin only counts its drafted positions (`DraftRows.records_logits`).

Should drafting SecureSD rows fail, the proposal goes on with vLLM's own drafting and records nothing
more: the SecureSD rows then verify only the drafts recorded before the failure (their token after
those comes from the target), which stays exact, and the engine goes on.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from ..argmax import vocab_argmax
from .request import SecureSDRequest

logger = logging.getLogger(__name__)


@dataclass
class DraftRows:
    """The batch the proposer is drafting for, set by the runner around one `propose` call.

    `requests[i]` is row i's SecureSD configuration (None for plain rows; fixed for the proposal);
    `steps` collects, per drafted position, the raw [R, V] and sampled-from [R, V] float32 logits of every
    row. With `records_logits` false (no verification round of these rows reads draft logits: greedy
    lossless rows) a greedy proposal is vLLM's own drafting, argmax(raw) as here, and only its drafted
    positions are counted (`unrecorded`, of `unrecorded_rows` rows each)."""

    requests: list[SecureSDRequest | None]
    steps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    records_logits: bool = True
    unrecorded: int = 0
    unrecorded_rows: int = 0
    failed: bool = False
    _flags: dict[tuple[int, torch.device], torch.Tensor] = field(default_factory=dict, repr=False)
    _stacked: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    any_securesd: bool = field(init=False)
    all_securesd: bool = field(init=False)

    def __post_init__(self) -> None:
        # Read at every drafted position of the proposal: found once.
        self.any_securesd = any(request is not None for request in self.requests)
        self.all_securesd = all(request is not None for request in self.requests)

    def securesd_flags(self, size: int, device: torch.device) -> torch.Tensor:
        """[size] bool, True at SecureSD rows (rows past the batch, padding, are not), built once per
        proposal for each size and device."""
        key = (size, device)
        if key not in self._flags:
            flags = ([request is not None for request in self.requests] + [False] * size)[:size]
            self._flags[key] = torch.tensor(flags, device=device)
        return self._flags[key]

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """([R, k, V] raw, [R, k, V] sampled-from) draft logits, or None if nothing was drafted; one tensor
        for both when every position was drawn from the raw logits themselves (greedy rows). Stacked on
        the first call and kept: a verification round that reads no draft logits (greedy lossless) never
        calls it, so no [R, k, V] copy is made for it."""
        if not self.steps:
            return None
        if self._stacked is None or self._stacked[0].shape[1] != len(self.steps):
            raw = torch.stack([raw for raw, _ in self.steps], dim=1)
            processed = raw
            if not all(processed is raw for raw, processed in self.steps):
                processed = torch.stack([processed for _, processed in self.steps], dim=1)
            self._stacked = raw, processed
        return self._stacked

    @property
    def batch_rows(self) -> int:
        """R, the rows the proposer drafted for (0 if nothing was drafted)."""
        return self.steps[0][0].shape[0] if self.steps else self.unrecorded_rows

    @property
    def proposals(self) -> int:
        """Positions drafted for every row, with or without their logits recorded."""
        return len(self.steps) + self.unrecorded

    def row_logits(self, row: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Row `row`'s (raw [k, V], sampled-from [k, V]) draft logits, views of `stacked()` (the same
        tensor twice for greedy rows); (None, None) for a row the proposer did not draft."""
        stacked = self.stacked() if row < self.batch_rows else None
        if stacked is None:
            return None, None
        raw, processed = stacked
        return raw[row], raw[row] if processed is raw else processed[row]


def draft_from_logits(
    raw: torch.Tensor, sampling_metadata: Any, rows: torch.Tensor, top_k_top_p: Callable
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw SecureSD drafts. raw: [R, V] float32 draft logits; rows: [R] bool, the SecureSD rows.

    Returns (tokens [R] long, sampled-from logits [R, V]); rows outside `rows` get argmax(raw) and
    are overwritten by the caller. `top_k_top_p(logits, k, p)` is vLLM's top-k/top-p op."""
    tokens = vocab_argmax(raw)
    temperature = sampling_metadata.temperature
    if sampling_metadata.all_greedy or temperature is None:
        return tokens, raw
    sampled = rows & (temperature[: raw.shape[0]].to(raw.device) > 0)
    if not bool(sampled.any()):
        return tokens, raw
    index = sampled.nonzero()[:, 0]
    top_k, top_p = (
        None if values is None else values[index.to(values.device)]
        for values in (sampling_metadata.top_k, sampling_metadata.top_p)
    )
    scaled = raw[index] / temperature[index.to(temperature.device)].to(raw.device, raw.dtype)[:, None]
    processed_rows = top_k_top_p(scaled, top_k, top_p)
    processed = raw.clone()
    processed[index] = processed_rows
    generators = getattr(sampling_metadata, "generators", None)
    tokens[index] = _draw(processed_rows.softmax(dim=-1), index.tolist(), generators)
    return tokens, processed


def _draw(probs: torch.Tensor, rows: list[int], generators: dict[int, torch.Generator] | None
          ) -> torch.Tensor:
    """[R'] one token per row of probs [R', V] (batch rows `rows`): with the row's own generator
    where the request has one (its `seed`), from torch's global generator otherwise."""
    if not generators or not any(row in generators for row in rows):
        return torch.multinomial(probs, 1)[:, 0]
    return torch.stack(
        [torch.multinomial(probs[i], 1, generator=generators.get(row))[0] for i, row in enumerate(rows)]
    )


def without_generators(sampling_metadata: Any, rows: Iterable[int]) -> Any:
    """`sampling_metadata` (vLLM's SamplingMetadata) without the generators of batch `rows`, for vLLM's
    own draws of other rows: a SecureSD row's generator then serves only SecureSD's draws, in the same
    order whatever else is in the batch, so its `seed` fixes its output."""
    generators = getattr(sampling_metadata, "generators", None)
    if not generators:
        return sampling_metadata
    rows = set(rows)
    if not rows & set(generators):
        return sampling_metadata
    kept = {row: generator for row, generator in generators.items() if row not in rows}
    return dataclasses.replace(sampling_metadata, generators=kept)


def patch_proposer(proposer_class: type, top_k_top_p: Callable) -> Callable[[], None]:
    """Wrap `proposer_class._sample_draft_tokens`; returns a function that undoes it.

    While the runner has set `proposer.securesd_rows` (a DraftRows), SecureSD rows are drafted by
    `draft_from_logits` and their logits recorded; otherwise vLLM's method runs unchanged."""
    original = proposer_class._sample_draft_tokens

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata: Any):
        rows: DraftRows | None = getattr(self, "securesd_rows", None)
        if rows is None or rows.failed or not rows.any_securesd:
            return original(self, hidden_states, sampling_metadata)
        if not rows.records_logits and sampling_metadata.all_greedy:
            rows.unrecorded += 1
            rows.unrecorded_rows = hidden_states.shape[0]
            return original(self, hidden_states, sampling_metadata)
        try:
            raw = self.model.compute_logits(hidden_states).to(torch.float32)
            ours = rows.securesd_flags(raw.shape[0], raw.device)
            tokens, processed = draft_from_logits(raw, sampling_metadata, ours, top_k_top_p)
        except Exception:  # noqa: BLE001 - drafting must not stop the engine (module doc)
            logger.exception("SecureSD drafting failed; vLLM drafts the rest of this proposal, unrecorded")
            rows.failed = True
            return original(self, hidden_states, sampling_metadata)
        rows.steps.append((raw, processed))
        if rows.all_securesd:
            return tokens, None
        mine = [row for row, request in enumerate(rows.requests) if request is not None]
        theirs, probs = original(self, hidden_states, without_generators(sampling_metadata, mine))
        return torch.where(ours, tokens.to(theirs.dtype), theirs), probs

    proposer_class._sample_draft_tokens = _sample_draft_tokens

    def undo() -> None:
        proposer_class._sample_draft_tokens = original

    return undo
