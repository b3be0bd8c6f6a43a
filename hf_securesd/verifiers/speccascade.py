"""Speculative cascades (Narasimhan et al., ICLR 2025): token-specific deferral rule "V3" and Chow's rule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RoundInputs, Verifier, gather, is_number, is_target_choice, require, residual

RULES = ("token", "chow")


@dataclass(frozen=True)
class SpecCascade(Verifier):
    """Lenience `a` in [0, 1] (0 = lossless).

    * rule "token": A = {v : q~(v) > (1 - a) max q~}. T = 0: accept x iff x = x* or x in A.
      T > 0: pi(v) = p(v) 1[v in A] + eta_c q(v) with eta_c = 1 - sum_{u in A} p(u);
      alpha = min(1, pi(x) / p(x)); R = normalize((pi - p)+).
    * rule "chow": defer to the target iff max p~ <= 1 - a; otherwise pi = p (accept the draft).

    The inequalities are strict so that a = 0 is exactly lossless at every temperature.

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
        require(is_number(self.a) and 0.0 <= self.a <= 1.0, f"SpecCascade a must be in [0, 1] (0 = lossless), got {self.a!r}")
        require(self.rule in RULES, f"SpecCascade rule must be one of {RULES}, got {self.rule!r}")

    def _lenient_set(self, round_inputs: RoundInputs) -> torch.Tensor:
        """bool [B, k, V]: tokens the rule lets the draft keep."""
        k = round_inputs.num_draft_tokens
        if self.rule == "chow":
            confident = round_inputs.draft_raw_probs.amax(dim=-1, keepdim=True) > 1.0 - self.a
            return confident.expand_as(round_inputs.draft_raw_probs)
        raw = round_inputs.target_raw_probs[:, :k]
        return raw > (1.0 - self.a) * raw.amax(dim=-1, keepdim=True)

    def _cascade_target(self, round_inputs: RoundInputs) -> torch.Tensor:
        """pi: [B, k, V], the distribution the cascade wants to sample from."""
        p = round_inputs.draft_probs
        kept = self._lenient_set(round_inputs).to(p.dtype)
        eta_c = 1.0 - (p * kept).sum(dim=-1, keepdim=True)
        return p * kept + eta_c * round_inputs.verified_target_probs()

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        if round_inputs.greedy:
            lenient = gather(self._lenient_set(round_inputs), candidates)
            return (is_target_choice(round_inputs, candidates) | lenient).to(torch.float32)
        pi = gather(self._cascade_target(round_inputs), candidates)
        p = gather(round_inputs.draft_probs, candidates)
        ratio = pi / p.clamp_min(torch.finfo(p.dtype).tiny)
        return torch.where(p > 0, ratio.clamp(max=1.0), (pi > 0).to(pi.dtype))

    def sampled_recovery(self, round_inputs: RoundInputs) -> torch.Tensor:
        pi = self._cascade_target(round_inputs)
        return residual(pi, round_inputs.draft_probs, fallback=round_inputs.verified_target_probs())
