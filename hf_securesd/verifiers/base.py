"""What every verifier sees and returns for one speculative round.

Shapes: B rows, k drafted tokens, V vocabulary entries, C candidate tokens per position.
A verifier is a pure function of one round: no model calls, no state across rounds. It answers two
questions for each of the k drafted positions:

* `acceptance(round, candidates)`: the probability alpha(c) of accepting candidate token c had the
  draft proposed it there ([B, k, C]); the drafted tokens themselves are the case C = 1.
* `recovery(round)`: the distribution R the token is drawn from when the draft is rejected
  ([B, k, V], rows sum to 1).

The bonus token (all k accepted) comes from the target distribution for every verifier here.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any, Callable, ClassVar

import torch


@dataclass(eq=False)
class RoundInputs:
    """One round of verification.

    Args:
        draft_tokens: [B, k] the drafted tokens x_1..x_k.
        target_logits: [B, k+1, V] target logits after the user's logits processors and temperature.
        draft_logits: [B, k, V] draft logits after the same processors and temperature (raw / T).
        target_raw_logits: [B, k+1, V] target logits straight from the model (what relaxed rules read).
        draft_raw_logits: [B, k, V] draft logits straight from the model.
        greedy: True at temperature 0 (`do_sample=False`): q and p are one-hot on their argmax.
        draft_lengths: [B] how many of the k drafts each row may keep (a row near its length budget
            keeps fewer; the rest are not verified); None means k for every row.
    """

    draft_tokens: torch.Tensor
    target_logits: torch.Tensor
    draft_logits: torch.Tensor
    target_raw_logits: torch.Tensor
    draft_raw_logits: torch.Tensor
    greedy: bool
    draft_lengths: torch.Tensor | None = None
    _memo: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_tokens.shape[1]

    @cached_property
    def target_probs(self) -> torch.Tensor:
        """q: [B, k+1, V]; one-hot on the argmax when greedy."""
        return _distribution(self.target_logits, self.greedy)

    @cached_property
    def draft_probs(self) -> torch.Tensor:
        """p: [B, k, V]; one-hot on the argmax when greedy."""
        return _distribution(self.draft_logits, self.greedy)

    @cached_property
    def target_raw_probs(self) -> torch.Tensor:
        """q~: [B, k+1, V] softmax of the raw target logits (T = 1, no processors)."""
        return self.target_raw_logits.softmax(dim=-1)

    @cached_property
    def draft_raw_probs(self) -> torch.Tensor:
        """p~: [B, k, V] softmax of the raw draft logits."""
        return self.draft_raw_logits.softmax(dim=-1)

    @cached_property
    def target_argmax(self) -> torch.Tensor:
        """x*: [B, k+1] argmax of the processed target logits (the target's greedy choice)."""
        return self.target_logits.argmax(dim=-1)

    def row_draft_lengths(self) -> torch.Tensor:
        """[B] long: drafts each row may keep."""
        if self.draft_lengths is None:
            return torch.full(self.draft_tokens.shape[:1], self.num_draft_tokens, device=self.draft_tokens.device)
        return self.draft_lengths

    def verified_target_probs(self) -> torch.Tensor:
        """q at the k drafted positions: [B, k, V]."""
        return self.target_probs[:, : self.num_draft_tokens]

    def memo(self, key: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Per-round cache for a verifier's own random draws, so acceptance and recovery share them."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]


def _distribution(logits: torch.Tensor, greedy: bool) -> torch.Tensor:
    if greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(torch.float32)
    return logits.softmax(dim=-1)


def gather(values: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """values [B, k, V], candidates [B, k, C] -> [B, k, C]."""
    return values.gather(-1, candidates)


def lossless_acceptance(round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
    """alpha(c) = min(1, q(c) / p(c)) -> [B, k, C]; where p(c) = 0, 1 if q(c) > 0 else 0 (never NaN).

    Greedy (q, p one-hot): alpha(c) = 1[c = x*] whatever the draft, computed without one-hot tensors."""
    if round_inputs.greedy:
        return is_target_choice(round_inputs, candidates).to(torch.float32)
    q = gather(round_inputs.verified_target_probs(), candidates)
    p = gather(round_inputs.draft_probs, candidates)
    ratio = q / p.clamp_min(torch.finfo(p.dtype).tiny)
    return torch.where(p > 0, ratio.clamp(max=1.0), (q > 0).to(q.dtype))


def residual(minuend: torch.Tensor, draft_probs: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """normalize((minuend - p)+) -> [B, k, V]; rows with no positive mass fall back to `fallback`."""
    positive = (minuend - draft_probs).clamp_min(0.0)
    mass = positive.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, positive / mass.clamp_min(torch.finfo(mass.dtype).tiny), fallback)


def lossless_recovery(round_inputs: RoundInputs) -> torch.Tensor:
    """normalize((q - p)+), falling back to q where q == p: [B, k, V]."""
    q = round_inputs.verified_target_probs()
    return residual(q, round_inputs.draft_probs, fallback=q)


def is_target_choice(round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
    """c == x* (the processed target argmax) -> bool [B, k, C]."""
    return candidates == round_inputs.target_argmax[:, : round_inputs.num_draft_tokens, None]


@dataclass(frozen=True)
class Verifier(ABC):
    """A verification rule with one knob (`knob`) that moves it from lossless to lossy.

    Subclasses define `name`, `knob`, `lossless_value`, `sweep_values` and the two rules.
    At temperature 0 every verifier recovers the target's argmax x* (SPEC.md §4), so only
    `sampled_recovery` is verifier specific.
    """

    name: ClassVar[str]
    knob: ClassVar[str]
    lossless_value: ClassVar[Any]
    sweep_values: ClassVar[tuple[Any, ...]]

    @abstractmethod
    def acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """alpha for `candidates` [B, k, C] -> float [B, k, C] in [0, 1]."""

    def expected_acceptance(self, round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
        """alpha averaged over the verifier's own random draws, [B, k, C] (Theorem 1 reads this).
        Deterministic rules: `acceptance` itself."""
        return self.acceptance(round_inputs, candidates)

    def sampled_recovery(self, round_inputs: RoundInputs) -> torch.Tensor:
        """Recovery distribution at temperature > 0: [B, k, V]. Default: the lossless residual."""
        return lossless_recovery(round_inputs)

    def recovery(self, round_inputs: RoundInputs) -> torch.Tensor:
        """Recovery distribution R: [B, k, V]. Greedy: one-hot on x* (q itself)."""
        if round_inputs.greedy:
            return round_inputs.verified_target_probs()
        return self.sampled_recovery(round_inputs)

    def check_draft_length(self, num_draft_tokens: int) -> None:
        """Raise a clear error when the configuration cannot work with k drafted tokens."""

    @property
    def is_lossless(self) -> bool:
        return getattr(self, self.knob) == self.lossless_value

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, used by `GenerationConfig` serialisation, hashing and repr."""
        return {"verifier": self.name, **asdict(self)}

    @classmethod
    def sweep(cls, **fixed: Any) -> list["Verifier"]:
        """One configured verifier per value of the knob's sweep (SPEC.md §4), lossless end first."""
        return [cls(**{**fixed, cls.knob: value}) for value in cls.sweep_values]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Verifier":
        names = {f.name for f in fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"{cls.__name__} has no option(s) {sorted(unknown)}; valid options: {sorted(names)}")
        return cls(**values)


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless `condition` holds (hyperparameter validation)."""
    if not condition:
        raise ValueError(message)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
