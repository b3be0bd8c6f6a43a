"""Speculative cascades (Narasimhan et al., ICLR 2025): token-specific deferral rule "V3" and Chow's rule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Needs, RoundInputs, Verifier, divided, gather, is_target_choice, normalized_positive_part, set_choice, set_real

RULES = ("token", "chow")


@dataclass(frozen=True)
class SpecCascade(Verifier):
    """Lenience `a` in [0, 1] (0 = lossless).

    * rule "token": A = {v : q~(v) > (1 - a) max q~}. T = 0: accept x iff x = x* or x in A.
      T > 0: pi(v) = p(v) 1[v in A] + eta_c q(v) with eta_c = 1 - sum_{u in A} p(u);
      alpha = min(1, pi(x) / p(x)); R = normalize((pi - p)+).
    * rule "chow": defer to the target iff max p~ <= 1 - a; otherwise pi = p (accept the draft).

    The inequalities are strict so that a = 0 is exactly lossless at every temperature. pi - p is
    computed as eta_c q - p 1[v not in A] (eta_c summed over the complement of A), in float64 where its
    mass is small, so a confident draft (p(A) close to 1) does not lose the recovery to cancellation.

    With a one-hot draft (p = 1_x, token rule): unchanged at T = 0; at T > 0 x in A is accepted, any
    other x with probability q(x), recovering from q (eta_c = 1). The Chow rule reads max p~ and needs
    a draft model's logits.

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier=SpecCascade(a=0.3))
    ```
    """

    a: float = 0.3
    rule: str = "token"
    name = "speccascade"
    knob = "a"
    lossless_value = 0.0
    sweep_values = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)

    def __post_init__(self) -> None:
        set_real(self, "a", lambda a: 0.0 <= a <= 1.0, "SpecCascade a must be in [0, 1] (0 = lossless)")
        set_choice(self, "rule", RULES)

    def _lenient_set(self, round_inputs: RoundInputs) -> torch.Tensor:
        """bool [B, k, V]: tokens the rule lets the draft keep."""
        k = round_inputs.num_draft_tokens
        if self.rule == "chow":
            confident = round_inputs.draft_raw_probs.amax(dim=-1, keepdim=True) > 1.0 - self.a
            return confident.expand_as(round_inputs.draft_raw_probs)
        raw = round_inputs.target_raw_probs[:, :k]
        return raw > (1.0 - self.a) * raw.amax(dim=-1, keepdim=True)

    def needs(self) -> Needs:
        if self.rule == "chow":
            return Needs(raw_draft_logits="SpecCascade rule='chow' defers on the draft's confidence max p~")
        return Needs()

    def _deferred_mass(self, round_inputs: RoundInputs, kept: torch.Tensor) -> torch.Tensor:
        """eta_c = 1 - p(A) = p(outside A), summed over the complement (no cancellation): [B, k, 1]."""
        return (round_inputs.draft_probs * (~kept).to(torch.float32)).sum(dim=-1, keepdim=True)

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        kept = self._lenient_set(round_inputs)
        lenient = gather(kept, candidates)
        if round_inputs.greedy:
            return (is_target_choice(round_inputs, candidates) | lenient).to(torch.float32)
        # pi(x) / p(x) is 1 + eta_c q(x) / p(x) >= 1 inside A and eta_c q(x) / p(x) outside it.
        eta_c = self._deferred_mass(round_inputs, kept)
        q = gather(round_inputs.verified_target_probs(), candidates)
        p = gather(round_inputs.draft_probs, candidates)
        outside = torch.where(p > 0, divided(eta_c * q, p).clamp(max=1.0), (q > 0).to(q.dtype))
        return torch.where(lenient, torch.ones_like(outside), outside)

    def sampled_recovery(self, round_inputs: RoundInputs) -> torch.Tensor:
        """normalize((pi - p)+) with pi - p = eta_c q - p 1[v not in A], computed without subtracting
        nearly equal numbers; q where that mass is zero (every draft inside A: never rejected)."""
        def difference(q: torch.Tensor, p: torch.Tensor, outside: torch.Tensor) -> torch.Tensor:
            return (p * outside).sum(dim=-1, keepdim=True) * q - p * outside

        outside = (~self._lenient_set(round_inputs)).float()
        return normalized_positive_part(round_inputs, difference, outside)
