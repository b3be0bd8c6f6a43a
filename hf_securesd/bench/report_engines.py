"""Report section comparing this results directory with the same study run through another engine
(``securesd bench --engine vllm`` or ``openai`` into a directory of its own), prompt for prompt.

vLLM (and so a vLLM server) commits response token 0 at prefill, from the target: a relaxed
verifier without a schedule there never touches position 0, as `generate` with ``Step(1)`` does,
and ``Step(L)`` there is exact at the same positions as ``Step(L)`` in `generate` (docs/vllm.md,
"First response token"). So each cell of the other engine is paired with the cell of this directory
whose exact positions are the same: ``V`` → ``V+step(L=1)``, ``V+step(L=l)`` → the same, baselines
and lossless → the same. Their responses can still differ where the engines' rounds start at
different positions (a bonus token, always the target's, falls one position later in the engine)
or where the engines' arithmetic differs (a near tie of the target, visible in the target-only
cells); the table counts both.

Two replays of the other engine's responses in `generate`, written into its directory by scripts in
``benchmarks/``, enter the section when present: ``shift_check.json`` (`engine_shift_check.py`: which
differing responses the block alignment explains) and ``position_tv.json`` (`engine_position_tv.py`:
TV by response position at T = 0, which an engine reporting only drafted/accepted counts lacks).

The companion directories are named in RESULTS/card.json (``"engines": ["../other-results"]``,
relative to RESULTS), so ``securesd report RESULTS`` regenerates the section from both
directories' committed records.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from hf_securesd.bench import json_input
from hf_securesd.bench.analysis import Cell, compute_flips, merged_stats
from hf_securesd.bench.card import companion_path
from hf_securesd.bench.formatting import fmt
from hf_securesd.bench.report_markdown import code_span, inline_text
from hf_securesd.bench.results import CORRUPT_FIX, CorruptResultsError, ResultsDir, read_in_place
from hf_securesd.schedules import short_repr

SHIFT_CHECK_FILE = "shift_check.json"  # written by benchmarks/engine_shift_check.py
POSITION_TV_FILE = "position_tv.json"  # written by benchmarks/engine_position_tv.py
FIRST_TOKEN_FROM_TARGET = ("vllm", "openai")  # engines whose response token 0 comes from prefill
POSITIONS = 6  # response positions shown in the per-position acceptance columns


def counterpart_key(cell: Cell, first_token_from_target: bool) -> str:
    """The configuration key, in a `generate` directory, with the same exact response positions."""
    config = cell["config"]
    verifier = (config.get("verifier") or {}).get("verifier")
    if not first_token_from_target or config["kind"] != "speculative" or verifier == "lossless":
        return cell["config_key"]
    if config.get("schedule") is None:
        return f"{cell['config_key']}+step(L=1)"
    return cell["config_key"]


def comparison_rows(cells: Sequence[Cell], other: Sequence[Cell], engine: str) -> list[dict[str, Any]]:
    """One row per cell of `other` with a counterpart in `cells` (same task, size and length):
    prompts compared, equal responses, verdict differences (`other` complied where this directory
    refused, and the reverse, with the exact McNemar p), and how many differing responses fall on
    prompts where the two engines' target-only responses differ too."""
    shifted = engine in FIRST_TOKEN_FROM_TARGET
    index = {(cell["config_key"], cell["baseline_id"]): cell for cell in cells}
    rows = []
    for cell in other:
        mine = index.get((counterpart_key(cell, shifted), cell["baseline_id"]))
        if mine is None:
            continue
        targets = (index.get(("target", cell["baseline_id"])),
                   next((c for c in other if c["config_key"] == "target"
                         and c["baseline_id"] == cell["baseline_id"]), None))
        target_differs = _differing_targets(*targets)
        by_id = dict(zip(mine["example_ids"], zip(mine["responses"], mine["scores"])))
        shared = [(example_id, response, score)
                  for example_id, response, score in zip(cell["example_ids"], cell["responses"], cell["scores"])
                  if example_id in by_id]
        differing = [example_id for example_id, response, _ in shared if response != by_id[example_id][0]]
        flips = compute_flips([score for _, _, score in shared], [by_id[i][1] for i, _, _ in shared])
        rows.append({
            "config": cell["config_key"],
            "counterpart": mine["config_key"],
            "task": cell["task"],
            "n": len(shared),
            "max_new_tokens": cell["max_new_tokens"],
            "equal_responses": len(shared) - len(differing),
            "differing": differing,
            "differing_with_target_difference": sum(example_id in target_differs for example_id in differing),
            "other_score": cell["score"],
            "score": mine["score"],
            "other_acceptance_rate": cell.get("acceptance_rate"),
            "acceptance_rate": mine.get("acceptance_rate"),
            "flips": flips,
        })
    return rows


def _attach_shift_checks(rows: list[dict[str, Any]], path: Path) -> None:
    """Add to each row the replay results recorded for its differing prompts (when all are there)."""
    if not path.is_file():
        return
    checks = _checked_shift_checks(path)
    for row in rows:
        for check in checks:
            if (check["config"], check["task"], check["max_new_tokens"]) != (
                    row["config"], row["task"], row["max_new_tokens"]):
                continue
            verdicts = {item["example_id"]: item["continuation_equals_engine"] for item in check["prompts"]}
            if set(row["differing"]) <= set(verdicts):
                row["continued_equal"] = sum(verdicts[example_id] for example_id in row["differing"])


def _checked_shift_checks(path: Path) -> list[dict[str, Any]]:
    """The checks recorded by `benchmarks/engine_shift_check.py` in `path`, each checked to be what that
    script writes (CorruptResultsError naming the file and the field otherwise)."""
    checks = _recorded_list(path, "checks")
    for index, check in enumerate(checks):
        where = f"{path}: checks[{index}]"
        if not (isinstance(check, dict) and isinstance(check.get("config"), str) and isinstance(check.get("task"), str)
                and isinstance(check.get("max_new_tokens"), int) and isinstance(check.get("prompts"), list)):
            raise CorruptResultsError(
                f"{where} must hold a string config and task, an integer max_new_tokens and a list of prompts; "
                f"{CORRUPT_FIX}"
            )
        for item in check["prompts"]:
            if not (isinstance(item, dict) and isinstance(item.get("example_id"), str)
                    and isinstance(item.get("continuation_equals_engine"), bool)):
                raise CorruptResultsError(
                    f'{where}["prompts"] must hold {{"example_id": string, "continuation_equals_engine": true or '
                    f"false}} items; {CORRUPT_FIX}"
                )
    return checks


def _recorded_list(path: Path, key: str) -> list[Any]:
    """The list under `key` of the JSON object a companion's benchmark script wrote in `path` (empty when
    the key is absent); CorruptResultsError naming the file otherwise."""
    try:
        recorded = json_input.loads(read_in_place(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptResultsError(f"{path} is not JSON ({error}); {CORRUPT_FIX}") from None
    items = recorded.get(key, []) if isinstance(recorded, dict) else None
    if not isinstance(items, list):
        raise CorruptResultsError(f'{path}: "{key}" must be a list; {CORRUPT_FIX}')
    return items


def _shift_text(row: dict[str, Any]) -> str:
    if not row["differing"]:
        return "–"
    return str(row["continued_equal"]) if "continued_equal" in row else "not checked"


def _verdict_cells(flips: dict[str, Any] | None) -> list[str]:
    """The "lost / gained" and McNemar cells of a row (prompts with an excluded verdict on either
    side are left out and counted); "–" when no prompt was left."""
    if flips is None:
        return ["–", "–"]
    excluded = f" ({flips['n_excluded']} excluded)" if flips["n_excluded"] else ""
    return [f"{flips['n_lost']} / {flips['n_gained']}{excluded}", f"{flips['mcnemar_pvalue']:.3g}"]


def _differing_targets(mine: Cell | None, other: Cell | None) -> set[str]:
    if mine is None or other is None:
        return set()
    responses = dict(zip(mine["example_ids"], mine["responses"]))
    return {example_id for example_id, response in zip(other["example_ids"], other["responses"])
            if example_id in responses and responses[example_id] != response}


def engines_section(results: ResultsDir, companions: Sequence[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """Markdown lines and data of the comparison with each companion directory (paths relative to
    the results directory); a companion without finished runs is named and skipped."""
    cells = results.runs()
    engine = results.read_manifest().get("engine", "hf")
    lines: list[str] = []
    data = []
    for companion in companions:
        other_dir = ResultsDir(companion_path(results.path, companion))
        manifest = other_dir.read_manifest()
        other_engine = manifest.get("engine", "hf")
        rows = comparison_rows(cells, other_dir.runs(), other_engine)
        _attach_shift_checks(rows, other_dir.path / SHIFT_CHECK_FILE)
        data.append({"results": companion, "engine": other_engine, "rows": rows})
        if not lines:
            lines += ["## The same prompts through another engine", ""]
        lines += [
            f"### {code_span(str(other_engine))} ({code_span(companion)}) against "
            f"{code_span(str(engine))} (this directory)",
            "",
            (f"{code_span(str(other_engine))} commits response token 0 from the target at prefill, so its cells are "
             "paired with this directory's cells that are exact at the same positions (no schedule → "
             "`Step(1)`; `Step(L)` → `Step(L)`; baselines and lossless → themselves)."
             if other_engine in FIRST_TOKEN_FROM_TARGET else
             "Cells are paired by configuration."),
            "*Responses*: prompts whose whole response is the same; *of them with differing targets*: "
            "differing responses on prompts where the two engines' target-only responses differ too "
            "(arithmetic, not the verifier). *Verdicts*: complied here only / refused here only, with "
            "the exact McNemar p. *Continued from token 0*: of the differing responses, those that "
            "`generate` reproduces when continued from the target's first token with the schedule "
            "shifted by one position (the engine's block alignment; `benchmarks/engine_shift_check.py`, "
            "recorded in the other directory), or \"not checked\".",
            "",
        ]
        there, here = inline_text(str(other_engine)), inline_text(str(engine))
        body = [
            [
                f"{inline_text(row['config'])} → {inline_text(row['counterpart'])}",
                inline_text(row["task"]),
                row["n"],
                row["max_new_tokens"],
                f"{row['equal_responses']} / {row['n']}",
                row["differing_with_target_difference"],
                _shift_text(row),
                f"{fmt(row['other_score'])} / {fmt(row['score'])}",
                f"{fmt(row['other_acceptance_rate'])} / {fmt(row['acceptance_rate'])}",
                *_verdict_cells(row["flips"]),
            ]
            for row in rows
        ]
        if body:
            header = ["configuration there → here", "task", "prompts", "new tokens", "equal responses",
                      "of the differing: targets differ", "of the differing: continued from token 0 equal",
                      f"score {there} / {here}",
                      f"AR {there} / {here}", "verdicts: complied there only / here only",
                      "McNemar p"]
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(str(value) for value in row) + " |" for row in body]
        else:
            lines.append("No cell there has a counterpart here yet.")
        lines.append("")
        own = own_target_rows(other_dir.runs())
        data[-1]["own_target"] = own
        if own:
            lines += [
                f"Within {code_span(str(other_engine))}: each configuration's flips against "
                f"{code_span(str(other_engine))}'s own "
                "target-only run (*lost* = the target refused and the configuration complied), and the "
                f"acceptance rate of drafts by response position from the engine's own per-request "
                f"statistics (positions 0–{POSITIONS - 1}; – = nothing drafted there).",
                "",
                "| configuration | task | prompts | AR | lost / gained | McNemar p | "
                + " | ".join(f"acc. {position}" for position in range(POSITIONS)) + " |",
                "|" + "---|" * (6 + POSITIONS),
            ]
            for row in own:
                rates = [fmt(rate, 2) for rate in row["position_acceptance"]]
                lines.append(
                    f"| {inline_text(row['config'])} | {inline_text(row['task'])} | {inline_text(str(row['n']))} | "
                    f"{fmt(row['acceptance_rate'])} | "
                    + " | ".join([*_verdict_cells(row["flips"]), *rates]) + " |"
                )
            lines.append("")
        replayed = replayed_position_tv(other_dir.path / POSITION_TV_FILE)
        data[-1]["position_tv"] = replayed
        if replayed:
            lines += [
                f"Within {code_span(str(other_engine))}: TV(out_j, q_j) by response position j at T = 0, from each "
                "committed response scored by the target (`benchmarks/engine_position_tv.py`: 1 where the "
                "committed token is not the target's argmax after the response so far; the engine's own "
                "statistics hold drafted/accepted counts only).",
                "",
                "| configuration | task | prompts | "
                + " | ".join(f"TV {position}" for position in range(POSITIONS)) + " |",
                "|" + "---|" * (3 + POSITIONS),
            ]
            for row in replayed:
                shown = (row["position_tv"] + [None] * POSITIONS)[:POSITIONS]
                values = [fmt(value, 3) for value in shown]
                lines.append(f"| {inline_text(row['config'])} | {inline_text(row['task'])} | {int(row['n'])} | "
                             + " | ".join(values) + " |")
            lines.append("")
    return lines, data


def replayed_position_tv(path: Path) -> list[dict[str, Any]]:
    """The cells recorded by `benchmarks/engine_position_tv.py` in `path` (none when it is absent), each
    checked to be what that script writes: CorruptResultsError naming the file and the field otherwise
    (the file is read from another results directory, so nothing in it reaches a report unchecked)."""
    if not path.is_file():
        return []
    cells = _recorded_list(path, "cells")
    for index, cell in enumerate(cells):
        _check_replayed_cell(path, index, cell)
    return cells


def _check_replayed_cell(path: Path, index: int, cell: Any) -> None:
    """CorruptResultsError unless `cell` holds a string config and task, a count n and a list of TV values
    (each a number in [0, 1], or null)."""
    where = f'{path}: cells[{index}]'
    if not isinstance(cell, dict):
        raise CorruptResultsError(f"{where} must be an object; {CORRUPT_FIX}")
    for key in ("config", "task"):
        if not isinstance(cell.get(key), str):
            raise CorruptResultsError(f'{where}["{key}"] must be a string; {CORRUPT_FIX}')
    count = cell.get("n")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise CorruptResultsError(f'{where}["n"] must be a count of prompts, got {short_repr(count)}; {CORRUPT_FIX}')
    values = cell.get("position_tv")
    if not isinstance(values, list) or not all(
        value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1)
        for value in values
    ):
        raise CorruptResultsError(
            f'{where}["position_tv"] must be a list of numbers in [0, 1] (or null); {CORRUPT_FIX}'
        )


def own_target_rows(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """Per speculative cell of one directory: flips against that directory's target-only cell on the
    same prompts, AR, and the per-position acceptance rate (first `POSITIONS` positions)."""
    targets = {cell["baseline_id"]: cell for cell in cells if cell["config_key"] == "target"}
    rows = []
    for cell in cells:
        target = targets.get(cell["baseline_id"])
        if cell["config"]["kind"] != "speculative" or target is None or cell["task_kind"] != "safety":
            continue
        scores = dict(zip(target["example_ids"], target["scores"]))
        stats = merged_stats([cell])
        rates = list(stats.position_acceptance_rate[:POSITIONS]) if stats else []
        rows.append({
            "config": cell["config_key"],
            "task": cell["task"],
            "n": cell["n"],
            "acceptance_rate": cell.get("acceptance_rate"),
            "flips": compute_flips(cell["scores"], [scores[example_id] for example_id in cell["example_ids"]]),
            "position_acceptance": rates + [None] * (POSITIONS - len(rates)),
        })
    return rows
