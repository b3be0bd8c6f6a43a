"""The speculative decoding loop of `generate`: a proposer's drafts (`proposers.py`), one target
forward per round, the shared verification step (`step.py`), all rows of a batch handled together.

One round (README, *SecureSD schedules*), for a row whose response has t tokens so far:

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

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import DynamicCache, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList

from .draft_length import DraftLength, DraftLengthController
from .host_values import long_tensor
from .model_runner import ModelRunner
from .prefixes import SCORE_PROBLEMS, Health, RowProcessing, TokenBuffer, usable_scores, without_invalid_values
from .proposers import DraftModelProposer, PromptLookupProposer, Proposal, Proposer, RoundState
from .schedules import Schedule
from .stats import RoundRecorder, SpeculativeStats
from .validation import SecureSDConfigError
from . import step as core_step
from . import stopping
from .step import RowSpec, StepOutput, VerificationRound
from .verifiers.base import Verifier


class NonFiniteLogitsError(FloatingPointError):
    """A model or the logits processors produced NaN or unusable scores; decoding stops instead of
    emitting a wrong token."""


@dataclass(frozen=True)
class PromptLookup:
    """Prompt lookup drafting (HF's `prompt_lookup_num_tokens` / `max_matching_ngram_size`); drafts end
    before the generation config's end-of-sequence ids [n] (`eos_token_id`, as in HF's lookup)."""

    max_matching_ngram_size: int = 2
    eos_token_id: torch.Tensor | None = None


@dataclass
class DecodeSettings:
    """How to decode.

    Args:
        draft_length: k, its schedule and the draft's confidence early stop (`draft_length.py`).
        max_length: prompt plus new tokens, per row (where the stopping criteria's `MaxLengthCriteria` stops).
        eos_token_id: [n_eos] ids that end a row (its `EosTokenCriteria`'s), or None.
        pad_token_id: fills rows that finished early in the returned [B, P + new] tensor.
        collect_deviation: also compute the exact per-position TV deviation (Theorem 1). Closed form at
            T = 0; at T > 0 it evaluates the acceptance rule over the whole vocabulary each round.
        output_scores / output_logits: single row only: processed / raw target logits per token.
        collect_stats: record each row's `SpeculativeStats` (off when only the sequences are returned).
    """

    verifier: Verifier
    schedule: Schedule | None
    draft_length: DraftLength
    do_sample: bool
    max_length: int
    eos_token_id: torch.Tensor | None
    pad_token_id: int | None
    logits_processor: LogitsProcessorList
    stopping_criteria: StoppingCriteriaList
    streamer: object | None = None
    collect_deviation: bool = False
    output_scores: bool = False
    output_logits: bool = False
    collect_stats: bool = True


@dataclass
class DecodeResult:
    sequences: torch.Tensor
    row_stats: list[SpeculativeStats] | None  # None unless settings.collect_stats
    scores: tuple[torch.Tensor, ...] | None
    raw_logits: tuple[torch.Tensor, ...] | None
    cache: DynamicCache | None


@dataclass
class Scored:
    """The target's verdict material for a round: raw and processed logits [A, k+1, V], and what the
    processors left wrong at each position ([A, k+1] `prefixes.usable_scores` codes; None: nothing)."""

    raw: torch.Tensor
    processed: torch.Tensor
    problems: torch.Tensor | None = None


@dataclass
class Committed:
    """A round's outcome on the host, per active row."""

    accepted: list[int]
    count: list[int]
    finished: list[int]
    deviation: list[list[float]] | None
    # per row, the first position the processors left without a distribution and its `usable_scores` code,
    # packed as position * PROBLEM_CODES + code (no problem: position k + 1); None when no row can have one
    first_problems: list[int] | None = None


PROBLEM_CODES = 4  # > every `usable_scores` code


def _read_back(
    accepted: torch.Tensor, count: torch.Tensor, finished: torch.Tensor, deviation: torch.Tensor | None,
    first_problems: torch.Tensor | None,
) -> Committed:
    """A round's outcome on the host in one transfer: accepted, count, finished [A], deviation [A, k] and
    each row's first problem position ([A], packed as in `Committed.first_problems`)."""
    rows = [accepted, count, finished] + ([] if first_problems is None else [first_problems])
    outcome = torch.stack(rows)  # [3 or 4, A] long
    if deviation is None:
        values = outcome.tolist()
        deviations = None
    else:
        active, k = deviation.shape
        flat = torch.cat([outcome.flatten().double(), deviation.flatten().double()]).tolist()
        values = [[int(v) for v in flat[i * active : (i + 1) * active]] for i in range(len(rows))]
        deviations = [flat[len(rows) * active + a * k : len(rows) * active + (a + 1) * k] for a in range(active)]
    return Committed(*values[:3], deviations, values[3] if first_problems is not None else None)


class SpeculativeLoop:
    """The rows still decoding and everything that follows them from round to round.

    One round is `propose` (the proposer), `score` (one target forward), `verify` (the shared
    verification step), `commit` (tokens, stopping, statistics, streamer) and `retire` (caches and
    finished rows). empty_rounds_grow: `DraftLengthController`'s (False for a proposer whose empty
    round says nothing of its drafts: prompt lookup)."""

    def __init__(
        self,
        target: PreTrainedModel,
        input_ids: torch.Tensor,
        settings: DecodeSettings,
        attention_mask: torch.Tensor | None,
        target_cache: DynamicCache | None,
        empty_rounds_grow: bool = True,
    ) -> None:
        self.settings = settings
        input_ids = input_ids.long()  # HF accepts any integer dtype; the buffers and the caches use int64
        self.input_ids = input_ids
        self.device = input_ids.device
        batch, self.prompt_length = input_ids.shape
        self.batch = batch
        self.prompt_mask = attention_mask.bool() if attention_mask is not None and not bool(attention_mask.all()) else None
        # int(): a static cache's length is its own counter tensor, which the cache advances in place
        self.cached = int(target_cache.get_seq_length()) if target_cache is not None else 0
        if self.cached >= self.prompt_length:
            raise SecureSDConfigError(
                f"the cache passed to generate already holds {self.cached} tokens but the input has "
                f"{self.prompt_length}; pass the whole conversation so far plus at least one new token as input_ids "
                "(the cache keeps all but the last token of a previous call's output)"
            )
        cached_mask = self.prompt_mask[:, : self.cached] if self.prompt_mask is not None and self.cached else None
        self.target = ModelRunner(target, target_cache, cached_mask)
        # No round drafts past max_length, so a huge k (valid, as in HF) sizes nothing beyond the new tokens.
        drafts_at_most = min(settings.draft_length.num_tokens, max(settings.max_length - self.prompt_length, 0))
        self.buffer = TokenBuffer(input_ids, room=drafts_at_most + 1)
        self.processing = RowProcessing(settings.logits_processor, self.buffer)
        self.controller = DraftLengthController(
            settings.draft_length, batch, self.device, empty_rounds_grow,
            smallest_k=settings.verifier.needs().min_draft_tokens,
        )
        self.recorder = RoundRecorder(batch) if settings.collect_stats else None
        self.health = Health()
        self.check_each_token = not stopping.only_length_and_eos(settings.stopping_criteria)
        self.eos = settings.eos_token_id.to(self.device) if settings.eos_token_id is not None else None
        self.spec = RowSpec(settings.verifier, settings.schedule)
        self.scores: tuple[torch.Tensor, ...] | None = () if settings.output_scores else None
        self.raw_logits: tuple[torch.Tensor, ...] | None = () if settings.output_logits else None
        self.rows = torch.arange(batch, device=self.device)  # batch row of each row still decoding
        self.host_rows = list(range(batch))
        self.pending: torch.Tensor | None = None  # [A, 1] last committed token, in neither cache yet

    def active_lengths(self) -> torch.Tensor:
        """[A] committed tokens of each active row (device)."""
        if len(self.host_rows) == self.batch:  # every row, in order: no gather
            return self.buffer.lengths
        return self.buffer.lengths[self.rows]

    def state(self) -> RoundState:
        budgets = [self.settings.max_length - self.buffer.host_lengths[row] - 1 for row in self.host_rows]
        return RoundState(self.rows, self.host_rows, self.pending, self.controller.limits(self.host_rows, budgets))

    def score(self, proposal: Proposal) -> tuple[Scored, int]:
        """One target forward over [pending (or the uncached prompt), drafts]; returns the logits of the
        k+1 verified positions and the first cache slot a row keeps."""
        drafts = proposal.tokens
        k, active = proposal.num_tokens, len(self.host_rows)
        if self.pending is None:
            tokens = torch.cat([self.input_ids[:, self.cached :], drafts], dim=1)
            mask = None
            if self.prompt_mask is not None:
                drafted = torch.ones_like(drafts, dtype=torch.bool)
                mask = torch.cat([self.prompt_mask[:, self.cached :], drafted], dim=1)
            first_kept = self.target.num_slots + self.prompt_length - self.cached
        else:
            tokens, mask = torch.cat([self.pending, drafts], dim=1), None
            first_kept = self.target.num_slots
        raw = self.target.forward(tokens, mask, keep=k + 1)
        if not self.processing.cleans_invalid:
            self.health.flag_nonfinite("target_model", raw)
        processed = self.processing(raw, self.rows, self.host_rows, offset=0)
        problems = None
        if self.processing.processors:
            vocab = raw.shape[-1]
            flat, problems = usable_scores(processed.reshape(-1, vocab), self.settings.do_sample)
            processed = flat.reshape(active, k + 1, vocab)
            if problems is not None:  # a position is a problem only if the round reaches it (`commit`)
                problems = problems.reshape(active, k + 1)
        problem = self.health.problem()
        if problem is not None:
            raise NonFiniteLogitsError(problem)
        return Scored(raw, processed, problems), first_kept

    def verify(self, proposal: Proposal, scored: Scored) -> StepOutput:
        schedule = self.settings.schedule
        responses = None
        if schedule is not None and schedule.reads_tokens:
            buffer, start = self.buffer, self.prompt_length
            responses = [buffer.tokens[row, start : buffer.host_lengths[row]].tolist() for row in self.host_rows]
        round_ = VerificationRound(
            rows=[self.spec] * len(self.host_rows),
            draft_tokens=proposal.tokens,
            draft_counts=proposal.counts,
            starts=self.active_lengths() - self.prompt_length,
            target_logits=scored.processed,
            target_raw_logits=self._rules_raw(scored.raw),
            greedy=not self.settings.do_sample,
            draft_logits=proposal.logits,
            draft_raw_logits=self._rules_raw(proposal.raw_logits),
            responses=responses,
            draft_probs=proposal.probs,
        )
        return core_step.verify_step(round_, collect_deviation=self.settings.collect_deviation, check_ranges=False)

    def _rules_raw(self, raw: torch.Tensor | None) -> torch.Tensor | None:
        """The raw logits the rules read: the model's own, cleaned of NaN and infinities when the call asks
        for it (`remove_invalid_values`; `output_logits` still returns the model's own, as HF does)."""
        if raw is None or not self.processing.cleans_invalid:
            return raw
        return without_invalid_values(raw)

    def commit(self, proposal: Proposal, scored: Scored, outcome: StepOutput) -> tuple[Committed, torch.Tensor]:
        """Write each row's accepted drafts and next token, cut at EOS, the length and stopping criteria,
        reading the round's outcome back to the host once. Returns it and the tokens [A, k+1]."""
        drafts, k, active = proposal.tokens, proposal.num_tokens, len(self.host_rows)
        accepted, next_token = outcome.accepted, outcome.next_tokens
        # The next token goes at index `accepted`; what follows it is never committed.
        next_column = next_token[:, None]
        new_tokens = torch.cat([drafts, next_column], dim=1).scatter_(1, accepted[:, None], next_column)
        room = self.settings.max_length - self.active_lengths()
        count = torch.minimum(accepted + 1, room)
        finished = count >= room
        if self.eos is not None:
            hits = torch.isin(new_tokens, self.eos) & (torch.arange(k + 1, device=self.device)[None] < count[:, None])
            hit = hits.any(dim=-1)
            count = torch.where(hit, hits.long().argmax(dim=-1) + 1, count)
            finished |= hit
        self.buffer.write(self.rows, 0, new_tokens, every_row=active == self.batch)
        first_problems = None
        if scored.problems is not None:
            positions = torch.arange(k + 1, device=self.device)[None]
            first = torch.where(scored.problems > 0, positions, k + 1).amin(dim=-1)  # [A]
            code = scored.problems.gather(1, first.clamp_max(k)[:, None])[:, 0]
            first_problems = first * PROBLEM_CODES + code
        done = _read_back(accepted, count, finished, outcome.deviation, first_problems)
        if self.check_each_token:
            stops = stopping.first_stops(
                self.settings.stopping_criteria, self.buffer, self.host_rows, done.count,
                None if self.scores is None else self._scores_until(scored),
            )
            for a, stop in enumerate(stops):
                if stop is not None:
                    done.count[a], done.finished[a] = stop, 1
            count = long_tensor(done.count, self.device)
        self._raise_if_read(done, proposal)
        self.buffer.advance(self.rows, count, self.host_rows, done.count)
        return done, new_tokens

    def _raise_if_read(self, done: Committed, proposal: Proposal) -> None:
        """Raise NonFiniteLogitsError where a row read a position the processors left without a distribution.
        Token i of a round comes from position i (draft i + 1 accepted there, or the next token drawn there),
        so a row reads the positions below its committed count (after EOS and the stopping criteria cut
        it); a position after a rejection, after the row's last committed token, or past its drafts is never
        read. A lookahead rule (FLy) decides a position from the later ones of its block: it reads every
        position up to the row's draft count."""
        if done.first_problems is None:
            return
        ahead = self.settings.verifier.needs().lookahead
        for a, packed in enumerate(done.first_problems):
            position, code = divmod(packed, PROBLEM_CODES)
            read = proposal.host_counts[a] + 1 if ahead else done.count[a]
            if position < read:
                raise NonFiniteLogitsError(Health.MESSAGES[SCORE_PROBLEMS[code]])

    def _scores_until(self, scored: Scored) -> Callable[[int], tuple[torch.Tensor, ...]]:
        """n -> the processed scores of the committed tokens and of this round's first n (single row)."""
        committed = self.scores
        return lambda n: committed + tuple(scored.processed[:, i] for i in range(n))

    def report(
        self, proposal: Proposal, scored: Scored, outcome: StepOutput, done: Committed, starts: list[int],
        new_tokens: torch.Tensor,
    ) -> None:
        """Statistics, the draft-length controller, scores/logits and the streamer for one round."""
        if self.recorder is not None:
            self.recorder.record(
                self.host_rows, starts, proposal.host_counts, done.accepted, done.count, done.finished, done.deviation
            )
        self.controller.record(
            self.rows, self.host_rows, proposal.host_counts, done.accepted, proposal.confidence, outcome.accepted,
            proposal.counts,
        )
        if self.scores is not None:
            self.scores += tuple(scored.processed[:, i] for i in range(done.count[0]))
        if self.raw_logits is not None:
            self.raw_logits += tuple(scored.raw[:, i] for i in range(done.count[0]))
        if self.settings.streamer is not None:
            self.settings.streamer.put(new_tokens[0, : done.count[0]].cpu())

    def retire(
        self, proposer: Proposer, proposal: Proposal, outcome: StepOutput, done: Committed, first_kept: int
    ) -> None:
        """Crop both caches to what each row kept and drop the rows that finished."""
        first_round = self.pending is None
        kept = [min(n, c - 1) + (0 if first_round else 1) for n, c in zip(done.accepted, done.count)]
        self.target.keep_slots(first_kept, kept)
        self.pending = outcome.next_tokens[:, None]
        still = [a for a in range(len(self.host_rows)) if not done.finished[a]]
        proposer.after_round(outcome.accepted, done.accepted, still, proposal)
        if len(still) < len(self.host_rows):
            self.host_rows = [self.host_rows[a] for a in still]
            if still:
                keep = long_tensor(still, self.device)
                self.rows, self.pending = self.rows[keep], self.pending[keep]
                self.target.select_rows(keep)
                proposer.select_rows(keep)

    def run(self, proposer: Proposer) -> DecodeResult:
        while self.host_rows:
            proposal = proposer.propose(self.state())
            scored, first_kept = self.score(proposal)
            starts = [self.buffer.host_lengths[row] - self.prompt_length for row in self.host_rows]
            outcome = self.verify(proposal, scored)
            done, new_tokens = self.commit(proposal, scored, outcome)
            self.report(proposal, scored, outcome, done, starts, new_tokens)
            self.retire(proposer, proposal, outcome, done, first_kept)
        if self.settings.streamer is not None:
            self.settings.streamer.end()
        return DecodeResult(
            self.buffer.sequences(self.settings.pad_token_id),
            self.recorder.finish() if self.recorder is not None else None,
            self.scores,
            self.raw_logits,
            None if self.target.has_holes or self.batch > 1 else self.target.handed_back_cache(),
        )


def speculative_decode(
    target: PreTrainedModel,
    input_ids: torch.Tensor,
    settings: DecodeSettings,
    *,
    draft: PreTrainedModel | None = None,
    prompt_lookup: PromptLookup | None = None,
    attention_mask: torch.Tensor | None = None,
    target_cache: DynamicCache | None = None,
) -> DecodeResult:
    """Generate until every row hits EOS, `max_length` or a stopping criterion.

    Args:
        input_ids: [B, P] prompts, left-padded when B > 1 (with `target_cache`: the whole conversation,
            of which the cache holds the first `target_cache.get_seq_length()` tokens).
        draft / prompt_lookup: the proposer, exactly one of them.
        attention_mask: [B, P] (0 on padding) or None when nothing is padded.
    """
    settings.verifier.check_draft_length(settings.draft_length.num_tokens)
    loop = SpeculativeLoop(target, input_ids, settings, attention_mask, target_cache, empty_rounds_grow=draft is not None)
    proposer: Proposer
    if draft is not None:
        proposer = DraftModelProposer(
            draft, input_ids, loop.prompt_mask, loop.buffer, loop.processing, loop.controller, loop.health,
            settings.do_sample,
        )
    elif prompt_lookup is not None:
        proposer = PromptLookupProposer(
            loop.buffer, loop.prompt_mask, prompt_lookup.max_matching_ngram_size, prompt_lookup.eos_token_id,
            writes_drafts=bool(loop.processing.processors),
        )
    else:
        raise ValueError("speculative_decode needs a proposer: a draft model (draft=) or prompt_lookup=")
    result = loop.run(proposer)
    if draft is not None:
        loop.controller.finish(draft.generation_config)
    return result
