"""Lossless verification (Leviathan et al. 2023; Chen et al. 2023): the output follows q exactly."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import RoundInputs, Verifier, lossless_acceptance


@dataclass(frozen=True)
class Lossless(Verifier):
    """alpha = min(1, q(x) / p(x)); R = normalize((q - p)+); greedy: accept iff x = x*, recover x*.

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier="lossless", do_sample=False)
    ```
    """

    name = "lossless"
    knob = "none"
    lossless_value = None
    sweep_values = (None,)

    @property
    def is_lossless(self) -> bool:
        return True

    @classmethod
    def sweep(cls, **fixed) -> list[Verifier]:
        return [cls()]

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        return lossless_acceptance(round_inputs, candidates)
