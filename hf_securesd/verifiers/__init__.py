"""Verifiers: one configuration dataclass per rule, and a registry from name to class."""

from __future__ import annotations

from typing import Any

from ..schedules import short_repr
from .base import RoundInputs, Verifier
from .bild import BiLD
from .fly import FLy
from .fsd import FSD
from .lossless import Lossless
from .lossysd import LossySD
from .mars import MARS
from .speccascade import SpecCascade
from .vllm_fly import VLLMFLy

VERIFIERS: dict[str, type[Verifier]] = {
    cls.name: cls for cls in (Lossless, LossySD, BiLD, SpecCascade, FSD, FLy, MARS, VLLMFLy)
}
RELAXED_VERIFIERS: tuple[str, ...] = tuple(name for name in VERIFIERS if name != "lossless")


def resolve_verifier(verifier: str | Verifier | dict[str, Any]) -> Verifier:
    """A name (default hyperparameters), a configured object, or its `to_dict()` form -> Verifier."""
    if isinstance(verifier, Verifier):
        return verifier
    if isinstance(verifier, dict):
        options = dict(verifier)
        if "verifier" not in options:
            raise ValueError(
                f"a verifier given as a dict names its rule under the key 'verifier', e.g. "
                f"{{'verifier': 'mars', 'theta': 0.9}}; got the keys {sorted(map(str, options))}"
            )
        name = options.pop("verifier")
        return _lookup(name).from_dict(options)
    if isinstance(verifier, str):
        return _lookup(verifier)()
    raise TypeError(
        f"verifier must be a name ({', '.join(VERIFIERS)}) or a configured object such as MARS(theta=0.9), "
        f"got {type(verifier).__name__}"
    )


def _lookup(name: Any) -> type[Verifier]:
    """The class of the verifier `name` (any case, surrounding whitespace ignored); ValueError naming the
    valid names otherwise."""
    if not isinstance(name, str):
        raise ValueError(
            f"a verifier's name must be a string, one of {', '.join(VERIFIERS)}; got {type(name).__name__} "
            f"{short_repr(name)}"
        )
    key = name.strip().lower()
    if key not in VERIFIERS:
        raise ValueError(f"unknown verifier {short_repr(name)}; valid names: {', '.join(VERIFIERS)}")
    return VERIFIERS[key]


__all__ = [
    "VERIFIERS",
    "RELAXED_VERIFIERS",
    "RoundInputs",
    "Verifier",
    "resolve_verifier",
    "Lossless",
    "LossySD",
    "BiLD",
    "SpecCascade",
    "FSD",
    "FLy",
    "MARS",
    "VLLMFLy",
]
