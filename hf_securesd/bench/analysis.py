"""Numbers derived from recorded cells: PRR and ΔPRR (through the `prr` evaluate module of
`hf_securesd.metrics`), SPD and ΔSPD with paired bootstrap intervals, the fields a cell's record
holds against its baselines (`derived_fields`), and the groupings the report and the calibration
read (relaxed sweeps, AR bins, per-position TV).

A *cell* is one record of `runs.jsonl` (see `results.py`): a decoding configuration on one task,
with per-example scores and seconds aligned with `example_ids`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from hf_securesd.bench.results import stats_from_dict
from hf_securesd.stats import SpeculativeStats

CONFIDENCE = 0.95
N_RESAMPLES = 1000
AR_BINS: tuple[tuple[float, float], ...] = ((0.0, 0.3), (0.3, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.0001))

Cell = dict[str, Any]


@functools.lru_cache(maxsize=1)
def prr_metric():
    """The `prr` evaluate module shipped in `hf_securesd.metrics` (loaded offline, once)."""
    import evaluate

    import hf_securesd.metrics

    return evaluate.load(hf_securesd.metrics.path("prr"))


def compute_prr(
    method: Sequence[float],
    target: Sequence[float],
    draft: Sequence[float],
    *,
    settings: Sequence[str] | None = None,
    baseline: Sequence[float] | None = None,
    example_ids: Sequence[str] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """PRR (and ΔPRR when `baseline` is given) of aligned per-example scores, with bootstrap
    intervals; see the `prr` module card (`example_ids`: settings that share examples are resampled
    together). An undefined PRR (target = draft) comes back as NaN
    with ``undefined: True`` instead of a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        return prr_metric().compute(
            predictions=list(method),
            target_scores=list(target),
            draft_scores=list(draft),
            settings=None if settings is None else list(settings),
            baseline_predictions=None if baseline is None else list(baseline),
            example_ids=None if example_ids is None else list(example_ids),
            confidence_level=CONFIDENCE,
            n_resamples=N_RESAMPLES,
            seed=seed,
        )


def aligned(cell: Cell, field: str, example_ids: Sequence[str]) -> list[float]:
    """`cell[field]` (per-example list) in the order of `example_ids`."""
    counts = Counter(cell["example_ids"])
    if len(counts) != len(cell["example_ids"]):
        repeated = next(example_id for example_id, count in counts.items() if count > 1)
        raise ValueError(
            f"cell {cell['cell']} holds example {repeated!r} more than once (results merged by hand?); each "
            "example must appear once per cell for paired comparisons"
        )
    by_id = dict(zip(cell["example_ids"], cell[field]))
    missing = [example_id for example_id in example_ids if example_id not in by_id]
    if missing:
        raise ValueError(
            f"cell {cell['cell']} lacks examples {missing[:3]}; its baseline was run on "
            f"other examples (same --seed, --limit and data are needed)"
        )
    return [by_id[example_id] for example_id in example_ids]


def speedup(target_seconds: Sequence[float], method_seconds: Sequence[float]) -> float:
    """SPD: total target-only wall time / total wall time of the method on the same prompts."""
    total = float(sum(method_seconds))
    return float(sum(target_seconds)) / total if total > 0 else math.nan


def finite_or_none(value: float | None) -> float | None:
    """`value` as a float, or None when it is missing, NaN or infinite."""
    return None if value is None or not math.isfinite(value) else float(value)


def prr_fields(cell: Cell, target: Cell, draft: Cell, seed: int) -> dict[str, Any]:
    """The PRR fields of a speculative or endpoint `cell` against its baseline cells. Examples
    without a score in any of the three cells (a judge verdict excluded by the judge's `unparsed`
    policy) are left out of the paired comparison."""
    ids = cell["example_ids"]
    columns = [cell["scores"], aligned(target, "scores", ids), aligned(draft, "scores", ids)]
    rows = [row for row in zip(*columns) if all(is_scored(value) for value in row)]
    undefined = {"prr": math.nan, "prr_ci": None, "undefined": True, "target_score": math.nan,
                 "draft_score": math.nan}
    prr = compute_prr(*(list(column) for column in zip(*rows)), seed=seed) if rows else undefined
    return {
        "prr": finite_or_none(prr["prr"]),
        "prr_ci": prr["prr_ci"],
        "prr_undefined": prr["undefined"],
        "target_score": prr["target_score"],
        "draft_score": prr["draft_score"],
    }


def derived_fields(cell: Cell, base: dict[tuple[str, str], Cell], seed: int) -> dict[str, Any]:
    """What a cell's record holds against its baselines in `base` (`results.baselines`: (kind,
    baseline id) -> cell): its SPD against the target-only cell (a target-only cell against
    itself), whether the two were timed in one session and, for a speculative or endpoint cell
    with both baselines, its PRR fields (`prr_fields`). The same whichever finished first, so a
    cell finished before a baseline gets them when the baseline finishes."""
    kind = cell["config"]["kind"]
    target = cell if kind == "target" else base.get(("target", cell["baseline_id"]))
    draft = base.get(("draft", cell["baseline_id"]))
    fields: dict[str, Any] = {
        "spd": None if target is None else finite_or_none(
            speedup(aligned(target, "seconds", cell["example_ids"]), cell["seconds"])
        ),
        "spd_same_session": target is not None and len(set(target["sessions"]) | set(cell["sessions"])) == 1,
    }
    if kind in ("speculative", "endpoint") and target and draft:
        fields.update(prr_fields(cell, target, draft, seed))
    return fields


def interval(samples: np.ndarray) -> list[float] | None:
    """Percentile interval of the finite samples at `CONFIDENCE`."""
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return None
    tail = (1.0 - CONFIDENCE) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return [float(low), float(high)]


def is_scored(value: float | None) -> bool:
    """Whether an example's score counts: False for the NaN (or null) of a verdict that the judge's
    `unparsed=exclude` policy left out."""
    return value is not None and math.isfinite(value)


def mean_ci(values: Sequence[float], seed: int = 0) -> tuple[float, list[float] | None]:
    """Mean of the finite `values` and its percentile bootstrap interval (None for fewer than 2)."""
    finite = np.asarray([value for value in values if is_scored(value)], dtype=float)
    if finite.size == 0:
        return math.nan, None
    if finite.size < 2:
        return float(finite.mean()), None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, finite.size, size=(N_RESAMPLES, finite.size))
    return float(finite.mean()), interval(finite[picks].mean(axis=1))


def score_ci(values: Sequence[float], seed: int = 0) -> tuple[float, list[float] | None]:
    """Mean of a cell's per-example scores and its interval: where every scored value is a verdict (0 or
    1: AFR, accuracy, pass@1) the exact Clopper-Pearson interval of the count, which keeps its level at
    small n and near 0 or 1 (a bootstrap there gives [1.0, 1.0] for 20 of 20); else `mean_ci`."""
    scored = [value for value in values if is_scored(value)]
    if not scored or any(value not in (0, 1) for value in scored):
        return mean_ci(values, seed)
    from hf_securesd.metrics.flips.flips import exact_interval

    return math.fsum(scored) / len(scored), exact_interval(int(sum(scored)), len(scored), CONFIDENCE)


@dataclass(frozen=True)
class SpeedPair:
    """Per-example seconds of one setting: target-only, with SecureSD and without, for the examples
    `example_ids` of the prompt set `prompts` (a task: settings of one task share its examples)."""

    target: np.ndarray
    with_schedule: np.ndarray
    without_schedule: np.ndarray
    example_ids: tuple[str, ...]
    prompts: str


def delta_speedup(pairs: Sequence[SpeedPair], seed: int = 0) -> tuple[float, list[float] | None]:
    """ΔSPD = mean over settings of SPD(with) - SPD(without), and a paired bootstrap interval that
    resamples the examples of each prompt set once for all its settings (the same picks for all three
    timings): settings run on the same prompts are correlated, and resampling each apart would make
    the interval too narrow."""
    if not pairs:
        return math.nan, None
    point = float(
        np.mean([speedup(p.target, p.with_schedule) - speedup(p.target, p.without_schedule) for p in pairs])
    )
    if any(len(p.target) < 2 for p in pairs):
        return point, None
    rng = np.random.default_rng(seed)
    samples = np.zeros(N_RESAMPLES)
    for prompts in dict.fromkeys(pair.prompts for pair in pairs):
        members = [pair for pair in pairs if pair.prompts == prompts]
        examples = {example: index for index, example in enumerate(dict.fromkeys(
            example for pair in members for example in pair.example_ids))}
        picks = rng.integers(0, len(examples), size=(N_RESAMPLES, len(examples)))
        offsets = (np.arange(N_RESAMPLES) * len(examples))[:, None]
        draws = np.bincount((picks + offsets).ravel(), minlength=N_RESAMPLES * len(examples))
        draws = draws.reshape(N_RESAMPLES, len(examples)).astype(float)  # [R, examples] times each was drawn
        for pair in members:
            weights = draws[:, [examples[example] for example in pair.example_ids]]  # [R, the pair's examples]
            target = weights @ pair.target
            with np.errstate(invalid="ignore", divide="ignore"):
                samples += target / (weights @ pair.with_schedule) - target / (weights @ pair.without_schedule)
    return point, interval(samples / len(pairs))


def relaxed_setting(cell: Cell) -> tuple[str, Any, str | None] | None:
    """(verifier name, knob value, schedule label) of a speculative cell; None for baselines.
    The lossless verifier has knob value None."""
    config = cell["config"]
    if config["kind"] != "speculative":
        return None
    return config["verifier"]["verifier"], cell["knob_value"], cell["schedule_label"]


def speculative_cells(
    cells: Iterable[Cell], verifier: str | None = None, schedule: str | None | bool = False
) -> list[Cell]:
    """Speculative cells, optionally of one verifier and one schedule label (None: no schedule;
    False: any schedule)."""
    chosen = []
    for cell in cells:
        setting = relaxed_setting(cell)
        if setting is None or (verifier is not None and setting[0] != verifier):
            continue
        if schedule is not False and setting[2] != schedule:
            continue
        chosen.append(cell)
    return chosen


def primary_cells(cells: Sequence[Cell]) -> list[Cell]:
    """The cells of each task's main run: those sharing the baseline id (task, size, length) that
    holds the most examples for the task, the first recorded on a tie. Runs of the same task at
    another size or length (a length check on a sample, say) are left out, so that tables pooling
    cells count each prompt once."""
    best: dict[str, tuple[int, str]] = {}
    for cell in cells:
        current = best.get(cell["task"])
        if current is None or cell["n"] > current[0]:
            best[cell["task"]] = (cell["n"], cell["baseline_id"])
    return [cell for cell in cells if cell["baseline_id"] == best[cell["task"]][1]]


def ar_bin(acceptance_rate: float) -> str | None:
    """Label of the AR bin holding `acceptance_rate`, e.g. ``[0.3, 0.5)``."""
    if acceptance_rate is None or not math.isfinite(acceptance_rate):
        return None
    for low, high in AR_BINS:
        if low <= acceptance_rate < high:
            return bin_label(low, high)
    return None


def bin_label(low: float, high: float) -> str:
    return f"[{low:.1f}, {min(high, 1.0):.1f}{']' if high > 1 else ')'}"


def merged_stats(cells: Iterable[Cell]) -> SpeculativeStats | None:
    """The speculative statistics of several cells summed (None when none has any)."""
    parts = [stats_from_dict(cell["stats"]) for cell in cells if cell.get("stats")]
    return SpeculativeStats.merge(parts) if parts else None


def mean_of(values: Iterable[float | None]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    finite = [value for value in values if value is not None and math.isfinite(value)]
    return float(np.mean(finite)) if finite else math.nan


@functools.lru_cache(maxsize=1)
def flips_metric():
    """The `flips` evaluate module shipped in `hf_securesd.metrics` (loaded offline, once)."""
    import evaluate

    import hf_securesd.metrics

    return evaluate.load(hf_securesd.metrics.path("flips"))


def compute_flips(method: Sequence[float], reference: Sequence[float]) -> dict[str, Any] | None:
    """Paired flips of aligned 0/1 outcomes against a reference (see the `flips` module card):
    per-direction counts with exact intervals, the exact McNemar p-value, the paired difference with
    Newcombe's interval.
    An example without a score in either list (an excluded verdict) is left out of the pairs and
    counted in ``n_excluded``; None when no pair is left."""
    pairs = [(mine, theirs) for mine, theirs in zip(method, reference, strict=True)
             if is_scored(mine) and is_scored(theirs)]
    if not pairs:
        return None
    result = flips_metric().compute(
        predictions=[mine for mine, _ in pairs],
        references=[theirs for _, theirs in pairs],
        confidence_level=CONFIDENCE,
    )
    return {**result, "n_excluded": len(method) - len(pairs)}


def judge_agreement(judge: str, judge_options: dict[str, Any] | None = None, data_dir: str | None = None
                    ) -> dict[str, Any] | None:
    """Agreement of a string judge with the human majority labels of JailbreakBench's
    `classifier_comparison.csv` (100 responses), positive class = jailbroken: agreement, Cohen's
    kappa, precision, recall and n. None when the file is not available locally, and for judges
    that call a model (run `securesd judge-validate` for those). `judge_options` the judge does not
    take, or with values it refuses, are a ValueError naming them (`check_judge_options`)."""
    from hf_securesd.judges import check_judge_options, get_judge
    from hf_securesd.judges.validate import agreement_stats, load_comparison

    if judge != "refusal_prefix":
        return None
    try:
        rows = load_comparison(data_dir)
    except (FileNotFoundError, ValueError):
        return None
    check_judge_options(judge, dict(judge_options or {}))
    judge_object = get_judge(judge, **dict(judge_options or {}))
    verdicts = judge_object.judge([row["goal"] for row in rows], [row["target_response"] for row in rows])
    stats = agreement_stats([v.attack_succeeded for v in verdicts], [row["human_majority"] == "1" for row in rows])
    return {
        "agreement": stats["agreement"],
        "kappa": stats["kappa"],
        "precision": stats["precision"],
        "recall": stats["recall"],
        "n": len(rows),
        "labels": "JailbreakBench classifier_comparison.csv, human majority",
        "match": getattr(judge_object, "match", None),
    }
