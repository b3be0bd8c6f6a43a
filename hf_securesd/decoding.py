"""The speculative decoding loop: draft forwards with the draft's own KV cache, one target forward per
round, SecureSD verification, per-row bookkeeping for batches with ragged acceptance.

One round (SPEC.md §2), for a row whose response has t tokens so far:

1. the draft proposes x_1..x_k autoregressively, keeping its logits (k draft forwards);
2. one target forward over [pending token, x_1..x_k] gives q_1..q_{k+1} (the pending token is the
   one drawn at the end of the previous round, not yet in either cache);
3. x_i is accepted with probability alpha_mix(t+i-1); at the first rejection a token is drawn from
   R_mix and the round ends; if all k are accepted a bonus token is drawn from q_{k+1}.

Batches: every row drafts k tokens and feeds k+1 slots to the target each round, but rows accept
different numbers. Each model's cache keeps a slot mask [B, S]: the slots of rejected drafts become
holes (masked out of attention, skipped by the position ids), so rows advance independently without
re-running anything; slots that are holes in every row (always the case for a single row) are
cropped away. Rows that finish (EOS, length, stopping criteria) leave the batch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .mixing import greedy_deviation, one_step_output, total_variation, verify_round
from .schedules import Schedule
from .stats import SpeculativeStats
from .verifiers.base import RoundInputs, Verifier


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN or infinite logits; decoding stops instead of emitting a wrong token."""


class _ModelRunner:
    """One model, its KV cache and, once a slot is a hole, the validity mask of the slots ([B, S] bool).

    While every slot is valid (always for a single row) no mask is kept: positions are a plain range
    and attention gets no mask, exactly as in plain decoding."""

    def __init__(self, model: PreTrainedModel, cache: DynamicCache | None) -> None:
        self.model = model
        self.cache = cache if cache is not None else DynamicCache(config=model.config)
        self.num_slots = 0
        self.slot_mask: torch.Tensor | None = None
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, keep: int, who: str) -> torch.Tensor:
        """Feed new slots. tokens: [B, m]; token_mask: [B, m] (False = a hole) or None (all valid)
        -> float32 logits of the last `keep` slots [B, keep, V]."""
        device = self.model.device
        batch, width = tokens.shape
        if self.slot_mask is None and token_mask is None:
            positions = torch.arange(self.num_slots, self.num_slots + width, device=device).expand(batch, -1)
            attention_mask = None
        else:
            previous = self.slot_mask if self.slot_mask is not None else torch.ones(batch, self.num_slots, dtype=torch.bool, device=device)
            new = token_mask.to(device) if token_mask is not None else torch.ones(batch, width, dtype=torch.bool, device=device)
            positions = (previous.sum(-1, keepdim=True) + new.long().cumsum(-1) - 1).clamp_min(0)
            self.slot_mask = torch.cat([previous, new], dim=-1)
            attention_mask = self.slot_mask.long()
        kwargs = {self._cache_argument: self.cache, "use_cache": True, "position_ids": positions, "attention_mask": attention_mask}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        logits = self.model(input_ids=tokens.to(device), **kwargs).logits[:, -keep:].to(torch.float32)
        self.num_slots += width
        if not torch.isfinite(logits).all():
            raise NonFiniteLogitsError(
                f"the {who} model produced NaN or infinite logits; decoding stopped rather than emit a wrong "
                f"token. Check the {who}'s dtype (fp16 overflow is the usual cause: load it in bfloat16 or "
                "float32) and its weights."
            )
        return logits

    def keep_slots(self, start: int, kept: torch.Tensor) -> None:
        """Of the slots from `start` on, row b keeps its first kept[b]; the rest become holes.
        Slots that are holes in every row at the end are cropped from the cache."""
        kept = kept.to(self.model.device)
        if self.slot_mask is None and bool((kept == kept[0]).all()):
            self._crop_to(start + int(kept[0]))
            return
        if self.slot_mask is None:
            self.slot_mask = torch.ones(kept.shape[0], self.num_slots, dtype=torch.bool, device=kept.device)
        offsets = torch.arange(self.num_slots - start, device=self.slot_mask.device)
        self.slot_mask[:, start:] &= offsets[None] < kept[:, None]
        used = self.slot_mask.any(dim=0).nonzero()
        self._crop_to(int(used[-1]) + 1 if used.numel() else 0)
        if bool(self.slot_mask.all()):
            self.slot_mask = None

    def _crop_to(self, length: int) -> None:
        if length < self.num_slots:
            self.cache.crop(length - self.num_slots)
            if self.slot_mask is not None:
                self.slot_mask = self.slot_mask[:, :length]
            self.num_slots = length

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows.to(self.model.device))
        if self.slot_mask is not None:
            self.slot_mask = self.slot_mask[rows.to(self.slot_mask.device)]
            if bool(self.slot_mask.all()):
                self.slot_mask = None

    @property
    def has_holes(self) -> bool:
        return self.slot_mask is not None


def _process(logits_processor: LogitsProcessorList, rows: list[torch.Tensor], drafts: torch.Tensor, raw: torch.Tensor, who: str) -> torch.Tensor:
    """Apply the user's processors (temperature/top-k/top-p included when sampling) at each position.

    rows: B committed sequences [L_b]; drafts: [B, d] drafted tokens already appended to each row;
    raw: [B, n, V] logits for the tokens that follow row + drafts[:, :i] for i = 0..n-1 -> [B, n, V].
    Each row sees exactly its own prefix. The processors are called one by one (the list's own
    __call__ inspects every signature on every call)."""
    if len(logits_processor) == 0:
        return raw
    processed = raw.clone()
    for b, row in enumerate(rows):
        sequence = torch.cat([row, drafts[b].to(row.device)])
        for i in range(raw.shape[1]):
            scores = raw[b : b + 1, i].clone()
            prefix = sequence[None, : row.shape[0] + i]
            for processor in logits_processor:
                scores = processor(prefix, scores)
            processed[b, i] = scores[0]
    if torch.isnan(processed).any() or (processed == float("-inf")).all(dim=-1).any():
        raise NonFiniteLogitsError(
            f"the logits processors left the {who} with NaN scores or no allowed token; check the processors "
            "passed to generate (e.g. conflicting bad_words_ids / top_k / top_p settings)"
        )
    return processed


def _only_length_and_eos(stopping_criteria: StoppingCriteriaList) -> bool:
    return all(isinstance(criterion, (MaxLengthCriteria, EosTokenCriteria)) for criterion in stopping_criteria)


def _commit_length(
    row: torch.Tensor, new_tokens: torch.Tensor, budget: int, eos: torch.Tensor | None, stopping_criteria, check_each_token: bool
) -> tuple[int, bool]:
    """How many of `new_tokens` [n] row [L] keeps, and whether the row is finished after them."""
    count = min(new_tokens.shape[0], budget)
    finished = count == budget
    if eos is not None:
        hits = torch.isin(new_tokens[:count], eos).nonzero()
        if hits.numel():
            count, finished = int(hits[0]) + 1, True
    if check_each_token:
        for n in range(1, count + 1):
            if bool(stopping_criteria(torch.cat([row, new_tokens[:n]])[None], None).all()):
                return n, True
    return count, finished


@dataclass
class DecodeResult:
    sequences: torch.Tensor
    row_stats: list[SpeculativeStats]
    scores: tuple[torch.Tensor, ...] | None
    raw_logits: tuple[torch.Tensor, ...] | None
    cache: DynamicCache | None


def speculative_decode(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    input_ids: torch.Tensor,
    *,
    verifier: Verifier,
    schedule: Schedule | None,
    num_draft_tokens: int,
    do_sample: bool,
    max_length: int,
    eos_token_id: torch.Tensor | None,
    pad_token_id: int | None,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    attention_mask: torch.Tensor | None = None,
    target_cache: DynamicCache | None = None,
    streamer=None,
    collect_deviation: bool = False,
    output_scores: bool = False,
    output_logits: bool = False,
) -> DecodeResult:
    """Generate until every row hits EOS, `max_length` or a stopping criterion.

    Args:
        input_ids: [B, P] prompts, left-padded when B > 1.
        attention_mask: [B, P] (0 on padding) or None when nothing is padded.
        eos_token_id: [n_eos] end-of-sequence ids, or None.
        pad_token_id: fills rows that finished early in the returned [B, P + new] tensor.
        collect_deviation: also compute the exact per-position TV deviation (Theorem 1), which
            evaluates the acceptance rule over the whole vocabulary each round.
        output_scores / output_logits: single row only: processed / raw target logits per token.
    """
    verifier.check_draft_length(num_draft_tokens)
    device = input_ids.device
    batch, prompt_length = input_ids.shape
    prompt_holes = attention_mask.bool() if attention_mask is not None and not bool(attention_mask.all()) else None
    target_runner = _ModelRunner(target, target_cache)
    draft_runner = _ModelRunner(draft, None)
    rows = [input_ids[b] for b in range(batch)]  # committed tokens per row (prompt included)
    active = torch.arange(batch, device=device)  # original row index of each row still decoding
    stats = [SpeculativeStats() for _ in range(batch)]
    scores: tuple[torch.Tensor, ...] | None = () if output_scores else None
    raw_logits: tuple[torch.Tensor, ...] | None = () if output_logits else None
    check_each_token = not _only_length_and_eos(stopping_criteria)
    eos = eos_token_id.to(device) if eos_token_id is not None else None
    pending: torch.Tensor | None = None  # [B_active] last committed token (rows[b][-1]), in neither cache yet
    last_draft: torch.Tensor | None = None  # [B_active] x_k of rows that accepted all k (else -1)

    while active.numel():
        lengths = [rows[int(b)].shape[0] for b in active]
        k = max(0, min(num_draft_tokens, max_length - min(lengths) - 1))

        # 1. Draft k tokens (first step feeds what the draft has not seen yet).
        if pending is None:
            draft_input, draft_mask = input_ids[active], prompt_holes[active] if prompt_holes is not None else None
        elif bool((last_draft >= 0).any()):
            draft_input = torch.stack([last_draft.clamp_min(0), pending], dim=1)
            draft_mask = torch.stack([last_draft >= 0, torch.ones_like(pending, dtype=torch.bool)], dim=1)
            draft_mask = None if bool(draft_mask.all()) else draft_mask
        else:
            draft_input, draft_mask = pending[:, None], None
        committed = [rows[int(b)] for b in active]
        first_draft_slot = draft_runner.num_slots + draft_input.shape[1]
        drafted, draft_raw, draft_processed = [], [], []
        for step in range(k):
            raw = draft_runner.forward(draft_input, draft_mask, keep=1, who="draft")
            so_far = torch.stack(drafted, dim=1) if drafted else raw.new_zeros(len(committed), 0, dtype=torch.long)
            processed = _process(logits_processor, committed, so_far, raw, "draft")[:, 0]
            token = torch.multinomial(processed.softmax(-1), 1)[:, 0] if do_sample else processed.argmax(-1)
            drafted.append(token.to(device))
            draft_raw.append(raw[:, 0].to(device))
            draft_processed.append(processed.to(device))
            draft_input, draft_mask = token[:, None], None
        drafts = torch.stack(drafted, dim=1) if k else input_ids.new_zeros(active.numel(), 0)

        # 2. Score every draft with one target forward.
        if pending is None:
            target_input = torch.cat([input_ids[active], drafts], dim=1)
            target_mask = None
            if prompt_holes is not None:
                target_mask = torch.cat([prompt_holes[active], torch.ones_like(drafts, dtype=torch.bool)], dim=1)
            first_kept_slot = target_runner.num_slots + prompt_length
        else:
            target_input = torch.cat([pending[:, None], drafts], dim=1)
            target_mask = None
            first_kept_slot = target_runner.num_slots
        target_raw = target_runner.forward(target_input, target_mask, keep=k + 1, who="target").to(device)
        target_processed = _process(logits_processor, committed, drafts, target_raw, "target")

        # 3. Verify.
        vocab = target_raw.shape[-1]
        round_inputs = RoundInputs(
            draft_tokens=drafts,
            target_logits=target_processed,
            draft_logits=torch.stack(draft_processed, dim=1) if k else target_raw.new_zeros(drafts.shape[0], 0, vocab),
            target_raw_logits=target_raw,
            draft_raw_logits=torch.stack(draft_raw, dim=1) if k else target_raw.new_zeros(drafts.shape[0], 0, vocab),
            greedy=not do_sample,
            draft_lengths=torch.tensor([min(k, max_length - row.shape[0] - 1) for row in committed], device=device),
        )
        response_positions = torch.tensor([row.shape[0] - prompt_length for row in committed], device=device)
        positions = response_positions[:, None] + torch.arange(k, device=device)
        eta = schedule.eta(positions) if schedule is not None else torch.ones(positions.shape, device=device)
        accepted, next_token, alpha = verify_round(verifier, round_inputs, eta)
        deviation = None
        if collect_deviation and k:
            deviation = (
                greedy_deviation(round_inputs, alpha)
                if not do_sample
                else total_variation(one_step_output(verifier, round_inputs, eta), round_inputs.verified_target_probs())
            )

        # 4. Commit per row, then drop finished rows and forget rejected slots.
        still_running = []
        for index, b in enumerate(active.tolist()):
            n, row_k = int(accepted[index]), int(round_inputs.draft_lengths[index])
            row_deviation = None if deviation is None else deviation[index, : min(n + 1, row_k)].tolist()
            stats[b].record_round(int(response_positions[index]), row_k, n, row_deviation)
            new_tokens = torch.cat([drafts[index, :n], next_token[index : index + 1]])
            count, finished = _commit_length(
                committed[index], new_tokens, max_length - committed[index].shape[0], eos, stopping_criteria, check_each_token
            )
            rows[b] = torch.cat([rows[b], new_tokens[:count]])
            stats[b].new_tokens += count
            if output_scores:
                scores += tuple(target_processed[:, i] for i in range(count))
            if output_logits:
                raw_logits += tuple(target_raw[:, i] for i in range(count))
            if streamer is not None:
                streamer.put(new_tokens[:count].cpu())
            if not finished:
                still_running.append(index)
        target_runner.keep_slots(first_kept_slot, accepted + (0 if pending is None else 1))
        if k:
            draft_runner.keep_slots(first_draft_slot, accepted.clamp(max=k - 1))
        last_draft = torch.where(accepted == k, drafts[:, -1], -1) if k else torch.full_like(accepted, -1)
        pending = next_token
        if len(still_running) < active.numel():
            keep = torch.tensor(still_running, dtype=torch.long, device=device)
            active, pending, last_draft = active[keep], pending[keep], last_draft[keep]
            if keep.numel():
                target_runner.select_rows(keep)
                draft_runner.select_rows(keep)

    if streamer is not None:
        streamer.end()
    return DecodeResult(
        _right_pad(rows, pad_token_id),
        stats,
        scores,
        raw_logits,
        None if target_runner.has_holes or batch > 1 else target_runner.cache,
    )


def _right_pad(rows: list[torch.Tensor], pad_token_id: int | None) -> torch.Tensor:
    """Stack rows [L_b] into [B, max L_b], filling with the pad token (as HF does for finished rows)."""
    width = max(row.shape[0] for row in rows)
    if pad_token_id is None and any(row.shape[0] < width for row in rows):
        raise ValueError("rows finished at different lengths and no pad_token_id is set; pass pad_token_id= to generate")
    out = rows[0].new_full((len(rows), width), pad_token_id if pad_token_id is not None else 0)
    for b, row in enumerate(rows):
        out[b, : row.shape[0]] = row
    return out
