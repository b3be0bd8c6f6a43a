"""BiLD (Kim et al., NeurIPS 2023): Big Little Decoder's rollback and fallback policies."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Needs, RoundInputs, Verifier, gather, is_target_choice, lossless_acceptance, lossless_recovery, set_real


@dataclass(frozen=True)
class BiLD(Verifier):
    """Rollback threshold `tau_rb` (nats, 0 = lossless): accept x iff -log q~(x) < tau_rb, otherwise
    the lossless rule (T = 0: accept iff x = x*; T > 0: alpha = min(1, q/p), residual recovery).
    Optional fallback `tau_fb` in [0, 1]: where the draft's confidence max p~ < tau_fb the target
    decides (alpha = 0, R = q).

    At T > 0 the target's argmax is not accepted unconditionally (it is at T = 0, where that is the
    lossless rule): accepting it with probability 1 would make every tau_rb > 0, however small,
    lossy, so the knob's lossless end would not be its limit.

    With a one-hot draft (p = 1_x) and no fallback: unchanged at T = 0; at T > 0 accept x iff
    -log q~(x) < tau_rb, else with probability q(x), recovering from normalize((q - 1_x)+). The
    fallback reads the draft's confidence max p~, so `tau_fb > 0` needs a draft model's logits.

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier=BiLD(tau_rb=2.0))
    ```
    """

    tau_rb: float = 2.0
    tau_fb: float = 0.0
    name = "bild"
    knob = "tau_rb"
    lossless_value = 0.0
    sweep_values = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0)

    def __post_init__(self) -> None:
        set_real(self, "tau_rb", lambda tau: tau >= 0, "BiLD tau_rb must be >= 0 nats (0 = lossless)")
        set_real(self, "tau_fb", lambda tau: 0.0 <= tau <= 1.0,
                 "BiLD tau_fb must be a probability in [0, 1] (0 = fallback off)")

    @property
    def is_lossless(self) -> bool:
        """Only with the fallback off: a fallback changes which drafts are accepted (not the output
        distribution at T = 0, but the acceptance rate and everything built on it)."""
        return self.tau_rb == 0 and self.tau_fb == 0

    def needs(self) -> Needs:
        if self.tau_fb > 0:
            return Needs(raw_draft_logits="BiLD's fallback (tau_fb > 0) reads the draft's confidence max p~")
        return Needs()

    def _falls_back(self, round_inputs: RoundInputs) -> torch.Tensor:
        """[B, k, 1] True where the draft is not confident enough and the target decides."""
        if self.tau_fb == 0:  # max p~ < 0 never holds; a proposer without logits needs nothing here
            return torch.zeros(*round_inputs.draft_tokens.shape, 1, dtype=torch.bool, device=round_inputs.draft_tokens.device)
        return round_inputs.draft_raw_probs.amax(dim=-1, keepdim=True) < self.tau_fb

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        raw = round_inputs.target_raw_probs[:, : round_inputs.num_draft_tokens]
        nll = -gather(raw, candidates).log()  # +inf where the raw probability is 0 (never accepted as close)
        if round_inputs.greedy:
            alpha = (is_target_choice(round_inputs, candidates) | (nll < self.tau_rb)).to(nll.dtype)
        else:
            alpha = torch.where(nll < self.tau_rb, torch.ones_like(nll), lossless_acceptance(round_inputs, candidates))
        return alpha.masked_fill(self._falls_back(round_inputs), 0.0)

    def recovery(self, round_inputs: RoundInputs) -> torch.Tensor:
        q = round_inputs.verified_target_probs()
        base = q if round_inputs.greedy else lossless_recovery(round_inputs)
        return torch.where(self._falls_back(round_inputs), q, base)
