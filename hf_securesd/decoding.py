"""The speculative decoding loop: draft forward with its own KV cache, one target forward per round,
SecureSD verification, cache crop on rejection.

One round (SPEC.md §2), for a sequence whose response has t tokens so far:

1. the draft proposes x_1..x_k autoregressively, keeping its logits (k one-token draft forwards);
2. one target forward over [last committed token, x_1..x_k] gives the logits for q_1..q_{k+1};
3. x_i is accepted with probability alpha_mix(t+i-1); at the first rejection a token is drawn from
   R_mix and the round ends; if all k are accepted a bonus token is drawn from q_{k+1};
4. both caches are cropped to the committed tokens.

Tensors keep a leading batch dimension B and acceptance is counted per row; `generate` currently
passes B = 1.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from .mixing import one_step_output, total_variation, verify_round
from .schedules import Schedule
from .stats import SpeculativeStats
from .verifiers.base import RoundInputs, Verifier


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN or infinite logits; decoding stops instead of emitting a wrong token."""


@dataclass
class _ModelRunner:
    """Runs one model forward over new tokens against its own KV cache.

    `seen` counts the tokens the cache holds; `attention_mask` ([B, total_len] or None for no padding)
    is shared by both models and grows as tokens are committed.
    """

    model: PreTrainedModel
    cache: DynamicCache
    seen: int = 0

    def __post_init__(self) -> None:
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None, keep: int) -> torch.Tensor:
        """tokens [B, m] continuing the cached prefix -> float32 logits of the last `keep` positions [B, keep, V]."""
        start, end = self.seen, self.seen + tokens.shape[1]
        device = self.model.device
        if attention_mask is None:
            positions = torch.arange(start, end, device=device).expand(tokens.shape[0], -1)
            mask = None
        else:
            mask = attention_mask[:, :end].to(device)
            positions = (mask.long().cumsum(-1) - 1).clamp_min(0)[:, start:end]
        kwargs = {self._cache_argument: self.cache, "use_cache": True, "position_ids": positions, "attention_mask": mask}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        logits = self.model(input_ids=tokens.to(device), **kwargs).logits[:, -keep:]
        self.seen = end
        return logits.to(torch.float32)

    def crop_to(self, length: int) -> None:
        """Forget cached tokens beyond `length`."""
        if self.seen > length:
            self.cache.crop(length - self.seen)
            self.seen = length


def _check_finite(logits: torch.Tensor, who: str, step: str) -> None:
    if not torch.isfinite(logits).all():
        raise NonFiniteLogitsError(
            f"the {who} model produced NaN or infinite logits ({step}); decoding stopped rather than emit a wrong "
            f"token. Check the {who}'s dtype (fp16 overflow is the usual cause: load it in bfloat16 or float32) "
            "and its weights."
        )


def _check_processed(scores: torch.Tensor, who: str) -> None:
    if torch.isnan(scores).any() or (scores == float("-inf")).all(dim=-1).any():
        raise NonFiniteLogitsError(
            f"the logits processors left the {who} with NaN scores or no allowed token; check the processors "
            "passed to generate (e.g. conflicting bad_words_ids / top_k / top_p settings)"
        )


def _process(
    logits_processor: LogitsProcessorList, sequence: torch.Tensor, raw: torch.Tensor, prefix_length: int, who: str
) -> torch.Tensor:
    """Apply the user's processors (including temperature/top-k/top-p when sampling) position by position.

    sequence: [B, L] tokens so far including drafts; raw: [B, n, V] logits for the tokens at
    positions prefix_length .. prefix_length + n - 1 -> processed [B, n, V]. The processors are
    called one by one (the list's own __call__ inspects every signature on every call)."""
    if len(logits_processor) == 0:
        return raw
    positions = []
    for i in range(raw.shape[1]):
        scores, prefix = raw[:, i].clone(), sequence[:, : prefix_length + i]
        for processor in logits_processor:
            scores = processor(prefix, scores)
        positions.append(scores)
    processed = torch.stack(positions, dim=1)
    _check_processed(processed, who)
    return processed


def _only_length_and_eos(stopping_criteria: StoppingCriteriaList) -> bool:
    return all(isinstance(criterion, (MaxLengthCriteria, EosTokenCriteria)) for criterion in stopping_criteria)


@dataclass
class DecodeResult:
    sequences: torch.Tensor
    stats: SpeculativeStats
    scores: tuple[torch.Tensor, ...] | None
    raw_logits: tuple[torch.Tensor, ...] | None
    cache: DynamicCache


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
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    attention_mask: torch.Tensor | None = None,
    target_cache: DynamicCache | None = None,
    streamer=None,
    collect_deviation: bool = False,
    output_scores: bool = False,
    output_logits: bool = False,
) -> DecodeResult:
    """Generate until EOS, `max_length` or a stopping criterion, with SecureSD verification.

    Args:
        input_ids: [1, prompt_len] prompt tokens (on the target's device).
        attention_mask: [1, prompt_len] or None when the prompt has no padding.
        eos_token_id: [n_eos] tensor of end-of-sequence ids, or None.
        collect_deviation: also compute the exact per-position TV deviation (Theorem 1), which
            evaluates the acceptance rule over the whole vocabulary each round.
    """
    verifier.check_draft_length(num_draft_tokens)
    target_runner = _ModelRunner(target, target_cache if target_cache is not None else DynamicCache(config=target.config))
    draft_runner = _ModelRunner(draft, DynamicCache(config=draft.config))
    sequence = input_ids
    prompt_length = input_ids.shape[1]
    stats = SpeculativeStats()
    scores: tuple[torch.Tensor, ...] | None = () if output_scores else None
    raw_logits: tuple[torch.Tensor, ...] | None = () if output_logits else None
    check_each_token = not _only_length_and_eos(stopping_criteria)
    eos = eos_token_id.to(sequence.device) if eos_token_id is not None else None

    while sequence.shape[1] < max_length:
        length = sequence.shape[1]
        response_position = length - prompt_length
        k = max(0, min(num_draft_tokens, max_length - length - 1))

        # 1. Draft k tokens.
        draft_tokens, draft_raw, draft_processed = [], [], []
        draft_input = sequence[:, draft_runner.seen :]
        drafted = sequence
        for _ in range(k):
            raw = draft_runner.forward(draft_input, _extend(attention_mask, drafted.shape[1]), keep=1)
            _check_finite(raw, "draft", "while drafting")
            processed = _process(logits_processor, drafted, raw, drafted.shape[1], "draft")[:, 0]
            token = torch.multinomial(processed.softmax(-1), 1)[:, 0] if do_sample else processed.argmax(-1)
            draft_tokens.append(token)
            draft_raw.append(raw[:, 0])
            draft_processed.append(processed)
            drafted = torch.cat([drafted, token[:, None].to(drafted.device)], dim=-1)
            draft_input = token[:, None]

        # 2. Score all drafts with one target forward.
        candidates = drafted.to(sequence.device)
        target_raw = target_runner.forward(
            candidates[:, target_runner.seen :], _extend(attention_mask, candidates.shape[1]), keep=k + 1
        )
        _check_finite(target_raw, "target", "while verifying")
        target_processed = _process(logits_processor, candidates, target_raw, length, "target")

        # 3. Verify.
        vocab = target_raw.shape[-1]
        round_inputs = RoundInputs(
            draft_tokens=torch.stack(draft_tokens, dim=1).to(sequence.device) if k else candidates[:, length:],
            target_logits=target_processed,
            draft_logits=_stack_or_empty(draft_processed, sequence, vocab),
            target_raw_logits=target_raw,
            draft_raw_logits=_stack_or_empty(draft_raw, sequence, vocab),
            greedy=not do_sample,
        )
        new_tokens, accepted = _verify(verifier, schedule, round_inputs, response_position, stats, collect_deviation)

        # 4. Commit, stop, crop.
        new_tokens = _truncate(new_tokens, max_length - length, eos)
        stop_at = _first_stop(stopping_criteria, sequence, new_tokens) if check_each_token else None
        if stop_at is not None:
            new_tokens = new_tokens[:, :stop_at]
        committed = new_tokens.shape[1]
        if output_scores:
            scores += tuple(target_processed[:, i] for i in range(committed))
        if output_logits:
            raw_logits += tuple(target_raw[:, i] for i in range(committed))
        sequence = torch.cat([sequence, new_tokens], dim=-1)
        attention_mask = _extend(attention_mask, sequence.shape[1])
        stats.new_tokens += committed
        if streamer is not None:
            streamer.put(new_tokens.cpu())
        target_runner.crop_to(length + accepted)
        draft_runner.crop_to(length + min(accepted, max(k - 1, 0)))
        finished = stop_at is not None or (eos is not None and bool(torch.isin(new_tokens[:, -1], eos).all()))
        if finished or (not check_each_token and bool(stopping_criteria(sequence, None).all())):
            break

    if streamer is not None:
        streamer.end()
    return DecodeResult(sequence, stats, scores, raw_logits, target_runner.cache)


def _extend(attention_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """Pad a [B, L] mask with ones up to `length` columns (None stays None: no padding anywhere)."""
    if attention_mask is None or attention_mask.shape[1] >= length:
        return attention_mask
    ones = attention_mask.new_ones(attention_mask.shape[0], length - attention_mask.shape[1])
    return torch.cat([attention_mask, ones], dim=-1)


def _stack_or_empty(rows: list[torch.Tensor], like: torch.Tensor, vocab: int) -> torch.Tensor:
    """Stack k tensors [B, V] into [B, k, V] on `like`'s device (k = 0 gives [B, 0, V])."""
    if rows:
        return torch.stack(rows, dim=1).to(like.device)
    return torch.zeros(like.shape[0], 0, vocab, device=like.device)


def _verify(
    verifier: Verifier,
    schedule: Schedule | None,
    round_inputs: RoundInputs,
    response_position: int,
    stats: SpeculativeStats,
    collect_deviation: bool,
) -> tuple[torch.Tensor, int]:
    """Verify one round of a single row. Returns (new tokens [1, n], accepted draft count)."""
    k = round_inputs.num_draft_tokens
    positions = torch.arange(response_position, response_position + k, device=round_inputs.draft_tokens.device)
    eta = (schedule.eta(positions) if schedule is not None else torch.ones(k, device=positions.device)).expand(
        round_inputs.draft_tokens.shape[0], k
    )
    accepted_per_row, next_token = verify_round(verifier, round_inputs, eta)
    accepted = int(accepted_per_row[0])
    deviation = None
    if collect_deviation and k:
        verified = min(accepted + 1, k)
        out = one_step_output(verifier, round_inputs, eta)[:, :verified]
        deviation = total_variation(out, round_inputs.verified_target_probs()[:, :verified])[0].tolist()
    stats.record_round(response_position, k, accepted, deviation)
    new_tokens = torch.cat([round_inputs.draft_tokens[:, :accepted], next_token[:, None]], dim=-1)
    return new_tokens, accepted


def _truncate(new_tokens: torch.Tensor, budget: int, eos: torch.Tensor | None) -> torch.Tensor:
    """Cut [1, n] new tokens at the length budget and just after the first EOS."""
    new_tokens = new_tokens[:, :budget]
    if eos is not None:
        hits = torch.isin(new_tokens[0], eos).nonzero()
        if hits.numel():
            new_tokens = new_tokens[:, : int(hits[0]) + 1]
    return new_tokens


def _first_stop(stopping_criteria: StoppingCriteriaList, sequence: torch.Tensor, new_tokens: torch.Tensor) -> int | None:
    """Smallest n such that the criteria fire on sequence + new_tokens[:, :n], or None."""
    for n in range(1, new_tokens.shape[1] + 1):
        if bool(stopping_criteria(torch.cat([sequence, new_tokens[:, :n]], dim=-1), None).all()):
            return n
    return None
