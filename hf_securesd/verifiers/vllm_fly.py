"""vLLM 0.33's own FLy rule (`rejection_sample_method="fly"`), as a verifier SecureSD can mix per request."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import Needs, RoundInputs, Verifier, divided, gather, require, set_integer, set_real

# vLLM 0.33 `SpeculativeConfig` defaults (vllm/config/speculative.py: fly_entropy_threshold=0.3,
# fly_entropy_top_k=3, fly_window_size=None -> min(6, num_speculative_tokens - 1)).
DEFAULT_MAX_WINDOW = 6


def top_k_entropy(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """-sum p log p over the `top_k` largest probabilities (not renormalised; zero terms skipped), in
    float32 as vLLM computes it: [..., V] -> [...]."""
    top = probs.to(torch.float32).topk(min(top_k, probs.shape[-1]), dim=-1).values
    logs = top.clamp_min(torch.finfo(top.dtype).tiny).log()
    terms = torch.where(top > 0, top * logs, torch.zeros_like(top))
    return -terms.sum(dim=-1)


@dataclass(frozen=True)
class VLLMFLy(Verifier):
    """FLy exactly as vLLM 0.33 runs it server-wide, here per request and under a SecureSD schedule.

    Knobs (vLLM's names without the `fly_` prefix, vLLM's defaults): `entropy_threshold` (tau, 0.3;
    inf = lossless), `window` (W), `entropy_top_k` (3). `window=None` is vLLM's default min(6, k - 1),
    taken per row with k = the n tokens the row drafted this round: vLLM derives W once from
    `num_speculative_tokens`, so the two agree for every row that drafted the full k; a row that
    drafted fewer (an n-gram match shorter than k, the last tokens of a `generate` budget) gets a
    smaller W here than vLLM would give it. Set `window` explicitly to pin W for every row.

    With n the row's drafted tokens and 0-based positions, a draft x_i that the native rule rejects is
    accepted anyway ("deferred") iff all of:

    * i + W < n: the whole window lies inside the row's drafts;
    * H(i) >= tau, H = -sum p log p over the `entropy_top_k` largest probabilities of the target's
      processed distribution softmax(target_logits) (after the logits processors and, at T > 0,
      temperature/top-k/top-p: q itself; at T = 0 the processed logits at T = 1);
    * the draft is possible for the target (T = 0: its processed logit is > -inf; T > 0: q(x_i) > 0
      and p(x_i) > 0);
    * the next W drafts x_{i+1..i+W} are all accepted natively (T = 0: x = x*; T > 0: the ordinary
      test q/p >= u with the uniform u that also decides that later position).

    Native rule: T = 0 accept iff x = x*; T > 0 accept iff p(x) > 0 and q(x)/p(x) >= u, u ~ U[0, 1).
    Recovery is vLLM's: T = 0 the target argmax x*; T > 0 a draw from normalize((q - p)+) (with a
    one-hot draft, as vLLM's n-gram proposer: q without the drafted token). The bonus token comes from q.
    At T > 0 the rule draws its own uniforms once per round (shared by `acceptance` and `recovery`),
    so without a schedule (eta = 1) the block is accepted with exactly vLLM's joint law: a deferral
    implies that the W drafts after it are accepted too.

    How it differs from `fly` (the rule of the FLy paper, README *Verifiers*): `fly` checks the next W - 1
    drafts where this one checks W; `fly` needs i <= k - W (1-based), this one i + W < n (0-based),
    one position less; `fly` reads the raw target softmax q~ and a top-3 entropy, this one the processed
    distribution and a configurable top-k; at T > 0 `fly` judges a future draft by whether it equals
    one of two samples of q, this one by vLLM's native acceptance test.

    Example:

    ```python
    >>> out = model.generate(ids, assistant_model=draft, verifier=VLLMFLy(), secure_schedule=Step(L=4))
    ```
    """

    entropy_threshold: float = 0.3
    window: int | None = None
    entropy_top_k: int = 3
    name = "vllm_fly"
    knob = "entropy_threshold"
    lossless_value = math.inf
    sweep_values = (math.inf, 1.0, 0.6, 0.3, 0.1)

    def __post_init__(self) -> None:
        set_real(self, "entropy_threshold", lambda tau: tau >= 0,
                 "vllm_fly entropy_threshold must be a number >= 0 (float('inf') = lossless)")
        if self.window is not None:
            set_integer(self, "window", 1, "vllm_fly window W must be None (min(6, k - 1)) or an integer >= 1")
        set_integer(self, "entropy_top_k", 1, "vllm_fly entropy_top_k must be an integer >= 1")

    def window_for(self, num_draft_tokens: int) -> int:
        """W for a row that drafted n tokens: `window`, or vLLM's default min(6, n - 1) (0: no window)."""
        if self.window is not None:
            return self.window
        return max(0, min(DEFAULT_MAX_WINDOW, num_draft_tokens - 1))

    def check_draft_length(self, num_draft_tokens: int) -> None:
        require(
            num_draft_tokens >= 2,
            "vllm_fly needs at least 2 drafted tokens per round (as vLLM's FLy does), but the draft length "
            f"k = {num_draft_tokens}; draft more tokens per round",
        )
        require(
            self.window_for(num_draft_tokens) < num_draft_tokens,
            f"vllm_fly window W={self.window} must be smaller than the draft length k = {num_draft_tokens}; use "
            f"window={num_draft_tokens - 1}, window=None (min(6, k - 1)) or draft more tokens per round",
        )

    def needs(self) -> Needs:
        return Needs(min_draft_tokens=2 if self.window is None else self.window + 1, lookahead=True)

    def _entropy_gate(self, round_inputs: RoundInputs) -> torch.Tensor:
        """H(i) >= tau at each drafted position: bool [B, k]."""
        k = round_inputs.num_draft_tokens
        processed = round_inputs.target_logits[:, :k].to(torch.float32).softmax(dim=-1)
        return top_k_entropy(processed, self.entropy_top_k) >= self.entropy_threshold

    def _possible(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """Whether a candidate may be deferred at all: bool [B, k, C]."""
        k = round_inputs.num_draft_tokens
        if round_inputs.greedy:
            return gather(round_inputs.target_logits[:, :k], candidates) > -math.inf
        q = gather(round_inputs.verified_target_probs(), candidates)
        p = gather(round_inputs.draft_probs, candidates)
        return (q > 0) & (p > 0)

    def _ratio(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """q(c) / p(c), 0 where p(c) = 0 (vLLM rejects such a draft natively): [B, k, C]."""
        q = gather(round_inputs.verified_target_probs(), candidates)
        p = gather(round_inputs.draft_probs, candidates)
        return torch.where(p > 0, divided(q, p), torch.zeros_like(q))

    def _uniforms(self, round_inputs: RoundInputs) -> torch.Tensor:
        """[B, k] uniforms in [0, 1) for the native tests, drawn once per round with the rows' own
        generators (vLLM's `generate_uniform_probs`)."""
        return round_inputs.memo("vllm_fly_uniforms", round_inputs.uniforms)

    def _deferrable(self, round_inputs: RoundInputs, native_drafts: torch.Tensor) -> torch.Tensor:
        """Probability that the window after each position holds and the gate fires: [B, k] float.

        native_drafts: [B, k] float, the probability (0/1 for this round's own draws) that each drafted
        token is accepted natively. Positions past a row's n drafts count as not accepted, so a window
        holds only where i + W < n; so do positions from the first one after i that a schedule makes exact
        again (`RoundInputs.lookahead_ends`: the rule never reads the drafts verified losslessly there).
        W is per row (`window_for(n)`)."""
        k = round_inputs.num_draft_tokens
        lengths = round_inputs.row_draft_lengths()
        ends = round_inputs.row_lookahead_ends()  # [B, k]
        windows = [self.window_for(n) for n in lengths.tolist()]
        widest = max(windows, default=0)
        positions = torch.arange(k + widest, device=native_drafts.device)[None]
        native = torch.nn.functional.pad(native_drafts, (0, widest))  # [B, k + widest]
        row_windows = torch.tensor(windows, device=native.device)
        in_window = positions[:, :widest] < row_windows[:, None]  # [B, widest]
        has_window = (row_windows >= 1).to(native.dtype)
        window_holds = torch.zeros_like(native_drafts)
        for i in range(k):
            inside = (positions[:, i + 1 : i + 1 + widest] < ends[:, i, None]).to(native.dtype)
            following = native[:, i + 1 : i + 1 + widest] * inside
            held = torch.where(in_window, following, torch.ones_like(following)).prod(dim=-1)
            window_holds[:, i] = held * has_window
        return window_holds * self._entropy_gate(round_inputs).to(native.dtype)

    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """alpha in {0, 1} given this round's own uniforms (T = 0: deterministic): [B, k, C]."""
        drafts = round_inputs.draft_tokens[..., None]
        if round_inputs.greedy:
            target_choice = round_inputs.target_argmax[:, : round_inputs.num_draft_tokens, None]
            native, native_drafts = candidates == target_choice, (drafts == target_choice)[..., 0]
        else:
            uniforms = self._uniforms(round_inputs)[..., None]
            native = self._ratio(round_inputs, candidates) >= uniforms
            native_drafts = (self._ratio(round_inputs, drafts) >= uniforms)[..., 0]
        deferred = self._deferrable(round_inputs, native_drafts.to(torch.float32))[..., None] > 0
        return (native | (deferred & self._possible(round_inputs, candidates))).to(torch.float32)

    def expected_acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """alpha averaged over the rule's own uniforms: a(c) + (1 - a(c)) * gate * prod_j a(x_{i+j}),
        a = min(1, q/p) (the native test and the window use different uniforms, so they are independent).
        At T = 0 this is `acceptance`."""
        if round_inputs.greedy:
            return self.acceptance(round_inputs, candidates)
        native = self._ratio(round_inputs, candidates).clamp(max=1.0)
        drafts = round_inputs.draft_tokens[..., None]
        native_drafts = self._ratio(round_inputs, drafts).clamp(max=1.0)[..., 0]
        window_holds = self._deferrable(round_inputs, native_drafts)[..., None]
        return native + (1.0 - native) * window_holds * self._possible(round_inputs, candidates)
