"""Run a study: target-only and draft-only baselines, then every speculative configuration, on
every task; one engine call per batch of `batch_size` prompts (default 1), greedy decoding. The
engine (`hf_securesd.bench.engines`: ``hf``, ``vllm``, ``openai``) generates; nothing here knows
which one it is.

Each example's generation is journaled as soon as it ends (a prompt the engine could not answer is
recorded in the failures file instead, never scored, and retried by the next run), and each cell
whose examples all have answers (configuration
x task) is scored and written with its AR, wall time, SPD against the target-only cell on the same
prompts, and PRR against the two baselines (`hf_securesd.metrics` `prr` module). A cell that
finished before one of its baselines (a baseline whose prompts failed in an earlier session) is
recorded again with its SPD and PRR when that baseline finishes. Rerunning into the same results
directory skips every recorded cell and example. See `results.py` for the files.

A judge that cannot score a finished cell (its endpoint fails, or the run deadline passes) stops
the study with `JudgeFailedError`; every generation journaled so far is kept, and the next run
scores them without generating them again.

Prompts: the task's chat messages through the target tokenizer's chat template (with the
generation prompt); the same token ids go to the target-only, draft-only and speculative runs.

Example:

    >>> from hf_securesd.bench.runner import StudySettings, prepare_tasks, run_study
    >>> from hf_securesd.bench.loading import load_study_models
    >>> from hf_securesd.bench.engines.hf import HFEngine
    >>> from hf_securesd.bench.plan import sweep_configs, parse_schedule
    >>> models = load_study_models("tiny", "tiny", dtype="fp32")                      # doctest: +SKIP
    >>> tasks = prepare_tasks(["gsm8k"], models.tokenizer, limit=3, max_new_tokens=16) # doctest: +SKIP
    >>> configs = sweep_configs(["mars:0.5"], [None, parse_schedule("step:1")])
    >>> settings = StudySettings("tiny", "tiny", dtype="fp32")
    >>> run_study(settings, HFEngine(models), tasks, configs, "RESULTS")             # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from hf_securesd.bench.analysis import derived_fields, finite_or_none
from hf_securesd.bench.budget import Budget, format_duration
from hf_securesd.bench.engines.base import Answer, Engine, Generation, GenerationFailure, Prompt
from hf_securesd.bench.plan import DRAFT, LOSSLESS, TARGET, RunConfig, knob_value, schedule_label
from hf_securesd.bench.results import FAILURES, ResultsDir, baselines, cell_key, stats_from_dict
from hf_securesd.bench.run_records import duration_problem
from hf_securesd.bench.tasks import Example, ScoreOptions, Task, check_isolation, examples_digest, get_task
from hf_securesd.judges import JudgeError, check_judge_options, describe_judge, judge_takes
from hf_securesd.judges.backends import judge_deadline
from hf_securesd.judges.secrets import redact_command, reject_secret_options
from hf_securesd.stats import SpeculativeStats

__all__ = ["Answer", "Generation", "GenerationFailure", "JudgeFailedError", "StudySettings", "TaskRun",
           "finish_cell", "prepare_tasks", "run_study", "with_prompts"]

# manifest entries an engine reports that describe one session (`engines.openai`: whether the target's
# requests switched the plugin off, and each server's /models answer): recorded in each session too
SESSION_RECORDS = ("target_plain_requests", "server_models")


class JudgeFailedError(RuntimeError):
    """The judge could not score a finished cell; the generations journaled so far are kept."""


@dataclass(frozen=True)
class StudySettings:
    """Settings every result of a study depends on (written to the manifest; a results directory
    only takes runs with the same ones). `seed` is the tasks' sampling seed (None: each task's
    default). `device`, `dtype` and `num_assistant_tokens` (k) are None for an engine that generates
    on servers (they choose them). `profile`: the --profile named (None: none); `defaults_profile`: the
    profile whose defaults filled in the options not given. `prompt_format`: how an engine that
    generates on servers sends the prompts, recorded and bound as its own manifest entries (openai:
    ``tokenizer``, ``token_ids``). `thinking_trace`: whether the target writes thinking traces ("yes":
    the safety tasks judge the text after a reply's first ``</think>``; "no": the whole reply)."""

    target: str
    draft: str
    device: str | None = "cpu"
    dtype: str | None = "bf16"
    num_assistant_tokens: int | None = 5
    batch_size: int = 1
    seed: int | None = None
    judge: str = "refusal_prefix"
    judge_options: Mapping[str, Any] = field(default_factory=dict)
    profile: str | None = None
    defaults_profile: str | None = None
    isolation: str = "auto"
    prompt_format: Mapping[str, Any] = field(default_factory=dict)
    thinking_trace: str = "yes"  # "yes": judge the text after a reply's `</think>`; "no": the whole reply
    # where a judge that reads data files (StrongREJECT's rubric) finds them when its options name no
    # data_dir: the study's local data folder (`--data-dir`); not recorded (the same data may move)
    data_dir: str | None = None

    def __post_init__(self) -> None:
        # judge options are written to study.json and the report: secrets belong in the environment
        reject_secret_options(self.judge_options)
        check_judge_options(self.judge, self.judge_build_options())  # before anything is generated

    def judge_build_options(self) -> dict[str, Any]:
        """The options the judge is built with: `judge_options`, plus `data_dir` for a judge that takes
        one (StrongREJECT) when they name none."""
        options = dict(self.judge_options)
        if self.data_dir is not None and "data_dir" not in options and judge_takes(self.judge, "data_dir"):
            options["data_dir"] = self.data_dir
        return options

    def manifest(self, engine: Engine) -> dict[str, Any]:
        """The binding settings, the model behind the judge (`describe_judge`) and what the engine
        says it is (engine, version, models, endpoints)."""
        return {
            "target": self.target,
            "draft": self.draft,
            "device": self.device,
            "dtype": self.dtype,
            "num_assistant_tokens": self.num_assistant_tokens,
            "seed": self.seed,
            "judge": self.judge,
            "judge_options": dict(self.judge_options),
            "judge_backend": describe_judge(self.judge, self.judge_options),
            "decoding": "greedy",
            "batch_size": self.batch_size,
            "profile": self.profile,
            "defaults_profile": self.defaults_profile,
            "thinking_trace": self.thinking_trace,
            **dict(self.prompt_format),
            **engine.describe(),
        }

    def score_options(self) -> ScoreOptions:
        return ScoreOptions(judge=self.judge, judge_options=self.judge_build_options(),
                            isolation=self.isolation, progress=False, thinking_trace=self.thinking_trace == "yes")


@dataclass(frozen=True)
class TaskRun:
    """A task at the size and length of this study, with its chat-templated prompts
    (`prompts[i]`: text of `examples[i]`; None where no target tokenizer is at hand, for an engine
    that takes the chat messages)."""

    task: Task
    examples: list[Example]
    prompts: list[str | None]
    max_new_tokens: int

    def prompt(self, index: int) -> Prompt:
        """Both forms of the prompt of `examples[index]`: its text and its chat messages."""
        return Prompt(self.prompts[index], self.task.build_prompt(self.examples[index]))

    @property
    def baseline_id(self) -> str:
        """Names the task, size and length: cells with the same id share baselines."""
        return f"{self.task.name}|n={len(self.examples)}|max_new_tokens={self.max_new_tokens}"

    def cell(self, config: RunConfig) -> str:
        return cell_key(config.key, self.task.name, len(self.examples), self.max_new_tokens)


def check_same_examples(plan: Sequence[tuple[RunConfig, TaskRun]], finished: dict[str, dict], out_dir: Path) -> None:
    """Refuse, before generating anything, a run whose tasks draw other examples than the cells already
    finished in `out_dir`, or the same ids with other contents (`examples_digest`, where the record holds
    one): another --data-dir or dataset version, whose new cells could never be compared with those
    baselines (they would be scored against other answers)."""
    for config, task_run in plan:
        recorded = finished.get(task_run.cell(config))
        if recorded is None:
            continue
        drawn = [example.id for example in task_run.examples]
        if sorted(recorded["example_ids"]) != sorted(drawn):
            differ = len(set(drawn) ^ set(recorded["example_ids"]))
            raise ValueError(
                f"{out_dir} holds {task_run.cell(config)} on other examples than this run draws ({differ} ids "
                "differ: another --data-dir or dataset version?); use a new --out directory or the same data"
            )
        digest = recorded.get("examples_digest")
        if digest is not None and digest != examples_digest(task_run.examples):
            raise ValueError(
                f"{out_dir} holds {task_run.cell(config)} on the same example ids with other contents than this "
                "run loads (their prompts, answers or tests differ: another --data-dir or dataset version, or a "
                "securesd release that loads them otherwise?); its cells would be scored against other answers "
                "than those recorded. Use a new --out directory or the same data (and release)"
            )


@dataclass
class StudyOutcome:
    """What one `run_study` call did."""

    out_dir: Path
    generated: int = 0
    cells_finished: int = 0
    cells_already_done: int = 0
    failed: int = 0
    first_error: str | None = None  # the first failed prompt's error (secrets redacted), for the console


def chat_prompt(tokenizer, messages: list[dict[str, str]]) -> str:
    """The prompt text: `messages` through the tokenizer's chat template, with the generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the target tokenizer has no chat template; benchmark an instruct/chat model "
            "(or set tokenizer.chat_template)"
        )
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def prepare_tasks(
    task_names: Sequence[str],
    tokenizer: Any | None,
    *,
    data_dir: str | os.PathLike | None = None,
    limit: int | float | None = None,
    seed: int | None = None,
    max_new_tokens: Callable[[Task], int] | int | None = None,
) -> list[TaskRun]:
    """Load each task's examples and build their prompts. `limit`: the first `limit` examples (an
    int), or the first ceil(limit x size) of each task (a float in (0, 1)), or all (None).
    `max_new_tokens` is a length for every task, or a function of the task, or None for each
    task's own length. Without a `tokenizer` the prompt texts are None (an engine that sends
    the chat messages builds them)."""
    if isinstance(limit, float) and not 0 < limit < 1:
        raise ValueError(f"a fractional limit must lie in (0, 1), got {limit}")
    runs = []
    for name in dict.fromkeys(task_names):
        task = get_task(name)
        if isinstance(limit, float):
            examples = task.examples(data_dir=data_dir, limit=None, seed=seed)
            examples = examples[: math.ceil(limit * len(examples))]
        else:
            examples = task.examples(data_dir=data_dir, limit=limit, seed=seed)
        if not examples:
            raise ValueError(f"task {name} has no examples at limit={limit}")
        length = (
            task.max_new_tokens
            if max_new_tokens is None
            else max_new_tokens if isinstance(max_new_tokens, int) else max_new_tokens(task)
        )
        runs.append(TaskRun(task, examples, [None] * len(examples), length))
    return with_prompts(runs, tokenizer)


def with_prompts(runs: Sequence[TaskRun], tokenizer: Any | None) -> list[TaskRun]:
    """`runs` with each example's prompt text built by `tokenizer`'s chat template (None without a
    tokenizer). Loading the examples first (`prepare_tasks` without a tokenizer) finds a data problem
    before any model is loaded; the prompts follow once the engine's tokenizer is at hand."""
    return [
        replace(run, prompts=[None if tokenizer is None else chat_prompt(tokenizer, run.task.build_prompt(example))
                              for example in run.examples])
        for run in runs
    ]


def git_revision(path: str | os.PathLike | None = None) -> str | None:
    """The git commit of the checkout holding `path` (default: this package), with ``+dirty``
    when tracked files differ from it; None outside a git checkout or without git."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
            cwd=where, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def provenance(command: Sequence[str] | None = None) -> dict[str, Any]:
    """Versions of this library, transformers and torch, the command line (shell-quoted, secrets
    typed on it redacted: `redact_command`) and the git revision of the library, recorded in every
    session of the manifest."""
    import transformers

    import hf_securesd

    argv = list(sys.argv if command is None else command)
    return {
        "hf_securesd": getattr(hf_securesd, "__version__", None),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": redact_command(argv),
        "git_revision": git_revision(),
    }


def log(message: str) -> None:
    """A line for the user on stderr (stdout is the command's result)."""
    print(message, file=sys.stderr, flush=True)


def measure_budget(
    engine: Engine,
    plan: Sequence[tuple[RunConfig, TaskRun]],
    todo: Sequence[tuple[RunConfig, TaskRun]],
    journal: Mapping[str, Mapping[str, Mapping[str, Any]]],
    settings: StudySettings,
    probe_tokens: int = 4,
) -> Budget:
    """Rates for `todo`: from the journaled generations of `plan`'s cells where a kind has some
    (seconds per example / the cell's max_new_tokens, pooled), else from one timed batch of
    `batch_size` prompts of the first pending task, `probe_tokens` new tokens (a probe charges its
    prompt processing to fewer tokens, so its rate errs high). Speculative kinds probe lossless,
    endpoint kinds their first endpoint; a probe that gets no answer, or an engine that cannot be
    probed, leaves the kind without a rate (no estimate)."""
    seconds: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for config, task_run in plan:
        for record in journal.get(task_run.cell(config), {}).values():
            seconds[config.kind] = seconds.get(config.kind, 0.0) + record["seconds"]
            tokens[config.kind] = tokens.get(config.kind, 0.0) + task_run.max_new_tokens
    rates = {kind: seconds[kind] / tokens[kind] for kind in seconds if tokens[kind] > 0}
    sources = dict.fromkeys(rates, "journal")
    probes = {"target": TARGET, "draft": DRAFT, "speculative": LOSSLESS}
    first = todo[0][1] if todo else None
    for kind in dict.fromkeys(config.kind for config, _ in todo):
        if kind in rates or first is None:
            continue
        if not engine.probes_rates:
            sources[kind] = f"not probed (the {engine.name} engine); no estimate"
            continue
        probe = probes.get(kind) or next(config for config, _ in todo if config.kind == kind)
        length = max(1, min(probe_tokens, first.max_new_tokens))
        prompts = [first.prompt(index) for index in range(min(settings.batch_size, len(first.examples)))]
        answers = engine.generate(probe, prompts, length, settings.num_assistant_tokens)
        if not isinstance(answers[0], Generation):
            sources[kind] = f"probe failed ({answers[0].error[:80]}); no estimate"
            continue
        rates[kind] = answers[0].seconds / length
        sources[kind] = f"probe of {len(answers)} x {length} tokens"
    return Budget(rates, sources)


def per_example_counts(generations: Sequence[Mapping[str, Any]], per_round: str) -> list[int | None]:
    """Each generation's total of its statistics' `per_round` counts (drafted or accepted tokens), None
    for one whose reply carried no speculative statistics (an endpoint may return them on some replies
    only, and a structured refusal has none)."""
    return [None if not g.get("stats") else sum(g["stats"][per_round]) for g in generations]


def finish_cell(
    config: RunConfig,
    task_run: TaskRun,
    journal: Mapping[str, Mapping[str, Any]],
    finished: Mapping[str, dict[str, Any]],
    settings: StudySettings,
) -> dict[str, Any]:
    """Score a cell whose examples are all journaled and build its record (SPD and PRR against
    the baseline cells in `finished`, keyed by cell: `derived_fields`). Its speculative statistics
    and AR are those of the replies that carry statistics, `stats_examples` of them (the others'
    per-example drafted and accepted counts are None)."""
    ids = [example.id for example in task_run.examples]
    generations = [journal[example_id] for example_id in ids]
    times = {
        "seconds": [g["seconds"] for g in generations],
        "wall_time": sum(g["seconds"] for g in generations),
        "cpu_time": (
            sum(g["cpu_seconds"] for g in generations)
            if all(g.get("cpu_seconds") is not None for g in generations)
            else None
        ),
    }
    problem = duration_problem(times)
    if problem is not None:  # each journaled time fits, but not their sum: refused before any judge is paid
        raise ValueError(
            f"the journaled generations of cell {task_run.cell(config)!r} add up to {problem}; securesd never "
            "writes such times: restore generations.jsonl from a backup, or start a new --out directory"
        )
    scored = task_run.task.score(
        task_run.examples, [g["response"] for g in generations], settings.score_options()
    )
    parts = [stats_from_dict(g["stats"]) for g in generations if g.get("stats")]
    stats = SpeculativeStats.merge(parts) if parts else None
    record: dict[str, Any] = {
        "cell": task_run.cell(config),
        "config_key": config.key,
        "config": config.to_dict(),
        "knob_value": None if config.verifier is None else knob_value(config.verifier),
        "schedule_label": None if config.schedule is None else schedule_label(config.schedule),
        "task": task_run.task.name,
        "task_kind": task_run.task.kind,
        "metric": scored.metric,
        "n": len(ids),
        "max_new_tokens": task_run.max_new_tokens,
        "baseline_id": task_run.baseline_id,
        "example_ids": ids,
        "examples_digest": examples_digest(task_run.examples),
        "scores": scored.per_example,
        "score": scored.value,
        "details": scored.details,
        "responses": [g["response"] for g in generations],
        "seconds": times["seconds"],
        "new_tokens": [g["new_tokens"] for g in generations],
        "wall_time": times["wall_time"],
        "cpu_time": times["cpu_time"],
        "sessions": sorted({g["session"] for g in generations}),
        "stats": None if stats is None else stats.to_dict(),
        "acceptance_rate": None if stats is None else finite_or_none(stats.acceptance_rate),
        "stats_examples": len(parts),
        "drafted": per_example_counts(generations, "drafted_per_round") if parts else None,
        "accepted": per_example_counts(generations, "accepted_per_round") if parts else None,
    }
    record.update(derived_fields(record, baselines(finished.values()), settings.seed or 0))
    return record


def refresh_dependents(baseline: dict[str, Any], finished: dict[str, dict[str, Any]], results: ResultsDir,
                       seed: int) -> None:
    """After the baseline cell `baseline` finished: recompute the SPD and PRR (`derived_fields`) of
    the cells on the same prompts that finished before it, and record each that changed again (the
    last record of a cell wins), so the results equal those of a session that ran it first."""
    base = baselines(finished.values())
    for key, cell in list(finished.items()):
        same_prompts = cell["baseline_id"] == baseline["baseline_id"]
        if cell is baseline or not same_prompts or cell["config"]["kind"] == "target":
            continue
        updated = {**cell, **derived_fields(cell, base, seed)}
        if updated != cell:
            results.add_run(updated)
            finished[key] = updated


def score_cell(
    config: RunConfig,
    task_run: TaskRun,
    journal: Mapping[str, Mapping[str, Any]],
    finished: Mapping[str, dict[str, Any]],
    settings: StudySettings,
    run_deadline: float | None,
    out_dir: Path,
) -> dict[str, Any]:
    """`finish_cell` with the judge's requests ending by `run_deadline`; a judge failure becomes a
    `JudgeFailedError` naming the judge, the cell, the problem and how to resume."""
    try:
        with judge_deadline(run_deadline):
            return finish_cell(config, task_run, journal, finished, settings)
    except JudgeError as error:
        raise JudgeFailedError(
            f"the {settings.judge} judge could not score {task_run.cell(config)}: {str(error).rstrip('.')}; "
            f"the generations journaled so far are kept in {out_dir}: run the same command again to score "
            "them (nothing is generated again)"
        ) from None


def run_study(
    settings: StudySettings,
    engine: Engine,
    tasks: Sequence[TaskRun],
    configs: Sequence[RunConfig],
    out_dir: str | os.PathLike,
    *,
    progress: bool = True,
    command: Sequence[str] | None = None,
    notes: Mapping[str, Any] | None = None,
    secrets: Sequence[str] = (),
    run_deadline: float | None = None,
) -> StudyOutcome:
    """Run (or resume) the study into `out_dir` with `engine`: the baselines of every task first
    (those `engine.baseline_configs()` names), then each configuration of `configs` on every task.
    Returns what this call generated, finished and failed (a cell with a failed prompt is left
    unfinished, for the next run to complete); raises `JudgeFailedError` when the judge cannot
    score a cell, and `ResultsDirInUseError` when another run holds `out_dir`.
    `command` is the command line recorded for this session (default: `sys.argv`); `notes` are
    extra manifest entries that bind nothing (e.g. the judge's measured agreement); `secrets` are
    the API keys the engine sends, redacted from everything written (`ResultsDir`);
    `run_deadline` is the `time.monotonic()` past which the judge sends no more requests."""
    batch_size = settings.batch_size
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    check_isolation([task_run.task.name for task_run in tasks], settings.isolation)  # before any generation
    results = ResultsDir(out_dir, secrets)
    session = {
        "id": uuid.uuid4().hex[:12],
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **provenance(command),
    }
    engine.check_configs(configs)
    manifest = settings.manifest(engine)
    session.update({key: manifest[key] for key in SESSION_RECORDS if key in manifest})
    results.open({**manifest, **dict(notes or {})}, session)
    finished = {run["cell"]: run for run in results.runs()}
    journal = results.generations()
    baselines = engine.baseline_configs()
    plan = [(config, task_run) for config in dict.fromkeys([*baselines, *configs]) for task_run in tasks]
    check_same_examples(plan, finished, results.path)
    outcome = StudyOutcome(results.path)
    todo = []
    for config, task_run in plan:
        if task_run.cell(config) in finished:
            outcome.cells_already_done += 1
        else:
            todo.append((config, task_run))
    pending_work = {
        task_run.cell(config): [
            (example, task_run.prompt(index))
            for index, example in enumerate(task_run.examples)
            if example.id not in journal.get(task_run.cell(config), {})
        ]
        for config, task_run in todo
    }
    work = {
        task_run.cell(config): (config.kind, len(pending_work[task_run.cell(config)]), task_run.max_new_tokens)
        for config, task_run in todo
    }
    remaining = sum(len(items) for items in pending_work.values())
    budget = None
    if remaining:
        first = next(task_run for config, task_run in todo if pending_work[task_run.cell(config)])
        shortest = min(range(len(first.examples)), key=lambda index: len(first.prompts[index] or ""))
        engine.warm_up(first.prompt(shortest), [config for config, _ in todo], settings.num_assistant_tokens)
        budget = measure_budget(engine, plan, todo, journal, settings)
        log(budget.describe(list(work.values()), batch_size))
    bar = tqdm(total=remaining, desc="securesd bench", unit="gen", disable=not progress, dynamic_ncols=True)
    try:
        for position, (config, task_run) in enumerate(todo):
            key = task_run.cell(config)
            done = journal.setdefault(key, {})
            pending = pending_work[key]
            cell_start = time.perf_counter()
            failed_here = 0
            for first in range(0, len(pending), batch_size):
                batch = pending[first:first + batch_size]
                if budget is not None:
                    eta = budget.eta([work[task_run.cell(c)] for c, t in todo[position:]])
                    bar.set_postfix_str(f"{config.key} on {task_run.task.name}, ETA {format_duration(eta)}")
                batch_start = time.perf_counter()
                answers = engine.generate(
                    config,
                    [prompt for _, prompt in batch],
                    task_run.max_new_tokens,
                    settings.num_assistant_tokens,
                )
                for (example, _), answer in zip(batch, answers, strict=True):
                    if isinstance(answer, GenerationFailure):
                        results.add_failure({"cell": key, "example_id": example.id, "error": answer.error,
                                             "attempts": answer.attempts, "session": session["id"]})
                        if outcome.first_error is None:
                            outcome.first_error = results.redacted(answer.error)
                        failed_here += 1
                        continue
                    record = {
                        "cell": key,
                        "example_id": example.id,
                        "response": answer.response,
                        "new_tokens": answer.new_tokens,
                        "finish_reason": answer.finish_reason,
                        "seconds": answer.seconds,
                        "cpu_seconds": answer.cpu_seconds,
                        "stats": None if answer.stats is None else answer.stats.to_dict(),
                        "session": session["id"],
                        "attempts": answer.attempts,
                        "retry_wait_seconds": answer.retry_wait_seconds,
                    }
                    if answer.reply_model is not None:
                        record["reply_model"] = answer.reply_model
                    done[example.id] = results.add_generation(record)
                outcome.generated += sum(isinstance(answer, Generation) for answer in answers)
                bar.update(len(batch))
                if budget is not None:
                    budget.record((config.kind, len(batch), task_run.max_new_tokens), time.perf_counter() - batch_start)
                    work[key] = (config.kind, len(pending) - first - len(batch), task_run.max_new_tokens)
            if failed_here:
                outcome.failed += failed_here
                log(f"[{position + 1}/{len(todo)}] {key}: {failed_here} of {len(pending)} prompts got no "
                    f"answer (recorded in {FAILURES}); the cell stays unfinished: rerun into the same --out "
                    "to retry them")
                continue
            run = score_cell(config, task_run, done, finished, settings, run_deadline, results.path)
            results.add_run(run)
            finished[key] = run
            if config.kind in ("target", "draft"):
                refresh_dependents(run, finished, results, settings.seed or 0)
            outcome.cells_finished += 1
            if budget is not None and not progress:
                eta = budget.eta([work[t.cell(c)] for c, t in todo[position + 1:]])
                log(
                    f"[{position + 1}/{len(todo)}] {key}: {len(pending)} generated in "
                    f"{format_duration(time.perf_counter() - cell_start)}; ETA {format_duration(eta)}"
                )
    finally:
        bar.close()
    return outcome
