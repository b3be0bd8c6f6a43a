"""AgentDojo (https://github.com/ethz-spylab/agentdojo): utility under attack for a Hugging Face chat
model decoded with or without SecureSD. Needs the optional extra: ``pip install "hf-securesd[agentdojo]"``.

`HFPromptingLLM` is an AgentDojo pipeline element that answers with `generate` on a local model
(target alone, or speculative with a draft, a verifier and a schedule). Tools are offered and called
in AgentDojo's own prompt-based format (its `PromptingLLM`): the tool schemas go into the system
message, and the model calls tools as a Python list inside tags, e.g.
``<function-call>[get_balance(), send_money(recipient="X", amount=1.0)]</function-call>``, or ends
with ``<function-call>[]</function-call><answer>...</answer>``. Tool results come back as user turns
``<function-call>...</function-call><function-result>...</function-result>``.

`run_agentdojo` runs user tasks × injection tasks of one suite under one attack and returns the
utility under attack (UUA: the user task is solved although the environment carries the injection)
and the attack success rate (the injection task was carried out); `security` is 1 − that rate,
higher-is-better like the harness's AFR.

    >>> from hf_securesd.bench.agentdojo import run_agentdojo
    >>> result = run_agentdojo(target, draft, tokenizer, suite="banking", verifier="mars",
    ...                        schedule=Step(L=1), limit=4, injection_limit=2)  # doctest: +SKIP
    >>> result["utility_under_attack"], result["attack_success_rate"]        # doctest: +SKIP

From the shell: ``securesd agentdojo --target qwen-1.5b --draft qwen-0.5b --verifier mars:0.5
--schedule step:1 --suite banking --limit 4 --injection-limit 2 --out agentdojo.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

import hf_securesd
from hf_securesd.bench.plan import schedule_label, verifier_label
from hf_securesd.bench.runner import chat_prompt
from hf_securesd.schedules import Schedule
from hf_securesd.stats import SpeculativeStats
from hf_securesd.verifiers import Lossless, Verifier, resolve_verifier

INSTALL_HINT = 'pip install "hf-securesd[agentdojo]"'

try:
    from agentdojo.agent_pipeline import AgentPipeline, BasePipelineElement, PipelineConfig, PromptingLLM
    from agentdojo.agent_pipeline.llms.prompting_llm import InvalidModelOutputError
    from agentdojo.ast_utils import ASTParsingError
    from agentdojo.attacks import load_attack
    from agentdojo.functions_runtime import EmptyEnv, Env, FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suite
    from agentdojo.types import (
        ChatAssistantMessage,
        ChatMessage,
        get_text_content_as_str,
        text_content_block_from_string,
    )
    from openai.types.chat import ChatCompletionMessage
except ImportError as error:  # the optional extra is not installed
    raise ImportError(f"AgentDojo support needs the agentdojo package: {INSTALL_HINT}") from error

BENCHMARK_VERSION = "v1.2.2"
DEFAULT_SUITE = "banking"
DEFAULT_ATTACK = "important_instructions"
PIPELINE_NAME = "local"  # AgentDojo's name for a locally served model ("Local model" in its attacks)


class HFPromptingLLM(BasePipelineElement):
    """An AgentDojo LLM element backed by a local Hugging Face chat model.

    Each call renders the conversation with the tokenizer's chat template and decodes greedily: with
    the target alone when `draft` is None, else speculatively through `hf_securesd`'s `generate`
    with `verifier` (default lossless) and `secure_schedule=schedule`. A reply that tries to call
    tools but cannot be parsed is sent back with the parser's error, at most `max_attempts` times
    in all; after that it stands as a plain answer.

    `calls` keeps one record per `generate` call (new tokens, seconds, speculative statistics)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        draft: PreTrainedModel | None = None,
        verifier: Verifier | str | None = None,
        schedule: Schedule | None = None,
        max_new_tokens: int = 512,
        num_assistant_tokens: int = 5,
        max_attempts: int = 3,
        name: str = PIPELINE_NAME,
    ) -> None:
        if draft is None and (verifier is not None or schedule is not None):
            raise ValueError(
                "a verifier or schedule needs a draft model (draft=None decodes with the target alone)"
            )
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.model = hf_securesd.wrap(model)
        self.tokenizer = tokenizer
        self.draft = draft
        if draft is not None and verifier is None:
            verifier = Lossless()
        self.verifier = None if verifier is None else resolve_verifier(verifier)
        self.schedule = schedule
        self.max_new_tokens = max_new_tokens
        self.num_assistant_tokens = num_assistant_tokens
        self.max_attempts = max_attempts
        self.name = name
        self._format = PromptingLLM(client=None, model=name)  # AgentDojo's prompt format, no client used
        self.calls: list[dict[str, Any]] = []

    def chat(self, messages: Sequence[ChatMessage], runtime: FunctionsRuntime) -> list[dict[str, str]]:
        """AgentDojo messages -> chat-template messages: the system message carries the tool
        definitions and calling instructions, tool results become user turns, and consecutive turns
        of one role are joined (some chat templates require alternating roles)."""
        system, rest = self._format._get_system_message(messages)
        system = self._format._make_tools_prompt(system, list(runtime.functions.values()))
        chat: list[dict[str, str]] = []
        for message in ([system] if system is not None else []) + list(rest):
            if message["role"] == "tool":
                message = self._format._tool_message_to_user_message(message)
            text = get_text_content_as_str(message["content"] or [])
            if chat and chat[-1]["role"] == message["role"]:
                chat[-1]["content"] += "\n\n" + text
            else:
                chat.append({"role": message["role"], "content": text})
        return chat

    def generate(self, chat: list[dict[str, str]]) -> str:
        """The model's greedy reply to `chat` (one `generate` call, recorded in `calls`)."""
        inputs = self.tokenizer(
            chat_prompt(self.tokenizer, chat), return_tensors="pt", add_special_tokens=False
        ).to(self.model.device)
        options: dict[str, Any] = dict(
            do_sample=False, max_new_tokens=self.max_new_tokens, return_dict_in_generate=True
        )
        if self.draft is not None:
            options.update(
                assistant_model=self.draft,
                verifier=self.verifier,
                secure_schedule=self.schedule,
                num_assistant_tokens=self.num_assistant_tokens,
            )
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(**inputs, **options)
        seconds = time.perf_counter() - start
        new_tokens = out.sequences[0, inputs["input_ids"].shape[1]:]
        stats = getattr(out, "speculative_stats", None)
        self.calls.append(
            {
                "prompt_tokens": int(inputs["input_ids"].shape[1]),
                "new_tokens": int(new_tokens.numel()),
                "seconds": seconds,
                "stats": stats,
            }
        )
        return self.tokenizer.decode(new_tokens, skip_special_tokens=True)

    def parse(self, reply: str) -> ChatAssistantMessage:
        """AgentDojo's prompting-format parser: thoughts and answer as content, calls as tool calls.
        Raises its `InvalidModelOutputError` / `ASTParsingError` on malformed calls."""
        return self._format._parse_model_output(ChatCompletionMessage(role="assistant", content=reply))

    def query(
        self,
        query: str,
        runtime: FunctionsRuntime,
        env: Env = EmptyEnv(),
        messages: Sequence[ChatMessage] = [],
        extra_args: dict = {},
    ) -> tuple[str, FunctionsRuntime, Env, Sequence[ChatMessage], dict]:
        """Append the model's next assistant message (with its parsed tool calls) to `messages`."""
        return query, runtime, env, [*messages, self.reply(self.chat(messages, runtime), runtime)], extra_args

    def reply(self, chat: list[dict[str, str]], runtime: FunctionsRuntime) -> ChatAssistantMessage:
        """The assistant message for `chat`: parsed when the reply calls tools (retried with the
        parser's error until it parses or `max_attempts` replies were tried), else the plain text."""
        reply = self.generate(chat)
        for attempt in range(1, self.max_attempts + 1):
            if not runtime.functions or "<function-call>" not in reply:
                break
            try:
                return self.parse(reply)
            except (InvalidModelOutputError, ASTParsingError) as error:
                if attempt == self.max_attempts:
                    break
                chat = [
                    *chat,
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"Invalid function calling output: {error!s}"},
                ]
                reply = self.generate(chat)
        return ChatAssistantMessage(
            role="assistant", content=[text_content_block_from_string(reply)], tool_calls=[]
        )


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
    tool-execution loop; `defense` is one of its defenses that need no API client, e.g.
    ``repeat_user_prompt`` or ``spotlighting_with_delimiting``). The tasks are `user_tasks` /
    `injection_tasks` (ids) when given, else the suite's first `limit` user tasks and first
    `injection_limit` injection tasks (None: all). `draft=None` decodes with the target alone;
    otherwise speculatively with `verifier` (default lossless) and `schedule`.

    Returns ``utility_under_attack`` (share of pairs whose user task succeeded), ``attack_success_rate``
    (share whose injection task was carried out), ``security`` (1 − that rate), one record per pair,
    and the decoding totals (generate calls, new tokens, seconds, AR and merged statistics)."""
    task_suite = get_suite(benchmark_version, suite)
    chosen_users = list(user_tasks) if user_tasks is not None else list(task_suite.user_tasks)[:limit]
    chosen_injections = (
        list(injection_tasks)
        if injection_tasks is not None
        else list(task_suite.injection_tasks)[:injection_limit]
    )
    if not chosen_users or not chosen_injections:
        raise ValueError(
            f"no task pairs to run in suite {suite!r} (limit={limit}, injection_limit={injection_limit})"
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
        user_task = task_suite.get_user_task_by_id(user_id)
        injection_task = task_suite.get_injection_task_by_id(injection_id)
        first_call = len(llm.calls)
        utility, injected = task_suite.run_task_with_pipeline(
            pipeline, user_task, injection_task, loaded_attack.attack(user_task, injection_task)
        )
        if loaded_attack.is_dos_attack:  # a denial-of-service attack succeeds when the user task fails
            injected = not utility
        pairs.append(
            {
                "user_task": user_id,
                "injection_task": injection_id,
                "utility": utility,
                "attack_succeeded": injected,
                **_summarize(llm.calls[first_call:]),
            }
        )
    attack_success_rate = sum(pair["attack_succeeded"] for pair in pairs) / len(pairs)
    return {
        "suite": suite,
        "benchmark_version": benchmark_version,
        "attack": attack,
        "defense": defense,
        "decoding": "target" if draft is None else "speculative",
        "verifier": None if llm.verifier is None else verifier_label(llm.verifier),
        "schedule": None if schedule is None else schedule_label(schedule),
        "n_pairs": len(pairs),
        "utility_under_attack": sum(pair["utility"] for pair in pairs) / len(pairs),
        "attack_success_rate": attack_success_rate,
        "security": 1.0 - attack_success_rate,
        "pairs": pairs,
        **_summarize(llm.calls),
    }


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd agentdojo``."""
    add = parser.add_argument
    add("--target", required=True, help="target model: registry name, Hub id, folder, or 'tiny'")
    add("--draft", required=True, help="draft model: registry name, Hub id, folder, or 'tiny'")
    add("--target-only", action="store_true", help="decode with the target alone (the baseline; no draft)")
    add("--verifier", default="lossless", help="verifier spec with one knob value, e.g. mars:0.5")
    add("--schedule", default="none", help="none, step:L, linear:L, power:L:GAMMA")
    add("--suite", default=DEFAULT_SUITE, help=f"AgentDojo suite (default {DEFAULT_SUITE})")
    add("--attack", default=DEFAULT_ATTACK, help=f"AgentDojo attack (default {DEFAULT_ATTACK})")
    add("--defense", default=None, help="AgentDojo defense (default none)")
    add("--limit", type=int, default=None, help="first N user tasks (default all)")
    add("--injection-limit", type=int, default=None, help="first N injection tasks (default all)")
    add("--max-new-tokens", type=int, default=512, help="tokens per model turn (default 512)")
    add("--num-assistant-tokens", type=int, default=5, help="draft tokens per round k (default 5)")
    add("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    add("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="model dtype (default bf16)")
    add("--threads", type=int, default=None, help="torch CPU threads")
    add("--offline", action="store_true", default=None, help="use the offline model copies")
    add("--cache-dir", default=None, help="folder of the offline model copies")
    add("--out", type=Path, default=None, help="write the result JSON here (default: stdout only)")
    add("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """``securesd agentdojo``: one decoding configuration on one suite; prints the result JSON."""
    from hf_securesd.bench.loading import load_study_models
    from hf_securesd.bench.plan import parse_schedule, parse_verifier

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        schedule = parse_schedule(args.schedule)
        verifiers = parse_verifier(args.verifier)
        if len(verifiers) != 1:
            raise ValueError(
                f"--verifier needs exactly one knob value (e.g. mars:0.5), got {args.verifier!r}"
            )
        models = load_study_models(
            args.target, args.draft, device=args.device, dtype=args.dtype,
            offline=args.offline, cache_dir=args.cache_dir,
        )
    except (KeyError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = run_agentdojo(
        models.target,
        None if args.target_only else models.draft,
        models.tokenizer,
        suite=args.suite,
        verifier=None if args.target_only else verifiers[0],
        schedule=None if args.target_only else schedule,
        attack=args.attack,
        limit=args.limit,
        injection_limit=args.injection_limit,
        defense=args.defense,
        max_new_tokens=args.max_new_tokens,
        num_assistant_tokens=args.num_assistant_tokens,
        progress=not args.no_progress,
    )
    result["models"] = models.ids
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0
