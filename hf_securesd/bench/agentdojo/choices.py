"""What an AgentDojo run is made of: the benchmark version, suite, attack, defense and tasks, their
defaults, and `plan_run`, which checks them (before any model is loaded or called) with a
ValueError naming the problem and the valid choices."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from agentdojo.agent_pipeline.agent_pipeline import DEFENSES
from agentdojo.attacks.attack_registry import ATTACKS
from agentdojo.task_suite import load_suites
from agentdojo.task_suite.task_suite import TaskSuite

BENCHMARK_VERSION = "v1.2.2"
DEFAULT_SUITE = "banking"
DEFAULT_ATTACK = "important_instructions"
# AgentDojo's defenses that run with a local model alone. Its others need what is not here:
UNSUPPORTED_DEFENSES = {
    "tool_filter": "needs an OpenAI client",
    "transformers_pi_detector": "downloads a detector model from the Hugging Face Hub",
}
SUPPORTED_DEFENSES = tuple(name for name in DEFENSES if name not in UNSUPPORTED_DEFENSES)


def _require_positive_int(name: str, value: Any) -> None:
    """Refuse anything but a whole number >= 1 (bool included, a float such as 2.5 too)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def _load_suite(benchmark_version: str, suite: str) -> TaskSuite:
    """AgentDojo's `suite` of `benchmark_version`, or a ValueError listing the valid ones."""
    # AgentDojo lists its versions only in this (defaultdict) table; empty entries are not versions.
    versions = [version for version, suites in load_suites._SUITES.items() if suites]
    if benchmark_version not in versions:
        raise ValueError(
            f"unknown AgentDojo benchmark version {benchmark_version!r}; choose from {', '.join(versions)}"
        )
    suites = load_suites.get_suites(benchmark_version)
    if suite not in suites:
        raise ValueError(f"unknown AgentDojo suite {suite!r}; choose from {', '.join(suites)}")
    return suites[suite]


def _check_attack(attack: str) -> None:
    """Refuse a name that is not in AgentDojo's attack registry."""
    if attack not in ATTACKS:
        raise ValueError(f"unknown AgentDojo attack {attack!r}; choose from {', '.join(sorted(ATTACKS))}")


def _check_defense(defense: str | None) -> None:
    """Refuse a defense that is unknown or cannot run here (see `UNSUPPORTED_DEFENSES`)."""
    if defense is None or defense in SUPPORTED_DEFENSES:
        return
    why = f" ({UNSUPPORTED_DEFENSES[defense]})" if defense in UNSUPPORTED_DEFENSES else ""
    raise ValueError(
        f"AgentDojo defense {defense!r} is not supported here{why}; choose none or one of "
        f"{', '.join(SUPPORTED_DEFENSES)}"
    )


def _choose_tasks(
    available: Sequence[str], ids: Sequence[str] | None, limit: int | None, *, ids_name: str, limit_name: str
) -> list[str]:
    """`ids` (checked against `available`), else the first `limit` of `available` (None: all)."""
    if limit is not None:
        _require_positive_int(limit_name, limit)
    if ids is None:
        return list(available)[:limit]
    if limit is not None:
        raise ValueError(f"give {ids_name} or {limit_name}, not both")
    if isinstance(ids, str):
        raise ValueError(f"{ids_name} must be a list of task ids, not a string: use [{ids!r}]")
    chosen = list(ids)
    if not chosen:
        raise ValueError(f"{ids_name} is empty; give at least one task id, or None for all")
    unknown = [task for task in chosen if task not in available]
    if unknown:
        raise ValueError(f"unknown {ids_name} {', '.join(map(repr, unknown))}; choose from {', '.join(available)}")
    repeated = sorted(task for task, count in Counter(chosen).items() if count > 1)
    if repeated:
        raise ValueError(f"{ids_name} repeats {', '.join(repeated)}; give each task once")
    return chosen


def plan_run(
    *,
    suite: str = DEFAULT_SUITE,
    attack: str = DEFAULT_ATTACK,
    defense: str | None = None,
    benchmark_version: str = BENCHMARK_VERSION,
    limit: int | None = None,
    injection_limit: int | None = None,
    user_tasks: Sequence[str] | None = None,
    injection_tasks: Sequence[str] | None = None,
) -> tuple[TaskSuite, list[str], list[str]]:
    """Check the names and task choices of a run (before any model is loaded or called) and return
    the suite with the chosen user task and injection task ids. Raises ValueError naming the problem
    and the valid choices."""
    task_suite = _load_suite(benchmark_version, suite)
    _check_attack(attack)
    _check_defense(defense)
    users = _choose_tasks(
        list(task_suite.user_tasks), user_tasks, limit, ids_name="user_tasks", limit_name="limit"
    )
    injections = _choose_tasks(
        list(task_suite.injection_tasks),
        injection_tasks,
        injection_limit,
        ids_name="injection_tasks",
        limit_name="injection_limit",
    )
    return task_suite, users, injections
