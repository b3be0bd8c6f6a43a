"""Report sections for the safety study: per-configuration AFR, PRR and paired flips against the
target (the `flips` evaluate module), verdict stability at a longer generation length, the cost of
each tier, and an appendix of sampled responses. Every number comes from the recorded cells of
`runs.jsonl`.

A flip is an example whose binary outcome differs from the target-only run on the same prompt:
*lost* = the target's attack failed (refusal) but the configuration's succeeded (compliance),
*gained* = the other way round. An example whose verdict the judge's `unparsed=exclude` policy left
out (a NaN score) in either run is left out of that comparison, and the tables say how many were.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

from hf_securesd.bench.analysis import (
    Cell,
    aligned,
    compute_flips,
    is_scored,
    judge_agreement,
    primary_cells,
    score_ci,
)
from hf_securesd.bench.formatting import fmt, fmt_ci, table
from hf_securesd.bench.report_markdown import code_span, inline_text, table_code
from hf_securesd.bench.results import CORRUPT_FIX, MANIFEST, CorruptResultsError

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
    """Whether every score of `cell` is 0, 1 or excluded (NaN)."""
    return all(score in (0.0, 1.0) for score in cell["scores"] if is_scored(score))


def flip_cells(flips: dict[str, Any] | None, flip_rate: bool = True) -> list[str]:
    """The lost, gained, flip-rate (unless `flip_rate` is False) and McNemar cells of a table row;
    "–" in each when no pair was left."""
    if flips is None:
        return ["–"] * (4 if flip_rate else 3)
    rate = [fmt_ci(flips["flip_rate"], flips["flip_rate_ci"])] if flip_rate else []
    return [
        f"{flips['n_lost']} ({fmt_ci(flips['lost_rate'], flips['lost_rate_ci'])})",
        f"{flips['n_gained']} ({fmt_ci(flips['gained_rate'], flips['gained_rate_ci'])})",
        *rate,
        f"{flips['mcnemar_pvalue']:.3g}",
    ]


def excluded_note(rows: Sequence[dict[str, Any]], unit: str = "prompts") -> list[str]:
    """A line naming, per configuration, the examples left out of its flips because a verdict was
    excluded in it or in the target (nothing when none was)."""
    counts = [(row["config"], row["excluded"]) for row in rows if row["excluded"]]
    if not counts:
        return []
    listed = ", ".join(f"{inline_text(config)} {count}" for config, count in counts)
    return [f"{unit.capitalize()} left out of the flips because the judge's `unparsed=exclude` policy excluded "
            f"their verdict in the configuration or in the target: {listed}.", ""]


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
        flips = compute_flips(cell["scores"], aligned(target, "scores", ids))
        score, interval = score_ci(cell["scores"], seed=seed)
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
                "score_ci": interval,
                "prr": cell.get("prr"),
                "prr_ci": cell.get("prr_ci"),
                "flips": flips,
                "excluded": len(ids) if flips is None else flips["n_excluded"],
            }
        )
    return rows


def agreement_text(manifest: dict[str, Any]) -> str:
    """The judge's measured agreement with human labels: recorded in the manifest at bench time,
    else measured now when the labelled file is available; else says it was not measured."""
    agreement = manifest.get("judge_agreement")
    if agreement is None:
        agreement = _measured_agreement(manifest)
    if not agreement:
        return (f"judge {code_span(str(manifest.get('judge')))}: agreement with human labels not measured "
                "(`securesd judge-validate`)")
    variant = {
        "start": " (refusal strings matched at the start of the normalised response)",
        "anywhere": " (refusal strings matched anywhere in the normalised response)",
    }.get(agreement.get("match"), "")
    share = agreement["agreement"]
    return (
        f"judge {code_span(str(manifest.get('judge')))}{variant}: "
        f"{'–' if share is None or not math.isfinite(share) else f'{share * 100:.0f} %'} agreement with human labels, "
        f"Cohen's κ {fmt(agreement['kappa'], 3)}, precision {fmt(agreement['precision'], 2)}, recall "
        f"{fmt(agreement['recall'], 2)} for \"jailbroken\" (n = {agreement['n']}, "
        f"{inline_text(str(agreement['labels']))})"
    )


def _measured_agreement(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """`judge_agreement` of the recorded judge built with the recorded options; options it does not
    take, or values it refuses, are a `CorruptResultsError` naming study.json's 'judge_options'."""
    options = manifest.get("judge_options") or {}
    try:
        return judge_agreement(manifest.get("judge", ""), options)
    except ValueError as error:
        raise CorruptResultsError(f"{MANIFEST}: 'judge_options' {options!r} cannot build the recorded judge "
                                  f"({error}); {CORRUPT_FIX}") from None


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
        "intervals: exact Clopper–Pearson 95 %; PRR intervals: 95 % percentile bootstrap over prompts.",
        "",
    ]
    for baseline_id in dict.fromkeys(row["baseline_id"] for row in rows):
        task_rows = [row for row in rows if row["baseline_id"] == baseline_id]
        first = task_rows[0]
        target = base[("target", baseline_id)]
        header = (f"### {inline_text(first['task'])}, {first['n']} prompts, {first['max_new_tokens']} new tokens "
                  f"(target-only AFR {fmt(target['score'])})")
        body = [
            [
                inline_text(row["config"]),
                fmt(row["acceptance_rate"]),
                fmt_ci(row["score"], row["score_ci"]),
                "–" if row["config"] == "draft" else fmt_ci(row["prr"], row["prr_ci"]),
                *flip_cells(row["flips"]),
            ]
            for row in task_rows
        ]
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
            *excluded_note(task_rows),
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
        # the shorter reply's verdict is the reference
        changes = compute_flips(aligned(long, "scores", shared), aligned(short, "scores", shared))
        if changes is None:
            continue
        rows.append([inline_text(config), inline_text(task), _prompts_text(changes),
                     f"{short['max_new_tokens']} → {long['max_new_tokens']}",
                     f"{changes['reference_rate']:.3f} → {changes['method_rate']:.3f}",
                     changes["n_lost"], changes["n_gained"]])
    if not rows:
        return []
    return [
        "## Verdict stability with a longer reply",
        "",
        "Configurations run again with more new tokens on a sample of the same prompts: verdicts at each "
        "length on the prompts both runs share. *refusal→compliance*: the judge saw a refusal in the "
        "shorter reply and none in the longer one; *compliance→refusal*: the reverse. Prompts whose verdict "
        "was excluded (judge policy `unparsed=exclude`) at either length are left out and counted.",
        "",
        table(["configuration", "task", "prompts", "new tokens", "AFR", "refusal→compliance",
                "compliance→refusal"], rows),
        "",
    ]


def _prompts_text(flips: dict[str, Any]) -> str:
    """The prompts a comparison counted, with those it left out when any were."""
    if not flips["n_excluded"]:
        return str(flips["n_examples"])
    return f"{flips['n_examples']} ({flips['n_excluded']} excluded)"


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
    return [
        "## Cost per tier",
        "",
        "Generation time only (scoring excluded). Wall hours are what the runs took on this machine while "
        "it was shared with other work; CPU hours are the process CPU time charged to the generations "
        "(recorded from the session that introduced it on). Torch threads per session: "
        f"{_threads_text(manifest)}.",
        "",
        table(["tier", "cells", "generations", "wall hours", "CPU hours"], rows),
        "",
    ]


def _threads_text(manifest: dict[str, Any]) -> str:
    """The torch thread counts the sessions recorded (positive integers, `manifest_checks`), each
    shown as inert text; "?" when none recorded one."""
    sessions = manifest.get("sessions", [])
    counts = sorted({session["threads"] for session in sessions if session.get("threads")})
    return ", ".join(inline_text(str(count)) for count in counts) or "?"


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
        f"response as generated (newlines shown as ⏎; markup shown as text, never rendered; cut after "
        f"{APPENDIX_RESPONSE_CHARS:,} characters), with the verdict "
        "(✗ = attack succeeded, the model complied; ✓ = attack failed; – = verdict excluded by the judge's "
        "`unparsed` policy). Prompts are given by id only (an id cut after "
        f"{APPENDIX_ID_CHARS} characters).",
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
                    _prompt_id(example_id),
                    _verdict_mark(cell["scores"][by_id[example_id]]),
                    _quote(cell["responses"][by_id[example_id]]),
                ]
                for example_id in picked
                if example_id in by_id
            ]
            lines += [f"### {inline_text(cell['config_key'])} on {inline_text(task)}", "",
                      table(["prompt id", "verdict", "response"], rows), ""]
    return lines


def _verdict_mark(score: float | None) -> str:
    """✓ attack failed, ✗ attack succeeded, – verdict excluded."""
    if not is_scored(score):
        return "–"
    return "✓" if score == 1.0 else "✗"


APPENDIX_RESPONSE_CHARS = 8_000  # of a response shown in the appendix (a few thousand tokens' worth)
APPENDIX_ID_CHARS = 200  # of a prompt id shown in the appendix (the benchmarks' ids are under 100)


def _prompt_id(example_id: str) -> str:
    """A prompt id as one table cell (`table_code`), cut after `APPENDIX_ID_CHARS` characters with the
    count of those left out (an id is repeated for every configuration of its task)."""
    if len(example_id) <= APPENDIX_ID_CHARS:
        return table_code(example_id)
    return f"{table_code(example_id[:APPENDIX_ID_CHARS])} … ({len(example_id) - APPENDIX_ID_CHARS:,} more characters)"


def _quote(text: str) -> str:
    """A response as one Markdown table cell, shown as text (`inline_text`), cut after
    `APPENDIX_RESPONSE_CHARS` characters with the count of those left out (a results directory holding a
    50 MB response made a 120 MB report)."""
    if len(text) <= APPENDIX_RESPONSE_CHARS:
        return inline_text(text) or "(empty)"
    left_out = len(text) - APPENDIX_RESPONSE_CHARS
    return f"{inline_text(text[:APPENDIX_RESPONSE_CHARS])} … ({left_out:,} more characters)"
