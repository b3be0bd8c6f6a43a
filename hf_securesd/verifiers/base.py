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
from typing import Any, Callable, ClassVar, Sequence

import torch

from ..argmax import vocab_argmax
from ..draws import draw_rows
from ..schedules import as_real, is_integer, is_no_number, not_a_number, python_scalar, short_repr

# A knob's infinite value (FLy's lossless tau) in `Verifier.to_dict()`: strict JSON has no Infinity.
INFINITY = "inf"
# The largest integer an integer knob may hold (a window or a top-k beyond it cannot index a tensor).
LARGEST_INTEGER_KNOB = 2**63 - 1


@dataclass(eq=False)
class RoundInputs:
    """One round of verification.

    Args:
        draft_tokens: [B, k] the drafted tokens x_1..x_k.
        target_logits: [B, k+1, V] target logits after the user's logits processors and temperature.
        draft_logits: [B, k, V] draft logits after the same processors and temperature (raw / T), the
            distribution the drafts were sampled from; None for a deterministic proposer (prompt lookup,
            n-gram, a greedy EAGLE head): the draft distribution is then one-hot on the drafted token.
        target_raw_logits: [B, k+1, V] target logits straight from the model (what relaxed rules read,
            always through `constrained_raw_logits`).
        draft_raw_logits: [B, k, V] draft logits straight from the model, or None when the proposer has
            none (verifiers that read them declare it in `Verifier.needs`).
        greedy: True at temperature 0 (`do_sample=False`): q and p are one-hot on their argmax.
        draft_lengths: [B] how many of the k drafts each row may keep (a row near its length budget
            keeps fewer; the rest are not verified); None means k for every row.
        generators: one `torch.Generator` (or None: the global one) per row; with any set, every random
            draw of row b (acceptance uniforms, a verifier's own samples, the token that ends the round)
            comes from its own generator, in a fixed order and of the row's own draft length, so a
            row's output does not depend on the other rows of the batch.
        given_target_argmax: [B, k+1] long, x* computed by the engine (the argmax of target_logits), or
            None (computed here). With it, target_logits and target_raw_logits may be None in a greedy
            lossless round, whose rule reads x* alone (`step.verify_step` checks that).
        given_draft_probs: [B, k, V] softmax(draft_logits) as the proposer computed it to draw the drafts
            (not recomputed), or None (computed here). Not read at T = 0, where p is one-hot.
        lookahead_ends: [B, k] long, for each drafted position i the end (exclusive) of the drafts a rule
            may read to decide it, or None: each row's draft length. `mixing.verify_round` sets it for a
            lookahead rule (FLy) where a schedule makes a later position exact (eta = 0 after eta > 0, as
            `Segments` does after its boundary): a rule that read those drafts to accept x_i would make
            them, given that x_i was accepted, no longer drawn from p, and their lossless verification
            inexact. Positions from the end on count as the end of the block.

    Constraints: a token whose processed target logit is -inf (masked by a processor or an engine's
    constraint: allowed ids, bad words, min-tokens EOS suppression, top-k/top-p) can never be emitted
    by the target, so no verifier may accept or recover it. The relaxed rules read the raw target
    logits with those tokens masked (`constrained_raw_logits`), and `mixing` gives such candidates
    acceptance 0 whatever the rule says.
    """

    draft_tokens: torch.Tensor
    target_logits: torch.Tensor | None
    draft_logits: torch.Tensor | None
    target_raw_logits: torch.Tensor | None
    draft_raw_logits: torch.Tensor | None
    greedy: bool
    draft_lengths: torch.Tensor | None = None
    generators: Sequence[torch.Generator | None] | None = None
    given_target_argmax: torch.Tensor | None = None
    given_draft_probs: torch.Tensor | None = None
    lookahead_ends: torch.Tensor | None = None
    _memo: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_tokens.shape[1]

    @cached_property
    def target_probs(self) -> torch.Tensor:
        """q: [B, k+1, V]; one-hot on the argmax when greedy. At T > 0 a position whose processed logits
        give no distribution (NaN, +inf, every token -inf) raises `UnusableTargetError`: a softmax row
        holds NaN in every entry exactly when that happens, so one entry per row is summed to find out."""
        q = _distribution(self.target_logits, self.greedy)
        if not self.greedy and math.isnan(float(q[..., 0].sum())):
            raise_unusable(self.target_logits, greedy=False)
        return q

    @cached_property
    def draft_probs(self) -> torch.Tensor:
        """p: [B, k, V]; one-hot on the argmax when greedy, on the drafted token without a draft distribution."""
        if self.draft_logits is None:
            vocab = self.target_logits.shape[-1]
            return torch.nn.functional.one_hot(self.draft_tokens, vocab).to(torch.float32)
        if self.given_draft_probs is not None and not self.greedy:
            return self.given_draft_probs
        return _distribution(self.draft_logits, self.greedy)

    @property
    def unconstrained(self) -> bool:
        """True when nothing processed the target logits (the same tensor as the raw ones): no token is
        masked, so the vocabulary-wide constraint passes below are skipped."""
        return self.target_logits is self.target_raw_logits

    @cached_property
    def masks_nothing(self) -> bool:
        """True when no token is masked: `unconstrained`, or processed target logits on a CPU that hold no
        -inf entry (one NumPy minimum instead of building and applying the [B, k+1, V] mask; a NaN entry
        makes the minimum NaN, which reads as masking). Where it holds, the raw logits masked by the
        constraints are the raw logits themselves, bit for bit. Off the CPU the mask is built as before (a
        device-wide minimum would synchronise with the host)."""
        if self.unconstrained:
            return True
        logits = self.target_logits
        if logits is None or not logits.is_cpu or logits.dtype not in (torch.float32, torch.float64):
            return False
        values = (logits.detach() if logits.requires_grad else logits).numpy()
        return bool(values.size) and bool(values.min() > float("-inf"))

    @cached_property
    def target_allowed(self) -> torch.Tensor:
        """bool [B, k+1, V]: tokens the target may emit (processed logit not -inf)."""
        return self.target_logits != float("-inf")

    @cached_property
    def constrained_raw_logits(self) -> torch.Tensor:
        """[B, k+1, V] raw target logits, -inf where the processed target logits forbid a token."""
        if self.target_raw_logits is None:
            raise ValueError(
                "VerificationRound.target_raw_logits is None, but a relaxed rule of this round reads the target's "
                "raw logits: give target_raw_logits [B, k+1, V] (the model's logits before the processors; the "
                "processed logits themselves when nothing processed them)"
            )
        if self.masks_nothing:
            return self.target_raw_logits
        return self.target_raw_logits.masked_fill(~self.target_allowed, float("-inf"))

    @cached_property
    def target_raw_probs(self) -> torch.Tensor:
        """q~: [B, k+1, V] softmax of the raw target logits (T = 1, no processors) over the tokens the
        constraints allow."""
        return self.constrained_raw_logits.softmax(dim=-1)

    @cached_property
    def draft_raw_probs(self) -> torch.Tensor:
        """p~: [B, k, V] softmax of the raw draft logits."""
        if self.draft_raw_logits is None:
            raise ValueError(
                "this verifier reads the draft model's raw logits, but the proposer gave none (prompt lookup, "
                "n-gram or another deterministic proposer); check the verifier's needs before verifying"
            )
        return self.draft_raw_logits.softmax(dim=-1)

    @cached_property
    def target_argmax(self) -> torch.Tensor:
        """x*: [B, k+1] argmax of the processed target logits (the target's greedy choice). Computed here, a
        position without one (a NaN logit, every token -inf) raises `UnusableTargetError`: the logits at
        x* are summed, which is finite unless some position's is NaN or infinite. A given x* is the
        engine's, taken as is."""
        if self.given_target_argmax is not None:
            return self.given_target_argmax
        x_star = vocab_argmax(self.target_logits)
        if not math.isfinite(float(self.target_logits.gather(-1, x_star[..., None]).sum())):
            raise_unusable(self.target_logits, greedy=True)
        return x_star

    def row_draft_lengths(self) -> torch.Tensor:
        """[B] long: drafts each row may keep."""
        if self.draft_lengths is None:
            return torch.full(self.draft_tokens.shape[:1], self.num_draft_tokens, device=self.draft_tokens.device)
        return self.draft_lengths

    def row_lookahead_ends(self) -> torch.Tensor:
        """[B, k] long: for each drafted position, the end (exclusive) of the drafts a lookahead rule may read
        to decide it (`lookahead_ends`, else the row's draft length at every position)."""
        if self.lookahead_ends is not None:
            return self.lookahead_ends
        return self.row_draft_lengths()[:, None].expand(-1, self.num_draft_tokens)

    def verified_target_probs(self) -> torch.Tensor:
        """q at the k drafted positions: [B, k, V]."""
        return self.target_probs[:, : self.num_draft_tokens]

    def precise_probs(self, index: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(q, p) in float64 from the logits at the drafted positions `index` (rows, positions): [N, V] each."""
        q = _distribution(self.target_logits[:, : self.num_draft_tokens][index].double(), self.greedy)
        if self.draft_logits is None:
            p = self.draft_probs[index].double()
        else:
            p = _distribution(self.draft_logits[index].double(), self.greedy)
        return q, p

    def allowed_at(self, candidates: torch.Tensor) -> torch.Tensor:
        """bool [B, k, C]: whether the target may emit each candidate at its drafted position."""
        if self.masks_nothing:
            return torch.ones(candidates.shape, dtype=torch.bool, device=candidates.device)
        return self.target_allowed[:, : self.num_draft_tokens].gather(-1, candidates)

    def memo(self, key: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Per-round cache for a verifier's own random draws, so acceptance and recovery share them."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def uniforms(self) -> torch.Tensor:
        """[B, k] U(0, 1) draws for the acceptance tests (row b's own generator for its own drafts)."""
        batch, k = self.draft_tokens.shape
        device = self.draft_tokens.device
        if self.generators is None:
            return torch.rand(batch, k, device=device)
        out = torch.ones(batch, k, device=device)
        for row, (generator, length) in enumerate(zip(self.generators, self.row_draft_lengths().tolist())):
            if length:
                out[row, :length] = torch.rand(length, generator=generator, device=device)
        return out

    def sample_positions(self, probs: torch.Tensor, draws: int) -> torch.Tensor:
        """probs [B, k, V] -> [B, k, draws] long, independent draws with replacement at every position.
        With generators, row b draws only at its own drafted positions (the rest repeat its argmax)."""
        batch, k, vocab = probs.shape
        if self.generators is None:
            return torch.multinomial(probs.reshape(-1, vocab), draws, replacement=True).view(batch, k, draws)
        out = probs.argmax(dim=-1, keepdim=True).expand(batch, k, draws).clone()
        for row, (generator, length) in enumerate(zip(self.generators, self.row_draft_lengths().tolist())):
            if length:
                out[row, :length] = torch.multinomial(probs[row, :length], draws, replacement=True, generator=generator)
        return out

    def sample_rows(self, probs: torch.Tensor) -> torch.Tensor:
        """probs [B, V] -> [B] long, one draw per row (with its own generator when set; `draws.draw_rows`)."""
        return draw_rows(probs, self.generators)


class UnusableTargetError(ValueError):
    """A row's processed target logits give no distribution at some position (NaN, every token -inf or, at
    T > 0, +inf), so no token can be verified or drawn there.

    Args:
        row: the row, counted in the rows the verifier was given (`in_round` renumbers it).
        position: the position in the row, 0..k (k: the bonus position of a row with k drafts).
        problem: what the logits hold there.
    """

    def __init__(self, row: int, position: int, problem: str) -> None:
        self.row, self.position, self.problem = row, position, problem
        super().__init__(
            f"row {row}, position {position}: the processed target logits {problem}, so there is no target "
            "distribution to verify against or draw from; check the target model's output and the logits "
            "processors before verifying (generate checks them and raises NonFiniteLogitsError)"
        )

    def in_round(self, rows: Sequence[int]) -> "UnusableTargetError":
        """The same error with its row numbered in the round, whose rows `rows` [G] the verifier was given."""
        return UnusableTargetError(rows[self.row], self.position, self.problem)


def raise_unusable(logits: torch.Tensor, greedy: bool) -> None:
    """Raise `UnusableTargetError` for the first position of logits [B, n, V] that gives no distribution: a NaN
    logit, every logit -inf or, when sampling (greedy False), a +inf logit (the softmax of which is
    undefined). Returns when there is none (a check that only suspected one: an overflowing sum)."""
    nan = logits.isnan().any(dim=-1)
    masked = (logits == -math.inf).all(dim=-1)
    bad = nan | masked
    if not greedy:
        bad = bad | (logits == math.inf).any(dim=-1)
    found = bad.nonzero()
    if not len(found):
        return
    row, position = found[0].tolist()
    if nan[row, position]:
        problem = "hold NaN"
    elif masked[row, position]:
        problem = "are -inf for every token (every token is masked)"
    else:
        token = int((logits[row, position] == math.inf).nonzero()[0, 0])
        problem = f"hold +inf (token {token}), whose softmax is undefined at T > 0"
    raise UnusableTargetError(row, position, problem)


def _distribution(logits: torch.Tensor, greedy: bool) -> torch.Tensor:
    if greedy:
        return torch.nn.functional.one_hot(vocab_argmax(logits), logits.shape[-1]).to(torch.float32)
    return logits.softmax(dim=-1)


def gather(values: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """values [B, k, V], candidates [B, k, C] -> [B, k, C]."""
    return values.gather(-1, candidates)


def divided(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator / denominator where the denominator is positive (subnormal values included, exactly),
    numerator / 1 elsewhere (for the caller to replace): same broadcast shape."""
    return numerator / torch.where(denominator > 0, denominator, torch.ones_like(denominator))


def lossless_acceptance(round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
    """alpha(c) = min(1, q(c) / p(c)) -> [B, k, C]; where p(c) = 0, 1 if q(c) > 0 else 0 (never NaN).

    Greedy (q, p one-hot): alpha(c) = 1[c = x*] whatever the draft, computed without one-hot tensors."""
    if round_inputs.greedy:
        return is_target_choice(round_inputs, candidates).to(torch.float32)
    q = gather(round_inputs.verified_target_probs(), candidates)
    p = gather(round_inputs.draft_probs, candidates)
    return torch.where(p > 0, divided(q, p).clamp(max=1.0), (q > 0).to(q.dtype))


# Below this positive mass a float32 difference of probabilities loses too many digits (each entry is
# off by ~6e-8 of max(q, p), ~1e-7 over the vocabulary): such positions are recomputed in float64.
PRECISE_BELOW = 1e-2


def normalized_positive_part(
    round_inputs: RoundInputs,
    difference: Callable[..., torch.Tensor],
    *extras: torch.Tensor,
    at: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """normalize(difference(q, p, *extras)+) at the drafted positions -> [B, k, V] float32, q where it has
    no positive mass. `difference` is evaluated in float32 and, at positions whose positive mass is below
    PRECISE_BELOW, again in float64 from the logits, so nearly equal q and p (or a cascade with p(A) ~ 1)
    cannot lose the distribution to cancellation. extras: [B, k, V] tensors indexed like q and p.

    at: (rows [N], positions [N]) long: only those drafted positions -> [N, V], the same values as the
    full result's entries there (for the one position per row a round draws its recovery token at)."""
    q, p = round_inputs.verified_target_probs(), round_inputs.draft_probs
    if at is not None:
        q, p, extras = q[at], p[at], tuple(extra[at] for extra in extras)
    positive = difference(q, p, *extras).clamp_min(0.0)
    mass = positive.sum(dim=-1, keepdim=True)
    out = torch.where(mass > 0, divided(positive, mass), q)
    small = mass[..., 0] < PRECISE_BELOW
    if bool(small.any()):
        index = small.nonzero(as_tuple=True)
        q64, p64 = round_inputs.precise_probs(index if at is None else (at[0][index[0]], at[1][index[0]]))
        positive64 = difference(q64, p64, *(extra[index].double() for extra in extras)).clamp_min(0.0)
        mass64 = positive64.sum(dim=-1, keepdim=True)
        out[index] = torch.where(mass64 > 0, divided(positive64, mass64), q64).to(out.dtype)
    return out


def lossless_recovery(round_inputs: RoundInputs, at: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """normalize((q - p)+), falling back to q where q == p: [B, k, V] (at (rows [N], positions [N]): only
    those drafted positions, [N, V])."""
    if round_inputs.greedy:
        q = round_inputs.verified_target_probs()
        return q if at is None else q[at]
    return normalized_positive_part(round_inputs, lambda q, p: q - p, at=at)


def is_target_choice(round_inputs: RoundInputs, candidates: torch.Tensor) -> torch.Tensor:
    """c == x* (the processed target argmax) -> bool [B, k, C]."""
    return candidates == round_inputs.target_argmax[:, : round_inputs.num_draft_tokens, None]


@dataclass(frozen=True)
class Needs:
    """What a configured verifier needs from the proposer and the round (admission reads this).

    Args:
        raw_draft_logits: why the rule reads the draft model's raw distribution p~ (None: it does not, so
            any proposer works, one-hot drafts included).
        min_draft_tokens: the smallest k the rule is defined for.
        lookahead: the rule at position i reads later drafts of the block (FLy), so its per-position
            output depends on the drafts after i.
    """

    raw_draft_logits: str | None = None
    min_draft_tokens: int = 1
    lookahead: bool = False


@dataclass(frozen=True)
class Verifier(ABC):
    """A verification rule with one knob (`knob`) that moves it from lossless to lossy.

    Subclasses define `name`, `knob`, `lossless_value`, `sweep_values` and the two rules.
    At temperature 0 every verifier recovers the target's argmax x* (README, *Verifiers*), so only
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

    def needs(self) -> Needs:
        """What this configuration needs (see `Needs`); the default rule reads only the target and p."""
        return Needs()

    def check_proposer(
        self, proposer: str, has_raw_draft_logits: bool, draft_model: str = "a draft model (assistant_model=...)"
    ) -> None:
        """Raise ValueError when `proposer` (a name for the message, e.g. "prompt lookup") cannot feed this
        configuration: the rule reads the draft's raw logits and the proposer has none. draft_model: how
        the caller's engine is given a draft model, for the fix the message names."""
        reason = self.needs().raw_draft_logits
        if reason is not None and not has_raw_draft_logits:
            from . import VERIFIERS  # the registry imports this module

            usable = [name for name, cls in VERIFIERS.items() if cls().needs().raw_draft_logits is None]
            itself = f" ({self.name} too, without that setting: its defaults need none)" if self.name in usable else ""
            raise ValueError(
                f"{reason}; {proposer} has no draft distribution. Use {draft_model}, or a verifier that reads "
                f"only the target: {'/'.join(usable)}{itself}"
            )

    @property
    def is_lossless(self) -> bool:
        return getattr(self, self.knob) == self.lossless_value

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (strict JSON: an infinite knob is the string "inf"), used by `GenerationConfig`
        serialisation, hashing and repr."""
        return {"verifier": self.name, **{name: _to_json(value) for name, value in asdict(self).items()}}

    @classmethod
    def sweep(cls, **fixed: Any) -> list["Verifier"]:
        """One configured verifier per value of the knob's sweep (`sweep_values`), lossless end first."""
        return [cls(**{**fixed, cls.knob: value}) for value in cls.sweep_values]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Verifier":
        names = {f.name for f in fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"{cls.__name__} has no option(s) {sorted(unknown)}; valid options: {sorted(names)}")
        return cls(**{name: math.inf if _is_infinity(value) else value for name, value in values.items()})


def _is_infinity(value: Any) -> bool:
    """The string `to_dict` writes for an infinite knob."""
    return isinstance(value, str) and value == INFINITY


def _to_json(value: Any) -> Any:
    """A knob value as strict JSON holds it: +inf as `INFINITY` (knobs are never NaN or -inf)."""
    return INFINITY if isinstance(value, float) and math.isinf(value) else value


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless `condition` holds (hyperparameter validation)."""
    if not condition:
        raise ValueError(message)


def set_real(config: "Verifier", name: str, valid: Callable[[float], bool], rule: str) -> None:
    """Check the real knob `name` of the frozen `config` and store it as a Python int or float: an int
    beyond torch's int64 range as the nearest float (the rules compare knobs with tensors, and torch
    refuses such an int: "int too big to convert").

    Accepted: a Python, NumPy or 0-d tensor integer or float for which `valid` holds (never NaN, a bool, or
    an integer too large for a float). Otherwise ValueError(f"{rule}, got <the value>")."""
    given = getattr(config, name)
    value = as_real(given)
    beyond = " (an integer beyond the float range)" if value is None and is_integer(given) else ""
    if is_no_number(given):  # not a number at all: say so rather than blame the range
        raise ValueError(f"{rule}, got {not_a_number(given)}")
    require(value is not None and valid(value), f"{rule}, got {short_repr(given)}{beyond}")
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        value = float(value)
    object.__setattr__(config, name, value)


def set_integer(config: "Verifier", name: str, smallest: int, rule: str) -> None:
    """Check the integer knob `name` of the frozen `config` (a Python, NumPy or 0-d tensor integer from
    `smallest` to `LARGEST_INTEGER_KNOB`, never a bool) and store it as a Python int; ValueError(f"{rule},
    got <the value>") otherwise."""
    given = getattr(config, name)
    if is_no_number(given):
        raise ValueError(f"{rule} (at most 2**63 - 1), got {not_a_number(given, 'an int')}")
    value = int(python_scalar(given)) if is_integer(given) else None
    require(
        value is not None and smallest <= value <= LARGEST_INTEGER_KNOB,
        f"{rule} (at most 2**63 - 1), got {short_repr(given)}",
    )
    object.__setattr__(config, name, value)


def set_choice(config: "Verifier", name: str, choices: tuple[str, ...]) -> None:
    """Check the option string `name` of the frozen `config` against `choices` (lower case), ignoring case as
    verifier names do, and store it in lower case; ValueError naming the choices otherwise."""
    given = getattr(config, name)
    value = given.lower() if isinstance(given, str) else None
    require(
        value in choices,
        f"{type(config).__name__} {name} must be one of {', '.join(map(repr, choices))}, got {short_repr(given)}",
    )
    object.__setattr__(config, name, value)
