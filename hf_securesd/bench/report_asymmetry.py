"""Report section for the safety–utility asymmetry: for each speculative configuration run on a
safety task and on a utility task, its PRR on each and the difference (utility PRR − safety PRR)
with a bootstrap interval, so that "safety is lost faster than utility" is a measured claim.

Each task's PRR and its interval are the `prr` module's, computed as the per-configuration tables
compute them (`analysis.prr_fields`: same examples, same seed), so they equal the ones in those
tables; like them, a task of a single example has no interval. The two tasks hold different prompts,
so the difference's interval resamples each task's examples from its own random stream (paired
within a task: the configuration's, the target's and the draft's scores of one example are drawn
together), with the module's tie rule for a resample whose target and draft means are equal; a task
of a single example gives no difference interval. A safety task on which the target and the draft do
not differ measurably (the bootstrap interval of their gap holds 0, or there is none) gives no PRR to
compare and is left out, and so is a pair whose PRR is undefined.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hf_securesd.bench.analysis import N_RESAMPLES, Cell, aligned, interval, is_scored, primary_cells, prr_fields
from hf_securesd.bench.formatting import fmt, fmt_ci, table
from hf_securesd.bench.report_markdown import inline_text
from hf_securesd.metrics.prr.prr import _ties


def prr_resamples(
    method: Sequence[float], target: Sequence[float], draft: Sequence[float], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap resamples of PRR and of the target–draft gap, each of shape [N_RESAMPLES];
    `method`, `target` and `draft` are aligned per-example scores of length n, resampled with the
    same indices. PRR is NaN in a resample whose target and draft means tie under the `prr` module's
    rule (equal up to a tolerance relative to their magnitude)."""
    columns = np.asarray([method, target, draft], dtype=float)
    picks = rng.integers(0, columns.shape[1], size=(N_RESAMPLES, columns.shape[1]))
    method_mean, target_mean, draft_mean = columns[:, picks].mean(axis=2)
    gap = target_mean - draft_mean
    undefined = _ties(target_mean, draft_mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        prr = np.where(undefined, np.nan, (method_mean - draft_mean) / np.where(undefined, 1.0, gap))
    return prr, gap


def _scored_columns(cell: Cell, target: Cell, draft: Cell) -> tuple[list[float], list[float], list[float]]:
    """The aligned scores of `cell`, `target` and `draft` on the examples scored in all three: an
    example without a score in one of them (an excluded judge verdict) is left out, as
    `analysis.prr_fields` leaves it out of the per-configuration tables. At least one example is
    scored in all three (else PRR is undefined and this is not asked)."""
    ids = cell["example_ids"]
    columns = (aligned(cell, "scores", ids), aligned(target, "scores", ids), aligned(draft, "scores", ids))
    rows = [row for row in zip(*columns) if all(is_scored(value) for value in row)]
    method, target_scores, draft_scores = (list(column) for column in zip(*rows))
    return method, target_scores, draft_scores


def _task_prr(cell: Cell, base: dict, seed: int, stream: int) -> dict[str, Any] | None:
    """PRR of `cell` against its baselines and its interval, as the per-configuration tables give them
    (`analysis.prr_fields`, which calls the `prr` module), the interval of the target–draft gap, and PRR
    resamples drawn from the random stream `stream` (for the difference). The gap's interval and the
    resamples are None for a single example, which has no interval. None when a baseline is missing or
    PRR is undefined (no scored example, or target and draft scores tie under the module's rule)."""
    target = base.get(("target", cell["baseline_id"]))
    draft = base.get(("draft", cell["baseline_id"]))
    if target is None or draft is None:
        return None
    fields = prr_fields(cell, target, draft, seed)
    if fields["prr"] is None:
        return None
    scores = _scored_columns(cell, target, draft)
    resampled = len(scores[0]) > 1
    return {
        "task": cell["task"],
        "acceptance_rate": cell.get("acceptance_rate"),
        "prr": fields["prr"],
        "prr_ci": fields["prr_ci"],
        "gap_ci": interval(prr_resamples(*scores, np.random.default_rng(seed))[1]) if resampled else None,
        "samples": prr_resamples(*scores, np.random.default_rng([seed, stream]))[0] if resampled else None,
    }


def _difference(safety: dict[str, Any], utility: dict[str, Any]) -> tuple[list[float] | None, int]:
    """The interval of utility PRR − safety PRR from the two tasks' resamples, and how many resamples
    were undefined (PRR undefined on either task); no interval when a task has no resamples."""
    if safety["samples"] is None or utility["samples"] is None:
        return None, 0
    difference = utility["samples"] - safety["samples"]
    return interval(difference), int(np.isnan(difference).sum())


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
                difference_ci, undefined_resamples = _difference(safety, utility)
                rows.append(
                    {
                        "config": config,
                        "safety": {key: value for key, value in safety.items() if key != "samples"},
                        "utility": {key: value for key, value in utility.items() if key != "samples"},
                        "difference": utility["prr"] - safety["prr"],
                        "difference_ci": difference_ci,
                        "undefined_resamples": undefined_resamples,
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
