"""MARS (Song et al., 2026): margin-aware acceptance of the target's runner-up token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..argmax import vocab_top_two
from .base import RoundInputs, Verifier, is_target_choice, lossless_acceptance, set_real


@dataclass(frozen=True)
class MARS(Verifier):
    """Logit-ratio threshold `theta` in (0, 1] (1 = lossless). With v1, v2 the target's top-2 tokens
    (ties go to the lowest index, on every device: `top_two`) and z1 >= z2 their raw logits, the
    runner-up is "close" when z1 > 0 and z2 / z1 > theta.

    * T = 0: accept x iff x = x*, or x in {v1, v2} and close.
    * T > 0: if close, accept x in {v1, v2}; otherwise the lossless rule. Recovery: residual.

    z1 > 0 is required because the ratio is not shift invariant and must not fire on negative logits.
    A one-token vocabulary has no runner-up: nothing is ever close, and the rule is the lossless one.

    With a one-hot draft (prompt lookup, n-gram, greedy EAGLE; p = 1_x) the rule is unchanged at T = 0;
    at T > 0 a close x in {v1, v2} is accepted, any other x with probability q(x), and the recovery is
    normalize((q - 1_x)+).

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier=MARS(theta=0.9))
    ```
    """

    theta: float = 0.9
    name = "mars"
    knob = "theta"
    lossless_value = 1.0
    sweep_values = (1.0, 0.98, 0.95, 0.9, 0.85, 0.8, 0.7, 0.5)

    def __post_init__(self) -> None:
        set_real(self, "theta", lambda theta: 0.0 < theta <= 1.0,
                 "MARS theta must be in (0, 1] (1 = lossless, smaller = more lenient)")

    def _lenient(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """bool [B, k, C]: the candidate is v1 or v2 at a position where the runner-up is close."""
        every_position = round_inputs.constrained_raw_logits  # [B, k+1, V]
        if every_position.shape[-1] < 2:  # no runner-up
            return torch.zeros(candidates.shape, dtype=torch.bool, device=candidates.device)
        k = round_inputs.num_draft_tokens
        # top two of every position, sliced after: whole rows in memory order reduce several times faster
        # than the drafted positions' strided slice of them at a real vocabulary
        v1, v2 = (tokens[:, :k] for tokens in top_two(every_position))
        logits = every_position[:, :k]
        z1, z2 = logits.gather(-1, v1), logits.gather(-1, v2)
        close = (z1 > 0) & (z2 > self.theta * z1) & (v2 != v1)  # one allowed token: no runner-up
        return close & ((candidates == v1) | (candidates == v2))

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        lenient = self._lenient(round_inputs, candidates)
        if round_inputs.greedy:
            return (is_target_choice(round_inputs, candidates) | lenient).to(torch.float32)
        return torch.where(lenient, torch.ones_like(candidates, dtype=torch.float32), lossless_acceptance(round_inputs, candidates))


def top_two(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(v1, v2) [..., 1] long: the largest and the runner-up of logits [..., V >= 2], ties broken by the
    lowest index (v1 is `argmax`'s x*; v2 is the first maximum once v1 is set aside), the same on every
    device, where `topk`'s order among equal values is unspecified. A row with a single finite logit at
    index 0 gets v2 = v1 (nothing else is larger than -inf). Computed by `vocab_top_two` (one pass over
    a real vocabulary on a CPU, no copy of the logits)."""
    return vocab_top_two(logits)
