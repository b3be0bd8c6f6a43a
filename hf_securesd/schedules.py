"""SecureSD position schedules: how much of the relaxed verifier to use at each response position.

A schedule maps the 0-based position `j` of a token in the response to a weight `eta_j` in [0, 1];
`eta = 0` is lossless verification and `eta = 1` is the unchanged relaxed verifier (README, *SecureSD schedules*).

Example:

```python
>>> from hf_securesd import Step, Linear, Power
>>> Step(L=2).eta(torch.arange(4))
tensor([0., 0., 1., 1.])
>>> Linear(L=4).eta(torch.arange(6))
tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000, 1.0000])
```
"""

from __future__ import annotations

import math
import numbers
import sys
from abc import ABC, abstractmethod
from dataclasses import MISSING, asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, ClassVar, Sequence

import torch

# Response positions are int64; a length at or above this bound is never reached, so the schedule's
# lossless part covers every position a response can have.
_NEVER_REACHED = 2**62


@dataclass(frozen=True)
class Schedule(ABC):
    """Base class. Subclasses implement `eta(positions)`; a schedule that also reads the tokens of the
    response (segments) sets `reads_tokens` and overrides `round_eta`."""

    name = "schedule"
    reads_tokens: ClassVar[bool] = False

    @abstractmethod
    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: int tensor of any shape (0-based response positions) -> float32 tensor, same shape."""

    def round_eta(
        self, starts: torch.Tensor, drafts: torch.Tensor, responses: Sequence[Sequence[int]] | None = None
    ) -> torch.Tensor:
        """eta of one round's drafted positions.

        Args:
            starts: [B] long, the 0-based response position of each row's first drafted token.
            drafts: [B, k] the drafted tokens (draft i sits at response position starts + i).
            responses: per row, the response tokens committed before this round (read only by schedules
                with `reads_tokens`; position-only schedules ignore it and may receive None).
        Returns: [B, k] float32 in [0, 1].
        """
        positions = starts[:, None] + torch.arange(drafts.shape[1], device=starts.device)
        return self.eta(positions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, used by `GenerationConfig` serialisation, hashing and repr."""
        return {"schedule": self.name, **asdict(self)}

    def _check_length(self) -> None:
        """Validate `L` and store it as a plain int (NumPy and 0-d tensor integers are accepted)."""
        L = self.L
        if is_no_number(L):
            raise ValueError(f"schedule length L must be an integer >= 0, got {not_a_number(L, 'an int')}")
        if not is_integer(L) or int(L) < 0:
            raise ValueError(
                f"schedule length L must be an integer >= 0, got {short_repr(L)}; "
                "L is the number of leading response tokens verified losslessly (L=1 is the paper's default)"
            )
        object.__setattr__(self, "L", int(L))


@dataclass(frozen=True)
class Step(Schedule):
    """eta_j = 0 for j < L, else 1: the first `L` response tokens are verified losslessly."""

    L: int = 1
    name = "step"

    def __post_init__(self) -> None:
        self._check_length()

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        if self.L >= _NEVER_REACHED:
            return torch.zeros(positions.shape, dtype=torch.float32, device=positions.device)
        return (positions >= self.L).to(torch.float32)


@dataclass(frozen=True)
class Power(Schedule):
    """eta_j = min(1, j / L) ** gamma: gamma = 1 is Linear, gamma > 1 moves the transition later."""

    L: int = 1
    gamma: float = 1.0
    name = "power"

    def __post_init__(self) -> None:
        self._check_length()
        gamma = as_real(self.gamma)
        if is_no_number(self.gamma):
            raise ValueError(f"Power schedule needs a finite gamma > 0, got {not_a_number(self.gamma)}")
        if gamma is None or not (gamma > 0 and math.isfinite(gamma)):
            raise ValueError(f"Power schedule needs a finite gamma > 0, got {short_repr(self.gamma)} (gamma=1 is Linear)")
        object.__setattr__(self, "gamma", gamma)

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        if self.L == 0:
            return torch.ones(positions.shape, dtype=torch.float32, device=positions.device)
        # j / L in float64 (exact for every int64 position); a huge L gives 0 (j / L underflows), never an overflow.
        length = float(self.L) if self.L < 2**1000 else math.inf
        ramp = (positions.to(torch.float64) / length).clamp(0.0, 1.0)
        return ramp.pow(float(self.gamma)).to(torch.float32)


@dataclass(frozen=True)
class Linear(Power):
    """eta_j = min(1, j / L): rises at a constant rate; Linear(1) equals Step(1)."""

    L: int = 1
    gamma: float = 1.0
    name = "linear"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gamma != 1.0:
            raise ValueError("Linear has gamma = 1 by definition; use Power(L, gamma) for another exponent")

    def to_dict(self) -> dict[str, Any]:
        return {"schedule": self.name, "L": self.L}


SCHEDULES: dict[str, type[Schedule]] = {"step": Step, "linear": Linear, "power": Power}
_BUILT_IN = (Step, Linear, Power)


def register_schedule(cls: type[Schedule]) -> type[Schedule]:
    """Class decorator: make `resolve_schedule` turn `{"schedule": cls.name, ...}` into `cls` (used by
    `segments.Segments`, which builds on this module). Returns the class unchanged."""
    SCHEDULES[cls.name] = cls
    return cls


def python_scalar(value: Any) -> Any:
    """A NumPy scalar, 0-d NumPy array or 0-d tensor as the Python number (or bool) it holds; anything
    else (an array or tensor with dimensions included) unchanged."""
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return value.item()
    return value


def is_integer(value: Any) -> bool:
    """A Python, NumPy or 0-d tensor integer (never a bool, never an array with dimensions)."""
    value = python_scalar(value)
    return hasattr(value, "__index__") and not isinstance(value, bool) and getattr(value, "ndim", None) is None


def as_real(value: Any) -> int | float | None:
    """`value` as a Python int or float when it is a real number a float can hold: a Python, NumPy or 0-d
    tensor integer or float (NaN and infinities included; never a bool or complex). None otherwise, an
    integer too large for a float (10**400) included, so a caller refuses it with its own message."""
    value = python_scalar(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if isinstance(value, numbers.Integral):
        value = int(value)
        return value if abs(value) <= _LARGEST_FLOAT else None
    return float(value)


_LARGEST_FLOAT = int(sys.float_info.max)


def schedule_weights(
    schedule: Schedule | None,
    starts: torch.Tensor,
    drafts: torch.Tensor,
    responses: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """eta [B, k] of one round (see `Schedule.round_eta`); no schedule is the pure relaxed verifier
    (eta = 1). The weights of a schedule that is not one of this package's are checked: a value
    outside [0, 1] (or NaN) raises instead of mixing with a meaningless weight."""
    if schedule is None:
        return torch.ones(drafts.shape, dtype=torch.float32, device=starts.device)
    eta = schedule.round_eta(starts, drafts, responses)
    if type(schedule) not in _BUILT_IN:
        eta = check_weights(schedule, eta, tuple(drafts.shape))
    return eta


def check_weights(schedule: Schedule, eta: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """`eta` as the weights to mix with: a real tensor of `shape` with every value in [0, 1]; a bool or
    integer one (a comparison such as `positions >= L`) as float32. ValueError otherwise, naming the
    schedule."""
    name = type(schedule).__name__
    if not isinstance(eta, torch.Tensor) or tuple(eta.shape) != shape:
        got = tuple(eta.shape) if isinstance(eta, torch.Tensor) else type(eta).__name__
        raise ValueError(f"schedule {name} returned eta of shape {got}; it must return a tensor of shape {shape}")
    if eta.dtype == torch.bool or not (eta.dtype.is_floating_point or eta.dtype.is_complex):
        eta = eta.to(torch.float32)  # bool or integer: 0 and 1 exact, others fail the range check
    elif eta.dtype.is_complex:
        raise ValueError(
            f"schedule {name} returned eta of dtype {eta.dtype}; eta is a real weight in [0, 1]: return a "
            "float tensor"
        )
    if eta.numel() and not bool(((eta >= 0) & (eta <= 1)).all()):
        bad = eta[~((eta >= 0) & (eta <= 1))].flatten()[0].item()
        raise ValueError(
            f"schedule {name} returned eta = {bad!r}; eta is the weight of the relaxed verifier and must lie in "
            "[0, 1] (0 = lossless, 1 = relaxed): clip it in the schedule's eta()"
        )
    return eta


def resolve_schedule(schedule: Schedule | dict | None) -> Schedule | None:
    """Accept a schedule object, its `to_dict()` form (as stored in a saved GenerationConfig) or None.

    Raises TypeError for something that is not a schedule and ValueError for a dict naming an unknown
    schedule or options it does not have, each message naming the valid choices."""
    if schedule is None or isinstance(schedule, Schedule):
        return schedule
    if not isinstance(schedule, dict):
        raise TypeError(
            "secure_schedule must be Step(L), Linear(L), Power(L, gamma), Segments(boundary, before, after), "
            f"a dict such as {{'schedule': 'step', 'L': 1}}, or None; "
            f"got {type(schedule).__name__} {short_repr(schedule)}"
        )
    name = schedule.get("schedule")
    if not isinstance(name, str) or name.lower() not in SCHEDULES:
        raise ValueError(
            f"unknown schedule {short_repr(name)} in secure_schedule; the 'schedule' key must be one of "
            f"{', '.join(repr(known) for known in SCHEDULES)}"
        )
    cls = SCHEDULES[name.lower()]
    options = {key: value for key, value in schedule.items() if key != "schedule"}
    valid = sorted(field.name for field in dataclass_fields(cls) if field.init)
    unknown = sorted(str(key) for key in options if key not in valid)
    if unknown:
        raise ValueError(f"schedule {name!r} has no option(s) {unknown}; valid options: {valid}")
    required = [
        item.name
        for item in dataclass_fields(cls)
        if item.init and item.name not in options
        and item.default is MISSING and item.default_factory is MISSING
    ]
    if required:
        raise ValueError(f"schedule {name!r} needs the option(s) {required}; valid options: {valid}")
    return cls(**options)


def not_a_number(given: Any, expected: str = "an int or a float") -> str:
    """How an error names a knob value that is no real number: "'0.5', which is str, not a number: pass an
    int or a float (the number 0.5 itself, not the text '0.5')" (the hint only for a finite number;
    `expected`: "an int" for integer knobs, whose hint is then an int)."""
    kind = "a bool" if isinstance(given, bool) else type(given).__name__
    said = f"{short_repr(given)}, which is {kind}, not a number: pass {expected}"
    if isinstance(given, str):
        try:
            number = float(given)
        except ValueError:
            return said
        if math.isfinite(number):
            shown = repr(int(number)) if expected == "an int" and number.is_integer() else repr(number)
            said += f" (the number {shown} itself, not the text {short_repr(given)})"
    return said


def is_no_number(value: Any) -> bool:
    """Whether `value` is no real number at all (text, None, a bool, a list, ...), as opposed to a number
    outside a knob's range or of the wrong kind (2.5 for an integer)."""
    return as_real(value) is None and not is_integer(value)


def short_repr(value: Any, limit: int = 80) -> str:
    """repr(value) cut to `limit` characters (an integer too long to print: its size in bits)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else text[: limit - 3] + "..."
