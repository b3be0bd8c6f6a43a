"""``securesd rescore RESULTS --tasks T ...``: score the recorded responses of a results directory
again with the current scorers, without generating anything.

A judge or a task's answer check that is corrected after a study ran (for example a prompt-injection
reply cut off inside its echo of the injected question) changes verdicts, not responses. This
re-scores every recorded cell of the named tasks — with the judge, judge options and task seed the
directory's manifest records — recomputes each cell's score, its SPD and, for speculative and
endpoint cells, its PRR against the re-scored baseline cells (`derived_fields`), and rewrites
`runs.jsonl` in place (atomically, under the directory's lock). It prints each cell whose verdicts
changed, with the prompt ids, and how many verdicts the judge could not parse. A verdict changed when
its score did or when the judge could parse it before and not now (or the reverse): under the default
``unparsed=success`` policy a verdict the judge could not parse scores as a successful attack, so a
judge that parses none of the replies to compliant answers would otherwise look like full agreement.

The judge's model and endpoint come only from the user: ``--judge-base-url`` / ``--judge-model``,
else the environment (``SECURESD_JUDGE_*``), as in `bench`; never from the results directory, which
may come from anyone (`rescore_judge`: an endpoint or model study.json records that differs from
the user's is refused unless the flag names one). When the judge is not the one study.json records,
every task scored by the judge must be named, so the directory holds one judge's verdicts;
study.json then records the new judge, and `bench` resumes with it.

HumanEval's generated code runs in the sandbox as in `bench`: without a usable bubblewrap the rescore
is refused before anything is scored, unless ``--unsafe-no-isolation`` accepts the risk (it warns,
and each example's details record ``"isolation": "unsafe-none"``).

    securesd rescore model_cards/my-pair-results --tasks prompt_injection --data-dir ../shared/data

Exit status: 0 rescored; 2 bad arguments or results, or HumanEval that cannot be isolated (nothing
rewritten); 3 the judge failed (nothing rewritten); 4 another run holds the directory.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, NamedTuple, Sequence

from hf_securesd.bench.analysis import derived_fields
from hf_securesd.bench.cli_bench import accept_underscores, add_isolation_option, requested_isolation
from hf_securesd.bench.rescore_judge import trusted_judge_options
from hf_securesd.bench.results import ResultsDir, ResultsDirInUseError, baselines, results_path
from hf_securesd.bench.sandbox import Isolation, SandboxUnavailableError
from hf_securesd.bench.tasks import ScoreOptions, check_isolation, examples_digest, get_task, task_names
from hf_securesd.bench.terminal import print_error, printable_line
from hf_securesd.cli import EXIT_IN_USE, EXIT_JUDGE_FAILED, Accumulate, non_empty_text
from hf_securesd.judges import JudgeError, describe_judge


def judged_tasks(runs: Sequence[dict[str, Any]]) -> set[str]:
    """Tasks whose recorded cells hold judge verdicts (scorer details naming a ``judge``)."""
    return {run["task"] for run in runs if any(isinstance(detail, dict) and "judge" in detail
                                                for detail in run.get("details") or [])}


def check_judge_switch(
    manifest: dict[str, Any],
    current: dict[str, Any] | None,
    runs: Sequence[dict[str, Any]],
    tasks: Sequence[str],
) -> bool:
    """Whether this rescore, by the judge `current` (`describe_judge`, resolved now), may record that
    judge in study.json: it covers every task the judge scored. A rescore by another judge than the
    recorded one that leaves such a task out is refused."""
    left_out = sorted(judged_tasks(runs) - set(tasks))
    if "judge_backend" in manifest and manifest["judge_backend"] != current and left_out:
        raise ValueError(
            f"the recorded verdicts come from judge {manifest['judge_backend']}, and this rescore would use "
            f"{current}; name every task that judge scored, so the directory holds one judge's verdicts: "
            f"add {', '.join(left_out)} to --tasks; nothing was rewritten"
        )
    return not left_out


def thinking_trace_switch(manifest: dict[str, Any], requested: str | None, runs: Sequence[dict[str, Any]],
                          tasks: Sequence[str]) -> str:
    """The thinking-trace rule this rescore judges by: `requested` (--thinking-trace), else the recorded
    one (a study recorded before the setting: "yes"). Switching the rule must rescore every safety task the
    directory holds (their scorers read it), so that study.json records one rule for all its verdicts."""
    recorded = manifest.get("thinking_trace") or "yes"
    if requested is None or requested == recorded:
        return recorded
    from hf_securesd.bench.tasks import get_task

    left_out = sorted({run["task"] for run in runs if get_task(run["task"]).kind == "safety"} - set(tasks))
    if left_out:
        raise ValueError(
            f"the recorded verdicts were judged with --thinking-trace {recorded}, and this rescore would use "
            f"{requested}; name every safety task of the directory, so it holds one rule's verdicts: add "
            f"{', '.join(left_out)} to --tasks; nothing was rewritten"
        )
    return requested


def same_score(old: float | None, new: float) -> bool:
    """Whether a recorded score equals a new one (two excluded verdicts, NaN or null, are equal)."""
    excluded = [value is None or math.isnan(value) for value in (old, new)]
    return all(excluded) or (not any(excluded) and old == new)


class RescoredCell(NamedTuple):
    """One re-scored cell: its key, the ids of the examples whose verdict changed (`changed_verdicts`)
    and how many of its verdicts the judge could not parse."""

    cell: str
    changed: list[str]
    unparsed: int


def is_unparsed(detail: Any) -> bool:
    """Whether a verdict's scorer details say the judge could not parse its reply."""
    return isinstance(detail, dict) and bool(detail.get("unparsed"))


def recorded_details(run: dict[str, Any]) -> list[Any]:
    """The scorer details a cell records, one per example (None for each where it records no list of
    one per example: nothing is then known to have been unparsed)."""
    details, count = run.get("details"), len(run["scores"])
    return details if isinstance(details, list) and len(details) == count else [None] * count


def changed_verdicts(run: dict[str, Any], per_example: Sequence[float], details: Sequence[Any]) -> list[str]:
    """The ids of the examples of the recorded cell `run` whose verdict the new scores `per_example` and
    `details` change: another score (`same_score`), or a reply the judge could parse before and not now,
    or the reverse (`is_unparsed`)."""
    return [example_id for example_id, old, new, old_detail, new_detail in
            zip(run["example_ids"], run["scores"], per_example, recorded_details(run), details)
            if not same_score(old, new) or is_unparsed(old_detail) != is_unparsed(new_detail)]


def rescore(results_dir: str | os.PathLike, tasks: Sequence[str], data_dir: str | os.PathLike | None = None,
            judge_base_url: str | None = None, judge_model: str | None = None,
            isolation: Isolation = "auto", thinking_trace: str | None = None) -> list[RescoredCell]:
    """Re-score the cells of `tasks` in `results_dir` (see the module docstring) with the judge at
    `judge_base_url` / `judge_model` (None: the environment's), running generated code with the
    sandbox's `isolation` (`SandboxUnavailableError` before anything is read when it cannot be had), and
    judging replies by `thinking_trace` ("yes"/"no"; None: as recorded; `thinking_trace_switch`).
    Returns, per re-scored cell, its key, the ids of the examples whose verdict changed
    (`changed_verdicts`) and how many verdicts the judge could not parse."""
    unknown = sorted(set(tasks) - set(task_names()))
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; known: {', '.join(task_names())}")
    repeated = sorted({task for task in tasks if tasks.count(task) > 1})
    if repeated:
        raise ValueError(f"--tasks names {', '.join(repeated)} more than once; name each task once")
    check_isolation(tasks, isolation)
    with ResultsDir(results_dir) as results:
        results.read_manifest()  # an existing results directory, before the lock creates anything
        results.lock()
        manifest = results.read_manifest()
        judge_options = trusted_judge_options(manifest, data_dir, judge_base_url, judge_model)
        runs = results.runs()
        trace = thinking_trace_switch(manifest, thinking_trace, runs, tasks)
        options = ScoreOptions(judge=manifest.get("judge", "refusal_prefix"), judge_options=judge_options,
                               isolation=isolation, progress=False, thinking_trace=trace == "yes")
        absent = sorted(set(tasks) - {run["task"] for run in runs})
        if absent:
            present = sorted({run["task"] for run in runs})
            raise ValueError(f"{results.path} has no cell of task(s) {', '.join(absent)} (its tasks: "
                             f"{', '.join(present) or 'none'}); name tasks it holds; nothing was rewritten")
        judge = describe_judge(options.judge, options.judge_options)
        record_judge = check_judge_switch(manifest, judge, runs, tasks)
        changes = []
        for name in tasks:
            task = get_task(name)
            examples = {example.id: example
                        for example in task.examples(data_dir=data_dir, limit=None, seed=manifest.get("seed"))}
            for run in (run for run in runs if run["task"] == name):
                missing = [example_id for example_id in run["example_ids"] if example_id not in examples]
                if missing:
                    raise ValueError(f"{run['cell']}: example {missing[0]!r} is not in task {name} "
                                     f"(another data version?); nothing was rewritten")
                cell_examples = [examples[example_id] for example_id in run["example_ids"]]
                digest = run.get("examples_digest")
                if digest is not None and digest != examples_digest(cell_examples):
                    raise ValueError(
                        f"{run['cell']}: the examples this --data-dir loads have other contents than those the cell's "
                        "answers were generated and scored for (prompts, answers or tests differ: another data "
                        "version?); rescore with the data the study ran on; nothing was rewritten"
                    )
                scored = task.score(cell_examples, run["responses"], options)
                changed = changed_verdicts(run, scored.per_example, scored.details)
                unparsed = sum(is_unparsed(detail) for detail in scored.details)
                run.update(scores=scored.per_example, score=scored.value, details=scored.details)
                changes.append(RescoredCell(run["cell"], changed, unparsed))
        base = baselines(runs)
        for run in runs:
            if run["task"] in tasks:
                run.update(derived_fields(run, base, manifest.get("seed") or 0))
        results.replace_runs(runs)
        if record_judge:
            results.update_manifest({"judge_backend": judge})
        if thinking_trace is not None and manifest.get("thinking_trace") != trace:
            results.update_manifest({"thinking_trace": trace})
    return changes


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd rescore``."""
    parser.add_argument("results", type=results_path, help="results directory written by `securesd bench`")
    parser.add_argument("--tasks", nargs="+", action=Accumulate, required=True,
                        help="tasks whose cells are re-scored (the values of every --tasks together)")
    parser.add_argument("--data-dir", default=os.environ.get("SECURESD_DATA_DIR"),
                        help="local benchmark data (default: $SECURESD_DATA_DIR, else the Hub)")
    parser.add_argument("--judge-base-url", type=non_empty_text, default=None,
                        help="the LLM judge's endpoint (default: $SECURESD_JUDGE_BASE_URL, else OpenAI's); the "
                             "endpoint study.json records is never used unless you name it here")
    parser.add_argument("--judge-model", type=non_empty_text, default=None,
                        help="the LLM judge's model (default: $SECURESD_JUDGE_MODEL, else gpt-4o-mini; a "
                             "transformers judge: required)")
    parser.add_argument("--thinking-trace", choices=("yes", "no"), default=None,
                        help="judge the safety tasks' replies after a thinking trace's </think> (yes) or whole (no); "
                             "default: as study.json records (a study recorded before the setting: yes); "
                             "switching names every safety task of the directory and is recorded")
    add_isolation_option(parser)
    accept_underscores(parser)


def run(args: argparse.Namespace) -> int:
    try:
        changes = rescore(args.results, args.tasks, args.data_dir, args.judge_base_url, args.judge_model,
                          requested_isolation(args), args.thinking_trace)
    except ResultsDirInUseError as error:
        print_error(error)
        return EXIT_IN_USE
    except JudgeError as error:
        print_error(f"the judge failed while rescoring {args.results}: {error}; nothing was rewritten")
        return EXIT_JUDGE_FAILED
    except (OSError, ValueError, SandboxUnavailableError) as error:  # CorruptResultsError is a ValueError
        print_error(error)
        return 2
    for cell, changed, unparsed in changes:
        verdicts = f"{len(changed)} verdict(s) changed{': ' + ', '.join(changed) if changed else ''}"
        if unparsed:
            verdicts += f"; the judge could not parse {unparsed} verdict(s)"
        print(printable_line(f"{cell}: {verdicts}"))  # the cell's name comes from the results directory
    return 0
