"""Run a study: target-only and draft-only baselines, then every speculative configuration, on
every task; one generate call per batch of `batch_size` prompts (default 1), greedy decoding.

Each example's generation is journaled as soon as it ends, and each finished cell (configuration
x task) is scored and written with its AR, wall time, SPD against the target-only cell on the same
prompts, and PRR against the two baselines (`hf_securesd.metrics` `prr` module). Rerunning into
the same results directory skips every recorded cell and example. See `results.py` for the files.

Prompts: the task's chat messages through the target tokenizer's chat template (with the
generation prompt); the same token ids go to the target-only, draft-only and speculative runs.

Example:

    >>> from hf_securesd.bench.runner import StudySettings, prepare_tasks, run_study
    >>> from hf_securesd.bench.loading import load_study_models
    >>> from hf_securesd.bench.plan import sweep_configs, parse_schedule
    >>> models = load_study_models("tiny", "tiny", dtype="fp32")                      # doctest: +SKIP
    >>> tasks = prepare_tasks(["gsm8k"], models.tokenizer, limit=3, max_new_tokens=16) # doctest: +SKIP
    >>> configs = sweep_configs(["mars:0.5"], [None, parse_schedule("step:1")])
    >>> settings = StudySettings("tiny", "tiny", dtype="fp32")
    >>> run_study(settings, models, tasks, configs, "RESULTS")                       # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import platform
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from tqdm.auto import tqdm

from hf_securesd.bench.analysis import aligned, compute_prr, speedup
from hf_securesd.bench.loading import StudyModels
from hf_securesd.bench.plan import DRAFT, LOSSLESS, TARGET, RunConfig, knob_value, schedule_label
from hf_securesd.bench.results import ResultsDir, cell_key, stats_from_dict
from hf_securesd.bench.tasks import Example, ScoreOptions, Task, get_task
from hf_securesd.stats import SpeculativeStats


@dataclass(frozen=True)
class StudySettings:
    """Settings every result of a study depends on (written to the manifest; a results directory
    only takes runs with the same ones). `seed` is the tasks' sampling seed (None: each task's
    default)."""

    target: str
    draft: str
    device: str = "cpu"
    dtype: str = "bf16"
    num_assistant_tokens: int = 5
    batch_size: int = 1
    seed: int | None = None
    judge: str = "refusal_prefix"
    judge_options: Mapping[str, Any] = field(default_factory=dict)
    profile: str | None = None

    def manifest(self, models: StudyModels) -> dict[str, Any]:
        return {
            "target": self.target,
            "draft": self.draft,
            "device": self.device,
            "dtype": self.dtype,
            "num_assistant_tokens": self.num_assistant_tokens,
            "seed": self.seed,
            "judge": self.judge,
            "judge_options": dict(self.judge_options),
            "decoding": "greedy",
            "batch_size": self.batch_size,
            "profile": self.profile,
            "models": models.ids,
        }

    def score_options(self) -> ScoreOptions:
        return ScoreOptions(judge=self.judge, judge_options=dict(self.judge_options), progress=False)


@dataclass(frozen=True)
class TaskRun:
    """A task at the size and length of this study, with its chat-templated prompts
    (`prompts[i]`: text of `examples[i]`)."""

    task: Task
    examples: list[Example]
    prompts: list[str]
    max_new_tokens: int

    @property
    def baseline_id(self) -> str:
        """Names the task, size and length: cells with the same id share baselines."""
        return f"{self.task.name}|n={len(self.examples)}|max_new_tokens={self.max_new_tokens}"

    def cell(self, config: RunConfig) -> str:
        return cell_key(config.key, self.task.name, len(self.examples), self.max_new_tokens)


@dataclass
class StudyOutcome:
    """What one `run_study` call did."""

    out_dir: Path
    generated: int = 0
    cells_finished: int = 0
    cells_already_done: int = 0


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
    tokenizer,
    *,
    data_dir: str | os.PathLike | None = None,
    limit: int | None = None,
    seed: int | None = None,
    max_new_tokens: Callable[[Task], int] | int | None = None,
) -> list[TaskRun]:
    """Load each task's examples (the first `limit`) and build their prompts. `max_new_tokens` is a
    length for every task, or a function of the task, or None for each task's own length."""
    runs = []
    for name in dict.fromkeys(task_names):
        task = get_task(name)
        examples = task.examples(data_dir=data_dir, limit=limit, seed=seed)
        if not examples:
            raise ValueError(f"task {name} has no examples at limit={limit}")
        length = (
            task.max_new_tokens
            if max_new_tokens is None
            else max_new_tokens if isinstance(max_new_tokens, int) else max_new_tokens(task)
        )
        prompts = [chat_prompt(tokenizer, task.build_prompt(example)) for example in examples]
        runs.append(TaskRun(task, examples, prompts, length))
    return runs


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Generation:
    """One answer: the response text, its new tokens, the wall seconds charged to it (the batch's
    time split evenly over its rows) and, for speculative runs, its statistics."""

    response: str
    new_tokens: int
    seconds: float
    stats: SpeculativeStats | None


def _trim(tokens: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """Drop the padding after a finished row: tokens [N] -> [n <= N]."""
    if pad_token_id is None:
        return tokens
    kept = (tokens != pad_token_id).nonzero()
    return tokens[: int(kept[-1]) + 1] if kept.numel() else tokens[:0]


def generate(
    models: StudyModels,
    config: RunConfig,
    prompts: Sequence[str],
    max_new_tokens: int,
    num_assistant_tokens: int,
) -> list[Generation]:
    """Greedy answers to a batch of prompts, one `generate` call (timed alone).

    Prompts are encoded without extra special tokens (the chat template has them) and left-padded:
    input_ids and attention_mask [B, P]."""
    model = models.draft if config.kind == "draft" else models.target
    inputs = models.tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False).to(
        model.device
    )
    options: dict[str, Any] = dict(
        do_sample=False, max_new_tokens=max_new_tokens, return_dict_in_generate=True
    )
    if config.kind == "speculative":
        options.update(
            assistant_model=models.draft,
            verifier=config.verifier,
            secure_schedule=config.schedule,
            num_assistant_tokens=num_assistant_tokens,
        )
    _synchronize(model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**inputs, **options)
    _synchronize(model.device)
    seconds = (time.perf_counter() - start) / len(prompts)
    prompt_length = inputs["input_ids"].shape[1]
    row_stats = getattr(out, "speculative_stats_per_row", None) if config.kind == "speculative" else None
    if config.kind == "speculative" and row_stats is None:
        row_stats = [out.speculative_stats]
    generations = []
    for row in range(len(prompts)):
        new_tokens = _trim(out.sequences[row, prompt_length:], models.tokenizer.pad_token_id)
        stats = None if row_stats is None else row_stats[row]
        generations.append(
            Generation(
                models.tokenizer.decode(new_tokens, skip_special_tokens=True),
                stats.new_tokens if stats is not None else int(new_tokens.numel()),
                seconds,
                stats,
            )
        )
    return generations


def warm_up(models: StudyModels, prompt: str, num_assistant_tokens: int) -> None:
    """One short untimed generation per decoding kind, so first-call costs stay out of the timings."""
    for config in (TARGET, DRAFT, LOSSLESS):
        generate(models, config, [prompt], 2, num_assistant_tokens)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def finish_cell(
    config: RunConfig,
    task_run: TaskRun,
    journal: Mapping[str, Mapping[str, Any]],
    finished: Mapping[str, dict[str, Any]],
    settings: StudySettings,
) -> dict[str, Any]:
    """Score a cell whose examples are all journaled and build its record (SPD and PRR against
    the baseline cells in `finished`, keyed by cell)."""
    ids = [example.id for example in task_run.examples]
    generations = [journal[example_id] for example_id in ids]
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
        "scores": scored.per_example,
        "score": scored.value,
        "details": scored.details,
        "responses": [g["response"] for g in generations],
        "seconds": [g["seconds"] for g in generations],
        "new_tokens": [g["new_tokens"] for g in generations],
        "wall_time": sum(g["seconds"] for g in generations),
        "sessions": sorted({g["session"] for g in generations}),
        "stats": None if stats is None else stats.to_dict(),
        "acceptance_rate": None if stats is None else _finite(stats.acceptance_rate),
    }
    target = record if config.kind == "target" else finished.get(task_run.cell(TARGET))
    record["spd"] = (
        None if target is None else _finite(speedup(aligned(target, "seconds", ids), record["seconds"]))
    )
    record["spd_same_session"] = (
        target is not None and len(set(target["sessions"]) | set(record["sessions"])) == 1
    )
    draft = finished.get(task_run.cell(DRAFT))
    if config.kind == "speculative" and target and draft:
        prr = compute_prr(
            scored.per_example,
            aligned(target, "scores", ids),
            aligned(draft, "scores", ids),
            seed=settings.seed or 0,
        )
        record.update(
            prr=_finite(prr["prr"]),
            prr_ci=prr["prr_ci"],
            prr_undefined=prr["undefined"],
            target_score=prr["target_score"],
            draft_score=prr["draft_score"],
        )
    return record


def run_study(
    settings: StudySettings,
    models: StudyModels,
    tasks: Sequence[TaskRun],
    configs: Sequence[RunConfig],
    out_dir: str | os.PathLike,
    *,
    progress: bool = True,
) -> StudyOutcome:
    """Run (or resume) the study into `out_dir`: the baselines of every task first, then each
    configuration of `configs` on every task. Returns what this call generated and finished."""
    batch_size = settings.batch_size
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    results = ResultsDir(out_dir)
    session = {
        "id": uuid.uuid4().hex[:12],
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    results.open(settings.manifest(models), session)
    finished = {run["cell"]: run for run in results.runs()}
    journal = results.generations()
    plan = [(config, task_run) for config in dict.fromkeys([TARGET, DRAFT, *configs]) for task_run in tasks]
    outcome = StudyOutcome(results.path)
    todo = []
    for config, task_run in plan:
        if task_run.cell(config) in finished:
            outcome.cells_already_done += 1
        else:
            todo.append((config, task_run))
    remaining = sum(
        1
        for config, task_run in todo
        for example in task_run.examples
        if example.id not in journal.get(task_run.cell(config), {})
    )
    bar = tqdm(total=remaining, desc="securesd bench", unit="gen", disable=not progress, dynamic_ncols=True)
    warmed = False
    try:
        for config, task_run in todo:
            key = task_run.cell(config)
            done = journal.setdefault(key, {})
            bar.set_postfix_str(f"{config.key} on {task_run.task.name}")
            pending = [
                (example, prompt)
                for example, prompt in zip(task_run.examples, task_run.prompts)
                if example.id not in done
            ]
            for first in range(0, len(pending), batch_size):
                batch = pending[first:first + batch_size]
                if not warmed:
                    warm_up(models, min(task_run.prompts, key=len), settings.num_assistant_tokens)
                    warmed = True
                answers = generate(
                    models,
                    config,
                    [prompt for _, prompt in batch],
                    task_run.max_new_tokens,
                    settings.num_assistant_tokens,
                )
                for (example, _), answer in zip(batch, answers):
                    record = {
                        "cell": key,
                        "example_id": example.id,
                        "response": answer.response,
                        "new_tokens": answer.new_tokens,
                        "seconds": answer.seconds,
                        "stats": None if answer.stats is None else answer.stats.to_dict(),
                        "session": session["id"],
                    }
                    results.add_generation(record)
                    done[example.id] = record
                outcome.generated += len(batch)
                bar.update(len(batch))
            run = finish_cell(config, task_run, done, finished, settings)
            results.add_run(run)
            finished[key] = run
            outcome.cells_finished += 1
    finally:
        bar.close()
    return outcome
