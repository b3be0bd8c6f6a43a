"""SecureSD verification of one vLLM step, on vLLM's flattened tensors, with the shared rules.

vLLM lays a verification step out request by request: B requests, request b with n_b drafted tokens,
`num_tokens = sum n_b`. This module turns the SecureSD rows of such a step into `RoundInputs`
(one per verifier and greedy/sampled kind, ragged rows padded and masked by `draft_lengths`), runs
`mixing.verify_round` on them with the schedule's eta at each drafted token's response position,
and writes the result into vLLM's output buffer [B, max_spec_len + 1] (accepted drafts, then the
token that ends the round, then -1 placeholders).

The bonus token (every draft accepted) is the one vLLM's own sampler drew from the processed target
distribution q_{n+1} with the request's sampling parameters: SPEC.md §2 draws it from q for every
verifier here, so this is the same rule, and it keeps vLLM's per-request seeds for that draw.

A failure while verifying (a rule raising on some logits, a schedule failing at some position) never
leaves this module: the rows that shared the failing call are verified again one by one, and a row that
still fails gets its token from the target alone, as if every draft were rejected (`target_only_token`).
That is lossless (the token follows q exactly), so the request goes on with a correct, if slower,
answer, and the engine and every other request are untouched; the error is logged with the row.
Failing the request instead is not possible from here: vLLM 0.32's runner has no per-request abort, and
an exception in the sampler stops the engine core with every request on it.
Nothing here imports vLLM.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..mixing import verify_round
from ..schedules import Schedule
from ..verifiers.base import RoundInputs, Verifier
from .request import SecureSDRequest

PLACEHOLDER = -1
logger = logging.getLogger(__name__)


@dataclass(eq=False)
class RowPlan:
    """A SecureSD row of the step.

    Args:
        row: the request's index in the batch.
        request: its verifier and schedule.
        position: 0-based response position of its first drafted token.
        draft_raw_logits: [m, V] raw draft logits at the proposed positions (m >= the drafts that
            reached verification), or None when the drafter kept none (then every draft is rejected
            and the token is drawn from the target, which is exact).
        draft_logits: [m, V] the draft logits the drafts were sampled from (raw / T, then top-k/top-p);
            the raw tensor itself for greedy rows.
    """

    row: int
    request: SecureSDRequest
    position: int
    draft_raw_logits: torch.Tensor | None
    draft_logits: torch.Tensor | None


@dataclass(frozen=True)
class RowResult:
    """What verification did for one row: drafts it verified and how many it accepted."""

    row: int
    position: int
    verified: int
    accepted: int


def eta_for(schedule: Schedule | None, positions: torch.Tensor) -> torch.Tensor:
    """eta at `positions` (any shape); no schedule means the pure relaxed verifier (eta = 1)."""
    if schedule is None:
        return torch.ones(positions.shape, dtype=torch.float32, device=positions.device)
    return schedule.eta(positions)


def verify_rows(
    plans: Sequence[RowPlan],
    output_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    target_raw_logits: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    greedy: Sequence[bool],
) -> list[RowResult]:
    """Verify the rows in `plans` and write their tokens into `output_token_ids` (in place).

    Args:
        output_token_ids: [B, max_spec_len + 1] int output buffer; other rows are left untouched.
        draft_token_ids: [num_tokens] drafted tokens, request by request (-1 marks an invalid draft).
        num_draft_tokens: [B] drafts per request.
        target_raw_logits: [num_tokens + B, V] raw target logits, request by request: its n_b drafted
            positions followed by its bonus position.
        target_logits: [num_tokens, V] processed target logits at the drafted positions (penalties,
            temperature, top-k/top-p applied; unscaled for greedy rows).
        bonus_token_ids: [B] or [B, 1] bonus tokens drawn by vLLM's sampler.
        greedy: [B] whether each request decodes at temperature 0.
    """
    device = target_logits.device
    counts = torch.tensor(list(num_draft_tokens), dtype=torch.long)
    draft_starts = (counts.cumsum(0) - counts).tolist()
    invalid = (draft_token_ids < 0).tolist() if bool((draft_token_ids < 0).any()) else None
    bonus = bonus_token_ids.reshape(-1)
    if plans:
        output_token_ids[torch.tensor([plan.row for plan in plans], device=output_token_ids.device)] = PLACEHOLDER
    results: list[RowResult] = []
    groups: dict[tuple[Verifier, bool], list[tuple[RowPlan, int]]] = defaultdict(list)
    for plan in plans:
        n = _usable_drafts(plan, invalid, draft_starts[plan.row], num_draft_tokens[plan.row])
        if n == 0:
            output_token_ids[plan.row, 0] = target_only_token(
                plan.row, num_draft_tokens, draft_starts, target_logits, bonus, greedy[plan.row]
            )
            results.append(RowResult(plan.row, plan.position, 0, 0))
            continue
        groups[(plan.request.verifier, bool(greedy[plan.row]))].append((plan, n))
    for (verifier, is_greedy), members in groups.items():

        def run(chosen: list[tuple[RowPlan, int]], verifier: Verifier = verifier, is_greedy: bool = is_greedy):
            return _verify_group(
                verifier, is_greedy, chosen, output_token_ids, draft_token_ids, draft_starts, num_draft_tokens,
                target_raw_logits, target_logits, bonus, device,
            )

        def fall_back(plan: RowPlan) -> RowResult:
            output_token_ids[plan.row] = PLACEHOLDER
            output_token_ids[plan.row, 0] = target_only_token(
                plan.row, num_draft_tokens, draft_starts, target_logits, bonus, greedy[plan.row]
            )
            return RowResult(plan.row, plan.position, 0, 0)

        results += _isolating_failures(members, run, fall_back)
    return results


def _isolating_failures(
    members: list[tuple[RowPlan, int]],
    run: Callable[[list[tuple[RowPlan, int]]], list[RowResult]],
    fall_back: Callable[[RowPlan], RowResult],
) -> list[RowResult]:
    """run(members); if it raises, run each member alone, and fall back for a member that fails alone."""
    try:
        return run(members)
    except Exception as error:  # noqa: BLE001 - one request's failure must not stop the engine (module doc)
        if len(members) == 1:
            plan = members[0][0]
            logger.error(
                "SecureSD verification of batch row %d (%s) failed: %r; its token comes from the target alone "
                "(lossless) this step", plan.row, plan.request.to_dict(), error,
            )
            return [fall_back(plan)]
    results: list[RowResult] = []
    for member in members:
        results += _isolating_failures([member], run, fall_back)
    return results


def fall_back_rows(
    plans: Sequence[RowPlan],
    output_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int],
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    greedy: Sequence[bool],
) -> list[RowResult]:
    """Every row in `plans` gets its token from the target alone (see the module doc); shapes as in
    `verify_rows`. For a failure outside one group's verification."""
    counts = torch.tensor(list(num_draft_tokens), dtype=torch.long)
    draft_starts = (counts.cumsum(0) - counts).tolist()
    bonus = bonus_token_ids.reshape(-1)
    results = []
    for plan in plans:
        output_token_ids[plan.row] = PLACEHOLDER
        output_token_ids[plan.row, 0] = target_only_token(
            plan.row, num_draft_tokens, draft_starts, target_logits, bonus, greedy[plan.row]
        )
        results.append(RowResult(plan.row, plan.position, 0, 0))
    return results


def _usable_drafts(plan: RowPlan, invalid: list[bool] | None, start: int, count: int) -> int:
    """Drafts of the row that can be verified: up to the first invalid one (-1), and none without logits.
    `invalid`: per flattened draft, whether it is -1 (None when none is)."""
    if count == 0 or plan.draft_raw_logits is None:
        return 0
    count = min(count, plan.draft_raw_logits.shape[0])
    if invalid is None:
        return count
    return next((offset for offset in range(count) if invalid[start + offset]), count)


def _leading_rows(tensors: list[torch.Tensor], lengths: list[int], k: int) -> torch.Tensor:
    """[G, k, V]: each tensor's first k rows, its last valid row repeated past its length."""
    return torch.stack([t[:k] if n >= k else t[torch.arange(k).clamp(max=n - 1)] for t, n in zip(tensors, lengths)])


def _schedule_weights(members: list[tuple[RowPlan, int]], positions: torch.Tensor) -> torch.Tensor:
    """eta [G, k] at each row's drafted positions [G, k], evaluated once per distinct schedule."""
    eta = torch.empty(positions.shape, dtype=torch.float32)
    by_schedule: dict[Schedule | None, list[int]] = defaultdict(list)
    for index, (plan, _) in enumerate(members):
        by_schedule[plan.request.schedule].append(index)
    for schedule, indices in by_schedule.items():
        chosen = torch.tensor(indices)
        eta[chosen] = eta_for(schedule, positions[chosen])
    return eta


def target_only_token(
    row: int, num_draft_tokens: Sequence[int], draft_starts: list[int], target_logits: torch.Tensor,
    bonus: torch.Tensor, is_greedy: bool,
) -> torch.Tensor:
    """The row's next token when no draft can be verified: vLLM's bonus token if nothing was drafted,
    else a draw from q at the first drafted position (every draft rejected; the output follows q).
    target_logits: [num_tokens, V] processed; bonus: [B]. Never raises on finite or -inf logits."""
    if num_draft_tokens[row] == 0:
        return bonus[row]
    logits = target_logits[draft_starts[row]]
    probs = logits.softmax(dim=-1)
    if is_greedy or not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        return logits.argmax()
    return torch.multinomial(probs, 1)[0]


def _verify_group(
    verifier: Verifier,
    is_greedy: bool,
    members: list[tuple[RowPlan, int]],
    output_token_ids: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_starts: list[int],
    num_draft_tokens: Sequence[int],
    target_raw_logits: torch.Tensor,
    target_logits: torch.Tensor,
    bonus: torch.Tensor,
    device: torch.device,
) -> list[RowResult]:
    """One RoundInputs for rows sharing a verifier and greedy/sampled kind: [G, k] with k = max n.

    Index lists are built in Python (a batch holds few rows) and turned into one tensor, which is
    cheaper than a dozen small tensor operations per step."""
    k = max(n for _, n in members)
    rows = [plan.row for plan, _ in members]
    counts = [n for _, n in members]
    draft_index: list[int] = []
    processed_index: list[int] = []
    raw_index: list[int] = []
    complete: list[bool] = []
    for (plan, n), row in zip(members, rows):
        start = draft_starts[row]
        # A row cut short by an invalid draft ends at a drafted position whose processed logits exist;
        # a complete row ends at the bonus position, whose token vLLM's sampler drew.
        whole = n == num_draft_tokens[row]
        end = n - 1 if whole else n
        complete.append(whole)
        # Padded slots repeat the row's last valid entry; draft_lengths keeps them out of verification.
        draft_index += [start + min(j, n - 1) for j in range(k)]
        processed_index += [start + min(j, end) for j in range(k + 1)]
        raw_index += [start + row + min(j, n) for j in range(k + 1)]
    size, vocab = len(rows), target_logits.shape[-1]
    index = torch.tensor(draft_index + processed_index + raw_index, device=device)
    draft_at, processed_at, raw_at = index.split([size * k, size * (k + 1), size * (k + 1)])
    draft_raw = _leading_rows([plan.draft_raw_logits for plan, _ in members], counts, k).to(device, torch.float32)
    draft_processed = (
        draft_raw if is_greedy else _leading_rows([plan.draft_logits for plan, _ in members], counts, k).to(device, torch.float32)
    )
    drafts = draft_token_ids[draft_at].view(size, k).long()
    round_inputs = RoundInputs(
        draft_tokens=drafts,
        target_logits=target_logits[processed_at].view(size, k + 1, vocab),
        draft_logits=draft_processed[:, :, :vocab],
        target_raw_logits=target_raw_logits[raw_at].view(size, k + 1, vocab).to(torch.float32),
        draft_raw_logits=draft_raw[:, :, :vocab],
        greedy=is_greedy,
        draft_lengths=torch.tensor(counts, device=device),
    )
    positions = torch.tensor([[plan.position + j for j in range(k)] for plan, _ in members])
    eta = _schedule_weights(members, positions).to(device)
    accepted, next_token, _ = verify_round(verifier, round_inputs, eta)
    accepted_list, next_list = accepted.tolist(), next_token.tolist()
    bonus_list, draft_list = bonus[torch.tensor(rows, device=bonus.device)].tolist(), drafts.tolist()
    written = []
    for i, n in enumerate(counts):
        a = accepted_list[i]
        last = bonus_list[i] if a == n and complete[i] else next_list[i]
        written.append(draft_list[i][:a] + [last] + [PLACEHOLDER] * (k - a))
    output_token_ids[torch.tensor(rows, device=output_token_ids.device), : k + 1] = torch.tensor(
        written, dtype=output_token_ids.dtype, device=output_token_ids.device
    )
    return [RowResult(plan.row, plan.position, n, accepted_list[i]) for i, (plan, n) in enumerate(members)]
