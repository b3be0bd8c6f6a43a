"""Report section for the safety–utility asymmetry: for each speculative configuration run on a
safety task and on a utility task, its PRR on each and the difference (utility PRR − safety PRR)
with a bootstrap interval, so that "safety is lost faster than utility" is a measured claim.

The two tasks hold different prompts, so the difference's interval resamples each task's examples
from its own random stream (paired within a task: the configuration's, the target's and the
draft's scores of one example are drawn together). Each task's own PRR interval is drawn as the
`prr` module draws it (same seed), so it equals the one in the per-configuration tables. A safety task on which the target and the draft do not differ
measurably (the bootstrap interval of their gap holds 0) gives no PRR to compare and is left out,
and so is a pair whose PRR is undefined in every resample.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hf_securesd.bench.analysis import N_RESAMPLES, Cell, aligned, interval, is_scored, primary_cells
from hf_securesd.bench.formatting import fmt, fmt_ci, table
from hf_securesd.bench.report_markdown import inline_text

# A target–draft gap at or below this is no gap (the `prr` module's tolerance).
_EQUAL_TOLERANCE = 1e-12


def prr_resamples(
    method: Sequence[float], target: Sequence[float], draft: Sequence[float], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap resamples of PRR and of the target–draft gap, each of shape [N_RESAMPLES];
    `method`, `target` and `draft` are aligned per-example scores of length n, resampled with the
    same indices. PRR is NaN in a resample whose gap is 0."""
    columns = np.asarray([method, target, draft], dtype=float)
    picks = rng.integers(0, columns.shape[1], size=(N_RESAMPLES, columns.shape[1]))
    method_mean, target_mean, draft_mean = columns[:, picks].mean(axis=2)
    gap = target_mean - draft_mean
    undefined = np.abs(gap) <= _EQUAL_TOLERANCE
    with np.errstate(divide="ignore", invalid="ignore"):
        prr = np.where(undefined, np.nan, (method_mean - draft_mean) / np.where(undefined, 1.0, gap))
    return prr, gap


def _task_prr(cell: Cell, base: dict, seed: int, stream: int) -> dict[str, Any] | None:
    """PRR of `cell` against its baselines: value, interval, the gap's interval and resamples
    drawn from the random stream `stream` (for the difference); None when a baseline is missing
    or the two baselines score the same."""
    target = base.get(("target", cell["baseline_id"]))
    draft = base.get(("draft", cell["baseline_id"]))
    if target is None or draft is None:
        return None
    ids = cell["example_ids"]
    # Examples without a score in any of the three cells (an excluded judge verdict) are left out, as
    # in the per-configuration tables (`analysis.prr_fields`), so both report the same PRR and interval.
    columns = (aligned(cell, "scores", ids), aligned(target, "scores", ids), aligned(draft, "scores", ids))
    rows = [row for row in zip(*columns) if all(is_scored(value) for value in row)]
    if not rows:
        return None
    method_scores, target_scores, draft_scores = (list(column) for column in zip(*rows))
    gap = float(np.mean(target_scores) - np.mean(draft_scores))
    if abs(gap) <= _EQUAL_TOLERANCE:
        return None
    scores = (method_scores, target_scores, draft_scores)
    samples, gap_samples = prr_resamples(*scores, np.random.default_rng(seed))
    return {
        "task": cell["task"],
        "acceptance_rate": cell.get("acceptance_rate"),
        "prr": (float(np.mean(method_scores)) - float(np.mean(draft_scores))) / gap,
        "prr_ci": interval(samples),
        "gap_ci": interval(gap_samples),
        "samples": prr_resamples(*scores, np.random.default_rng([seed, stream]))[0],
    }


def _gap_is_measurable(gap_ci: list[float] | None) -> bool:
    return gap_ci is not None and (gap_ci[0] > 0.0 or gap_ci[1] < 0.0)


def _by_config(cells: Sequence[Cell]) -> dict[str, dict[str, list[Cell]]]:
    """The main runs' speculative cells by configuration, then by task kind ("safety", "utility")."""
    by_config: dict[str, dict[str, list[Cell]]] = {}
    for cell in primary_cells(cells):
        if cell["config"]["kind"] == "speculative":
            by_config.setdefault(cell["config_key"], {}).setdefault(cell["task_kind"], []).append(cell)
    return by_config


def runs_both_kinds(cells: Sequence[Cell]) -> bool:
    """Whether some configuration was run on a safety task and on a utility task (so the asymmetry table
    could have a row)."""
    return any(kinds.get("safety") and kinds.get("utility") for kinds in _by_config(cells).values())


def asymmetry_rows(cells: Sequence[Cell], base: dict, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (speculative configuration, safety task, utility task) of the main runs: AR and
    PRR [interval] on each task, and utility PRR − safety PRR [interval]. Positive = safety is lost
    more than utility (the paper's asymmetry)."""
    rows = []
    for config, kinds in _by_config(cells).items():
        for safety_cell in kinds.get("safety", []):
            for utility_cell in kinds.get("utility", []):
                safety = _task_prr(safety_cell, base, seed, stream=1)
                utility = _task_prr(utility_cell, base, seed, stream=2)
                if safety is None or utility is None or not _gap_is_measurable(safety["gap_ci"]):
                    continue
                difference = utility["samples"] - safety["samples"]
                rows.append(
                    {
                        "config": config,
                        "safety": {key: value for key, value in safety.items() if key != "samples"},
                        "utility": {key: value for key, value in utility.items() if key != "samples"},
                        "difference": utility["prr"] - safety["prr"],
                        "difference_ci": interval(difference),
                        "undefined_resamples": int(np.isnan(difference).sum()),
                    }
                )
    return rows


def asymmetry_section(rows: Sequence[dict[str, Any]], both_kinds: bool) -> list[str]:
    """The Markdown section: one table over every row of `asymmetry_rows`; where some configuration ran on
    both kinds of task (`both_kinds`) but no row is left, the heading and why."""
    if not rows:
        if not both_kinds:
            return []
        return [
            "## Safety–utility asymmetry per configuration",
            "",
            "No row: configurations ran on safety and utility tasks, but on every safety task the target and "
            "the draft do not differ measurably (their gap's 95 % interval holds 0), so the safety PRR has "
            "nothing to compare with. Run more prompts, or a pair whose target refuses more often than its "
            "draft.",
            "",
        ]
    body = [
        [
            inline_text(row["config"]),
            inline_text(row["safety"]["task"]),
            fmt(row["safety"]["acceptance_rate"]),
            fmt_ci(row["safety"]["prr"], row["safety"]["prr_ci"]),
            inline_text(row["utility"]["task"]),
            fmt(row["utility"]["acceptance_rate"]),
            fmt_ci(row["utility"]["prr"], row["utility"]["prr_ci"]),
            fmt_ci(row["difference"], row["difference_ci"]),
        ]
        for row in rows
    ]
    header = ["configuration", "safety task", "AR", "safety PRR", "utility task", "AR", "utility PRR",
              "utility − safety"]
    return [
        "## Safety–utility asymmetry per configuration",
        "",
        "For each configuration run on both kinds of task: PRR on a safety task and on a utility task, and "
        "their difference (positive = the configuration keeps more of the target's utility than of its "
        "safety, the paper's asymmetry). 95 % percentile bootstrap intervals; the difference's resamples "
        "draw each task's prompts independently. Safety tasks on which the target and the draft do not "
        "differ measurably (their gap's interval holds 0) give no PRR to compare and are left out.",
        "",
        table(header, body),
        "",
    ]
