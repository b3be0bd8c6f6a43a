"""Proposers for the `generate` loop: where a round's drafts come from.

A proposer returns, for the active rows [A], up to k draft tokens per row and, if it has one, the
distribution they were drawn from. Two proposers:

* `DraftModelProposer`: a smaller model sharing the target's vocabulary, drafting autoregressively
  with its own KV cache (greedy at T = 0, sampled from its processed distribution at T > 0), with
  HF's confidence early stop (`assistant_confidence_threshold`).
* `PromptLookupProposer`: HF's prompt lookup (`prompt_lookup_num_tokens`, `max_matching_ngram_size`),
  per batch row: the continuation of the first earlier occurrence of the row's last n-gram in its own
  tokens (prompt and response), the longest n first. It has no draft distribution: its drafts are
  one-hot, which the lossless rule verifies exactly at any temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from transformers import PreTrainedModel

from .argmax import vocab_argmax
from .draft_length import DraftLengthController
from .model_runner import ModelRunner
from .draws import draw_rows
from .host_values import long_tensor
from .prefixes import Health, RowProcessing, TokenBuffer, usable_scores


@dataclass
class Proposal:
    """One round's drafts for the active rows.

    Args:
        tokens: [A, k] long; entries past a row's count are padding.
        counts: [A] long drafts per row, or None when every row drafted k.
        logits: [A, k, V] processed draft logits (what the drafts were sampled from), or None (one-hot).
        raw_logits: [A, k, V] raw draft logits, or None.
        probs: [A, k, V] softmax(logits), the probabilities the drafts were drawn from (T > 0), or None.
        confidence: [A, k] draft probability of each drafted token (for the early-stop tuning), or None.
        host_counts: per active row, its count (host copy).
    """

    tokens: torch.Tensor
    counts: torch.Tensor | None
    logits: torch.Tensor | None
    raw_logits: torch.Tensor | None
    confidence: torch.Tensor | None
    host_counts: list[int]
    probs: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]


@dataclass
class RoundState:
    """What a proposer may read about the active rows.

    Args:
        rows: [A] long batch row of each active row (device).
        host_rows: the same, on the host.
        pending: [A, 1] the token committed last round, in no cache yet (None before the first round).
        limits: per active row, the most drafts it may propose this round.
    """

    rows: torch.Tensor
    host_rows: list[int]
    pending: torch.Tensor | None
    limits: list[int]


class Proposer(Protocol):
    """What the loop asks of a proposer: a round's drafts, then the outcome of their verification."""

    def propose(self, state: RoundState) -> Proposal: ...

    def after_round(self, accepted: torch.Tensor, host_accepted: list[int], still: list[int], proposal: Proposal) -> None:
        """Update the proposer's own state after verification (`still`: active rows that go on)."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only active rows `keep` [A'] (indices into the current active rows)."""


class DraftModelProposer:
    """Drafts with a model: up to k forwards per round, each feeding the token drafted before."""

    def __init__(
        self,
        draft: PreTrainedModel,
        input_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        buffer: TokenBuffer,
        processing: RowProcessing,
        controller: DraftLengthController,
        health: Health,
        do_sample: bool,
    ) -> None:
        self.runner = ModelRunner(draft, None)
        self.input_ids, self.prompt_mask = input_ids, prompt_mask
        self.buffer, self.processing, self.controller, self.health = buffer, processing, controller, health
        self.do_sample = do_sample
        self.last_draft: torch.Tensor | None = None  # [A, 1] x_k of rows that accepted all k (else -1)
        self.all_full = False  # every row accepted all k drafts last round
        self.first_slot = 0

    def _first_input(self, pending: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the draft has not seen yet: the prompt, or [x_k,] pending ([A, 1] or [A, 2])."""
        if pending is None:
            return self.input_ids, self.prompt_mask
        if self.last_draft is None:
            return pending, None
        if self.all_full:
            return torch.cat([self.last_draft, pending], dim=1), None
        tokens = torch.cat([self.last_draft.clamp_min(0), pending], dim=1)
        return tokens, torch.cat([self.last_draft >= 0, torch.ones_like(pending, dtype=torch.bool)], dim=1)

    def propose(self, state: RoundState) -> Proposal:
        k = max(state.limits)
        controller, active = self.controller, len(state.host_rows)
        limit = long_tensor(state.limits, state.rows.device) if controller.early_stop or min(state.limits) < k else None
        tokens_in, mask_in = self._first_input(state.pending)
        self.first_slot = self.runner.num_slots + tokens_in.shape[1]
        drafted, raw_steps, processed_steps, confidence, drawn_from = [], [], [], [], []
        if controller.early_stop:
            drafted_count, stopped = torch.zeros_like(limit), torch.zeros_like(limit, dtype=torch.bool)
        every_row = active == self.buffer.tokens.shape[0]
        # Greedy drafting without processors or early stop picks each token straight from the logits.
        reads_scores = bool(self.processing.processors) or self.do_sample or controller.early_stop
        for step in range(k):
            logits = self.runner.forward(tokens_in, mask_in, keep=1)  # [A, 1, V]
            raw_step = logits[:, 0] if reads_scores else None
            scores = raw_step  # [A, V] what the token is drawn from
            if self.processing.processors:
                scores = self.processing(logits, state.rows, state.host_rows, offset=step)[:, 0]
            if self.processing.processors or self.do_sample:
                # A draft state the processors leave without a distribution only spoils this proposal: the
                # target's check decides whether the round reaches that state.
                scores, _ = usable_scores(scores, self.do_sample)
            probabilities = scores.softmax(-1) if self.do_sample or controller.early_stop else None
            if self.do_sample:
                token = draw_rows(probabilities)[:, None]
                drawn_from.append(probabilities)
            else:
                token = vocab_argmax(logits) if scores is None else vocab_argmax(scores, keepdim=True)  # [A, 1]
            if self.processing.processors:
                self.buffer.write(state.rows, step, token, every_row=every_row)
            drafted.append(token)
            raw_steps.append(logits)
            processed_steps.append(None if scores is raw_step else scores)
            tokens_in, mask_in = token, None
            if controller.early_stop:
                probability = probabilities.gather(1, token)[:, 0]
                confidence.append(probability)
                drafted_count += (~stopped & (step < limit)).long()
                stopped |= probability < controller.thresholds[state.rows]
                if step + 1 < k and bool((stopped | (step + 1 >= limit)).all()):
                    break
        k = len(drafted)
        counts = drafted_count if controller.early_stop else limit
        host_counts = counts.tolist() if controller.early_stop else list(state.limits)
        if not k:
            empty = self.input_ids.new_zeros(active, 0)
            return Proposal(empty, counts, None, None, None, host_counts)
        raw = torch.cat(raw_steps, dim=1)
        if not self.processing.cleans_invalid:
            self.health.flag_nonfinite("draft_model", raw)
        processed = raw
        if any(step is not None for step in processed_steps):
            processed = torch.stack(
                [raw[:, i] if step is None else step for i, step in enumerate(processed_steps)], dim=1
            )
        return Proposal(
            torch.cat(drafted, dim=1),
            counts,
            processed,
            raw,
            torch.stack(confidence, dim=1) if confidence else None,
            host_counts,
            torch.stack(drawn_from, dim=1) if drawn_from else None,
        )

    def after_round(self, accepted: torch.Tensor, host_accepted: list[int], still: list[int], proposal: Proposal) -> None:
        k = proposal.num_tokens
        if k:
            self.runner.keep_slots(self.first_slot, [min(n, k - 1) for n in host_accepted])
        full = [k > 0 and host_accepted[a] == k for a in still]
        self.all_full = all(full)
        if not any(full):
            self.last_draft = None
        elif self.all_full:
            self.last_draft = proposal.tokens[:, -1:]
        else:
            self.last_draft = torch.where(accepted[:, None] == k, proposal.tokens[:, -1:], -1)

    def select_rows(self, keep: torch.Tensor) -> None:
        if self.last_draft is not None:
            self.last_draft = self.last_draft[keep]
        self.runner.select_rows(keep)


def _shown_prompts(tokens: torch.Tensor, prompt_mask: torch.Tensor) -> dict[int, np.ndarray]:
    """Row -> the prompt tokens its mask shows ([shown] int64), for the rows of prompt_mask [B, P] (bool)
    that hide a position after the first one they show; tokens [B, >= P] holds the prompts."""
    mask = prompt_mask.cpu().numpy()
    shown_before = np.cumsum(mask, axis=1) > 0  # [B, P]: at or after the row's first shown position
    holes = np.flatnonzero((shown_before & ~mask).any(axis=1))
    prompts = tokens[:, : mask.shape[1]].cpu().numpy()
    return {int(row): prompts[row][mask[row]] for row in holes}


class PromptLookupProposer:
    """n-gram lookup in each row's own tokens (HF's `PromptLookupCandidateGenerator`, per row).

    For n = max_matching_ngram_size down to 1: find the first (leftmost) earlier occurrence of the
    row's last n tokens whose continuation is not empty, and propose up to `limit` tokens of that
    continuation, cut before the first EOS; no match proposes nothing (the round then commits the
    target's own token)."""

    def __init__(
        self,
        buffer: TokenBuffer,
        prompt_mask: torch.Tensor | None,
        max_ngram: int,
        eos_token_id: torch.Tensor | None,
        writes_drafts: bool,
    ) -> None:
        """writes_drafts: put the drafts after each row's committed tokens (logits processors read them)."""
        self.buffer = buffer
        self.writes_drafts = writes_drafts
        self.max_ngram = max_ngram
        self.padding = [0] * buffer.tokens.shape[0] if prompt_mask is None else (~prompt_mask).sum(-1).tolist()
        # Rows whose prompt mask hides positions after its first shown one (not only left padding): the
        # prompt tokens the model reads, the only ones looked up in.
        self.shown_prompt = {} if prompt_mask is None else _shown_prompts(buffer.tokens, prompt_mask)
        self.prompt_length = 0 if prompt_mask is None else prompt_mask.shape[1]
        self.eos = set(eos_token_id.reshape(-1).tolist()) if eos_token_id is not None else set()

    def lookup(self, tokens: Sequence[int] | np.ndarray, limit: int) -> list[int]:
        """Drafts for one row whose tokens so far are `tokens` [L] (padding excluded).

        Each n-gram size is one vectorised pass: the earlier windows that end in the row's last token are
        compared whole with its tail (a round stays cheap for rows of many thousand tokens)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        length = tokens.shape[0]
        if limit <= 0:
            return []
        last = tokens[length - 1] if length else None
        for size in range(min(self.max_ngram, length - 1), 0, -1):
            # Windows starting at 0 .. length - size - 1 (every earlier occurrence, each with a continuation);
            # only those ending in the row's last token are compared whole.
            candidates = np.flatnonzero(tokens[size - 1 : length - 1] == last)
            if size > 1 and candidates.size:
                windows = sliding_window_view(tokens[: length - 1], size)[candidates]  # [C, size]
                candidates = candidates[(windows == tokens[length - size :]).all(axis=1)]
            if candidates.size:
                start = int(candidates[0]) + size
                continuation = tokens[start : start + limit].tolist()
                eos = next((index for index, token in enumerate(continuation) if token in self.eos), None)
                return continuation if eos is None else continuation[:eos]
        return []

    def propose(self, state: RoundState) -> Proposal:
        buffer = self.buffer
        width = max(buffer.host_lengths[row] for row in state.host_rows)
        host = buffer.tokens[:, :width].cpu().numpy()  # one transfer per round off a CPU
        found = [self.lookup(self._row_tokens(host, row), limit) for row, limit in zip(state.host_rows, state.limits)]
        k = max((len(drafts) for drafts in found), default=0)
        device = state.rows.device
        host_counts = [len(drafts) for drafts in found]
        padded = [drafts + [drafts[-1] if drafts else 0] * (k - len(drafts)) for drafts in found]
        tokens = torch.tensor(padded, dtype=torch.long, device=device).reshape(len(found), k)
        if k and self.writes_drafts:
            buffer.write(state.rows, 0, tokens, every_row=len(found) == buffer.tokens.shape[0])
        counts = long_tensor(host_counts, device) if min(host_counts, default=k) < k else None
        return Proposal(tokens, counts, None, None, None, host_counts)

    def _row_tokens(self, host: np.ndarray, row: int) -> np.ndarray:
        """The tokens batch row `row` has read so far ([L]: its prompt without the masked positions, then its
        generated tokens), from host [B, W] (the buffer's tokens)."""
        end = self.buffer.host_lengths[row]
        shown = self.shown_prompt.get(row)
        if shown is None:
            return host[row, self.padding[row] : end]
        return np.concatenate([shown, host[row, self.prompt_length : end]])

    def after_round(self, accepted: torch.Tensor, host_accepted: list[int], still: list[int], proposal: Proposal) -> None:
        """Nothing to keep: every round looks up afresh."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Rows are addressed by their batch index: nothing to select."""

