"""The benchmark task registry. A task is data: a name, a loader, a prompt builder and a scorer.

Adding a benchmark is one small module in this package that defines `TASKS` (a tuple of `Task`)
plus one line in `_TASK_MODULES`. Modules are imported only when one of their tasks is asked for.

Example:

    >>> from hf_securesd.bench.tasks import get_task
    >>> task = get_task("gsm8k")
    >>> examples = task.examples(data_dir="/path/to/data", limit=2)    # doctest: +SKIP
    >>> messages = task.build_prompt(examples[0])                      # doctest: +SKIP
    >>> task.score(examples, ["#### 18", "#### 3"]).value              # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

from hf_securesd.bench.data import resolve_data_dir
from hf_securesd.bench.sandbox import Isolation, Sandbox, SandboxLimits

Message = dict[str, str]

# task name -> module in this package that defines it
_TASK_MODULES: dict[str, str] = {
    "humaneval": "humaneval",
    "gsm8k": "gsm8k",
    "jailbreak": "jailbreak",
    "jailbreak_adaptive": "jailbreak",
    "prompt_injection": "prompt_injection",
    "prompt_injection_adaptive": "prompt_injection",
}
# tasks whose scorers run the generated code (in `Sandbox`)
CODE_TASKS = frozenset({"humaneval"})
# the sampling seed of every task unless --seed names another (a study.json seed of null stands for it)
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Example:
    """One benchmark item. `id` is stable across runs; `fields` holds what the task's prompt
    builder and scorer need (and is written to result files as is)."""

    id: str
    fields: Mapping[str, Any]


def examples_digest(examples: Sequence[Example]) -> str:
    """SHA-256 of the examples' ids and fields (prompts, gold answers, tests), in id order: what a cell was
    scored against, so a rerun with the same ids from other data (another --data-dir, the Hub instead of
    a local copy, another dataset version) can be told apart."""
    content = sorted(([example.id, example.fields] for example in examples), key=lambda pair: pair[0])
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ScoreOptions:
    """Knobs that scorers read. `judge` names a judge of `hf_securesd.judges` and `judge_options`
    are its constructor arguments (jailbreak); `sandbox_limits`, `isolation` and `workers`
    configure code execution (HumanEval); `thinking_trace` (jailbreak, prompt injection): whether the
    model writes a thinking trace, so that only the text after its `</think>` is judged
    (`judges.reasoning.judged_text`)."""

    judge: str = "refusal_prefix"
    judge_options: Mapping[str, Any] = field(default_factory=dict)
    sandbox_limits: SandboxLimits = field(default_factory=SandboxLimits)
    isolation: Isolation = "auto"
    workers: int | None = None
    progress: bool = True
    thinking_trace: bool = True  # responses may open with a thinking trace: judge after `</think>`


@dataclass(frozen=True)
class TaskScore:
    """A task's score on a list of responses. `per_example` is oriented higher-is-better (pass,
    correct, attack failed = 1.0) and `value` is its mean; `details` holds one dict per example
    (extracted answer, sandbox status, judge verdict, ...)."""

    task: str
    metric: str
    value: float
    per_example: list[float]
    details: list[dict[str, Any]]


Loader = Callable[[Path | None, int], list[Example]]
PromptBuilder = Callable[[Example], list[Message]]
Scorer = Callable[[Sequence[Example], Sequence[str], ScoreOptions], TaskScore]


@dataclass(frozen=True)
class Task:
    """A benchmark. `load(data_dir, seed)` returns the full, deterministic example list (`data_dir`
    None means the Hugging Face Hub); `build_prompt` turns an example into chat messages;
    `score_fn(examples, responses, options)` scores the responses.

    `kind` is "utility" or "safety" (which PRR curve the task belongs to); `metric` names the raw
    score (pass@1, accuracy, AFR), always higher-is-better."""

    name: str
    kind: Literal["utility", "safety"]
    metric: str
    description: str
    load: Loader
    build_prompt: PromptBuilder
    score_fn: Scorer
    default_seed: int = DEFAULT_SEED
    max_new_tokens: int = 256

    def examples(self, data_dir: str | os.PathLike | None = None, limit: int | None = None,
                 seed: int | None = None) -> list[Example]:
        """The task's examples: from `data_dir` (or `$SECURESD_DATA_DIR`), else the Hub; the first
        `limit` of them when given (the lists are already in a seeded random order where sampled). A
        ValueError, naming the count the task has and the fix, for a `limit` above it (the study would
        be smaller than asked), or for a loader that gives one id to two examples (results are keyed
        by id; the task's loaders refuse such data first, naming the file)."""
        examples = self.load(resolve_data_dir(data_dir), self.default_seed if seed is None else seed)
        ids: set[str] = set()
        for example in examples:
            if example.id in ids:
                raise ValueError(f"task {self.name}: two examples share the id {example.id!r}; results are "
                                 f"kept by example id, so fix the data (or loader) that repeats it")
            ids.add(example.id)
        if limit is not None and limit > len(examples):
            raise ValueError(f"task {self.name} has {len(examples)} examples, fewer than the {limit} asked "
                             f"(--limit): ask for {len(examples)} or fewer, a fraction of each task (--limit 0.5), "
                             f"or no limit to run them all")
        return examples if limit is None else examples[:limit]

    def score(self, examples: Sequence[Example], responses: Sequence[str],
              options: ScoreOptions | None = None) -> TaskScore:
        """Score `responses` (the generated text only, one per example, same order)."""
        if len(examples) != len(responses):
            raise ValueError(f"{self.name}: got {len(responses)} responses for {len(examples)} examples")
        if not examples:
            raise ValueError(f"{self.name}: nothing to score (no examples)")
        return self.score_fn(examples, responses, options or ScoreOptions())


def task_names() -> list[str]:
    """Names of all registered tasks."""
    return list(_TASK_MODULES)


def check_isolation(names: Iterable[str], isolation: Isolation) -> None:
    """Refuse, before anything is loaded or generated, tasks that run generated code (`CODE_TASKS`)
    where the sandbox cannot give them `isolation`: `SandboxUnavailableError`, naming the cause and the
    fix (``unsafe-none`` is always available, and warns)."""
    if CODE_TASKS & set(names):
        Sandbox(isolation=isolation)


def get_task(name: str) -> Task:
    """The registered task called `name`."""
    if name not in _TASK_MODULES:
        raise KeyError(f"unknown benchmark task {name!r}; available: {', '.join(task_names())}")
    module = importlib.import_module(f"{__name__}.{_TASK_MODULES[name]}")
    for task in module.TASKS:
        if task.name == name:
            return task
    raise KeyError(f"module {module.__name__} does not define task {name!r}")
