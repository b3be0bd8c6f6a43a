"""LossySD: additive lenience on the acceptance test."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RoundInputs, Verifier, gather, is_target_choice, lossless_acceptance, set_real


@dataclass(frozen=True)
class LossySD(Verifier):
    """Additive relaxation by `epsilon` in [0, 1] (0 = lossless, 1 = accept everything).

    * T = 0: accept x iff x = x* or q~(x) > max q~ - epsilon.
    * T > 0: alpha = min(1, q(x) / p(x) + epsilon); recovery is the lossless residual.

    The inequality is strict so that epsilon = 0 is exactly lossless even when logits processors
    move the argmax away from the raw one.

    With a one-hot draft (p = 1_x): unchanged at T = 0 (it reads only the target); at T > 0
    alpha = min(1, q(x) + epsilon) and R = normalize((q - 1_x)+).

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier=LossySD(epsilon=0.2))
    ```
    """

    epsilon: float = 0.1
    name = "lossysd"
    knob = "epsilon"
    lossless_value = 0.0
    sweep_values = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8)

    def __post_init__(self) -> None:
        set_real(self, "epsilon", lambda epsilon: 0.0 <= epsilon <= 1.0,
                 "LossySD epsilon must be in [0, 1] (0 = lossless, 1 = accept all)")

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        if round_inputs.greedy:
            raw = round_inputs.target_raw_probs[:, : round_inputs.num_draft_tokens]
            lenient = gather(raw, candidates) > raw.amax(dim=-1, keepdim=True) - self.epsilon
            return (is_target_choice(round_inputs, candidates) | lenient).to(torch.float32)
        return (lossless_acceptance(round_inputs, candidates) + self.epsilon).clamp(max=1.0)
