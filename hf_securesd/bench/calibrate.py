"""Choose SecureSD's Step(L) for a pair (paper §7.3): sweep L on a small calibration set and
recommend the smallest L whose safety PRR is within `tolerance` of lossless verification while
keeping the speed-up, i.e. SPD at least (1 - `spd_tolerance`) times that of the relaxed verifier
without SecureSD.

For a reasoning model the swept schedule can be the answer segment's instead: with a `Segments`
template (its boundary and `before`), L is swept in `Segments(boundary, before, after=Step(L))`.

`recommend` is a pure function of recorded cells (`runs.jsonl` records), so it can be checked on
synthetic results; `calibration_configs` is what `securesd calibrate` runs. It weighs only the L
values it is given (`securesd calibrate` passes this run's --L: cells of other L recorded earlier
in the same --out are left out), and flags an SPD timed in another session than its target-only
baseline (`LevelResult.spd_same_session`, `session_note`), as a resumed or extended --out holds.

A configuration's safety (utility) PRR is the mean over its safety (utility) tasks whose PRR is
defined: a task whose PRR is undefined (its target-only and draft-only scores are equal, or a baseline
is missing) is left out of the mean, where the `prr` module, given the tasks as settings, would call
the whole mean undefined. The figures say so: each level counts the tasks it left out
(`LevelResult.safety_prr_left_out`, `utility_prr_left_out`, `Recommendation.lossless_safety_prr_left_out`),
and `left_out_note` names every figure that is the mean of only some of its tasks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, Sequence

from hf_securesd.bench.analysis import Cell, mean_of, speculative_cells
from hf_securesd.bench.formatting import fmt
from hf_securesd.bench.plan import LOSSLESS, RunConfig, check_no_repeats, parse_verifier, verifier_key, verifier_label
from hf_securesd.bench.results import json_ready
from hf_securesd.schedules import Schedule, Step
from hf_securesd.segments import Segments, check_boundary_ids

DEFAULT_LENGTHS = (1, 2, 4, 8, 12)
# relative slack of the rule's comparisons: a bound such as 0.8 - 0.1 is 0.7000000000000001 in floats,
# so without it a safety PRR of exactly 0.7 (k/n on a small set) would miss "within 0.1 of 0.8"
RELATIVE_SLACK = 1e-9


@dataclass(frozen=True)
class LevelResult:
    """Figures of one configuration on the calibration set (means over its tasks of each kind), and
    the rule's two checks: `safe` (safety PRR within the tolerance of lossless) and `fast` (SPD kept).
    A check is None when it was not made: a figure it compares is undefined, or the configuration is
    not a swept level (the relaxed verifier itself)."""

    L: int | None  # None: the relaxed verifier without SecureSD
    safety_prr: float
    utility_prr: float
    spd: float
    acceptance_rate: float
    safe: bool | None = None
    fast: bool | None = None
    spd_same_session: bool = True  # False: a cell's SPD was timed in another session than its target-only baseline
    safety_prr_left_out: int = 0  # safety tasks whose PRR is undefined, left out of `safety_prr`'s mean
    utility_prr_left_out: int = 0  # utility tasks whose PRR is undefined, left out of `utility_prr`'s mean


@dataclass(frozen=True)
class Recommendation:
    """The recommended L for one relaxed verifier setting (None when no L qualifies), why, and the
    figures behind it."""

    verifier: str
    L: int | None
    reason: str
    lossless_safety_prr: float
    relaxed: LevelResult
    levels: list[LevelResult] = field(default_factory=list)
    lossless_safety_prr_left_out: int = 0  # lossless safety tasks whose PRR is undefined, left out of its mean

    def to_dict(self) -> dict[str, Any]:
        """The recommendation as standard JSON data (`results.json_ready`): an undefined figure
        is None (written as null, never as the NaN token), as in every other results file."""
        return json_ready(asdict(self))


def kept_percent(spd_tolerance: float) -> str:
    """The share of the relaxed verifier's SPD that a level must keep, ``1 - spd_tolerance`` as a
    percentage with every digit the tolerance has (0.1 -> "90%", 0.004 -> "99.6%"): rounded to a whole
    percent, a tight tolerance would read as a bound it is not ("100%")."""
    kept = (Decimal(1) - Decimal(repr(float(spd_tolerance)))) * 100
    return f"{kept.normalize():f}%"


def check_text(passed: bool | None) -> str:
    """A rule check as calibration.md shows it: "yes", "no", or "–" when it was not made."""
    return "–" if passed is None else "yes" if passed else "no"


def _at_least(value: float, bound: float) -> bool | None:
    """Whether `value` >= `bound`, inclusive up to float rounding (`RELATIVE_SLACK` of the bound, at
    least of 1); None when either is undefined (NaN or infinite)."""
    if not (math.isfinite(value) and math.isfinite(bound)):
        return None
    return value >= bound - RELATIVE_SLACK * max(1.0, abs(bound))


def swept_schedule(length: int, segments: Segments | None = None) -> Schedule:
    """Step(L), or with a `segments` template its schedule with after=Step(L) (the answer's L)."""
    if segments is None:
        return Step(L=length)
    return Segments(segments.boundary, segments.before, Step(L=length))


def _swept_length(schedule: dict[str, Any] | None, segments: Segments | None) -> int | None:
    """L of a recorded schedule dict when it belongs to the sweep, else None."""
    if not schedule:
        return None
    if segments is None:
        return int(schedule["L"]) if schedule["schedule"] == "step" else None
    template = segments.to_dict()
    after = schedule.get("after")
    same = all(schedule.get(key) == template[key] for key in ("schedule", "boundary", "before"))
    return int(after["L"]) if same and isinstance(after, dict) and after.get("schedule") == "step" else None


def schedule_name(length: int | None, segments: Segments | None = None) -> str:
    """How a swept L reads in messages: ``Step(L=4)`` or ``Segments(after=Step(L=4))``."""
    return f"Step(L={length})" if segments is None else f"Segments(after=Step(L={length}))"


def calibration_configs(
    verifier_specs: Sequence[str], lengths: Sequence[int], segments: Segments | None = None
) -> list[RunConfig]:
    """Lossless, then each relaxed verifier setting without a schedule and under the swept schedule
    (`swept_schedule`) for each L."""
    configs = [LOSSLESS]
    check_no_repeats("--verifier", verifier_specs, verifier_key)
    for spec in verifier_specs:
        name, colon, _ = spec.strip().lower().partition(":")
        if not colon and name != "lossless":
            raise ValueError(
                f"--verifier {spec!r} names no setting: calibrate runs each setting without and with each --L "
                f"schedule, so the whole {name} sweep would be {len(parse_verifier(spec))} settings; give the "
                f"one you deploy, {name}:VALUE (e.g. {name}:0.5), or several as {name}:V1,V2"
            )
        for verifier in parse_verifier(spec):
            if verifier.name == "lossless":
                raise ValueError(
                    "calibrate needs relaxed verifiers (e.g. mars:0.5); lossless is run as the reference"
                )
            configs.append(RunConfig("speculative", verifier))
            configs.extend(
                RunConfig("speculative", verifier, swept_schedule(length, segments))
                for length in sorted(set(lengths))
            )
    return configs


def check_lengths(lengths: Sequence[int]) -> None:
    """Refuse a negative --L before anything is generated."""
    negative = [length for length in lengths if length < 0]
    if negative:
        raise ValueError(f"--L {negative[0]}: each L must be an integer >= 0 (the number of leading response "
                         "tokens verified losslessly; 1 is the paper's default)")


def check_fraction(option: str, value: float) -> None:
    """Refuse a fraction outside [0, 1] for `option`."""
    if not 0 <= value <= 1:
        raise ValueError(f"{option} {value}: give a fraction between 0 and 1 (e.g. 0.1 for 10%)")


def check_safety_tolerance(value: float) -> None:
    """Refuse a --tolerance outside [0, 1]: it is a shortfall in safety PRR, which runs from 0 (the
    draft alone) to 1 (the target alone), so a shortfall of 1 already accepts any L that is as safe
    as the draft alone."""
    if not 0 <= value <= 1:
        raise ValueError(
            f"--tolerance {value}: give the allowed safety-PRR shortfall from lossless between 0 and 1 "
            "(PRR runs from 0, the draft alone, to 1, the target alone), e.g. --tolerance 0.05"
        )


def check_boundaries_in_vocabulary(configs: Sequence[RunConfig], engine: Any) -> None:
    """Refuse --segment-boundary token ids outside the target's vocabulary before anything is generated
    (engines that run no model in this process are checked by their servers)."""
    from hf_securesd.validation import vocab_size

    target = getattr(getattr(engine, "models", None), "target", None)
    if target is None:
        return
    size = vocab_size(target)
    for config in configs:
        try:
            check_boundary_ids(config.schedule, size)
        except ValueError as error:
            raise ValueError(f"--segment-boundary: {error}") from None


def _kind_prr(cells: Sequence[Cell], kind: str) -> tuple[float, int]:
    """The mean PRR of the `kind` ("safety", "utility") cells whose PRR is defined (NaN when none is),
    and how many cells of that kind have none and are left out of the mean."""
    values = [cell.get("prr") for cell in cells if cell["task_kind"] == kind]
    defined = [value for value in values if value is not None and math.isfinite(value)]
    return mean_of(defined), len(values) - len(defined)


def _level(cells: Sequence[Cell], L: int | None) -> LevelResult:
    """The figures of one configuration's `cells` (one per task): each a mean over the tasks where it is
    defined, with the count of tasks whose PRR is undefined and left out."""
    safety_prr, safety_left_out = _kind_prr(cells, "safety")
    utility_prr, utility_left_out = _kind_prr(cells, "utility")
    return LevelResult(
        L=L,
        safety_prr=safety_prr,
        utility_prr=utility_prr,
        safety_prr_left_out=safety_left_out,
        utility_prr_left_out=utility_left_out,
        spd=mean_of(cell.get("spd") for cell in cells),
        acceptance_rate=mean_of(cell.get("acceptance_rate") for cell in cells),
        # a cell without a target-only baseline has no SPD (spd_same_session False there): nothing to flag
        spd_same_session=all(
            cell.get("spd_same_session") is not False for cell in cells if cell.get("spd") is not None
        ),
    )


def recommend(
    cells: Sequence[Cell],
    verifier: str,
    tolerance: float = 0.05,
    spd_tolerance: float = 0.1,
    segments: Segments | None = None,
    lengths: Sequence[int] | None = None,
) -> Recommendation:
    """Recommend L for the relaxed setting `verifier` (its label, e.g. ``mars(theta=0.5)``) from
    recorded cells holding the lossless verifier, that setting without a schedule and under Step(L)
    (with a `segments` template: under that schedule with after=Step(L); other cells are ignored).
    With `lengths` only those L are weighed (the --L of this run); None: every L recorded. A ValueError
    when the lossless or plain runs are missing, or no swept cell is recorded at any L weighed."""
    lossless = speculative_cells(cells, "lossless", None)
    mine = [cell for cell in speculative_cells(cells) if cell["config_key"].split("+")[0] == verifier]
    plain = [cell for cell in mine if cell["schedule_label"] is None]
    if not lossless or not plain:
        raise ValueError(
            f"calibration of {verifier} needs runs of the lossless verifier and of {verifier} "
            f"without a schedule; run `securesd calibrate` (or bench with --schedules none step:L ...)"
        )
    lossless_level = _level(lossless, 0)
    lossless_safety, left_out = lossless_level.safety_prr, lossless_level.safety_prr_left_out
    relaxed = _level(plain, None)
    by_length = _cells_by_length(mine, verifier, segments, lengths)
    levels = [
        _checked(_level(group, length), lossless_safety - tolerance, (1.0 - spd_tolerance) * relaxed.spd)
        for length, group in sorted(by_length.items())
    ]
    if not math.isfinite(lossless_safety):
        return Recommendation(
            verifier,
            None,
            "safety PRR is undefined on the calibration set (the target-only and "
            "draft-only safety scores are equal, or there is no safety task); use more or other "
            "examples",
            lossless_safety,
            relaxed,
            levels,
            lossless_safety_prr_left_out=left_out,
        )
    chosen = next((level for level in levels if level.safe and level.fast), None)
    if chosen is not None:
        reason = (
            f"{schedule_name(chosen.L, segments)} is the smallest L with safety PRR {chosen.safety_prr:.3f} "
            f"within {tolerance} "
            f"of lossless ({lossless_safety:.3f}) and SPD {chosen.spd:.2f} at least "
            f"{kept_percent(spd_tolerance)} of the relaxed verifier's {relaxed.spd:.2f}"
        )
        return Recommendation(
            verifier, chosen.L, reason, lossless_safety, relaxed, levels, lossless_safety_prr_left_out=left_out
        )
    reason = _no_level_reason(levels, tolerance, spd_tolerance, lossless_safety, relaxed.spd, segments)
    return Recommendation(
        verifier, None, reason, lossless_safety, relaxed, levels, lossless_safety_prr_left_out=left_out
    )


def _cells_by_length(
    cells: Sequence[Cell], verifier: str, segments: Segments | None, lengths: Sequence[int] | None
) -> dict[int, list[Cell]]:
    """The swept cells of `cells` by their L, only those of `lengths` when given; a ValueError naming
    the requested and the recorded L when no cell is left."""
    recorded: dict[int, list[Cell]] = {}
    for cell in cells:
        length = _swept_length(cell["config"]["schedule"], segments)
        if length is not None:
            recorded.setdefault(length, []).append(cell)
    weighed = {length: group for length, group in recorded.items() if lengths is None or length in lengths}
    if not weighed:
        requested = "" if lengths is None else f" at L in {sorted(set(lengths))}"
        found = f"L in {sorted(recorded)}" if recorded else "none"
        sweep = "Step(L)" if segments is None else "Segments(after=Step(L))"
        raise ValueError(
            f"calibration of {verifier} has no recorded cell under {sweep}{requested} (recorded: {found}); "
            "weigh recorded L, or run `securesd calibrate` with those --L first"
        )
    return weighed


def _checked(level: LevelResult, safety_bound: float, spd_bound: float) -> LevelResult:
    """`level` with its checks made: safety PRR >= `safety_bound`, SPD >= `spd_bound` (each None
    when a figure it compares is undefined)."""
    return LevelResult(**{**asdict(level), "safe": _at_least(level.safety_prr, safety_bound),
                          "fast": _at_least(level.spd, spd_bound)})


def _no_level_reason(
    levels: Sequence[LevelResult],
    tolerance: float,
    spd_tolerance: float,
    lossless_safety: float,
    relaxed_spd: float,
    segments: Segments | None,
) -> str:
    """Why no level qualifies: the safe ones do not keep the speed-up (or their SPD could not be
    compared: `_speed_reason`), no level is safe, or no level's safety PRR is defined."""
    lengths = [level.L for level in levels]
    safe = [level for level in levels if level.safe]
    if safe:
        return _speed_reason(safe, tolerance, spd_tolerance, relaxed_spd, segments)
    if all(level.safe is None for level in levels):
        return (
            f"safety PRR is undefined at every L in {lengths} (the target-only and draft-only safety "
            "scores are equal on those prompts, or no safety task was run); use more or other examples"
        )
    unchecked = [level.L for level in levels if level.safe is None]
    undefined = f" (undefined at L in {unchecked})" if unchecked else ""
    return (
        f"no L in {lengths} brings safety PRR within {tolerance} of lossless "
        f"({lossless_safety:.3f}){undefined}; try larger L, or lossless verification"
    )


def _speed_reason(
    safe: Sequence[LevelResult], tolerance: float, spd_tolerance: float, relaxed_spd: float,
    segments: Segments | None,
) -> str:
    """Why none of the `safe` levels (those within the tolerance, none of them fast) qualifies: the
    smallest one's SPD is below the bound or could not be compared, and the speed of each larger safe
    one whose SPD is undefined was not checked either (such an L is never called too slow)."""
    first, *larger = safe
    within = (f"{schedule_name(first.L, segments)} is the smallest L within {tolerance} of lossless safety, "
              "but")
    if first.fast is None:
        return (
            f"{within} its SPD ({fmt(first.spd, 2)}) or the relaxed verifier's ({fmt(relaxed_spd, 2)}) is "
            "undefined, so whether it keeps the speed-up was not checked; rerun with more examples"
        )
    digits = _distinct_digits(first.spd, (1.0 - spd_tolerance) * relaxed_spd)
    slow = (f"{within} its SPD {first.spd:.{digits}f} is below {kept_percent(spd_tolerance)} of the relaxed "
            f"verifier's {relaxed_spd:.{digits}f}")
    unchecked = [schedule_name(level.L, segments) for level in larger if level.fast is None]
    if unchecked:
        return (
            f"{slow}; the SPD of {', '.join(unchecked)} (also within {tolerance} of lossless safety) is "
            "undefined, so whether the speed-up is kept there was not checked; rerun with more examples"
        )
    return f"{slow}; no L keeps the speed-up"


def _distinct_digits(value: float, bound: float, fewest: int = 2, most: int = 6) -> int:
    """The fewest decimals, from `fewest` up to `most`, that show `value` and `bound` as different
    numbers: an SPD just below its bound must not read as equal to it ("0.46 is below 100% of 0.46")."""
    differ = (digits for digits in range(fewest, most + 1) if f"{value:.{digits}f}" != f"{bound:.{digits}f}")
    return next(differ, most)


def _named_levels(recommendation: Recommendation) -> list[tuple[str, LevelResult]]:
    """The relaxed verifier's row and each swept level of `recommendation`, as the notes name them."""
    return [("the relaxed verifier", recommendation.relaxed)] + [
        (f"L={level.L}", level) for level in recommendation.levels
    ]


def session_note(recommendation: Recommendation) -> str | None:
    """What calibration.md and the command say when an SPD of `recommendation` was timed in another
    session than its target-only baseline (a resumed or extended --out), or None when all were timed
    in one: such SPDs mix machine states, so the speed-up check compares them with care."""
    other = [name for name, level in _named_levels(recommendation) if not level.spd_same_session]
    if not other:
        return None
    return (
        f"SPD of {', '.join(other)} (marked *) was timed in another session than its target-only baseline "
        "(this --out was resumed or extended), so the speed-up check compares timings of different "
        "sessions; for one session's timings, calibrate into a new --out"
    )


def left_out_note(recommendation: Recommendation) -> str | None:
    """What calibration.md and the command say when a PRR figure of `recommendation` is the mean over
    only some of its tasks, the others' PRR being undefined and left out (how many, per figure), or
    None when no defined figure left a task out (an undefined figure shows as undefined already)."""
    figures = [("lossless safety PRR", recommendation.lossless_safety_prr, recommendation.lossless_safety_prr_left_out)]
    for name, level in _named_levels(recommendation):
        figures += [(f"safety PRR of {name}", level.safety_prr, level.safety_prr_left_out),
                    (f"utility PRR of {name}", level.utility_prr, level.utility_prr_left_out)]
    partial = [
        f"{figure} leaves out {count} task{'s' if count > 1 else ''}"
        for figure, value, count in figures
        if count and math.isfinite(value)
    ]
    if not partial:
        return None
    return (
        f"PRR figures average the tasks where PRR is defined: {', '.join(partial)} whose PRR is undefined "
        "(the target-only and draft-only scores are equal there, or a baseline is missing)"
    )


def verifier_labels(verifier_specs: Sequence[str]) -> list[str]:
    """Labels of the relaxed settings named by `verifier_specs`."""
    return [verifier_label(verifier) for spec in verifier_specs for verifier in parse_verifier(spec)]
