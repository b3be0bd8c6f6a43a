"""FLy (Li et al., ICLR 2026): accept a mismatch when the target is uncertain and self-corrects onto the draft."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import RoundInputs, Verifier, require


def top3_entropy(probs: torch.Tensor) -> torch.Tensor:
    """H_3: entropy of the three largest probabilities, not renormalised, in nats. [B, k, V] -> [B, k]."""
    top = probs.topk(min(3, probs.shape[-1]), dim=-1).values
    return -(top * top.clamp_min(torch.finfo(top.dtype).tiny).log()).sum(dim=-1)


@dataclass(frozen=True)
class FLy(Verifier):
    """Entropy threshold `tau` (inf = lossless at T = 0) and lookahead window `window` (W, 1 <= W <= k-1).

    A drafted token "matches" when it equals either of two independent samples from q (at T = 0:
    x*). A mismatch at 1-based position i is accepted iff H_3(q~_i) >= tau, the next W-1 drafted
    tokens all match, and i <= k - W. On rejection the token is the first of the two samples.

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier=FLy(tau=0.3, window=3))
    ```
    """

    tau: float = 0.6
    window: int = 3
    name = "fly"
    knob = "tau"
    lossless_value = math.inf
    sweep_values = (math.inf, 1.0, 0.6, 0.3, 0.1)

    def __post_init__(self) -> None:
        require(
            isinstance(self.tau, (int, float)) and not isinstance(self.tau, bool) and self.tau >= 0,
            f"FLy tau must be >= 0 (float('inf') = lossless), got {self.tau!r}",
        )
        require(
            isinstance(self.window, int) and not isinstance(self.window, bool) and self.window >= 1,
            f"FLy window W must be an integer >= 1, got {self.window!r}",
        )

    def check_draft_length(self, num_draft_tokens: int) -> None:
        require(
            self.window <= num_draft_tokens - 1,
            f"FLy window W={self.window} needs W <= k-1 but k (num_assistant_tokens) = {num_draft_tokens}; "
            f"use FLy(window={max(1, num_draft_tokens - 1)}) or draft more tokens",
        )

    def _samples(self, round_inputs: RoundInputs) -> torch.Tensor:
        """[2, B, k] two independent draws from q at each drafted position (x* twice at T = 0)."""

        def draw() -> torch.Tensor:
            q = round_inputs.verified_target_probs()
            flat = q.reshape(-1, q.shape[-1])
            picks = torch.multinomial(flat, 2, replacement=True) if not round_inputs.greedy else flat.argmax(-1, keepdim=True).expand(-1, 2)
            return picks.T.reshape(2, *q.shape[:-1])

        return round_inputs.memo("fly_samples", draw)

    def _lenient(self, round_inputs: RoundInputs) -> torch.Tensor:
        """bool [B, k]: positions where a mismatch is forgiven."""
        k = round_inputs.num_draft_tokens
        samples = self._samples(round_inputs)
        drafted = round_inputs.draft_tokens
        matches = (drafted == samples[0]) | (drafted == samples[1])
        uncertain = top3_entropy(round_inputs.target_raw_probs[:, :k]) >= self.tau
        lenient = torch.zeros_like(matches)
        limit = round_inputs.row_draft_lengths() - self.window  # 1-based i <= k - W, per row
        for i in range(k - self.window):  # 0-based i
            lookahead = matches[:, i + 1 : i + self.window].all(dim=-1)
            lenient[:, i] = uncertain[:, i] & lookahead & (i + 1 <= limit)
        return lenient

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        samples = self._samples(round_inputs)[..., None]
        match = (candidates == samples[0]) | (candidates == samples[1])
        return (match | self._lenient(round_inputs)[..., None]).to(torch.float32)

    def sampled_recovery(self, round_inputs: RoundInputs) -> torch.Tensor:
        first = self._samples(round_inputs)[0]
        return torch.nn.functional.one_hot(first, round_inputs.target_logits.shape[-1]).to(torch.float32)
