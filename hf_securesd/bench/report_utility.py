"""The utility section of `securesd report`: per utility task with 0/1 scores (GSM8K exact match,
HumanEval pass@1), each configuration's score and PRR with their intervals, its paired flips against
the target-only run on the same problems (*lost* = the target solved the problem and the
configuration did not, *gained* = the reverse), and where its replies part from the target's: how
many are the target's reply exactly, and the median length of the text they share with it from the
start. Every number comes from the recorded cells of `runs.jsonl`."""

from __future__ import annotations

import os
import statistics
from typing import Any, Sequence

from hf_securesd.bench.analysis import Cell, aligned, score_ci
from hf_securesd.bench.formatting import fmt, fmt_ci, table
from hf_securesd.bench.report_markdown import inline_text
from hf_securesd.bench.report_safety import excluded_note, flip_cells, flip_rows


def utility_rows(cells: Sequence[Cell], base: dict, seed: int = 0) -> list[dict[str, Any]]:
    """`flip_rows` of the utility cells, each with `same_reply` (replies equal to the target's on the
    same problem) and `shared_prefix_median` (median over problems of the length, in characters, of
    the longest common prefix of the reply and the target's)."""
    by_name = {cell["cell"]: cell for cell in cells}
    rows = flip_rows(cells, base, seed, kind="utility")
    for row in rows:
        cell = by_name[row["cell"]]
        ids = cell["example_ids"]
        targets = aligned(base[("target", row["baseline_id"])], "responses", ids)
        shared = [len(os.path.commonprefix([reply, target])) for reply, target in zip(cell["responses"], targets)]
        row["same_reply"] = sum(reply == target for reply, target in zip(cell["responses"], targets))
        row["shared_prefix_median"] = statistics.median(shared)
    return rows


def utility_section(rows: Sequence[dict[str, Any]], base: dict, seed: int = 0) -> list[str]:
    """The per-configuration utility tables (one per task, size and length), or nothing without rows.

    rows: `utility_rows(cells, base, seed)`; base: the baselines by (kind, baseline_id)."""
    if not rows:
        return []
    lines = [
        "## Utility per configuration: score, PRR and paired flips against the target",
        "",
        "Flips compare each problem's outcome with the target-only run on the same problem: *lost* = the "
        "target solved it and this configuration did not, *gained* = the reverse. Counts with exact "
        "Clopper–Pearson 95 % intervals of the rate over all problems; p = exact McNemar test (binomial "
        "test on the discordant problems). Score intervals: exact Clopper–Pearson 95 %; PRR intervals: 95 % "
        "percentile bootstrap over problems. "
        "*Same reply*: replies equal to the target's; *shared start*: the median number of characters a "
        "reply shares with the target's from its beginning (0 = it parts at the first character).",
        "",
    ]
    for baseline_id in dict.fromkeys(row["baseline_id"] for row in rows):
        task_rows = [row for row in rows if row["baseline_id"] == baseline_id]
        first = task_rows[0]
        target = base[("target", baseline_id)]
        metric = target.get("metric") or "score"
        header = (f"### {inline_text(first['task'])}, {first['n']} problems, {first['max_new_tokens']} new tokens "
                  f"(target-only {inline_text(metric)} {fmt_ci(*score_ci(target['scores'], seed=seed))})")
        body = [
            [
                inline_text(row["config"]),
                fmt(row["acceptance_rate"]),
                fmt_ci(row["score"], row["score_ci"]),
                "–" if row["config"] == "draft" else fmt_ci(row["prr"], row["prr_ci"]),
                *flip_cells(row["flips"], flip_rate=False),
                f"{row['same_reply']}/{row['n']}",
                f"{row['shared_prefix_median']:g}",
            ]
            for row in task_rows
        ]
        lines += [
            header,
            "",
            table(["configuration", "AR", f"{inline_text(metric)} [95% CI]", "PRR [95% CI]", "lost: solved→failed",
                   "gained: failed→solved", "McNemar p", "same reply", "shared start (chars)"], body),
            "",
            *excluded_note(task_rows, "problems"),
        ]
    return lines
