"""FSD (Holsman et al., ACL Findings 2025): accept by distribution divergence, not by token."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Needs, RoundInputs, Verifier, is_target_choice, set_choice, set_real

DIVERGENCES = ("js", "kl", "tv")


def divergence(target: torch.Tensor, draft: torch.Tensor, kind: str) -> torch.Tensor:
    """D(q~, p~) over the last dim, in nats for "js" (<= ln 2) and "kl" (KL(p~ || q~)); [B, k, V] -> [B, k].

    KL(p~ || q~) is +inf where the draft puts mass on a token q~ gives none (a token the processors mask
    out of q~): such a position is never close."""
    tiny = torch.finfo(target.dtype).tiny
    if kind == "tv":
        return 0.5 * (target - draft).abs().sum(dim=-1)
    if kind == "kl":
        # Terms where p~ = 0 are 0; where p~ > 0 = q~ the log ratio is +inf, and so is the sum. A NaN stays
        # NaN (never close).
        terms = torch.where(draft == 0, torch.zeros_like(draft), draft * (draft.log() - target.log()))
        return terms.sum(dim=-1).clamp_min(0.0)
    middle = 0.5 * (target + draft)
    log_middle = middle.clamp_min(tiny).log()
    kl_target = (target * (target.clamp_min(tiny).log() - log_middle)).sum(dim=-1)
    kl_draft = (draft * (draft.clamp_min(tiny).log() - log_middle)).sum(dim=-1)
    return (0.5 * (kl_target + kl_draft)).clamp(0.0, math.log(2.0))


def _draft_over_allowed(round_inputs: RoundInputs) -> torch.Tensor:
    """p~ [B, k, V] renormalised over the tokens the constraints allow the target at each position, as q~
    is: the two distributions are compared on the same support. A position where p~ has no mass on an
    allowed token gets NaN, which is never close."""
    draft = round_inputs.draft_raw_probs
    if round_inputs.unconstrained:
        return draft
    allowed = draft * round_inputs.target_allowed[:, : round_inputs.num_draft_tokens]
    return allowed / allowed.sum(dim=-1, keepdim=True)


@dataclass(frozen=True)
class FSD(Verifier):
    """Accept every drafted token at a position iff D(q~, p~) < tau (it does not depend on the
    token); otherwise reject and draw from q itself. `divergence` is "js" (default), "kl" or "tv".
    Where processors forbid tokens, q~ and p~ are both renormalised over the allowed ones.
    At T = 0 a token equal to x* is accepted too, which changes no output (x* is what recovery
    would emit) and keeps tau = 0 exactly lossless with the lossless acceptance rate. At T > 0,
    tau = 0 is the lossless rule itself (`is_lossless`), while any tau > 0 that no position meets
    rejects every draft and draws from q: the same output, acceptance 0 (and, mixed with the
    lossless rule by a schedule, a lossy mixture: the mixed rule of two q-preserving rules).

    FSD compares the two distributions, so it needs the draft model's raw logits: a deterministic
    proposer (prompt lookup, n-gram, greedy EAGLE without logits) cannot feed it.

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier=FSD(tau=0.2, divergence="js"))
    ```
    """

    tau: float = 0.2
    divergence: str = "js"
    name = "fsd"
    knob = "tau"
    lossless_value = 0.0
    sweep_values = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)

    def __post_init__(self) -> None:
        set_choice(self, "divergence", DIVERGENCES)
        set_real(self, "tau", lambda tau: tau >= 0, "FSD tau must be >= 0 (0 = lossless)")

    def needs(self) -> Needs:
        return Needs(raw_draft_logits="FSD compares the draft's distribution with the target's (D(q~, p~))")

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        k = round_inputs.num_draft_tokens
        close = divergence(round_inputs.target_raw_probs[:, :k], _draft_over_allowed(round_inputs), self.divergence) < self.tau
        accepted = close[..., None].expand(candidates.shape)
        if round_inputs.greedy:
            accepted = accepted | is_target_choice(round_inputs, candidates)
        return accepted.to(torch.float32)

    def sampled_recovery(self, round_inputs: RoundInputs) -> torch.Tensor:
        return round_inputs.verified_target_probs()
