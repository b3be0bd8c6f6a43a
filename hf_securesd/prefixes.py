"""Every row's tokens in one tensor, and the user's logits processors applied over them batched, each
row seeing exactly its own prefix and its own batch row.

Rows of a speculative batch advance by different numbers of tokens per round, so at a given draft
step (or verified position) their prefixes differ in length. Two ways to call a processor:

* row-independent processors (temperature, top-k/top-p/min-p/typical/epsilon/eta, repetition
  penalty without `prompt_ignore_length`, ...) see all rows at once: a row's ids are its prefix with
  the columns after it (up to the widest prefix) filled with its own first token, which changes
  nothing for them (they read only the scores, or the set of tokens present). The target's k+1 positions go in
  one call of B*(k+1) rows. `min_length` and `min_new_tokens` read only each row's prefix length:
  they are applied in the same pass from every row's own length (EOS at -inf where the row is short),
  which is what the processor does to that row alone.
* any other processor (length-dependent ones such as `no_repeat_ngram_size`, `forced_eos_token_id`,
  `prefix_allowed_tokens_fn`, custom processors) is called once per distinct prefix length with the
  batch's full shape [B, L]: row b at index b holds exactly what plain `generate` would pass for it
  (its left-padded prompt plus its tokens so far), so batch ids and lengths are those of plain
  decoding. A row ahead of L holds its first L tokens (a prefix it really had); a row behind holds
  its prefix filled on the left with its first token, which need not be a state plain decoding
  reaches. Both rows' results are discarded, but the processor must not fail on them: a custom
  processor sees them (`prefix_allowed_tokens_fn`, HF's `PrefixConstrainedLogitsProcessor`, is called
  for the rows at L alone, so a grammar's function meets only real prefixes).
"""

from __future__ import annotations

import math

import torch
from transformers import LogitsProcessorList
from transformers.generation import logits_process

from .fused_penalty import PenaltyThenTemperature, fuse_penalty_temperature, ids_within
from .fused_warpers import TopKTopP, fuse_top_k_top_p
from .validation import SecureSDConfigError

_SCORES_ONLY = tuple(
    getattr(logits_process, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "TopHLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "InfNanRemoveLogitsProcessor",
        "LogitNormalization",
        "SuppressTokensLogitsProcessor",
    )
    if hasattr(logits_process, name)
)


# Processors that always return a new tensor and keep no reference to it (HF's temperature divides into
# one; the fused passes below build theirs): the next fused top-k/top-p may write into it.
_FRESH_OUTPUT = (logits_process.TemperatureLogitsWarper, PenaltyThenTemperature, TopKTopP)

# Processors that read only the prefix length (and ban EOS below a minimum).
_LENGTH_ONLY = (logits_process.MinLengthLogitsProcessor, logits_process.MinNewTokensLengthLogitsProcessor)


def row_independent(processor, prompt_length: int) -> bool:
    """True when `processor` reads only the scores and the set of tokens in each row (so a row's
    fill with one of its own tokens and its place in the batch change nothing), or only each
    row's prefix length (`min_length`, `min_new_tokens`: `RowProcessing` applies them from every
    row's own length). A repetition penalty that ignores a part of each row's prompt (a [B]
    `prompt_ignore_length`, as `generate` builds it from the attention mask for the left padding)
    qualifies too when every row keeps at least one token of its `prompt_length`-token prompt (the
    ignored positions are shown as that token: see `RowProcessing`); one that ignores a whole prompt
    (only generated tokens penalised) is called per prefix length like any other processor."""
    if type(processor) in _SCORES_ONLY or type(processor) in _LENGTH_ONLY:
        return True
    if type(processor) is logits_process.RepetitionPenaltyLogitsProcessor:
        ignored = getattr(processor, "prompt_ignore_length", None)
        if ignored is None:
            return True
        return (isinstance(ignored, torch.Tensor) and ignored.dim() == 1 and ignored.numel() > 0
                and int(ignored.max()) < prompt_length)
    return False


def checked_scores(processor: object, scores: object, shape: torch.Size) -> torch.Tensor:
    """A processor's output, checked to be what a logits processor returns: a floating-point tensor of its
    input's shape [N, V]. Anything else (a [V] row from a squeezed [1, V] input, fewer columns, integers)
    would be read as other rows or tokens: `SecureSDConfigError` names the processor and what it returned."""
    if isinstance(scores, torch.Tensor) and scores.shape == shape and scores.is_floating_point():
        return scores
    got = f"a {tuple(scores.shape)} {scores.dtype} tensor" if isinstance(scores, torch.Tensor) else type(scores).__name__
    raise SecureSDConfigError(
        f"the logits processor {type(processor).__name__} returned {got} for scores of shape {tuple(shape)}: a "
        "logits processor returns floating-point scores of its input's shape [batch_size, vocab_size]; fix the "
        "processor (e.g. do not squeeze the batch dimension)"
    )


def _constrains_one_beam(processor) -> bool:
    """Whether `processor` is HF's own `PrefixConstrainedLogitsProcessor` over one beam per batch row (as
    speculative decoding runs), whose user function `_constrain_rows` can call row by row."""
    return (
        type(processor) is logits_process.PrefixConstrainedLogitsProcessor
        and getattr(processor, "_num_beams", None) == 1
        and callable(getattr(processor, "_prefix_allowed_tokens_fn", None))
    )


def _constrain_rows(
    processor: logits_process.PrefixConstrainedLogitsProcessor, ids: torch.Tensor, scores: torch.Tensor,
    rows: list[int],
) -> torch.Tensor:
    """`processor(ids, scores)` for the batch rows `rows` alone (ids [B, L], scores [B, V] -> [B, V], the
    other rows' scores unchanged): HF's processor run on those rows, its user function called with each
    row's own batch id. A grammar's function then never meets the rows that are not at this length,
    whose tokens need not be a state it can reach (and may raise on, or allow nothing for)."""
    chosen = torch.tensor(rows, device=ids.device)
    function = processor._prefix_allowed_tokens_fn
    own_rows = logits_process.PrefixConstrainedLogitsProcessor(
        lambda index, sent: function(rows[index], sent), num_beams=1
    )
    out = scores.clone()
    out[chosen] = own_rows(ids[chosen], scores[chosen])
    return out


class TokenBuffer:
    """Tokens of every row: [B, C], row b's committed tokens (its left-padded prompt included) at
    [0, length_b), this round's drafts right after them. `lengths` [B] lives on the device and
    `host_lengths` (numpy-free list of ints) mirrors it, so building views needs no synchronisation."""

    def __init__(self, input_ids: torch.Tensor, room: int) -> None:
        """room: tokens a round may write after a row's committed ones (k drafts plus one); the buffer
        starts with space for a few rounds and doubles when a write needs more."""
        batch, prompt_length = input_ids.shape
        self.tokens = input_ids.new_zeros(batch, prompt_length + 4 * max(room, 1))
        self.tokens[:, :prompt_length] = input_ids
        self.lengths = torch.full((batch,), prompt_length, dtype=torch.long, device=input_ids.device)
        self.host_lengths = [prompt_length] * batch
        self._steps: dict[tuple[int, int], torch.Tensor] = {}  # (offset, n) -> [n] offset .. offset + n - 1
        self._column_range = torch.arange(0, device=input_ids.device)
        self.version = 0  # advanced with the committed tokens (what a view of them may be cached against)

    def write(self, rows: torch.Tensor, offset: int, values: torch.Tensor, every_row: bool) -> None:
        """values [A, n] go to positions length_b + offset .. + n - 1 of rows [A] (`every_row`: rows is
        the whole batch in order, which allows a cheaper in-place scatter)."""
        width = values.shape[1]
        self._make_room(max(self.host_lengths) + offset + width)
        steps = self._step_range(offset, width)
        columns = (self.lengths if every_row else self.lengths[rows])[:, None] + steps
        if every_row:
            self.tokens.scatter_(1, columns, values)
        else:
            self.tokens[rows[:, None], columns] = values

    def _make_room(self, width: int) -> None:
        """Grow the buffer (doubling) so that `width` columns fit."""
        capacity = self.tokens.shape[1]
        if width > capacity:
            grown = self.tokens.new_zeros(self.tokens.shape[0], max(width, 2 * capacity))
            grown[:, :capacity] = self.tokens
            self.tokens = grown

    def advance(self, rows: torch.Tensor, counts: torch.Tensor, host_rows: list[int], host_counts: list[int]) -> None:
        """Commit counts [A] tokens (already written) to rows [A]."""
        if len(host_rows) == len(self.host_lengths):  # every row, in order
            self.lengths += counts
        else:
            self.lengths[rows] += counts
        for row, count in zip(host_rows, host_counts):
            self.host_lengths[row] += count
        self.version += 1

    def drafted(self, rows: torch.Tensor | None, n: int) -> torch.Tensor:
        """[A, n] the n tokens written after the committed ones of batch rows `rows` [A] (every batch row
        in order when None)."""
        tokens = self.tokens if rows is None else self.tokens.index_select(0, rows)
        lengths = self.lengths if rows is None else self.lengths[rows]
        return tokens.gather(1, lengths[:, None] + self._step_range(0, n))

    def token_sets(
        self, rows: torch.Tensor | None, offset: int, n: int, width: int, hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[A*n, width] ids whose row a*n + i holds exactly the set of tokens of batch row rows[a]'s prefix
        of length_b + offset + i tokens (every batch row in order when rows is None), for processors that
        read only that set (the repetition penalty): the prefix at its own positions, the columns after it
        filled with the row's first token. Cheaper than `views` (no per-row alignment). hidden: optional
        [B] leading positions per batch row (its left padding) shown as its first token after them."""
        tokens = self.tokens[:, :width] if rows is None else self.tokens[:, :width].index_select(0, rows)
        lengths = self.lengths if rows is None else self.lengths[rows]
        columns = self._columns(width)
        ends = lengths[:, None] + self._step_range(offset, n)  # [A, n] prefix lengths
        inside = columns < ends[:, :, None]  # [A, n, width]
        if hidden is None:
            fill = tokens[:, :1]
        else:
            start = hidden.to(tokens.device)
            start = (start if rows is None else start[rows])[:, None]
            fill = tokens.gather(1, start)
            inside &= columns >= start[:, :, None]
        return torch.where(inside, tokens[:, None], fill[:, None]).reshape(-1, width)

    def _columns(self, width: int) -> torch.Tensor:
        """[width] long 0 .. width - 1, sliced from a cached range."""
        if self._column_range.shape[0] < width:
            self._column_range = torch.arange(2 * width, device=self.tokens.device)
        return self._column_range[:width]

    def _step_range(self, offset: int, n: int) -> torch.Tensor:
        """[n] long offset .. offset + n - 1 (cached)."""
        steps = self._steps.get((offset, n))
        if steps is None:
            steps = self._steps[offset, n] = torch.arange(offset, offset + n, device=self.tokens.device)
        return steps

    def views(self, rows: torch.Tensor, prefix_lengths: torch.Tensor, width: int, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """[N, width] prefixes: row rows[n]'s first prefix_lengths[n] tokens, right-aligned and filled on
        the left with the row's first token (a prefix longer than `width` keeps its last `width`).
        hidden: optional [B] count of leading positions per batch row (its left padding) shown as the
        row's first token after them instead, so they add nothing to the row's set of tokens."""
        source = torch.arange(width, device=rows.device)[None] - (width - prefix_lengths)[:, None]
        picked = self.tokens.index_select(0, rows)  # [N, C]; a gather is cheaper than 2-d advanced indexing
        if hidden is None:
            # Column 0 holds the row's first token (`fill`; writes land after the prompt), so clamping the
            # positions before the prefix to 0 fills them with it.
            return picked.gather(1, source.clamp_min(0))
        start = hidden.to(rows.device)[rows][:, None]
        return picked.gather(1, torch.maximum(source, start))

    def sequences(self, pad_token_id: int | None) -> torch.Tensor:
        """[B, max length] committed tokens, rows that stopped early right-filled with the pad token."""
        width = max(self.host_lengths)
        if pad_token_id is None and min(self.host_lengths) < width:
            raise ValueError("rows finished at different lengths and no pad_token_id is set; pass pad_token_id= to generate")
        out = self.tokens[:, :width].clone()
        if pad_token_id is not None:
            out.masked_fill_(torch.arange(width, device=out.device)[None] >= self.lengths[:, None], pad_token_id)
        return out


class Health:
    """Device-side flags raised during a round, read once per round (no synchronisation per call)."""

    MESSAGES = {
        "draft_model": "the draft model produced NaN or infinite logits; decoding stopped rather than emit a wrong "
        "token. Check the draft's dtype (fp16 overflow is the usual cause: load it in bfloat16 or float32) "
        "and its weights, "
        "or pass remove_invalid_values=True to generate (NaN scores become 0 and infinite ones the largest or "
        "smallest finite value, as in plain transformers decoding).",
        "target_model": "the target model produced NaN or infinite logits; decoding stopped rather than emit a wrong "
        "token. Check the target's dtype (fp16 overflow is the usual cause: load it in bfloat16 or float32) "
        "and its weights, "
        "or pass remove_invalid_values=True to generate (NaN scores become 0 and infinite ones the largest or "
        "smallest finite value, as in plain transformers decoding).",
        "target_processors": "the logits processors left the target with NaN scores or no allowed token; check the "
        "processors passed to generate (e.g. conflicting bad_words_ids / top_k / top_p settings)",
        "several_infinite": "after the logits processors several tokens score +inf, so the sampling distribution is "
        "undefined (a temperature so small that logits / temperature overflows, e.g. 1e-45, or a processor forcing "
        "more than one token); use do_sample=False for greedy decoding, or a temperature of at least 1e-3",
    }

    def __init__(self) -> None:
        self._names: list[str] = []
        self._conditions: list[torch.Tensor] = []
        self._checked_names: list[str] = []
        self._checked_values: list[torch.Tensor] = []
        self._finite: list[torch.Tensor] = []

    def flag(self, name: str, condition: torch.Tensor) -> None:
        """Remember a 0-dim bool tensor that is True when `name`'s problem occurred."""
        self._names.append(name)
        self._conditions.append(condition)

    def flag_nonfinite(self, name: str, values: torch.Tensor) -> None:
        """Remember that `name`'s problem occurred if `values` holds a NaN or an infinity. One reduction
        on the device: a NaN or an infinity makes the sum NaN or infinite, so a finite sum clears `values`;
        a sum that is not finite (it may also be an overflow of finite values) is checked exactly
        (`all_finite`) when the flags are read."""
        self._checked_names.append(name)
        self._checked_values.append(values)
        total = values.sum()
        spread = total - total  # 0 for a finite sum, NaN otherwise
        self._finite.append(spread == spread)

    def problem(self) -> str | None:
        """The message of the first raised flag since the last call (one synchronisation), or None."""
        if not self._conditions and not self._finite:
            return None
        parts = [torch.stack(self._conditions)] if self._conditions else []
        if self._finite:
            parts.append(torch.stack(self._finite))
        values = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()
        flagged = len(self._conditions)
        raised = values[:flagged] + [
            not (finite or bool(all_finite(checked))) for finite, checked in zip(values[flagged:], self._checked_values)
        ]
        names = self._names + self._checked_names
        self._names, self._conditions, self._checked_names, self._checked_values, self._finite = [], [], [], [], []
        order = list(self.MESSAGES)
        hits = sorted(order.index(name) for name, up in zip(names, raised) if up)
        return self.MESSAGES[order[hits[0]]] if hits else None


def without_invalid_values(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] with NaN as 0 and +-inf as the dtype's largest / smallest finite value: what HF's
    `InfNanRemoveLogitsProcessor` (`remove_invalid_values=True`) does to the scores it processes, applied
    to the raw logits the relaxed rules read."""
    return torch.nan_to_num(logits, nan=0.0)


def all_finite(values: torch.Tensor) -> torch.Tensor:
    """0-dim bool: every entry of `values` is finite (`torch.isfinite(values).all()`, without the
    vocabulary-sized bool tensor: 0 * x is 0 for a finite x and NaN for an infinite or NaN one, so the
    sum is 0 or NaN, and NaN is the one value not equal to itself)."""
    marker = (values * 0).sum()
    return marker == marker


# What `usable_scores` found wrong with a row of processed scores (0: nothing), in the order their
# messages (`Health.MESSAGES`) take precedence.
NO_DISTRIBUTION, SEVERAL_INFINITE = 1, 2
SCORE_PROBLEMS = {NO_DISTRIBUTION: "target_processors", SEVERAL_INFINITE: "several_infinite"}


def usable_scores(scores: torch.Tensor, do_sample: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Processed scores [N, V] made safe to read at every row, and what was wrong with each row.

    -> (scores [N, V], problems [N] long, or None where no row can have one): 0 for a row with a
    distribution; NO_DISTRIBUTION for a row holding NaN or no finite maximum (every token banned),
    replaced by zeros; SEVERAL_INFINITE, when sampling, for a row where several tokens score +inf (the
    sampling distribution is undefined), which keeps those tokens with equal weight. When sampling, a row
    with one +inf score puts all its mass on that token (the limit of the softmax). Nothing is raised
    here: a row is a problem only if the round reaches it (a draft's state, or a target position after a
    rejected draft, is never committed), which the caller decides."""
    peak = scores.amax(dim=-1, keepdim=True)
    if scores.device.type == "cpu" and math.isfinite(float(peak.sum())):
        # Every row's peak is finite (a sum that overflows only takes the careful path below). Reading a
        # CPU tensor costs no synchronisation: nothing to repair.
        return scores, None
    broken = peak.isnan() | (peak == float("-inf"))  # [N, 1]
    problems = broken[:, 0].long() * NO_DISTRIBUTION
    if not do_sample:
        return torch.where(broken, 0.0, scores), problems
    infinite = peak == float("inf")
    on_peak = scores == peak
    several = infinite[:, 0] & (on_peak.sum(dim=-1) > 1)  # a +inf peak: never a broken row
    forced = torch.where(on_peak, 0.0, float("-inf"))
    return torch.where(infinite, forced, torch.where(broken, 0.0, scores)), problems + several.long() * SEVERAL_INFINITE


class RowProcessing:
    """Applies a `LogitsProcessorList` to a round's logits, batched (see the module docstring)."""

    def __init__(self, processors: LogitsProcessorList, buffer: TokenBuffer) -> None:
        self.processors = list(processors)
        self.buffer = buffer
        prompt_length = min(buffer.host_lengths)  # before any token is committed: every row's prompt
        self.row_independent = all(row_independent(processor, prompt_length) for processor in self.processors)
        # `remove_invalid_values=True`: the model's NaN and infinite logits are expected and cleaned
        self.cleans_invalid = any(
            type(processor) is logits_process.InfNanRemoveLogitsProcessor for processor in self.processors
        )
        # What `_all_rows_at_once` calls: HF's repetition penalty + temperature pair and its top-k + top-p
        # pair fused (the same scores, fewer vocabulary-sized copies, no sort).
        self._batched = fuse_top_k_top_p(fuse_penalty_temperature(self.processors))
        self._plain: dict[int, logits_process.RepetitionPenaltyLogitsProcessor | PenaltyThenTemperature] = {}
        self._hidden: dict[int, tuple[torch.Tensor, bool]] = {}  # id -> (prompt_ignore_length, hides any)
        self._eos: dict[tuple[int, int, torch.device], torch.Tensor] = {}  # (id, V, device) -> [V] EOS mask
        # (buffer version, rows, hidden, [A, W] ids) of the committed tokens' sets, built at a round's first
        # draft step and extended by the drafts at the next ones (`_prefix_ids`)
        self._committed_sets: tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None
        # (buffer version, rows, hidden, V, in range) of the ids a round's first draft step showed a fused penalty
        self._checked_ids: tuple[int, torch.Tensor, torch.Tensor | None, int, bool] | None = None

    def __call__(self, raw: torch.Tensor, rows: torch.Tensor, host_rows: list[int], offset: int) -> torch.Tensor:
        """raw [A, n, V]: logits for the tokens that follow each row's committed tokens plus its first
        offset + i drafts (i = 0..n-1). rows [A]: batch rows on the device; host_rows: the same as ints.
        -> processed [A, n, V] (float32)."""
        if not self.processors:
            return raw
        if self.row_independent:
            return self._all_rows_at_once(raw, rows, host_rows, offset)
        return self._by_prefix_length(raw, host_rows, offset)

    def _all_rows_at_once(self, raw: torch.Tensor, rows: torch.Tensor, host_rows: list[int], offset: int) -> torch.Tensor:
        active, n, vocab = raw.shape
        scores = raw.reshape(active * n, vocab)
        flat_rows = rows.repeat_interleave(n) if n > 1 else rows
        unread = flat_rows[:, None]  # processors that read only the scores get a stand-in
        ids = None
        fresh = False  # `scores` is a new tensor a processor above made, which nothing else holds
        for processor in self._batched:
            ignored = getattr(processor, "prompt_ignore_length", None)
            if type(processor) is TopKTopP:
                scores = processor.apply(unread, scores, in_place=fresh)
            elif type(processor) in _SCORES_ONLY:
                scores = processor(unread, scores)
            elif type(processor) in _LENGTH_ONLY:
                scores = self._ban_eos_where_short(processor, scores, host_rows, offset, n)
            elif isinstance(ignored, torch.Tensor):
                # The penalty skips each batch row's left padding: show those positions as a real token
                # of the row instead, and apply the plain penalty to all B*n rows at once.
                hidden_ids = self._prefix_ids(rows, host_rows, offset, n, hidden=ignored)
                scores = self._penalise(self._plain_penalty(processor), hidden_ids, scores, rows, offset, n, ignored)
            else:
                if ids is None:
                    ids = self._prefix_ids(rows, host_rows, offset, n)
                scores = self._penalise(processor, ids, scores, rows, offset, n, None)
            fresh = type(processor) in _FRESH_OUTPUT
        return scores.reshape(active, n, vocab)

    def _penalise(
        self,
        penalty: logits_process.RepetitionPenaltyLogitsProcessor | PenaltyThenTemperature,
        ids: torch.Tensor,
        scores: torch.Tensor,
        rows: torch.Tensor,
        offset: int,
        n: int,
        hidden: torch.Tensor | None,
    ) -> torch.Tensor:
        """penalty(ids, scores) for a repetition penalty (alone or fused with its temperature) over ids
        [A*n, W] from `_prefix_ids` (hidden: the positions it showed as other tokens of the row). The fused
        pass needs every id in [0, V) (HF's pair runs otherwise). A round's draft steps after the first show
        the committed tokens its first step showed plus drafts drawn from V scores, so the check runs at
        the first step and its answer serves the round."""
        if type(penalty) is not PenaltyThenTemperature:
            return penalty(ids, scores)
        vocab = scores.shape[1]
        checked = self._checked_ids
        if n == 1 and offset and checked is not None:
            version, checked_rows, checked_hidden, checked_vocab, in_range = checked
            if version == self.buffer.version and checked_rows is rows and checked_hidden is hidden and checked_vocab == vocab:
                return penalty(ids, scores, ids_in_range=in_range)
        in_range = ids_within(ids, vocab)
        if n == 1 and not offset:
            self._checked_ids = (self.buffer.version, rows, hidden, vocab, in_range)
        return penalty(ids, scores, ids_in_range=in_range)

    def _prefix_ids(
        self,
        rows: torch.Tensor,
        host_rows: list[int],
        offset: int,
        n: int,
        hidden: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[A*n, width] ids holding the token set of each of rows [A] (row a*n + i: rows[a]) at its
        committed tokens plus offset + i drafts (i = 0..n-1), width the longest: what the
        repetition penalty reads (`TokenBuffer.token_sets`). When every row is active, at the same length
        and shows all its tokens (n = 1, no hidden padding), each prefix is a whole row of the buffer: a
        slice, bitwise the same ids. A draft step after the first (n = 1, offset > 0) shows the committed
        tokens' sets built at the round's first step followed by the offset drafts: the same set per row."""
        buffer = self.buffer
        lengths = buffer.host_lengths
        every_row = len(host_rows) == len(lengths)
        width = max(lengths[row] for row in host_rows) + offset + n - 1
        if n == 1 and every_row and min(lengths) == max(lengths) and not self._hides(hidden):
            return buffer.tokens[:, :width]
        if n == 1 and offset:
            cached = self._committed_sets
            if cached is not None and cached[0] == buffer.version and cached[1] is rows and cached[2] is hidden:
                return torch.cat([cached[3], buffer.drafted(None if every_row else rows, offset)], dim=1)
        ids = buffer.token_sets(None if every_row else rows, offset, n, width, hidden)
        if n == 1 and not offset:
            self._committed_sets = (buffer.version, rows, hidden, ids)
        return ids

    def _ban_eos_where_short(
        self, processor, scores: torch.Tensor, host_rows: list[int], offset: int, n: int
    ) -> torch.Tensor:
        """scores [A*n, V] (rows a*n + i: batch row host_rows[a] after offset + i drafts) with the
        processor's EOS tokens at -inf in every row whose prefix is shorter than its minimum: what
        `MinLengthLogitsProcessor` / `MinNewTokensLengthLogitsProcessor` do to that row alone, whose
        prefix length is its committed length (left padding included) plus offset + i."""
        if type(processor) is logits_process.MinLengthLogitsProcessor:
            minimum, skipped = processor.min_length, 0
        else:
            minimum, skipped = processor.min_new_tokens, processor.prompt_length_to_skip
        lengths = self.buffer.host_lengths
        short = [lengths[row] + offset + i - skipped < minimum for row in host_rows for i in range(n)]
        if not any(short):
            return scores
        key = (id(processor), scores.shape[-1], scores.device)
        eos = self._eos.get(key)
        if eos is None:
            vocabulary = torch.arange(scores.shape[-1], device=scores.device)
            eos = self._eos[key] = torch.isin(vocabulary, torch.as_tensor(processor.eos_token_id, device=scores.device))
        if all(short):
            return torch.where(eos, -math.inf, scores)
        banned = torch.tensor(short, device=scores.device)[:, None] & eos
        return torch.where(banned, -math.inf, scores)

    def _hides(self, hidden: torch.Tensor | None) -> bool:
        """Whether `hidden` [B] (a penalty's `prompt_ignore_length`) hides any position; read once."""
        if hidden is None:
            return False
        known = self._hidden.get(id(hidden))
        if known is None or known[0] is not hidden:
            known = self._hidden[id(hidden)] = (hidden, bool(hidden.any()))
        return known[1]

    def _plain_penalty(self, processor) -> logits_process.RepetitionPenaltyLogitsProcessor | PenaltyThenTemperature:
        """The penalty (alone or fused with the temperature after it) reading every position of the ids."""
        plain = self._plain.get(id(processor))
        if plain is None:
            plain = self._plain[id(processor)] = (
                processor.without_ignore_length() if type(processor) is PenaltyThenTemperature
                else logits_process.RepetitionPenaltyLogitsProcessor(processor.penalty)
            )
        return plain

    def _by_prefix_length(self, raw: torch.Tensor, host_rows: list[int], offset: int) -> torch.Tensor:
        n = raw.shape[1]
        lengths = self.buffer.host_lengths
        batch = len(lengths)
        position_of = {row: index for index, row in enumerate(host_rows)}
        processed = raw.clone()
        device = raw.device
        everyone = torch.arange(batch, device=device)
        for length in sorted({lengths[row] + offset + i for row in host_rows for i in range(n)}):
            step, members = [], []
            for row in range(batch):
                index = position_of.get(row)
                if index is None:
                    step.append(-1)
                    continue
                i = min(max(length - lengths[row] - offset, 0), n - 1)
                step.append(i)
                if lengths[row] + offset + i == length:
                    members.append((index, i, row))
            steps = torch.tensor(step, device=device)
            prefix = torch.tensor(lengths, device=device) + torch.where(steps >= 0, offset + steps, 0)
            # a row ahead of `length` shows its first `length` tokens: a prefix it really had
            ids = self.buffer.views(everyone, prefix.clamp_max(length), length)
            scores = torch.zeros(batch, raw.shape[-1], dtype=raw.dtype, device=device)
            active = torch.tensor([row for row in range(batch) if row in position_of], device=device, dtype=torch.long)
            if active.numel():
                at = torch.tensor([position_of[row] for row in active.tolist()], device=device)
                scores[active] = raw[at, steps[active]]
            at_length = [row for _, _, row in members]
            for processor in self.processors:
                if _constrains_one_beam(processor):
                    scores = _constrain_rows(processor, ids, scores, at_length)
                else:
                    scores = checked_scores(processor, processor(ids, scores), scores.shape)
            if scores.dtype != processed.dtype:  # a processor's own precision, as plain decoding keeps it
                processed = processed.to(scores.dtype)
            index, i, row = (torch.tensor(column, device=device) for column in zip(*members))
            processed[index, i] = scores[row]
        return processed
