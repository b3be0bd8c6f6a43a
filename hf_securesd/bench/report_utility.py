"""The utility section of `securesd report`: per utility task with 0/1 scores (GSM8K exact match,
HumanEval pass@1), each configuration's score and PRR with their intervals and its paired flips
against the target-only run on the same problems (*lost* = the target solved the problem and the
configuration did not, *gained* = the reverse), from the rows `report_safety.flip_rows` builds for
utility tasks. Every number comes from the recorded cells of `runs.jsonl`."""

from __future__ import annotations

from typing import Any, Sequence

from hf_securesd.bench.analysis import mean_ci
from hf_securesd.bench.formatting import fmt, fmt_ci, table


def utility_section(rows: Sequence[dict[str, Any]], base: dict, seed: int = 0) -> list[str]:
    """The per-configuration utility tables (one per task, size and length), or nothing without rows.

    rows: `flip_rows(cells, base, seed, kind="utility")`; base: the baselines by (kind, baseline_id)."""
    if not rows:
        return []
    lines = [
        "## Utility per configuration: score, PRR and paired flips against the target",
        "",
        "Flips compare each problem's outcome with the target-only run on the same problem: *lost* = the "
        "target solved it and this configuration did not, *gained* = the reverse. Counts with exact "
        "Clopper–Pearson 95 % intervals of the rate over all problems; p = exact McNemar test (binomial "
        "test on the discordant problems). Score and PRR intervals: 95 % percentile bootstrap over problems.",
        "",
    ]
    for baseline_id in dict.fromkeys(row["baseline_id"] for row in rows):
        task_rows = [row for row in rows if row["baseline_id"] == baseline_id]
        first = task_rows[0]
        target = base[("target", baseline_id)]
        metric = target.get("metric") or "score"
        header = (f"### {first['task']}, {first['n']} problems, {first['max_new_tokens']} new tokens "
                  f"(target-only {metric} {fmt_ci(*mean_ci(target['scores'], seed=seed))})")
        body = [
            [
                row["config"],
                fmt(row["acceptance_rate"]),
                fmt_ci(row["score"], row["score_ci"]),
                "–" if row["config"] == "draft" else fmt_ci(row["prr"], row["prr_ci"]),
                f"{row['flips']['n_lost']} ({fmt_ci(row['flips']['lost_rate'], row['flips']['lost_rate_ci'])})",
                f"{row['flips']['n_gained']} ({fmt_ci(row['flips']['gained_rate'], row['flips']['gained_rate_ci'])})",
                f"{row['flips']['mcnemar_pvalue']:.3g}",
            ]
            for row in task_rows
        ]
        lines += [
            header,
            "",
            table(["configuration", "AR", f"{metric} [95% CI]", "PRR [95% CI]", "lost: solved→failed",
                   "gained: failed→solved", "McNemar p"], body),
            "",
        ]
    return lines
