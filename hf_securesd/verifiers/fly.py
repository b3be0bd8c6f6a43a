"""FLy (Li et al., ICLR 2026): accept a mismatch when the target is uncertain and self-corrects onto the draft."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Needs, RoundInputs, Verifier, gather, lossless_acceptance, require, set_integer, set_real


def top3_entropy(probs: torch.Tensor) -> torch.Tensor:
    """H_3: entropy of the three largest probabilities, not renormalised, in nats. [B, k, V] -> [B, k]."""
    top = probs.topk(min(3, probs.shape[-1]), dim=-1).values
    return -(top * top.clamp_min(torch.finfo(top.dtype).tiny).log()).sum(dim=-1)


@dataclass(frozen=True)
class FLy(Verifier):
    """Entropy threshold `tau` (inf = lossless) and lookahead window `window` (W, 1 <= W <= k-1).

    A mismatch at 1-based position i is forgiven (accepted) iff H_3(q~_i) >= tau, the next W-1
    drafted tokens all "match" the target, and i <= k - W. Under a schedule that makes a later position
    exact again (`Segments` after its boundary), the block ends for i at the first such position after it
    (`RoundInputs.lookahead_ends`): the rule never reads the drafts that position verifies losslessly.
    A drafted token matches when it equals either of two independent samples from q (at T = 0: x*).
    Where nothing is forgiven the lossless rule decides (T = 0: accept iff x = x*, recover x*; T > 0:
    alpha = min(1, q/p), residual recovery).

    The lossless end is the limit of the knob: as tau grows the gate fires less often, and once it
    never fires FLy is exactly lossless, at T = 0 and T > 0 alike. (Judging a position that is not
    forgiven by the two-sample match itself, as a literal reading of the method does at T > 0, is
    lossy even when the gate never fires: first-token TV 0.05 at tau = 1e9 in our tests.)

    With a one-hot draft (p = 1_x) the rule is unchanged at T = 0; at T > 0 a position that is not
    forgiven accepts x with probability q(x) and recovers from normalize((q - 1_x)+).

    The lookahead makes the output at position i depend on the later drafts of the block: the
    per-position deviation in `SpeculativeStats` is, for FLy, the TV of the one-step output given the
    drafted block, averaged over rounds (see `SpeculativeStats.position_tv`).

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
        set_real(self, "tau", lambda tau: tau >= 0, "FLy tau must be >= 0 (float('inf') = lossless)")
        set_integer(self, "window", 1, "FLy window W must be an integer >= 1")

    def check_draft_length(self, num_draft_tokens: int) -> None:
        require(
            num_draft_tokens >= 2,
            f"FLy needs at least 2 drafted tokens per round (its window W >= 1 must satisfy W <= k-1), but the "
            f"draft length k = {num_draft_tokens}; draft more tokens per round",
        )
        require(
            self.window <= num_draft_tokens - 1,
            f"FLy window W={self.window} needs W <= k-1 but the draft length k = {num_draft_tokens}; "
            f"use FLy(window={num_draft_tokens - 1}) or draft {self.window + 1} or more tokens per round",
        )

    def needs(self) -> Needs:
        return Needs(min_draft_tokens=self.window + 1, lookahead=True)

    def _samples(self, round_inputs: RoundInputs) -> torch.Tensor:
        """[2, B, k] two independent draws from q at each drafted position (x* twice at T = 0)."""

        def draw() -> torch.Tensor:
            if round_inputs.greedy:  # (q, one-hot on x*, is not built)
                return round_inputs.target_argmax[:, : round_inputs.num_draft_tokens].expand(2, -1, -1)
            return round_inputs.sample_positions(round_inputs.verified_target_probs(), 2).permute(2, 0, 1)

        return round_inputs.memo("fly_samples", draw)

    def _forgiven(self, round_inputs: RoundInputs, matches: torch.Tensor) -> torch.Tensor:
        """Probability that a mismatch is forgiven, given how likely each drafted token is to match.

        matches: [B, k] float in [0, 1] (0/1 for this round's own draws) -> [B, k] float."""
        k = round_inputs.num_draft_tokens
        uncertain = (top3_entropy(round_inputs.target_raw_probs[:, :k]) >= self.tau).to(matches.dtype)
        # 1-based i <= n - W, with n the end of the drafts the rule may read for i (the row's draft length,
        # or where a schedule makes a later position exact: `RoundInputs.lookahead_ends`)
        limit = round_inputs.row_lookahead_ends() - self.window  # [B, k]
        forgiven = torch.zeros_like(matches)
        for i in range(k - self.window):  # 0-based i
            lookahead = matches[:, i + 1 : i + self.window].prod(dim=-1)
            forgiven[:, i] = uncertain[:, i] * lookahead * (i + 1 <= limit[:, i]).to(matches.dtype)
        return forgiven

    def _with_forgiveness(self, round_inputs: RoundInputs, candidates: torch.Tensor, forgiven: torch.Tensor) -> torch.Tensor:
        """alpha = 1 where forgiven, else the lossless rule: [B, k, C]."""
        lossless = lossless_acceptance(round_inputs, candidates)
        return forgiven[..., None] + (1.0 - forgiven[..., None]) * lossless

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        samples = self._samples(round_inputs)
        drafted = round_inputs.draft_tokens
        matches = ((drafted == samples[0]) | (drafted == samples[1])).to(torch.float32)
        return self._with_forgiveness(round_inputs, candidates, self._forgiven(round_inputs, matches))

    def expected_acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """alpha averaged over FLy's own two samples: a drafted token x matches with probability
        1 - (1 - q(x))^2 (at T = 0 the samples are x*, so this equals `acceptance`)."""
        if round_inputs.greedy:
            return self.acceptance(round_inputs, candidates)
        q_drafted = gather(round_inputs.verified_target_probs(), round_inputs.draft_tokens[..., None])[..., 0]
        matches = 1.0 - (1.0 - q_drafted) ** 2
        return self._with_forgiveness(round_inputs, candidates, self._forgiven(round_inputs, matches))
