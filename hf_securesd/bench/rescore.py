"""``securesd rescore RESULTS --tasks T ...``: score the recorded responses of a results directory
again with the current scorers, without generating anything.

A judge or a task's answer check that is corrected after a study ran (for example a prompt-injection
reply cut off inside its echo of the injected question) changes verdicts, not responses. This
re-scores every recorded cell of the named tasks — with the judge, judge options and task seed the
directory's manifest records — recomputes each cell's score and, for speculative and endpoint
cells, its PRR against the re-scored baseline cells, and rewrites `runs.jsonl` in place (atomically,
under the directory's lock). It prints each cell whose verdicts changed, with the prompt ids.

    securesd rescore model_cards/my-pair-results --tasks prompt_injection --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.runner import prr_fields
from hf_securesd.bench.tasks import ScoreOptions, get_task, task_names


def rescore(results_dir: str | os.PathLike, tasks: Sequence[str],
            data_dir: str | os.PathLike | None = None) -> list[tuple[str, list[str]]]:
    """Re-score the cells of `tasks` in `results_dir` (see the module docstring). Returns, per
    re-scored cell, its key and the ids of the examples whose score changed."""
    unknown = sorted(set(tasks) - set(task_names()))
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(task_names())}")
    with ResultsDir(results_dir) as results:
        results.lock()
        manifest = results.read_manifest()
        options = ScoreOptions(judge=manifest.get("judge", "refusal_prefix"),
                               judge_options=dict(manifest.get("judge_options") or {}), progress=False)
        runs = results.runs()
        changes = []
        for name in dict.fromkeys(tasks):
            task = get_task(name)
            examples = {example.id: example
                        for example in task.examples(data_dir=data_dir, limit=None, seed=manifest.get("seed"))}
            for run in (run for run in runs if run["task"] == name):
                missing = [example_id for example_id in run["example_ids"] if example_id not in examples]
                if missing:
                    raise ValueError(f"{run['cell']}: example {missing[0]!r} is not in task {name} "
                                     f"(another data version?); nothing was rewritten")
                scored = task.score([examples[example_id] for example_id in run["example_ids"]],
                                    run["responses"], options)
                changed = [example_id for example_id, old, new in
                           zip(run["example_ids"], run["scores"], scored.per_example) if old != new]
                run.update(scores=scored.per_example, score=scored.value, details=scored.details)
                changes.append((run["cell"], changed))
        by_key = {(run["config_key"], run["baseline_id"]): run for run in runs}
        for run in runs:
            target, draft = by_key.get(("target", run["baseline_id"])), by_key.get(("draft", run["baseline_id"]))
            if run["task"] in tasks and run["config"]["kind"] in ("speculative", "endpoint") and target and draft:
                run.update(prr_fields(run, target, draft, manifest.get("seed") or 0))
        results.replace_runs(runs)
    return changes


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd rescore``."""
    parser.add_argument("results", type=Path, help="results directory written by `securesd bench`")
    parser.add_argument("--tasks", nargs="+", required=True, help="tasks whose cells are re-scored")
    parser.add_argument("--data-dir", default=os.environ.get("SECURESD_DATA_DIR"),
                        help="local benchmark data (default: $SECURESD_DATA_DIR, else the Hub)")


def run(args: argparse.Namespace) -> int:
    try:
        changes = rescore(args.results, args.tasks, args.data_dir)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for cell, changed in changes:
        print(f"{cell}: {len(changed)} verdict(s) changed{': ' + ', '.join(changed) if changed else ''}")
    return 0
