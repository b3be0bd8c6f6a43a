"""What a study runs: decoding configurations (target-only, draft-only, speculative with a verifier
and an optional SecureSD schedule, or a named endpoint of a deployment under audit), parsed from
command-line specs, and their stable keys.

Example:

    >>> from hf_securesd.bench.plan import parse_schedule, sweep_configs
    >>> parse_schedule("step:1")
    Step(L=1)
    >>> [c.key for c in sweep_configs(["mars:0.5"], [None, parse_schedule("step:1")])]
    ['lossless', 'mars(theta=0.5)', 'mars(theta=0.5)+step(L=1)']
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Sequence

import torch

from hf_securesd.bench import json_input
from hf_securesd.schedules import Linear, Power, Schedule, Step, resolve_schedule
from hf_securesd.segments import Segments
from hf_securesd.verifiers import VERIFIERS, Lossless, Verifier, resolve_verifier

Kind = Literal["target", "draft", "speculative", "endpoint"]
SCHEDULES: dict[str, type[Schedule]] = {"step": Step, "linear": Linear, "power": Power, "segments": Segments}


@dataclass(frozen=True)
class RunConfig:
    """One way of decoding. `verifier` and `schedule` are set only for speculative runs
    (`schedule` None: the relaxed verifier unchanged); `endpoint` only for an ``endpoint`` run: a
    deployment whose decoding is whatever its server does, known by the name given to it."""

    kind: Kind
    verifier: Verifier | None = None
    schedule: Schedule | None = None
    endpoint: str | None = None

    def __post_init__(self) -> None:
        if (self.kind == "endpoint") != (self.endpoint is not None):
            raise ValueError(f"an endpoint run needs an endpoint name and only it takes one "
                             f"(kind {self.kind!r}, endpoint {self.endpoint!r})")

    @property
    def key(self) -> str:
        """Stable, human-readable identifier, e.g. ``mars(theta=0.9)+step(L=1)``, ``endpoint:prod``."""
        if self.kind == "endpoint":
            return f"endpoint:{self.endpoint}"
        if self.kind != "speculative":
            return self.kind
        return verifier_label(self.verifier) + (
            "" if self.schedule is None else "+" + schedule_label(self.schedule)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form written to the results files."""
        values = {
            "kind": self.kind,
            "verifier": None if self.verifier is None else self.verifier.to_dict(),
            "schedule": None if self.schedule is None else self.schedule.to_dict(),
        }
        return values if self.endpoint is None else {**values, "endpoint": self.endpoint}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        verifier = values.get("verifier")
        schedule = values.get("schedule")
        return cls(
            kind=values["kind"],
            verifier=None if verifier is None else resolve_verifier(verifier),
            schedule=None if schedule is None else schedule_from_dict(schedule),
            endpoint=values.get("endpoint"),
        )


TARGET = RunConfig("target")
DRAFT = RunConfig("draft")
LOSSLESS = RunConfig("speculative", Lossless())


def _format(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, "g") if isinstance(value, float) else str(value)


def knob_value(verifier: Verifier) -> Any:
    """The value of the verifier's sweep knob (None for lossless)."""
    return None if verifier.name == "lossless" else getattr(verifier, verifier.knob)


def verifier_label(verifier: Verifier) -> str:
    """``name(knob=value)``, or ``lossless``."""
    if verifier.name == "lossless":
        return "lossless"
    return f"{verifier.name}({verifier.knob}={_format(knob_value(verifier))})"


def schedule_label(schedule: Schedule) -> str:
    """``step(L=1)``, ``linear(L=4)``, ``power(L=4,gamma=2)``,
    ``segments(boundary='</think>',before=none,after=step(L=4))``."""
    if isinstance(schedule, Segments):
        return _segments_label(schedule)
    options = {key: value for key, value in schedule.to_dict().items() if key != "schedule"}
    return f"{schedule.name}(" + ",".join(f"{key}={_format(value)}" for key, value in options.items()) + ")"


def _segments_label(schedule: Segments) -> str:
    boundaries = [item if isinstance(item, str) else list(item) for item in schedule.boundary]
    boundary = boundaries[0] if len(boundaries) == 1 else boundaries

    def part(value: Schedule | str | None) -> str:
        return "none" if value is None else value if isinstance(value, str) else schedule_label(value)

    return f"segments(boundary={boundary!r},before={part(schedule.before)},after={part(schedule.after)})"


def schedule_from_dict(values: dict[str, Any]) -> Schedule:
    """Inverse of `Schedule.to_dict()`."""
    options = dict(values)
    name = options.pop("schedule")
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    return SCHEDULES[name](**options)


def check_no_repeats(option: str, values: Sequence[Any], settings: Callable[[Any], Sequence[object]]) -> None:
    """Refuse `option` values that name the same setting twice, within one value (``mars:0.5,0.5``)
    or across values (``mars mars:0.5``, where the ``mars`` sweep holds 0.5); `settings`: a value ->
    the settings it names."""
    seen: dict[object, int] = {}
    for index, value in enumerate(values):
        for setting in settings(value):
            if setting in seen:
                where = f"in {value!r}" if seen[setting] == index else f"{values[seen[setting]]!r} and {value!r}"
                raise ValueError(f"{option} names the same setting twice: {setting} ({where}); give each once")
            seen[setting] = index


@dataclass(frozen=True)
class ScheduleSetting:
    """A --schedules value as the setting it names: equal for spellings that weigh every position alike
    (``step:1``, ``linear:1`` and ``power:1:2``; ``power:4:1.0`` and ``linear:4``); shown as its label."""

    weights: tuple
    label: str = field(compare=False)

    def __str__(self) -> str:
        return self.label


WEIGHED_UP_TO = 4096  # the largest L whose weights are compared; beyond it schedules compare by label


def schedule_key(spec: str) -> tuple[ScheduleSetting]:
    """The setting a --schedules value names (`ScheduleSetting`; ``none`` without a schedule)."""
    schedule = parse_schedule(spec)
    label = "none" if schedule is None else schedule_label(schedule)
    return (ScheduleSetting(_weights(schedule), label),)


def _weights(schedule: Schedule | str | None) -> tuple:
    """What makes two schedules one setting: a position schedule's weights eta_0 .. eta_L without the
    trailing 1s (every built-in one weighs 1 from L on; ``none`` is the empty tuple); a segment schedule's
    boundaries and the weights of its parts (both parts constant and alike: that constant)."""
    if schedule is None:
        return ()
    if schedule == "lossless":
        return ("lossless",)
    if isinstance(schedule, Segments):
        before, after = _weights(schedule.before), _weights(schedule.after)
        if before == after and before in ((), ("lossless",)):
            return before
        return ("segments", repr(schedule.to_dict()["boundary"]), before, after)
    if not isinstance(schedule, (Step, Power)) or schedule.L > WEIGHED_UP_TO:
        return ("label", schedule_label(schedule))
    weights = [float(eta) for eta in schedule.eta(torch.arange(schedule.L + 1))]
    while weights and weights[-1] == 1.0:
        weights.pop()
    return tuple(weights)


def verifier_key(spec: str) -> tuple[str, ...]:
    """The settings a --verifiers value names: their labels (``MARS:0.50`` and ``mars:0.5`` are one)."""
    return tuple(verifier_label(verifier) for verifier in parse_verifier(spec))


def parse_schedule(spec: str) -> Schedule | None:
    """``none`` -> None (relaxed verifier unchanged); ``step:L``, ``linear:L``, ``power:L:gamma``; or
    a JSON object in a schedule's `to_dict()` form, e.g. a segment schedule:
    ``{"schedule": "segments", "boundary": "</think>", "before": null,
    "after": {"schedule": "step", "L": 4}}``."""
    if spec.strip().startswith("{"):
        return _parse_json_schedule(spec)
    name, *numbers = spec.strip().lower().split(":")
    if name == "none" and not numbers:
        return None
    try:
        schedule = short_schedule(name, numbers)
    except ValueError as error:
        raise ValueError(f"bad schedule {spec!r}: {error}") from error
    if schedule is not None:
        return refuse_zero_length(schedule, spec)
    raise ValueError(
        f"bad schedule {spec!r}; use none, step:L, linear:L, power:L:gamma (e.g. step:1) or a JSON object "
        'such as {"schedule": "segments", "boundary": "</think>", "before": null, '
        '"after": {"schedule": "step", "L": 4}}'
    )


def short_schedule(name: str, numbers: list[str]) -> Schedule | None:
    """The schedule of a ``step:L``, ``linear:L`` or ``power:L:gamma`` spec split at its colons; None
    for any other form."""
    if name == "step" and len(numbers) == 1:
        return Step(L=int(numbers[0]))
    if name == "linear" and len(numbers) == 1:
        return Linear(L=int(numbers[0]))
    if name == "power" and len(numbers) == 2:
        return Power(L=int(numbers[0]), gamma=float(numbers[1]))
    return None


def _parse_json_schedule(spec: str) -> Schedule:
    try:
        values = json_input.loads(spec)
    except json.JSONDecodeError as error:
        raise ValueError(f"bad schedule {spec!r}: not valid JSON ({error})") from None
    if not isinstance(values, dict) or not isinstance(values.get("schedule"), str):
        raise ValueError(f"bad schedule {spec!r}: a JSON schedule is an object with a 'schedule' name")
    try:
        schedule = resolve_schedule(values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"bad schedule {spec!r}: {error}") from None
    return refuse_zero_length(schedule, spec)


def refuse_zero_length(schedule: Schedule, spec: str) -> Schedule:
    """`schedule`, refused when it is ``none`` under another name: L = 0 verifies no token losslessly
    (Step, Linear and Power alike), which is the relaxed verifier alone, run as ``none``."""
    if isinstance(schedule, (Step, Power)) and schedule.L == 0:
        raise ValueError(f"schedule {spec!r}: L=0 verifies no token losslessly, so it is the relaxed verifier "
                         "alone; give it as none (or L >= 1)")
    return schedule


def parse_verifier(spec: str) -> list[Verifier]:
    """``mars`` -> the relaxed points of its sweep, `Verifier.sweep()` (the lossless end is run once, as the
    ``lossless`` verifier); ``mars:0.9,0.5`` -> those knob values; ``lossless`` -> [Lossless()]."""
    name, colon, values = spec.strip().lower().partition(":")
    if name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r} in {spec!r}; choose from {', '.join(VERIFIERS)}")
    cls = VERIFIERS[name]
    if name == "lossless":
        if colon:
            raise ValueError(f"verifier {spec!r}: lossless takes no value; give it as lossless")
        return [Lossless()]
    if not colon:
        return [verifier for verifier in cls.sweep() if not verifier.is_lossless]
    items = values.split(",")
    if not all(item.strip() for item in items):
        raise ValueError(f"verifier {spec!r} has an empty value; give {name} (its sweep) or "
                         f"{name}:V1,V2 with a number between the commas, e.g. {name}:0.9,0.5")
    try:
        knob_values = [float(value) for value in items]
    except ValueError as error:
        raise ValueError(f"bad knob values in {spec!r}: give numbers, e.g. {name}:0.9,0.5") from error
    return [cls(**{cls.knob: value}) for value in knob_values]


def sweep_configs(verifier_specs: Sequence[str], schedules: Sequence[Schedule | None]) -> list[RunConfig]:
    """The lossless verifier once, then every relaxed verifier setting under every schedule, in the
    order of `verifier_specs`. Naming ``lossless`` among the specs runs it at that place instead of
    first (e.g. last, when the relaxed cells matter most and time may run out)."""
    named = any(spec.strip().lower() == "lossless" for spec in verifier_specs)
    configs = [] if named else [LOSSLESS]
    for spec in verifier_specs:
        for verifier in parse_verifier(spec):
            if verifier.name == "lossless":
                configs.append(LOSSLESS)
                continue
            configs.extend(RunConfig("speculative", verifier, schedule) for schedule in schedules)
    return list(dict.fromkeys(configs, None))


def resolve_text_boundaries(configs: Sequence[RunConfig], tokenizer: Any) -> list[RunConfig]:
    """`configs` with the text boundaries of their segment schedules turned into token ids by the
    target's `tokenizer` (`Segments.with_tokenizer`: keys and recorded dicts keep the text)."""
    return [
        replace(config, schedule=config.schedule.with_tokenizer(tokenizer))
        if isinstance(config.schedule, Segments) and config.schedule.text_boundaries
        else config
        for config in configs
    ]
