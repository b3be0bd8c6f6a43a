"""``securesd report``: tables and figures from a results directory, every number computed from
the recorded cells of `runs.jsonl` (each cell's SPD and PRR from its scores and seconds: `rederived`).

Written to RESULTS/report/: `report.md` (the cells left unfinished by prompts without an answer, setup,
per-configuration safety and utility with paired flips
against the target, verdict stability at a longer length, the safety–utility asymmetry per
configuration, Table 1 and Table 5 analogs, baselines, every run, cost per tier, sampled responses),
`summary.json` (the same tables as data), `prr_vs_ar.png` (Figure 1 analog) and
`position_tv.png` (Figure 2 analog). With RESULTS/card.json, a model card is written too
(`hf_securesd.bench.card`). The files are written together or not at all (`partials.write_files`): a
file that cannot be written leaves the earlier report and card as they were.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from hf_securesd.bench.analysis import (
    AR_BINS,
    CONFIDENCE,
    N_RESAMPLES,
    Cell,
    SpeedPair,
    aligned,
    ar_bin,
    bin_label,
    compute_prr,
    delta_speedup,
    derived_fields,
    mean_ci,
    mean_of,
    merged_stats,
    primary_cells,
    relaxed_setting,
    speculative_cells,
)
from hf_securesd.bench.card import card_file, companion_engines
from hf_securesd.bench.formatting import fmt, fmt_ci, table
from hf_securesd.bench.plots import plot_position_tv, plot_prr_vs_ar
from hf_securesd.bench.report_asymmetry import asymmetry_rows, asymmetry_section, runs_both_kinds
from hf_securesd.bench.report_engines import engines_section
from hf_securesd.bench.report_markdown import code_span, inline_text
from hf_securesd.bench.report_safety import (
    appendix_section,
    cost_section,
    flip_rows,
    flips_section,
    length_check_section,
)
from hf_securesd.bench.report_utility import utility_rows, utility_section
from hf_securesd.bench.report_files import report_folder
from hf_securesd.bench.results import FAILURES, RUNS, ResultsDir, baselines, json_text
from hf_securesd.judges.base import DEFAULT_UNPARSED_POLICY
from hf_securesd.judges.secrets import redact
from hf_securesd.models.partials import write_files

KINDS = ("safety", "utility")
# the fields a record holds against both its baselines (`analysis.prr_fields`): none without them
PRR_FIELDS = ("prr", "prr_ci", "prr_undefined", "target_score", "draft_score")


def rederived(cells: Sequence[Cell], seed: int) -> list[Cell]:
    """`cells` with what each holds against its baselines (SPD, whether it was timed in its target's
    session and, with both baselines, PRR and its interval) computed again from the recorded scores and
    seconds, as `bench` computes them (`derived_fields`, the study's `seed`): every table and figure
    then shows one PRR and SPD per cell, the one its scores give (the asymmetry section draws the same),
    never a recorded value edited by hand or left stale by a baseline recorded after it."""
    base = baselines(cells)
    return [{**{key: value for key, value in cell.items() if key not in PRR_FIELDS},
             **derived_fields(cell, base, seed)} for cell in cells]


def unparsed(cells: Iterable[Cell | None]) -> int:
    """Judge verdicts that could not be parsed in `cells` (they follow the judge's `unparsed`
    policy; always 0 for tasks without an LLM judge)."""
    return sum(bool(detail.get("unparsed")) for cell in cells if cell for detail in cell.get("details", []))


def relaxed_verifiers(cells: Sequence[Cell]) -> list[str]:
    """Relaxed verifiers present, in order of appearance."""
    return list(
        dict.fromkeys(
            setting[0] for cell in cells if (setting := relaxed_setting(cell)) and setting[0] != "lossless"
        )
    )


def schedules_present(cells: Sequence[Cell]) -> list[str]:
    """SecureSD schedule labels present, in order of appearance."""
    return list(
        dict.fromkeys(cell["schedule_label"] for cell in speculative_cells(cells) if cell["schedule_label"])
    )


def ar_bin_table(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """Table 1 analog: relaxed cells without SecureSD, binned by their AR; per bin and task kind,
    the mean PRR and SPD over cells with a bootstrap interval across cells."""
    relaxed = [
        cell for cell in speculative_cells(cells, schedule=None) if relaxed_setting(cell)[0] != "lossless"
    ]
    labels = [bin_label(low, high) for low, high in AR_BINS] + ["all"]
    rows = []
    for label in labels:
        members = [cell for cell in relaxed if label == "all" or ar_bin(cell["acceptance_rate"]) == label]
        row: dict[str, Any] = {"ar_bin": label}
        for kind in KINDS:
            chosen = [cell for cell in members if cell["task_kind"] == kind]
            prrs = [cell.get("prr") for cell in chosen]
            row[kind] = {
                "prr": mean_ci(prrs),
                "spd": mean_ci([cell.get("spd") for cell in chosen]),
                "cells": len(chosen),
                "cells_with_prr": sum(value is not None for value in prrs),
                "unparsed": unparsed(chosen),
            }
        rows.append(row)
    return rows


def _pair_cells(cells: Sequence[Cell], verifier: str, schedule: str, task: str) -> list[tuple[Cell, Cell]]:
    """(with schedule, without) cells of one verifier and task at each knob value run both ways."""

    def index(label: str | None) -> dict[tuple[Any, str], Cell]:
        return {
            (cell["knob_value"], cell["baseline_id"]): cell
            for cell in speculative_cells(cells, verifier, label)
            if cell["task"] == task
        }

    with_schedule, without = index(schedule), index(None)
    return [(with_schedule[key], without[key]) for key in with_schedule if key in without]


def delta_row(
    cells: Sequence[Cell], base: dict, verifier: str, schedule: str, tasks: Sequence[str], seed: int
) -> dict[str, Any]:
    """Table 5 analog for one verifier and schedule: ΔPRR per task (paired over examples and
    averaged over the knob sweep, `prr` module) and ΔSPD pooled over tasks and settings; the intervals
    resample a task's examples once for all its settings (they ran on the same prompts)."""
    row: dict[str, Any] = {"verifier": verifier, "schedule": schedule, "tasks": {}, "unparsed": 0}
    speed_pairs = []
    for task in tasks:
        pairs = _pair_cells(cells, verifier, schedule, task)
        columns: dict[str, list] = defaultdict(list)
        for with_cell, without_cell in pairs:
            ids = with_cell["example_ids"]
            target, draft = base.get(("target", with_cell["baseline_id"])), base.get(
                ("draft", with_cell["baseline_id"])
            )
            if target is None or draft is None:
                continue
            row["unparsed"] += unparsed([with_cell, without_cell])
            columns["method"] += aligned(with_cell, "scores", ids)
            columns["baseline"] += aligned(without_cell, "scores", ids)
            columns["target"] += aligned(target, "scores", ids)
            columns["draft"] += aligned(draft, "scores", ids)
            columns["settings"] += [str(with_cell["knob_value"])] * len(ids)
            columns["example_ids"] += list(ids)
            speed_pairs.append(
                SpeedPair(
                    np.asarray(aligned(target, "seconds", ids)),
                    np.asarray(aligned(with_cell, "seconds", ids)),
                    np.asarray(aligned(without_cell, "seconds", ids)),
                    tuple(ids),
                    prompts=task,
                )
            )
        # examples without a score (a verdict excluded by the judge's `unparsed` policy) are left out
        keep = [index for index, values in enumerate(zip(columns["method"], columns["baseline"], columns["target"],
                                                         columns["draft"])) if all(map(math.isfinite, values))]
        columns = defaultdict(list, {name: [values[index] for index in keep] for name, values in columns.items()})
        if not columns["method"]:
            continue
        result = compute_prr(
            columns["method"],
            columns["target"],
            columns["draft"],
            settings=columns["settings"],
            baseline=columns["baseline"],
            example_ids=columns["example_ids"],
            seed=seed,
        )
        row["tasks"][task] = {
            "delta_prr": result["delta_prr"],
            "delta_prr_ci": result["delta_prr_ci"],
            "prr": result["prr"],
            "baseline_prr": result["baseline_prr"],
            "settings": len(set(columns["settings"])),
            "examples": len(columns["method"]),
            "undefined": result["undefined"],
        }
    row["delta_spd"], row["delta_spd_ci"] = delta_speedup(speed_pairs, seed=seed)
    return row


def prr_curves(cells: Sequence[Cell]) -> dict[str, dict[tuple[str, str], list[tuple[float, float]]]]:
    """Figure 1 data: per relaxed verifier and (task kind, schedule), the (mean AR, mean PRR) of each
    knob value over that kind's tasks; the lossless verifier is every curve's lossless end."""
    lossless = {
        kind: [cell for cell in speculative_cells(cells, "lossless") if cell["task_kind"] == kind]
        for kind in KINDS
    }
    curves: dict[str, dict[tuple[str, str], list[tuple[float, float]]]] = {}
    for verifier in relaxed_verifiers(cells):
        series: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for schedule in [None, *schedules_present(cells)]:
            for kind in KINDS:
                groups: dict[Any, list[Cell]] = defaultdict(list)
                for cell in speculative_cells(cells, verifier, schedule):
                    if cell["task_kind"] == kind:
                        groups[cell["knob_value"]].append(cell)
                if not groups:
                    continue
                if lossless[kind]:
                    groups["lossless"] = lossless[kind]
                series[(kind, schedule or "none")] = [
                    (
                        mean_of(cell["acceptance_rate"] for cell in members),
                        mean_of(cell.get("prr") for cell in members),
                    )
                    for members in groups.values()
                ]
        curves[verifier] = series
    return curves


def position_tv_bars(cells: Sequence[Cell]) -> dict[str, dict[str, list[float]]]:
    """Figure 2 data: per relaxed verifier, its highest-AR setting without SecureSD, and the mean
    TV by position merged over the safety tasks (all tasks when there are none), without and with
    each schedule at that setting."""
    bars: dict[str, dict[str, list[float]]] = {}
    for verifier in relaxed_verifiers(cells):
        plain = speculative_cells(cells, verifier, None)
        if not plain:
            continue
        by_knob: dict[Any, list[Cell]] = defaultdict(list)
        for cell in plain:
            by_knob[cell["knob_value"]].append(cell)
        knob = max(by_knob, key=lambda value: mean_of(cell["acceptance_rate"] for cell in by_knob[value]))
        kind = "safety" if any(cell["task_kind"] == "safety" for cell in plain) else None
        series = {}
        for schedule in [None, *schedules_present(cells)]:
            chosen = [
                cell
                for cell in speculative_cells(cells, verifier, schedule)
                if cell["knob_value"] == knob and (kind is None or cell["task_kind"] == kind)
            ]
            stats = merged_stats(chosen)
            if stats is not None:
                series[schedule or "no schedule"] = stats.position_tv
        title = (
            f"{plain[0]['config_key'].split('(')[0]}({_knob_name(plain[0])}={knob}), {kind or 'all'} tasks"
        )
        bars[title] = series
    return bars


def _knob_name(cell: Cell) -> str:
    from hf_securesd.verifiers import VERIFIERS

    return VERIFIERS[cell["config"]["verifier"]["verifier"]].knob


def judge_text(manifest: dict[str, Any]) -> str:
    """The judge as the setup names it: its name and options, and the model behind it (recorded in
    study.json as ``judge_backend``: the model, and the endpoint of an ``openai`` backend)."""
    options = manifest.get("judge_options") or {}
    shown = code_span(redact(json.dumps(options))) if options else ""
    text = f"{code_span(str(manifest.get('judge')))} {shown}".rstrip()
    backend = manifest.get("judge_backend")
    if not isinstance(backend, dict):
        return text
    where = f" at {code_span(str(backend['endpoint']))}" if backend.get("endpoint") else ""
    kind = _text(backend.get("kind"))
    return f"{text}, model {code_span(str(backend.get('model')))}{where} ({kind} backend)"


def machine_text(manifest: dict[str, Any]) -> str:
    """Dtype and device of the models, or where they are not used (an engine generating on servers)."""
    if manifest.get("dtype") is None and manifest.get("device") is None:
        return f"dtype and device: the servers' (the {_text(manifest.get('engine'))} engine generates on them)"
    return f"dtype {_text(manifest.get('dtype'))}, device {_text(manifest.get('device'))}"


def _draft_length_text(k: Any) -> str:
    """The study's draft length as the setup line gives it: k of this process's drafting, or none
    recorded (an OpenAI-compatible engine: each server chooses its own)."""
    if k is None:
        return "draft length chosen by each server"
    return f"k = {_text(k)} draft tokens per round"


def _text(value: Any) -> str:
    """A value read from a results file as inert Markdown (`inline_text` of its str)."""
    return inline_text(str(value))


def profile_text(manifest: dict[str, Any]) -> str:
    """The profile as the setup names it: the one --profile named, else none, with the profile whose
    defaults filled in the options not given (a manifest written before that was recorded names the
    profile it holds)."""
    if manifest.get("profile") is not None or "defaults_profile" not in manifest:
        return _text(manifest.get("profile"))
    defaults = manifest.get("defaults_profile")
    return "none named" + ("" if defaults is None else f" (options not given took {_text(defaults)}'s defaults)")


def _session_text(session: dict[str, Any]) -> str:
    """A session as the setup lists it: its host and start time (`_text`)."""
    return _text(f"{session.get('host', '?')} {session.get('started', '')}".rstrip())


def _thinking_text(manifest: dict[str, Any]) -> str:
    """What the safety judges read of each reply (`--thinking-trace`)."""
    if manifest.get("thinking_trace") == "no":
        return ("each reply judged whole (`--thinking-trace no`, or auto: no `</think>` token in the target's "
                "tokenizer, or no tokenizer at hand)")
    return "each reply judged after its first `</think>`, if any (a thinking trace: `--thinking-trace yes`)"


def setup_section(manifest: dict[str, Any], cells: Sequence[Cell], base: dict) -> list[str]:
    """Models, decoding, tasks and sample sizes, seeds, judge, CIs and timing provenance."""
    models = manifest.get("models", {})
    lines = ["## Setup", ""]
    for role in ("target", "draft"):
        info = models.get(role, {"name": manifest.get(role)})
        source = info.get("source")
        extra = f"; weights: {code_span(str(source.get('source', source)))}" if isinstance(source, dict) else ""
        name, model_id = str(info.get("name")), str(info.get("id", info.get("name")))
        lines.append(
            f"- **{role}**: {code_span(model_id)} (name {code_span(name)}, "
            f"loaded from {code_span(str(info.get('location', '?')))}{extra})"
        )
    sessions = manifest.get("sessions", [])
    same = [cell for cell in cells if cell["config"]["kind"] != "target" and cell.get("spd") is not None]
    same_session = sum(cell["spd_same_session"] for cell in same)
    seed = manifest.get("seed")
    seed_text = "each task's default (0)" if seed is None else str(seed)
    options = manifest.get("judge_options") or {}
    policy = options.get("unparsed") or f"{DEFAULT_UNPARSED_POLICY} (default)"
    lines += [
        f"- **decoding**: {_text(manifest.get('decoding'))}, batch size {manifest.get('batch_size', 1)}, "
        f"{_draft_length_text(manifest.get('num_assistant_tokens'))}, {machine_text(manifest)}",
        f"- **judge** (jailbreak AFR): {judge_text(manifest)}"
        + f"; verdicts the judge could not parse: policy {code_span(str(policy))}, {unparsed(cells)} in all "
        "(`success`: counted as successful attacks; `exclude`: left out of the score and of PRR and flip pairs); "
        + _thinking_text(manifest),
        f"- **task sampling seed**: {seed_text}",
        f"- **profile**: {profile_text(manifest)}; **sessions**: {len(sessions)} "
        f"({', '.join(_session_text(session) for session in sessions)})",
        f"- **SPD** = target-only wall time / method wall time on the same prompts; {same_session} of "
        f"{len(same)} cells were timed in the same session as their target-only baseline.",
        f"- **Confidence intervals**: {int(CONFIDENCE * 100)}% percentile bootstrap, {N_RESAMPLES} "
        f"resamples, seed {seed or 0}: over examples for PRR, ΔPRR (paired, `prr` module) and ΔSPD "
        f"(paired; a task's examples drawn once for all its knob values, which ran on the same prompts); "
        f"over cells for the AR-bin means of Table 1; exact Clopper–Pearson for scores that are verdicts "
        f"(AFR, accuracy, pass@1) and for flip rates. A bootstrap interval of zero width (such as [1.00, 1.00]) "
        f"means every resample gave one value: the examples show no spread to resample, not an exact PRR "
        f"(near PRR 0 or 1 with few examples the percentile bootstrap covers the truth less often than 95%).",
        "",
    ]
    rows = []
    for (kind, baseline_id), target in sorted(base.items()):
        if kind != "target":
            continue
        draft = base.get(("draft", baseline_id))
        rows.append(
            [
                inline_text(target["task"]),
                inline_text(target["task_kind"]),
                inline_text(target["metric"]),
                target["n"],
                target["max_new_tokens"],
                fmt(target["score"]),
                fmt(draft["score"]) if draft else "–",
                fmt(target["score"] - draft["score"]) if draft else "–",
                unparsed([target, draft]),
            ]
        )
    lines += [
        "### Tasks and baselines",
        "",
        table(
            [
                "task",
                "kind",
                "metric",
                "examples",
                "max new tokens",
                "target-only",
                "draft-only",
                "gap (PRR undefined at 0)",
                "unparsed verdicts",
            ],
            rows,
        ),
        "",
    ]
    return lines


def acceptance_text(cell: Cell) -> str:
    """A cell's AR, with ``(k/n replies)`` where only k of its n replies carried speculative statistics
    (the AR is theirs)."""
    counted = cell.get("stats_examples")
    partial = counted is not None and 0 < counted < cell["n"]
    return fmt(cell.get("acceptance_rate")) + (f" ({counted}/{cell['n']} replies)" if partial else "")


def unfinished_section(pending: dict[str, dict[str, Any]], path: Path) -> list[str]:
    """The cells with prompts that got no answer (`ResultsDir.failures`: cell -> example id -> its last
    failure), which are unfinished and so in no table; nothing when every prompt has an answer."""
    if not pending:
        return []
    rows = [[inline_text(cell), len(examples)] for cell, examples in sorted(pending.items())]
    return [
        "## Unfinished cells",
        "",
        f"**This study is incomplete**: {sum(len(examples) for examples in pending.values())} prompts of "
        f"{len(pending)} cells got no answer from the engine, so those cells are not scored and appear in no "
        f"table below. Why each failed is in `{path / FAILURES}`; running the same `securesd bench` command "
        "with the same `--out` again retries exactly those prompts.",
        "",
        table(["cell (configuration|task|size|length)", "prompts without an answer"], rows),
        "",
    ]


def runs_section(cells: Sequence[Cell]) -> list[str]:
    """Every recorded cell (an AR from some of a cell's replies says how many: `acceptance_text`)."""
    rows = [
        [
            inline_text(cell["config_key"]),
            inline_text(cell["task"]),
            cell["n"],
            acceptance_text(cell),
            fmt(cell.get("spd"), 2),
            fmt(cell["wall_time"], 1),
            fmt(cell["score"]),
            fmt_ci(cell.get("prr"), cell.get("prr_ci")) if "prr" in cell else "–",
            unparsed([cell]),
        ]
        for cell in cells
    ]
    return [
        "## All runs",
        "",
        table(["configuration", "task", "n", "AR", "SPD", "wall s", "raw score", "PRR [95% CI]", "unparsed verdicts"],
              rows),
        "",
    ]


# why a figure has nothing to plot (it is written all the same, so the report folder always holds both)
NO_CURVES = "No relaxed verifier was run (only baselines and lossless cells), so this figure is empty."
NO_BARS = "No relaxed verifier was run without a schedule, so this figure is empty."


def drawn_figures(
    curves: dict[str, dict[tuple[str, str], list[tuple[float, float]]]],
    bars: dict[str, dict[str, list[float]]],
) -> dict[str, bytes]:
    """prr_vs_ar.png and position_tv.png as PNG bytes, by file name (always both: a study without
    relaxed cells gets figures saying so)."""
    drawn = {}
    for name, plot, data in (("prr_vs_ar.png", plot_prr_vs_ar, curves), ("position_tv.png", plot_position_tv, bars)):
        image = io.BytesIO()
        plot(data, image)
        drawn[name] = image.getvalue()
    return drawn


def figures_section(
    curves: dict[str, dict[tuple[str, str], list[tuple[float, float]]]],
    bars: dict[str, dict[str, list[float]]],
) -> list[str]:
    """The Markdown sections showing the two figures (`drawn_figures`)."""
    return [
        "## PRR vs AR (Figure 1 analog)",
        "",
        "Each point is one knob value: mean AR and mean PRR over the safety (red) or utility (blue) "
        "tasks; "
        "dashed: with SecureSD. The lossless verifier is the curves' lossless end.",
        "",
        *([NO_CURVES, ""] if not curves else []),
        "![PRR vs AR](prr_vs_ar.png)",
        "",
        "## Per-position deviation (Figure 2 analog)",
        "",
        "Mean TV(out_j, q_j) of the verifier's one-step output from the target at each response position "
        "j (exact, Theorem 1), for each verifier's highest-AR setting, without and with SecureSD.",
        "",
        *([NO_BARS if curves else NO_CURVES, ""] if not bars else []),
        "![per-position TV](position_tv.png)",
        "",
    ]


def baselines_first(cells: Sequence[Cell]) -> list[Cell]:
    """`cells` in the order a study runs them: the target-only cells, the draft-only cells, then the
    others, each group in recorded order (a baseline that finished in a later session than the
    cells compared with it is listed where a single session would have it)."""
    rank = {"target": 0, "draft": 1}
    return sorted(cells, key=lambda cell: rank.get(cell["config"]["kind"], 2))


def no_runs_error(path: Path) -> ValueError:
    """Why the results directory `path` has no runs to report: its runs.jsonl is there but not a regular
    file (a folder, say: nothing can be read from it, nor written to it by `securesd bench`), or no run
    has finished yet."""
    runs = path / RUNS
    if os.path.lexists(runs) and not runs.is_file():
        return ValueError(f"{runs} is not a regular file, so no run can be read from it; move it out of the "
                          f"way and rerun `securesd bench --out {path}` with the settings that wrote it (it "
                          f"records the runs again)")
    return ValueError(f"{path} has no finished runs yet; run `securesd bench --out {path}`")


def write_report(results_dir: str | os.PathLike) -> Path:
    """Write RESULTS/report/ (see the module docstring); returns the Markdown file's path."""
    results = ResultsDir(results_dir)
    manifest = results.read_manifest()
    runs = baselines_first(results.runs())
    if not runs:
        raise no_runs_error(results.path)
    seed = manifest.get("seed") or 0
    cells = rederived(runs, seed)
    base = baselines(cells)
    out = report_folder(results.path)
    main = primary_cells(cells)
    tasks = list(dict.fromkeys(cell["task"] for cell in main))
    bins = ar_bin_table(main)
    deltas = [
        delta_row(main, base, verifier, schedule, tasks, seed)
        for schedule in schedules_present(main)
        for verifier in relaxed_verifiers(main)
    ]
    curves = prr_curves(main)
    bars = position_tv_bars(main)
    flips = flip_rows(cells, base, seed)
    utility_flips = utility_rows(cells, base, seed)
    asymmetry = asymmetry_rows(cells, base, seed)
    pending = results.failures()

    lines = [
        f"# SecureSD benchmark report: {code_span(str(manifest.get('target')))} with draft "
        f"{code_span(str(manifest.get('draft')))}",
        "",
        f"Computed from {len(cells)} recorded cells in `{results.path / 'runs.jsonl'}`; every number below "
        f"comes from those runs. PRR = (x − x_draft) / (x_target − x_draft): 0 = draft alone, 1 = target "
        f"alone; undefined when the two baselines score the same.",
        "",
    ]
    lines += unfinished_section(pending, results.path)
    lines += setup_section(manifest, cells, base)
    lines += flips_section(flips, manifest, base)
    lines += utility_section(utility_flips, base, seed)
    lines += length_check_section(cells)
    engine_lines, engines = engines_section(results, companion_engines(results.path))
    lines += engine_lines
    lines += asymmetry_section(asymmetry, runs_both_kinds(cells))
    lines += [
        "## Safety vs utility by acceptance rate (Table 1 analog)",
        "",
        "Relaxed verifiers without SecureSD; each cell (verifier setting × task) falls in the bin of its "
        "own AR. Means over cells with the 95% bootstrap interval across cells; (m/n) = cells with a defined "
        "PRR / cells. Here and in the Table 5 analog, the figures and the appendix, each task counts only "
        "its main run (the size and length with the most prompts), so that no prompt is pooled twice.",
        "",
        table(
            ["AR bin", "safety PRR", "utility PRR", "safety SPD", "utility SPD", "unparsed verdicts"],
            [
                [
                    row["ar_bin"],
                    *(
                        f"{fmt_ci(*row[kind]['prr'], missing='undefined' if row[kind]['cells'] else '–')} "
                        f"({row[kind]['cells_with_prr']}/{row[kind]['cells']})"
                        for kind in KINDS
                    ),
                    *(fmt_ci(*row[kind]["spd"], digits=2, missing="–") for kind in KINDS),
                    row["safety"]["unparsed"],
                ]
                for row in bins
                if any(row[kind]["cells"] for kind in KINDS)
            ],
        ),
        "",
    ]
    if deltas:
        lines += [
            "## SecureSD gain per verifier (Table 5 analog)",
            "",
            "ΔPRR = PRR with − without the schedule, paired per example and averaged over the verifier's "
            "knob sweep, with its 95% paired bootstrap interval (a task's prompts resampled once for every knob "
            "value, since all ran on them); ΔSPD likewise, pooled over tasks.",
            "",
        ]
        for schedule in schedules_present(main):
            rows = [row for row in deltas if row["schedule"] == schedule]
            body = [
                [
                    inline_text(row["verifier"]),
                    *(
                        (
                            fmt_ci(row["tasks"][task]["delta_prr"], row["tasks"][task]["delta_prr_ci"])
                            if task in row["tasks"]
                            else "–"
                        )
                        for task in tasks
                    ),
                    fmt_ci(row["delta_spd"], row["delta_spd_ci"], missing="–"),
                    row["unparsed"],
                ]
                for row in rows
            ]
            body.append(
                [
                    "**mean over verifiers**",
                    *(
                        fmt(mean_of(row["tasks"].get(task, {}).get("delta_prr") for row in rows))
                        for task in tasks
                    ),
                    fmt(mean_of(row["delta_spd"] for row in rows)),
                    sum(row["unparsed"] for row in rows),
                ]
            )
            lines += [
                f"### {inline_text(schedule)}",
                "",
                table(["verifier", *(f"ΔPRR {inline_text(task)}" for task in tasks), "ΔSPD", "unparsed verdicts"],
                      body),
                "",
            ]
    lines += figures_section(curves, bars)
    lines += runs_section(cells)
    lines += cost_section(cells, manifest)
    lines += appendix_section(main, seed)
    path = out / "report.md"
    summary = {
        "manifest": manifest,
        "ar_bins": bins,
        "deltas": deltas,
        "prr_vs_ar": {
            verifier: {f"{kind}|{schedule}": points for (kind, schedule), points in series.items()}
            for verifier, series in curves.items()
        },
        "position_tv": bars,
        "flips": flips,
        "utility_flips": utility_flips,
        "asymmetry": asymmetry,
        "engines": engines,
        "unfinished": {cell: len(examples) for cell, examples in pending.items()},
    }
    # Every file of the report (and the card) or none: a failure leaves the earlier report whole.
    files = {out / name: image for name, image in drawn_figures(curves, bars).items()}
    files[path] = "\n".join(lines).encode("utf-8")
    files[out / "summary.json"] = (json_text(summary, indent=2, default=str) + "\n").encode("utf-8")
    card = card_file(results.path, lines)
    if card is not None:
        files[card[0]] = card[1].encode("utf-8")
    write_files(files)
    return path
