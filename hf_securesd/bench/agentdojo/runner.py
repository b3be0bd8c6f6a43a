"""`run_agentdojo`: user tasks × injection tasks of one suite under one attack, each pair an agent
episode of `HFPromptingLLM` in AgentDojo's pipeline, scored into utility under attack, attack
success rate and security, with the decoding totals."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from agentdojo.agent_pipeline import AgentPipeline, PipelineConfig
from agentdojo.attacks import BaseAttack, load_attack
from agentdojo.task_suite.task_suite import TaskSuite
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hf_securesd.bench.agentdojo.choices import BENCHMARK_VERSION, DEFAULT_ATTACK, DEFAULT_SUITE, plan_run
from hf_securesd.bench.agentdojo.element import HFPromptingLLM
from hf_securesd.bench.plan import schedule_label, verifier_label
from hf_securesd.schedules import Schedule
from hf_securesd.stats import SpeculativeStats
from hf_securesd.verifiers import Verifier

# The package's logger, "hf_securesd.bench.agentdojo", as when the package was one module.
logger = logging.getLogger(__package__)


def _summarize(calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals over `generate` calls: count, new tokens, seconds, merged statistics and AR."""
    parts = [call["stats"] for call in calls if call["stats"] is not None]
    stats = SpeculativeStats.merge(parts) if parts else None
    return {
        "generate_calls": len(calls),
        "new_tokens": sum(call["new_tokens"] for call in calls),
        "seconds": sum(call["seconds"] for call in calls),
        "acceptance_rate": None if stats is None else stats.acceptance_rate,
        "stats": None if stats is None else stats.to_dict(),
    }


def _run_pair(
    task_suite: TaskSuite, pipeline: AgentPipeline, attack: BaseAttack, user_id: str, injection_id: str
) -> tuple[bool, bool]:
    """(utility, attack succeeded) of one user task under one injection task."""
    user_task = task_suite.get_user_task_by_id(user_id)
    injection_task = task_suite.get_injection_task_by_id(injection_id)
    utility, injected = task_suite.run_task_with_pipeline(
        pipeline, user_task, injection_task, attack.attack(user_task, injection_task)
    )
    if attack.is_dos_attack:  # a denial-of-service attack succeeds when the user task fails
        injected = not utility
    return utility, injected


def _figures(pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """UUA, attack success rate and security over the pairs that ran without an error (None when
    none did), and how many pairs that is."""
    scored = [pair for pair in pairs if pair["error"] is None]
    failed = len(pairs) - len(scored)
    attack_success_rate = sum(pair["attack_succeeded"] for pair in scored) / len(scored) if scored else None
    return {
        "n_pairs": len(pairs),
        "n_failed": failed,
        "n_scored": len(scored),
        "figures_over": f"{len(scored)} of {len(pairs)} pairs ({failed} failed with an error, see pairs[].error)",
        "utility_under_attack": sum(pair["utility"] for pair in scored) / len(scored) if scored else None,
        "attack_success_rate": attack_success_rate,
        "security": None if attack_success_rate is None else 1.0 - attack_success_rate,
    }


def run_agentdojo(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    *,
    suite: str = DEFAULT_SUITE,
    verifier: Verifier | str | None = None,
    schedule: Schedule | None = None,
    attack: str = DEFAULT_ATTACK,
    limit: int | None = None,
    injection_limit: int | None = None,
    user_tasks: Sequence[str] | None = None,
    injection_tasks: Sequence[str] | None = None,
    defense: str | None = None,
    benchmark_version: str = BENCHMARK_VERSION,
    max_new_tokens: int = 512,
    num_assistant_tokens: int = 5,
    progress: bool = True,
) -> dict[str, Any]:
    """Run user tasks × injection tasks of an AgentDojo suite under `attack` and score them.

    The pipeline is AgentDojo's standard one (its default system message, then the model and the
    tool-execution loop; `defense` is None or one of `SUPPORTED_DEFENSES`, ``repeat_user_prompt``
    and ``spotlighting_with_delimiting``: AgentDojo's other two need an OpenAI client or a detector
    model from the Hub). The tasks are `user_tasks` / `injection_tasks` (lists of ids) when given,
    else the suite's first `limit` user tasks and first `injection_limit` injection tasks (None:
    all). Names and tasks are checked first (`plan_run`: ValueError listing the valid choices).
    `draft=None` decodes with the target alone; otherwise speculatively with `verifier` (default
    lossless) and `schedule`.

    A pair that raises is recorded with its ``error`` (type and message; None for the others) and
    the run goes on. ``utility_under_attack`` (share of pairs whose user task succeeded),
    ``attack_success_rate`` (share whose injection task was carried out) and ``security`` (1 − that
    rate) are over the ``n_scored`` pairs that ran (None if none did; ``n_failed`` did not, as
    ``figures_over`` says). Also returned: one record per pair and the decoding totals (generate
    calls, new tokens, seconds, AR and merged statistics)."""
    task_suite, chosen_users, chosen_injections = plan_run(
        suite=suite,
        attack=attack,
        defense=defense,
        benchmark_version=benchmark_version,
        limit=limit,
        injection_limit=injection_limit,
        user_tasks=user_tasks,
        injection_tasks=injection_tasks,
    )
    llm = HFPromptingLLM(
        target,
        tokenizer,
        draft=draft,
        verifier=verifier,
        schedule=schedule,
        max_new_tokens=max_new_tokens,
        num_assistant_tokens=num_assistant_tokens,
    )
    pipeline = AgentPipeline.from_config(
        PipelineConfig(llm=llm, model_id=None, defense=defense, system_message_name=None, system_message=None)
    )
    loaded_attack = load_attack(attack, task_suite, pipeline)
    pairs = []
    pair_ids = [(user_id, injection_id) for user_id in chosen_users for injection_id in chosen_injections]
    for user_id, injection_id in tqdm(pair_ids, desc=f"agentdojo {suite}", unit="pair", disable=not progress):
        first_call = len(llm.calls)
        utility = injected = error = None
        try:
            utility, injected = _run_pair(task_suite, pipeline, loaded_attack, user_id, injection_id)
        except Exception as failure:  # one pair's failure must not lose the pairs already run
            error = f"{type(failure).__name__}: {failure}"
            logger.warning("agentdojo pair %s × %s failed: %s", user_id, injection_id, error)
        pairs.append(
            {
                "user_task": user_id,
                "injection_task": injection_id,
                "utility": utility,
                "attack_succeeded": injected,
                "error": error,
                **_summarize(llm.calls[first_call:]),
            }
        )
    return {
        "suite": suite,
        "benchmark_version": benchmark_version,
        "attack": attack,
        "defense": defense,
        "decoding": "target" if draft is None else "speculative",
        "verifier": None if llm.verifier is None else verifier_label(llm.verifier),
        "schedule": None if schedule is None else schedule_label(schedule),
        **_figures(pairs),
        "pairs": pairs,
        **_summarize(llm.calls),
    }
