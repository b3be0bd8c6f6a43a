"""SecureSD position schedules: how much of the relaxed verifier to use at each response position.

A schedule maps the 0-based position `j` of a token in the response to a weight `eta_j` in [0, 1];
`eta = 0` is lossless verification and `eta = 1` is the unchanged relaxed verifier (SPEC.md §2).

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
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Schedule(ABC):
    """Base class. Subclasses implement `eta(positions)`."""

    name = "schedule"

    @abstractmethod
    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: int tensor of any shape (0-based response positions) -> float32 tensor, same shape."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, used by `GenerationConfig` serialisation, hashing and repr."""
        return {"schedule": self.name, **asdict(self)}

    @staticmethod
    def _check_length(L: int) -> None:
        if isinstance(L, bool) or not isinstance(L, int) or L < 0:
            raise ValueError(
                f"schedule length L must be an integer >= 0, got {L!r}; "
                "L is the number of leading response tokens verified losslessly (L=1 is the paper's default)"
            )


@dataclass(frozen=True)
class Step(Schedule):
    """eta_j = 0 for j < L, else 1: the first `L` response tokens are verified losslessly."""

    L: int = 1
    name = "step"

    def __post_init__(self) -> None:
        self._check_length(self.L)

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        return (positions >= self.L).to(torch.float32)


@dataclass(frozen=True)
class Power(Schedule):
    """eta_j = min(1, j / L) ** gamma: gamma = 1 is Linear, gamma > 1 moves the transition later."""

    L: int = 1
    gamma: float = 1.0
    name = "power"

    def __post_init__(self) -> None:
        self._check_length(self.L)
        if not isinstance(self.gamma, (int, float)) or isinstance(self.gamma, bool) or not (
            self.gamma > 0 and math.isfinite(self.gamma)
        ):
            raise ValueError(f"Power schedule needs a finite gamma > 0, got {self.gamma!r} (gamma=1 is Linear)")

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        if self.L == 0:
            return torch.ones(positions.shape, dtype=torch.float32, device=positions.device)
        ramp = (positions.to(torch.float32) / self.L).clamp(0.0, 1.0)
        return ramp.pow(self.gamma)


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


def resolve_schedule(schedule: Schedule | dict | None) -> Schedule | None:
    """Accept a schedule object, its `to_dict()` form (as stored in a saved GenerationConfig) or None."""
    if schedule is None or isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, dict) and schedule.get("schedule") in SCHEDULES:
        fields = {key: value for key, value in schedule.items() if key != "schedule"}
        return SCHEDULES[schedule["schedule"]](**fields)
    raise TypeError(
        f"secure_schedule must be Step(L), Linear(L), Power(L, gamma) or None, got {schedule!r}"
    )
