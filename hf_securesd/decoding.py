"""The speculative decoding loop: draft forwards with the draft's own KV cache, one target forward per
round, SecureSD verification, all rows of a batch handled together.

One round (SPEC.md §2), for a row whose response has t tokens so far:

1. the draft proposes x_1..x_d autoregressively, keeping its logits (d <= k draft forwards; k and the
   early stop on low draft confidence follow HF's draft-length controls, see `draft_length.py`);
2. one target forward over [pending token, x_1..x_d] gives q_1..q_{d+1} (the pending token is the
   one drawn at the end of the previous round, not yet in either cache);
3. x_i is accepted with probability alpha_mix(t+i-1); at the first rejection a token is drawn from
   R_mix and the round ends; if all d are accepted a bonus token is drawn from q_{d+1}.

Batches: every row drafts the round's k tokens and feeds k+1 slots to the target, but rows keep
different numbers. Each model's cache keeps a slot mask [B, S]: the slots of rejected drafts become
holes (masked out of attention, skipped by the position ids), so rows advance independently without
re-running anything; slots that are holes in every row are cropped away. Rows that finish (EOS,
length, stopping criteria) leave the batch. Logits processors run batched, each row seeing its own
prefix and batch row (`prefixes.py`); commit, EOS and length checks run on the device for all rows,
and a round reads its outcome back to the host once, whatever the batch size.

A cache passed in (`past_key_values=` / `cache=` of a previous call) is continued exactly: the target
is fed only the uncached suffix of the input, the draft prefills the whole input. The returned cache
(single rows) holds every token but the last one, as plain decoding leaves it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .draft_length import DraftLength, DraftLengthController
from .mixing import greedy_deviation, one_step_output, total_variation, verify_round
from .prefixes import Health, RowProcessing, TokenBuffer, checked_scores, first_stops
from .schedules import Schedule, schedule_weights
from .stats import RoundRecorder, SpeculativeStats
from .verifiers.base import RoundInputs, Verifier


class NonFiniteLogitsError(FloatingPointError):
    """A model or the logits processors produced NaN or unusable scores; decoding stops instead of
    emitting a wrong token."""


class _ModelRunner:
    """One model, its KV cache and, once a slot is a hole, the validity mask of the slots ([B, S] bool).

    While every slot is valid (always for a single row) no mask is kept: positions are a plain range
    and attention gets no mask, exactly as in plain decoding."""

    def __init__(self, model: PreTrainedModel, cache: DynamicCache | None, cached_mask: torch.Tensor | None = None) -> None:
        self.model = model
        self.device = model.device
        self.cache = cache if cache is not None else DynamicCache(config=model.config)
        self.num_slots = self.cache.get_seq_length() if cache is not None else 0
        self.slot_mask = cached_mask
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, keep: int) -> torch.Tensor:
        """Feed new slots. tokens: [B, m]; token_mask: [B, m] (False = a hole) or None (all valid)
        -> float32 logits of the last `keep` slots [B, keep, V]."""
        device = self.device
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
        return logits

    def keep_slots(self, start: int, kept: list[int]) -> None:
        """Of the slots from `start` on, row b keeps its first kept[b]; the rest become holes. The slot
        before `start` is valid in some row, so the cache is cropped to start + max(kept)."""
        if self.slot_mask is None and min(kept) == max(kept):
            self._crop_to(start + kept[0])
            return
        device = self.device
        if self.slot_mask is None:
            self.slot_mask = torch.ones(len(kept), self.num_slots, dtype=torch.bool, device=device)
        offsets = torch.arange(self.num_slots - start, device=device)
        self.slot_mask[:, start:] &= offsets[None] < torch.tensor(kept, device=device)[:, None]
        self._crop_to(start + max(kept))

    def _crop_to(self, length: int) -> None:
        if length < self.num_slots:
            self.cache.crop(length - self.num_slots)
            if self.slot_mask is not None:
                self.slot_mask = self.slot_mask[:, :length]
            self.num_slots = length

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows.to(self.device))
        if self.slot_mask is not None:
            self.slot_mask = self.slot_mask[rows.to(self.slot_mask.device)]

    @property
    def has_holes(self) -> bool:
        return self.slot_mask is not None


def _only_length_and_eos(stopping_criteria: StoppingCriteriaList) -> bool:
    return all(isinstance(criterion, (MaxLengthCriteria, EosTokenCriteria)) for criterion in stopping_criteria)


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
    draft_length: DraftLength,
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
        input_ids: [B, P] prompts, left-padded when B > 1 (with `target_cache`: the whole conversation,
            of which the cache holds the first `target_cache.get_seq_length()` tokens).
        draft_length: k, its schedule and the draft's confidence early stop (`draft_length.py`).
        attention_mask: [B, P] (0 on padding) or None when nothing is padded.
        eos_token_id: [n_eos] end-of-sequence ids, or None.
        pad_token_id: fills rows that finished early in the returned [B, P + new] tensor.
        collect_deviation: also compute the exact per-position TV deviation (Theorem 1). Closed form at
            T = 0; at T > 0 it evaluates the acceptance rule over the whole vocabulary each round.
        output_scores / output_logits: single row only: processed / raw target logits per token.
    """
    verifier.check_draft_length(draft_length.num_tokens)
    device = input_ids.device
    batch, prompt_length = input_ids.shape
    prompt_mask = attention_mask.bool() if attention_mask is not None and not bool(attention_mask.all()) else None
    cached = target_cache.get_seq_length() if target_cache is not None else 0
    if cached >= prompt_length:
        raise ValueError(
            f"the cache passed to generate already holds {cached} tokens but the input has {prompt_length}; pass the "
            "whole conversation so far plus at least one new token as input_ids (the cache keeps all but the last "
            "token of a previous call's output)"
        )
    target_runner = _ModelRunner(target, target_cache, prompt_mask[:, :cached] if prompt_mask is not None and cached else None)
    draft_runner = _ModelRunner(draft, None)
    buffer = TokenBuffer(input_ids, capacity=2 * max_length + 2)
    processing = RowProcessing(logits_processor, buffer)
    controller = DraftLengthController(draft_length, batch, device)
    recorder = RoundRecorder(batch)
    health = Health()
    check_each_token = not _only_length_and_eos(stopping_criteria)
    eos = eos_token_id.to(device) if eos_token_id is not None else None
    scores: tuple[torch.Tensor, ...] | None = () if output_scores else None
    raw_logits: tuple[torch.Tensor, ...] | None = () if output_logits else None

    rows = torch.arange(batch, device=device)  # batch row of each row still decoding
    host_rows = list(range(batch))
    pending: torch.Tensor | None = None  # [A] last committed token, in neither cache yet
    last_draft: torch.Tensor | None = None  # [A] x_k of rows that accepted all k drafts (else -1), or None
    all_full = False  # every row accepted all k drafts last round
    while host_rows:
        active = len(host_rows)
        budgets = [max_length - buffer.host_lengths[row] - 1 for row in host_rows]
        limits = controller.limits(host_rows, budgets)
        k = max(limits)
        limit = torch.tensor(limits, device=device) if controller.early_stop or min(limits) < k else None

        # 1. Draft up to k tokens (the first step feeds what the draft has not seen yet).
        if pending is None:
            draft_input, draft_mask = input_ids, prompt_mask
        elif last_draft is not None:
            draft_input = torch.stack([last_draft.clamp_min(0), pending], dim=1)
            draft_mask = None
            if not all_full:
                draft_mask = torch.stack([last_draft >= 0, torch.ones_like(pending, dtype=torch.bool)], dim=1)
        else:
            draft_input, draft_mask = pending[:, None], None
        first_draft_slot = draft_runner.num_slots + draft_input.shape[1]
        drafted, draft_raw, draft_processed, confidence = [], [], [], []
        if controller.early_stop:
            drafted_count, stopped = torch.zeros_like(limit), torch.zeros_like(limit, dtype=torch.bool)
        for step in range(k):
            raw = draft_runner.forward(draft_input, draft_mask, keep=1)
            processed = processing(raw, rows, host_rows, offset=step)[:, 0]
            if processing.processors or do_sample:
                processed = checked_scores(processed, do_sample, health, "draft")
            token = torch.multinomial(processed.softmax(-1), 1)[:, 0] if do_sample else processed.argmax(-1)
            if processing.processors:
                buffer.write(rows, step, token[:, None], every_row=active == batch)
            drafted.append(token)
            draft_raw.append(raw[:, 0])
            draft_processed.append(processed)
            draft_input, draft_mask = token[:, None], None
            if controller.early_stop:
                probability = processed.softmax(-1).gather(1, token[:, None])[:, 0]
                confidence.append(probability)
                drafted_count += (~stopped & (step < limit)).long()
                stopped |= probability < controller.thresholds[rows]
                if step + 1 < k and bool((stopped | (step + 1 >= limit)).all()):
                    break
        k = len(drafted)
        draft_lengths = drafted_count if controller.early_stop else limit  # None: k for every row
        drafts = torch.stack(drafted, dim=1) if k else input_ids.new_zeros(active, 0)

        # 2. Score every draft with one target forward.
        if pending is None:
            target_input = torch.cat([input_ids[:, cached:], drafts], dim=1)
            target_mask = None
            if prompt_mask is not None:
                target_mask = torch.cat([prompt_mask[:, cached:], torch.ones_like(drafts, dtype=torch.bool)], dim=1)
            first_kept_slot = target_runner.num_slots + prompt_length - cached
        else:
            target_input, target_mask = torch.cat([pending[:, None], drafts], dim=1), None
            first_kept_slot = target_runner.num_slots
        target_raw = target_runner.forward(target_input, target_mask, keep=k + 1)
        health.flag("target_model", ~torch.isfinite(target_raw).all())
        draft_raw_logits = torch.stack(draft_raw, dim=1) if k else target_raw.new_zeros(active, 0, target_raw.shape[-1])
        health.flag("draft_model", ~torch.isfinite(draft_raw_logits).all())
        target_processed = processing(target_raw, rows, host_rows, offset=0)
        if processing.processors:
            vocab = target_raw.shape[-1]
            target_processed = checked_scores(target_processed.reshape(-1, vocab), do_sample, health, "target").reshape(active, k + 1, vocab)
        problem = health.problem()
        if problem is not None:
            raise NonFiniteLogitsError(problem)

        # 3. Verify.
        empty = target_raw.new_zeros(active, 0, target_raw.shape[-1])
        round_inputs = RoundInputs(
            draft_tokens=drafts,
            target_logits=target_processed,
            draft_logits=torch.stack(draft_processed, dim=1) if k else empty,
            target_raw_logits=target_raw,
            draft_raw_logits=draft_raw_logits,
            greedy=not do_sample,
            draft_lengths=draft_lengths,
        )
        starts = [buffer.host_lengths[row] - prompt_length for row in host_rows]
        responses = None
        if schedule is not None and schedule.reads_tokens:
            responses = [buffer.tokens[row, prompt_length : buffer.host_lengths[row]].tolist() for row in host_rows]
        eta = schedule_weights(schedule, buffer.lengths[rows] - prompt_length, drafts, responses)
        accepted, next_token, alpha = verify_round(verifier, round_inputs, eta)
        deviation = None
        if collect_deviation and k:
            deviation = (
                greedy_deviation(round_inputs, alpha)
                if not do_sample
                else total_variation(one_step_output(verifier, round_inputs, eta), round_inputs.verified_target_probs())
            )

        # 4. Commit for all rows on the device, then read the round's outcome back once.
        new_tokens = torch.cat([drafts, drafts.new_zeros(active, 1)], dim=1).scatter(1, accepted[:, None], next_token[:, None])
        room = max_length - buffer.lengths[rows]
        count = torch.minimum(accepted + 1, room)
        finished = count >= room
        if eos is not None:
            hits = torch.isin(new_tokens, eos) & (torch.arange(k + 1, device=device)[None] < count[:, None])
            hit = hits.any(dim=-1)
            count = torch.where(hit, hits.long().argmax(dim=-1) + 1, count)
            finished |= hit
        buffer.write(rows, 0, new_tokens, every_row=active == batch)
        read_back = [accepted, count, finished.long()] + ([draft_lengths] if controller.early_stop else [])
        outcome = [torch.stack(read_back).flatten().double()]
        if deviation is not None:
            outcome.append(deviation.flatten().double())
        values = torch.cat(outcome).tolist() if len(outcome) > 1 else outcome[0].tolist()
        accepted_h, count_h, finished_h = ([int(value) for value in values[i * active : (i + 1) * active]] for i in range(3))
        drafted_h = [int(value) for value in values[3 * active : 4 * active]] if controller.early_stop else limits
        deviation_h = None
        if deviation is not None:
            base = len(read_back) * active
            deviation_h = [values[base + a * k : base + (a + 1) * k] for a in range(active)]
        if check_each_token:
            for a, stop in enumerate(first_stops(stopping_criteria, buffer, host_rows, count_h)):
                if stop is not None:
                    count_h[a], finished_h[a] = stop, 1
            count = torch.tensor(count_h, device=device)
        recorder.record(host_rows, starts, drafted_h, accepted_h, count_h, finished_h, deviation_h)
        controller.record(
            rows, host_rows, drafted_h, accepted_h, torch.stack(confidence, 1) if confidence else None, accepted, draft_lengths
        )
        if output_scores:
            scores += tuple(target_processed[:, i] for i in range(count_h[0]))
        if output_logits:
            raw_logits += tuple(target_raw[:, i] for i in range(count_h[0]))
        if streamer is not None:
            streamer.put(new_tokens[0, : count_h[0]].cpu())
        buffer.advance(rows, count, host_rows, count_h)
        first_round = pending is None
        target_runner.keep_slots(first_kept_slot, [min(n, c - 1) + (0 if first_round else 1) for n, c in zip(accepted_h, count_h)])
        if k:
            draft_runner.keep_slots(first_draft_slot, [min(n, k - 1) for n in accepted_h])
        pending = next_token
        still = [a for a in range(active) if not finished_h[a]]
        full = [k > 0 and accepted_h[a] == k for a in still]
        last_draft = torch.where(accepted == k, drafts[:, -1], -1) if any(full) else None
        all_full = all(full)
        if len(still) < active:
            host_rows = [host_rows[a] for a in still]
            if still:
                keep = torch.tensor(still, dtype=torch.long, device=device)
                rows, pending = rows[keep], pending[keep]
                last_draft = last_draft[keep] if last_draft is not None else None
                target_runner.select_rows(keep)
                draft_runner.select_rows(keep)

    if streamer is not None:
        streamer.end()
    controller.finish(draft.generation_config)
    return DecodeResult(
        buffer.sequences(pad_token_id),
        recorder.finish(),
        scores,
        raw_logits,
        None if target_runner.has_holes or batch > 1 else target_runner.cache,
    )
