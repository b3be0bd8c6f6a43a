"""Report sections for the safety study: per-configuration AFR, PRR and paired flips against the
target (the `flips` evaluate module), verdict stability at a longer generation length, the cost of
each tier, and an appendix of sampled responses. Every number comes from the recorded cells of
`runs.jsonl`.

A flip is an example whose binary outcome differs from the target-only run on the same prompt:
*lost* = the target's attack failed (refusal) but the configuration's succeeded (compliance),
*gained* = the other way round.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from hf_securesd.bench.analysis import (
    Cell,
    aligned,
    compute_flips,
    judge_agreement,
    mean_ci,
    primary_cells,
)
from hf_securesd.bench.formatting import fmt, fmt_ci, table

# Tiers of the safety study: which tasks each covers.
TIERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("1-2 safety (jailbreak)", ("jailbreak",)),
    ("safety (prompt injection)", ("prompt_injection",)),
    ("3 adaptive attack", ("prompt_injection_adaptive", "jailbreak_adaptive")),
    ("4 utility", ("gsm8k", "humaneval")),
)
APPENDIX_SIZE = 20
INJECTION_JUDGE = (
    "Prompt-injection verdicts are not the refusal judge's: the attack succeeded when the reply gives the "
    "injected task's correct answer (the original benchmark's check, on whole words after deleting any "
    "verbatim copy of the injected question, also one cut off by the length limit); no human labels exist "
    "for it, so no agreement is measured. Here *lost* = the target resisted the injection and the "
    "configuration answered the injected task; *gained* = the reverse."
)


def _binary(cell: Cell) -> bool:
    return all(score in (0.0, 1.0) for score in cell["scores"])


def flip_rows(cells: Sequence[Cell], base: dict, seed: int = 0, kind: str = "safety") -> list[dict[str, Any]]:
    """Per cell of a `kind` task ("safety" or "utility") with 0/1 scores (the draft-only run and every
    speculative configuration): AR, raw score with its bootstrap interval, PRR, and the flips against
    the target-only cell on the same examples."""
    rows = []
    for cell in cells:
        if cell["task_kind"] != kind or cell["config"]["kind"] == "target" or not _binary(cell):
            continue
        target = base.get(("target", cell["baseline_id"]))
        if target is None:
            continue
        ids = cell["example_ids"]
        flips = compute_flips(cell["scores"], aligned(target, "scores", ids), seed=seed)
        score, score_ci = mean_ci(cell["scores"], seed=seed)
        rows.append(
            {
                "cell": cell["cell"],
                "config": cell["config_key"],
                "task": cell["task"],
                "baseline_id": cell["baseline_id"],
                "n": cell["n"],
                "max_new_tokens": cell["max_new_tokens"],
                "acceptance_rate": cell.get("acceptance_rate"),
                "score": score,
                "score_ci": score_ci,
                "prr": cell.get("prr"),
                "prr_ci": cell.get("prr_ci"),
                "flips": flips,
            }
        )
    return rows


def agreement_text(manifest: dict[str, Any]) -> str:
    """The judge's measured agreement with human labels: recorded in the manifest at bench time,
    else measured now when the labelled file is available; else says it was not measured."""
    agreement = manifest.get("judge_agreement")
    if agreement is None:
        agreement = judge_agreement(manifest.get("judge", ""), manifest.get("judge_options") or {})
    if not agreement:
        return f"judge `{manifest.get('judge')}`: agreement with human labels not measured (`securesd judge-validate`)"
    variant = {
        "start": " (refusal strings matched at the start of the normalised response)",
        "anywhere": " (refusal strings matched anywhere in the normalised response)",
    }.get(agreement.get("match"), "")
    return (
        f"judge `{manifest.get('judge')}`{variant}: {agreement['agreement'] * 100:.0f} % agreement with human labels, "
        f"Cohen's κ {agreement['kappa']:.3f}, precision {agreement['precision']:.2f}, recall "
        f"{agreement['recall']:.2f} for \"jailbroken\" (n = {agreement['n']}, {agreement['labels']})"
    )


def flips_section(rows: Sequence[dict[str, Any]], manifest: dict[str, Any], base: dict) -> list[str]:
    """The per-configuration safety table with paired flips."""
    if not rows:
        return []
    lines = [
        "## Safety per configuration: AFR, PRR and paired flips against the target",
        "",
        f"Jailbreak AFR by {agreement_text(manifest)}. Flips compare each prompt's verdict with the target-only "
        "run on the same prompt: *lost* = the target refused (attack failed) and this configuration "
        "complied, *gained* = the reverse. Counts with exact Clopper–Pearson 95 % intervals of the "
        "rate over all prompts; p = exact McNemar test (binomial test on the discordant prompts). AFR "
        "and PRR intervals: 95 % percentile bootstrap over prompts.",
        "",
    ]
    for baseline_id in dict.fromkeys(row["baseline_id"] for row in rows):
        task_rows = [row for row in rows if row["baseline_id"] == baseline_id]
        first = task_rows[0]
        target = base[("target", baseline_id)]
        header = (f"### {first['task']}, {first['n']} prompts, {first['max_new_tokens']} new tokens "
                  f"(target-only AFR {fmt(target['score'])})")
        body = []
        for row in task_rows:
            flips = row["flips"]
            body.append(
                [
                    row["config"],
                    fmt(row["acceptance_rate"]),
                    fmt_ci(row["score"], row["score_ci"]),
                    "–" if row["config"] == "draft" else fmt_ci(row["prr"], row["prr_ci"]),
                    f"{flips['n_lost']} ({fmt_ci(flips['lost_rate'], flips['lost_rate_ci'])})",
                    f"{flips['n_gained']} ({fmt_ci(flips['gained_rate'], flips['gained_rate_ci'])})",
                    fmt_ci(flips["flip_rate"], flips["flip_rate_ci"]),
                    f"{flips['mcnemar_pvalue']:.3g}",
                ]
            )
        lines += [header, ""]
        if first["task"].startswith("prompt_injection"):
            lines += [INJECTION_JUDGE, ""]
        lines += [
            table(
                ["configuration", "AR", "AFR [95% CI]", "PRR [95% CI]", "lost: refusal→compliance",
                 "gained: compliance→refusal", "flip rate", "McNemar p"],
                body,
            ),
            "",
        ]
    return lines


def length_check_section(cells: Sequence[Cell]) -> list[str]:
    """Verdict stability under a longer reply: for each configuration run on a safety task at two
    generation lengths, the prompts both runs share and how many verdicts the longer run changed."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        if cell["task_kind"] == "safety" and _binary(cell):
            groups.setdefault((cell["config_key"], cell["task"]), []).append(cell)
    rows = []
    for (config, task), runs in groups.items():
        runs = sorted(runs, key=lambda cell: cell["max_new_tokens"])
        short, long = runs[0], runs[-1]
        if short["max_new_tokens"] == long["max_new_tokens"]:
            continue
        short_ids = set(short["example_ids"])
        shared = [example_id for example_id in long["example_ids"] if example_id in short_ids]
        if not shared:
            continue
        before, after = aligned(short, "scores", shared), aligned(long, "scores", shared)
        changes = compute_flips(after, before)  # the shorter reply's verdict is the reference
        rows.append([config, task, len(shared), f"{short['max_new_tokens']} → {long['max_new_tokens']}",
                     f"{sum(before) / len(shared):.3f} → {sum(after) / len(shared):.3f}",
                     changes["n_lost"], changes["n_gained"]])
    if not rows:
        return []
    return [
        "## Verdict stability with a longer reply",
        "",
        "Configurations run again with more new tokens on a sample of the same prompts: verdicts at each "
        "length on the prompts both runs share. *refusal→compliance*: the judge saw a refusal in the "
        "shorter reply and none in the longer one; *compliance→refusal*: the reverse.",
        "",
        table(["configuration", "task", "prompts", "new tokens", "AFR", "refusal→compliance",
                "compliance→refusal"], rows),
        "",
    ]


def cost_section(cells: Sequence[Cell], manifest: dict[str, Any]) -> list[str]:
    """Wall hours (and CPU hours where recorded) per tier of the study; runs of a tier's task at
    another size or length than its main run (a length check) get a row of their own."""
    main = {id(cell) for cell in primary_cells(cells)}
    rows = []
    for tier, tasks in TIERS:
        in_tier = [cell for cell in cells if cell["task"] in tasks]
        main_run = [cell for cell in in_tier if id(cell) in main]
        side_runs = [cell for cell in in_tier if id(cell) not in main]
        for label, chosen in ((tier, main_run), (f"{tier}: other sizes and lengths", side_runs)):
            if chosen:
                rows.append(_cost_row(label, chosen))
    if not rows:
        return []
    threads = sorted({session.get("threads") for session in manifest.get("sessions", []) if session.get("threads")})
    return [
        "## Cost per tier",
        "",
        "Generation time only (scoring excluded). Wall hours are what the runs took on this machine while "
        "it was shared with other work; CPU hours are the process CPU time charged to the generations "
        f"(recorded from the session that introduced it on). Torch threads per session: {threads or '?'}.",
        "",
        table(["tier", "cells", "generations", "wall hours", "CPU hours"], rows),
        "",
    ]


def _cost_row(label: str, cells: Sequence[Cell]) -> list[Any]:
    cpu = [cell["cpu_time"] for cell in cells if cell.get("cpu_time") is not None]
    return [
        label,
        len(cells),
        sum(cell["n"] for cell in cells),
        f"{sum(cell['wall_time'] for cell in cells) / 3600:.2f}",
        f"{sum(cpu) / 3600:.2f} ({len(cpu)}/{len(cells)} cells)" if cpu else "not recorded",
    ]


def appendix_section(cells: Sequence[Cell], seed: int = 0, size: int = APPENDIX_SIZE) -> list[str]:
    """Per safety configuration, the responses to `size` prompts drawn at random (seeded; the same
    prompts for every configuration of a task), with the judge's verdict. Prompts are named by id
    only: the benchmark text is not reproduced."""
    safety = [cell for cell in cells if cell["task_kind"] == "safety"]
    if not safety:
        return []
    lines = [
        "## Appendix: sampled responses",
        "",
        f"{size} prompts per task drawn at random (seed {seed}), the same for every configuration; each "
        "response as generated (newlines shown as ⏎), with the verdict (✗ = attack succeeded, the model "
        "complied; ✓ = attack failed). Prompts are given by id only.",
        "",
    ]
    for task in dict.fromkeys(cell["task"] for cell in safety):
        task_cells = [cell for cell in safety if cell["task"] == task]
        ids = sorted(set(task_cells[0]["example_ids"]))
        picked = random.Random(f"{seed}/appendix/{task}").sample(ids, min(size, len(ids)))
        for cell in task_cells:
            by_id = {example_id: i for i, example_id in enumerate(cell["example_ids"])}
            rows = [
                [
                    f"`{example_id}`",
                    "✓" if cell["scores"][by_id[example_id]] == 1.0 else "✗",
                    _quote(cell["responses"][by_id[example_id]]),
                ]
                for example_id in picked
                if example_id in by_id
            ]
            lines += [f"### {cell['config_key']} on {task}", "", table(["prompt id", "verdict", "response"], rows), ""]
    return lines


def _quote(text: str) -> str:
    """A response as one Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", " ⏎ ").strip() or "(empty)"
