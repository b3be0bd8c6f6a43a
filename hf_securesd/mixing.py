"""SecureSD mixing (README, *SecureSD schedules*): blend lossless and relaxed verification by response position.

    alpha_mix(j) = (1 - eta_j) alpha_lossless + eta_j alpha_relaxed
    R_mix(j)     = (1 - eta_j) R_lossless     + eta_j R_relaxed

The mixer never knows which relaxed verifier it is mixing. When eta is 0 (or 1) at every position
of a round, only the lossless (or only the relaxed) rule is evaluated, so the mixing costs nothing
where it changes nothing.
"""

from __future__ import annotations

from typing import Callable

import torch

from .verifiers.base import RoundInputs, Verifier, lossless_acceptance, lossless_recovery


def _mix(
    eta: torch.Tensor,
    verifier: Verifier,
    lossless_part: Callable[[], torch.Tensor],
    relaxed_part: Callable[[], torch.Tensor],
) -> torch.Tensor:
    """(1 - eta) lossless + eta relaxed, evaluating only the parts with non-zero weight.
    eta: [B, k, 1] broadcastable against the parts."""
    if verifier.is_lossless or bool((eta == 0).all()):
        return lossless_part()
    if bool((eta == 1).all()):
        return relaxed_part()
    return (1.0 - eta) * lossless_part() + eta * relaxed_part()


def mixed_acceptance(
    verifier: Verifier, round_inputs: RoundInputs, eta: torch.Tensor, candidates: torch.Tensor
) -> torch.Tensor:
    """alpha_mix for `candidates` [B, k, C] with eta [B, k] -> [B, k, C]. A candidate the constraints
    forbid (processed target logit -inf) gets 0 from the relaxed rule whatever it says; the lossless
    rule never accepts one (q = 0 there, and at T = 0 it is never x*)."""
    return _mix(
        eta[..., None],
        verifier,
        lambda: lossless_acceptance(round_inputs, candidates),
        lambda: verifier.acceptance(round_inputs, candidates) * round_inputs.allowed_at(candidates),
    )


def mixed_recovery(verifier: Verifier, round_inputs: RoundInputs, eta: torch.Tensor) -> torch.Tensor:
    """R_mix with eta [B, k] -> [B, k, V]."""
    return _mix(
        eta[..., None],
        verifier,
        lambda: lossless_recovery(round_inputs),
        lambda: verifier.recovery(round_inputs),
    )


def recovery_at(verifier: Verifier, round_inputs: RoundInputs, eta: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """R_mix at drafted position positions[b] of each row b -> [B, V]: `mixed_recovery`'s entries there.
    Where eta is 0 at every one of those positions only the lossless rule is evaluated, and only there
    (one [B, V] residual instead of [B, k, V])."""
    rows = torch.arange(positions.shape[0], device=positions.device)
    if verifier.is_lossless or bool((eta[rows, positions] == 0).all()):
        return lossless_recovery(round_inputs, at=(rows, positions))
    return mixed_recovery(verifier, round_inputs, eta)[rows, positions]


def bonus_distribution(round_inputs: RoundInputs) -> torch.Tensor:
    """Distribution of the bonus token after a row's drafts were all accepted: [B, V].

    SecureSD draws it from (1 - eta) q_{k+1} + eta R^_{k+1}; every verifier here has R^ = q, so
    the mixture is q at the position after the row's last kept draft, whatever eta is."""
    q = round_inputs.target_probs
    if round_inputs.draft_lengths is None:  # every row may keep all k drafts: q at position k, a view
        return q[:, round_inputs.num_draft_tokens]
    index = round_inputs.row_draft_lengths()[:, None, None].expand(-1, 1, q.shape[-1])
    return q.gather(1, index)[:, 0]


def one_step_output(verifier: Verifier, round_inputs: RoundInputs, eta: torch.Tensor) -> torch.Tensor:
    """Theorem 1: out(y) = alpha(y) p(y) + (1 - sum_v alpha(v) p(v)) R(y), at each drafted position.

    eta: [B, k] -> [B, k, V]. A verifier's own random draws (FLy's samples of q at T > 0) are averaged
    out (`Verifier.expected_acceptance`), so this is the output distribution given the drafted block.
    """
    _bound_lookahead(verifier, round_inputs, eta)
    p = round_inputs.draft_probs
    batch, k, vocab = p.shape
    everything = torch.arange(vocab, device=p.device).expand(batch, k, vocab)
    alpha = _mix(
        eta[..., None],
        verifier,
        lambda: lossless_acceptance(round_inputs, everything),
        lambda: verifier.expected_acceptance(round_inputs, everything) * round_inputs.allowed_at(everything),
    )
    recovery = mixed_recovery(verifier, round_inputs, eta)
    kept = alpha * p
    return kept + (1.0 - kept.sum(dim=-1, keepdim=True)).clamp_min(0.0) * recovery


def total_variation(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """TV distance over the last dim: [..., V] -> [...]."""
    return 0.5 * (first - second).abs().sum(dim=-1)


def verify_round(
    verifier: Verifier, round_inputs: RoundInputs, eta: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Accept a prefix of each row's drafts and draw the token that ends the round.

    eta: [B, k] schedule weights of the drafted positions; may be None for a greedy lossless round, whose
    rule reads no weight (any other round raises ValueError without it).
    Returns (accepted [B] long in 0..k, next_token [B], alpha [B, k]): x_i is accepted iff
    u_i < alpha_mix(x_i) for all i up to it; at the first rejection the token comes from R_mix
    there, and once a row's drafts (k, or its `draft_lengths` entry) are all accepted it is the
    bonus token from q. At T = 0 every recovery distribution and the bonus are one-hot on the
    target's argmax x*, so the token is read off x* without vocabulary-sized work; the lossless rule
    there accepts x_i iff x_i = x*_i and draws no uniform (alpha is 0 or 1).
    """
    k = round_inputs.num_draft_tokens
    if round_inputs.greedy and verifier.is_lossless:
        # alpha = 1[x = x*] is 0 or 1, so u < alpha is alpha itself: no uniforms to draw.
        matches = round_inputs.draft_tokens == round_inputs.target_argmax[:, :k]
        accepted = _within_lengths(round_inputs, matches.cumprod(dim=-1).sum(dim=-1))
        return accepted, round_inputs.target_argmax.gather(1, accepted[:, None])[:, 0], matches.float()
    if eta is None:
        raise ValueError(
            f"verify_round: eta is None, but {verifier.to_dict()} (greedy={round_inputs.greedy}) mixes by "
            "the schedule weights; give eta [B, k] (only greedy lossless rounds may omit it)"
        )
    _bound_lookahead(verifier, round_inputs, eta)
    alpha = mixed_acceptance(verifier, round_inputs, eta, round_inputs.draft_tokens[..., None])[..., 0]
    passed = round_inputs.uniforms() < alpha
    accepted = _within_lengths(round_inputs, passed.long().cumprod(dim=-1).sum(dim=-1))
    if round_inputs.greedy:
        return accepted, round_inputs.target_argmax.gather(1, accepted[:, None])[:, 0], alpha
    lengths = round_inputs.row_draft_lengths()
    bonus = bonus_distribution(round_inputs)
    if k == 0 or bool((accepted == lengths).all()):
        distribution = bonus
    else:
        at_rejection = recovery_at(verifier, round_inputs, eta, accepted.clamp(max=k - 1))
        distribution = torch.where((accepted < lengths)[:, None], at_rejection, bonus)
    return accepted, round_inputs.sample_rows(distribution), alpha


def _bound_lookahead(verifier: Verifier, round_inputs: RoundInputs, eta: torch.Tensor) -> None:
    """Give a lookahead rule (FLy) the end of what it may read at each position (`lookahead_ends`)."""
    if verifier.needs().lookahead and not verifier.is_lossless:
        round_inputs.lookahead_ends = lookahead_ends(eta, round_inputs.row_draft_lengths())


def lookahead_ends(eta: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """eta [B, k], lengths [B] -> [B, k] long: for each drafted position i, the first later position whose
    weight is 0 (verified losslessly: exact), capped by the row's draft length. A lookahead rule deciding
    x_i reads only the drafts before it: had it read the exact position's draft (or a later one, which
    depends on it), accepting x_i would condition that draft, and its lossless test would no longer
    give the target's distribution (exact where eta = 0)."""
    batch, k = eta.shape
    if k == 0:
        return torch.zeros(batch, 0, dtype=torch.long, device=eta.device)
    positions = torch.arange(k, device=eta.device)
    exact_at = torch.where(eta == 0, positions, k)  # [B, k]: the position where exact, else k
    later = torch.cat([exact_at[:, 1:], exact_at.new_full((batch, 1), k)], dim=1)  # position i reads i + 1 on
    first_later = later.flip(1).cummin(dim=1).values.flip(1)
    return torch.minimum(first_later, lengths[:, None])


def _within_lengths(round_inputs: RoundInputs, accepted: torch.Tensor) -> torch.Tensor:
    """accepted [B] capped at each row's draft length (nothing to cap when every row keeps all k)."""
    if round_inputs.draft_lengths is None:
        return accepted
    return torch.minimum(accepted, round_inputs.draft_lengths)


def greedy_deviation(round_inputs: RoundInputs, alpha: torch.Tensor) -> torch.Tensor:
    """TV(out_i, q_i) at T = 0: out = alpha(x) delta_x + (1 - alpha(x)) delta_x*, so the deviation is
    alpha_mix(x_i) where x_i != x*_i and 0 elsewhere. alpha: [B, k] -> [B, k]."""
    k = round_inputs.num_draft_tokens
    return alpha * (round_inputs.draft_tokens != round_inputs.target_argmax[:, :k]).to(alpha.dtype)
