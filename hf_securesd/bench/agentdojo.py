"""AgentDojo (https://github.com/ethz-spylab/agentdojo): utility under attack for a Hugging Face chat
model decoded with or without SecureSD. Needs the optional extra: ``pip install "hf-securesd[agentdojo]"``.

`HFPromptingLLM` is an AgentDojo pipeline element that answers with `generate` on a local model
(target alone, or speculative with a draft, a verifier and a schedule). Tools are offered and called
in AgentDojo's own prompt-based format (its `PromptingLLM`): the tool schemas go into the system
message, and the model calls tools as a Python list inside tags, e.g.
``<function-call>[get_balance(), send_money(recipient="X", amount=1.0)]</function-call>``, or ends
with ``<function-call>[]</function-call><answer>...</answer>``. Tool results come back as user turns
``<function-call>...</function-call><function-result>...</function-result>``. Text inside the turns
cannot forge chat-template control tokens: the tokenizer's special and added token strings are
broken with a zero-width space before the template is applied.

`run_agentdojo` runs user tasks × injection tasks of one suite under one attack and returns the
utility under attack (UUA: the user task is solved although the environment carries the injection)
and the attack success rate (the injection task was carried out); `security` is 1 − that rate,
higher-is-better like the harness's AFR. A pair that fails with an error is recorded with the error
and left out of the figures; the run goes on.

    >>> from hf_securesd.bench.agentdojo import run_agentdojo
    >>> result = run_agentdojo(target, draft, tokenizer, suite="banking", verifier="mars",
    ...                        schedule=Step(L=1), limit=4, injection_limit=2)  # doctest: +SKIP
    >>> result["utility_under_attack"], result["attack_success_rate"]        # doctest: +SKIP

From the shell: ``securesd agentdojo --target qwen-1.5b --draft qwen-0.5b --verifier mars:0.5
--schedule step:1 --suite banking --limit 4 --injection-limit 2 --out agentdojo.json``.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

import hf_securesd
from hf_securesd.bench.plan import schedule_label, verifier_label
from hf_securesd.bench.runner import chat_prompt
from hf_securesd.cli import positive_int
from hf_securesd.schedules import Schedule
from hf_securesd.stats import SpeculativeStats
from hf_securesd.verifiers import Lossless, Verifier, resolve_verifier

INSTALL_HINT = 'pip install "hf-securesd[agentdojo]"'

try:
    from agentdojo.agent_pipeline import AgentPipeline, BasePipelineElement, PipelineConfig, PromptingLLM
    from agentdojo.agent_pipeline.agent_pipeline import DEFENSES
    from agentdojo.agent_pipeline.llms.prompting_llm import InvalidModelOutputError
    from agentdojo.ast_utils import ASTParsingError, create_python_function_from_tool_call
    from agentdojo.attacks import BaseAttack, load_attack
    from agentdojo.attacks.attack_registry import ATTACKS
    from agentdojo.functions_runtime import EmptyEnv, Env, FunctionCall, FunctionsRuntime
    from agentdojo.task_suite import load_suites
    from agentdojo.task_suite.task_suite import TaskSuite
    from agentdojo.types import (
        ChatAssistantMessage,
        ChatMessage,
        get_text_content_as_str,
        text_content_block_from_string,
    )
    from openai.types.chat import ChatCompletionMessage
except ImportError as error:  # the optional extra is not installed
    raise ImportError(f"AgentDojo support needs the agentdojo package: {INSTALL_HINT}") from error

logger = logging.getLogger(__name__)

BENCHMARK_VERSION = "v1.2.2"
DEFAULT_SUITE = "banking"
DEFAULT_ATTACK = "important_instructions"
PIPELINE_NAME = "local"  # AgentDojo's name for a locally served model ("Local model" in its attacks)
# AgentDojo's defenses that run with a local model alone. Its others need what is not here:
UNSUPPORTED_DEFENSES = {
    "tool_filter": "needs an OpenAI client",
    "transformers_pi_detector": "downloads a detector model from the Hugging Face Hub",
}
SUPPORTED_DEFENSES = tuple(name for name in DEFENSES if name not in UNSUPPORTED_DEFENSES)
CALL_OPEN, CALL_CLOSE = "<function-call>", "</function-call>"
# Longest reply handed to AgentDojo's parser. Its lazy regexes take quadratic time on many unclosed
# tags (8,000 tags, 120 KB: 7 s per parse); at this length the worst case stays under a second. A
# reply of max_new_tokens=512 is ~2,000 characters (~4 per token); even 4,096 tokens of 8 characters
# fit. A longer reply is answered with a parse error (re-prompted, then kept as plain text).
MAX_PARSED_REPLY_CHARS = 32_768
# Inserted after the first character of a control-token string found in a message's text, so the
# tokenizer reads it as plain characters (checked per tokenizer in `HFPromptingLLM.__init__`).
TOKEN_BREAK = "\u200b"  # zero-width space: the text stays readable


def _require_positive_int(name: str, value: Any) -> None:
    """Refuse anything but a whole number >= 1 (bool included, a float such as 2.5 too)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def _control_strings(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The tokenizer's special and added token strings (longest first) that text could spell out.
    One-character tokens are left out: they cannot be broken by an insertion."""
    strings = set(tokenizer.get_added_vocab()) | set(tokenizer.all_special_tokens)
    return sorted((text for text in strings if len(text) > 1), key=len, reverse=True)


def _break_token(match: re.Match[str]) -> str:
    """The matched control string with `TOKEN_BREAK` after its first character."""
    return match[0][0] + TOKEN_BREAK + match[0][1:]


def _assistant_text(text: str, calls: Sequence[FunctionCall]) -> str:
    """A past assistant turn that called tools, in the format the model is asked to produce."""
    thoughts = f"<function-thoughts>{text}</function-thoughts>" if text else ""
    listed = ", ".join(create_python_function_from_tool_call(call) for call in calls)
    return f"{thoughts}{CALL_OPEN}[{listed}]{CALL_CLOSE}"


def _check_reply(reply: str) -> None:
    """Refuse, with an `ASTParsingError` the model is shown, what AgentDojo's parser would misread or
    take long on: an over-long reply, several call blocks (it reads only the first), and a block
    that is not exactly one list of calls with distinct keyword arguments (it drops extra statements
    and positional arguments, and lets a repeated keyword win)."""
    if len(reply) > MAX_PARSED_REPLY_CHARS:
        raise ASTParsingError(
            f"the reply is {len(reply)} characters long; tool calls are read from replies of at most "
            f"{MAX_PARSED_REPLY_CHARS} characters, so answer more briefly"
        )
    blocks = reply.count(CALL_OPEN)
    if blocks > 1:
        raise ASTParsingError(
            f"the reply has {blocks} {CALL_OPEN} blocks; put every call in one list inside a single "
            f"{CALL_OPEN}[...]{CALL_CLOSE}"
        )
    start = reply.find(CALL_OPEN)
    end = reply.find(CALL_CLOSE, start)
    if start >= 0 and end >= 0:
        _check_call_block(reply[start + len(CALL_OPEN) : end])


def _check_call_block(source: str) -> None:
    """The text between the call tags must be one statement whose calls pass `_check_call`."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return  # AgentDojo's parser reports it
    if len(tree.body) != 1:
        raise ASTParsingError(
            f"the {CALL_OPEN} block holds {len(tree.body)} statements; write exactly one list of calls, "
            'e.g. [] or [get_balance(), send_money(recipient="X", amount=1.0)]'
        )
    value = getattr(tree.body[0], "value", None)
    for call in value.elts if isinstance(value, ast.List) else [value]:
        if isinstance(call, ast.Call):
            _check_call(call)


def _check_call(call: ast.Call) -> None:
    """Arguments by keyword only, each given once."""
    name = call.func.id if isinstance(call.func, ast.Name) else "a call"
    if call.args:
        raise ASTParsingError(f"{name}(...) has positional arguments; pass every argument by name, e.g. f(a=1)")
    counts = Counter(keyword.arg for keyword in call.keywords if keyword.arg is not None)
    repeated = sorted(argument for argument, count in counts.items() if count > 1)
    if repeated:
        raise ASTParsingError(f"{name}(...) repeats the argument(s) {', '.join(repeated)}; give each once")


def _parse_error_text(error: Exception) -> str:
    """The message the model gets back for a reply that could not be parsed."""
    if isinstance(error, (InvalidModelOutputError, ASTParsingError)):
        return f"Invalid function calling output: {error!s}"
    return f"Invalid function calling output: {type(error).__name__}: {error!s}"


class HFPromptingLLM(BasePipelineElement):
    """An AgentDojo LLM element backed by a local Hugging Face chat model.

    Each call renders the conversation with the tokenizer's chat template and decodes greedily: with
    the target alone when `draft` is None, else speculatively through `hf_securesd`'s `generate`
    with `verifier` (default lossless) and `secure_schedule=schedule`. A reply that tries to call
    tools but cannot be parsed (any error of the parser) is sent back with the error, at most
    `max_attempts` times in all; after that it stands as a plain answer.

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
        for option, value in (
            ("max_new_tokens", max_new_tokens),
            ("num_assistant_tokens", num_assistant_tokens),
            ("max_attempts", max_attempts),
        ):
            _require_positive_int(option, value)
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
        controls = _control_strings(tokenizer)
        self._controls = re.compile("|".join(map(re.escape, controls))) if controls else None
        self._check_token_break(controls)
        self.calls: list[dict[str, Any]] = []

    def _check_token_break(self, controls: Sequence[str]) -> None:
        """Refuse a tokenizer that turns a broken control string back into the control token (e.g.
        a normalizer that drops zero-width characters before matching added tokens)."""
        for control in controls:
            broken = self.neutralise(control)
            if control in self.tokenizer.tokenize(broken):
                raise ValueError(
                    f"the tokenizer reads {broken!r} as its control token {control!r}, so text from tools "
                    "could forge chat turns; use a tokenizer that does not drop zero-width spaces"
                )

    def neutralise(self, text: str) -> str:
        """`text` with every control-token string broken by a zero-width space (repeated until none
        is left, in case a token overlaps itself)."""
        while self._controls is not None and self._controls.search(text):
            text = self._controls.sub(_break_token, text)
        return text

    def chat(self, messages: Sequence[ChatMessage], runtime: FunctionsRuntime) -> list[dict[str, str]]:
        """AgentDojo messages -> chat-template messages: the system message carries the tool
        definitions and calling instructions, past tool calls are written back into their assistant
        turns, tool results become user turns, and consecutive turns of one role are joined (some
        chat templates require alternating roles)."""
        system, rest = self._format._get_system_message(messages)
        system = self._format._make_tools_prompt(system, list(runtime.functions.values()))
        chat: list[dict[str, str]] = []
        for message in ([system] if system is not None else []) + list(rest):
            if message["role"] == "tool":
                message = self._format._tool_message_to_user_message(message)
            text = get_text_content_as_str(message["content"] or [])
            if message["role"] == "assistant" and message.get("tool_calls"):
                text = _assistant_text(text, message["tool_calls"])
            if chat and chat[-1]["role"] == message["role"]:
                chat[-1]["content"] += "\n\n" + text
            else:
                chat.append({"role": message["role"], "content": text})
        return chat

    def prompt(self, chat: list[dict[str, str]]) -> str:
        """The prompt text for `chat`: each message's text neutralised (tool results, the user's and
        the model's words cannot forge turns), then the chat template with the generation prompt."""
        return chat_prompt(self.tokenizer, [{**turn, "content": self.neutralise(turn["content"])} for turn in chat])

    def generate(self, chat: list[dict[str, str]]) -> str:
        """The model's greedy reply to `chat` (one `generate` call, recorded in `calls`)."""
        inputs = self.tokenizer(self.prompt(chat), return_tensors="pt", add_special_tokens=False).to(
            self.model.device
        )
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
        """AgentDojo's prompting-format parser (thoughts and answer as content, calls as tool calls)
        after `_check_reply`. Raises `ASTParsingError` / `InvalidModelOutputError` on malformed calls,
        and whatever else the parser raises on odd input (IndexError, TypeError, ValidationError,
        RecursionError, ...)."""
        _check_reply(reply)
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
            if not runtime.functions or CALL_OPEN not in reply:
                break
            try:
                return self.parse(reply)
            except Exception as error:  # the parser raises more than its own two error types
                if attempt == self.max_attempts:
                    break
                chat = [
                    *chat,
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": _parse_error_text(error)},
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


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd agentdojo``."""
    add = parser.add_argument
    add("--target", required=True, help="target model: registry name, Hub id, folder, or 'tiny'")
    add("--draft", default=None, help="draft model: registry name, Hub id, folder, or 'tiny' "
        "(required unless --target-only, which does not load it)")
    add("--target-only", action="store_true", help="decode with the target alone (the baseline; no draft)")
    add("--verifier", default=None, help="verifier spec with one knob value, e.g. mars:0.5 "
        "(default lossless; not with --target-only)")
    add("--schedule", default=None, help="none, step:L, linear:L, power:L:GAMMA (default none; "
        "not with --target-only)")
    add("--suite", default=DEFAULT_SUITE, help=f"AgentDojo suite (default {DEFAULT_SUITE})")
    add("--attack", default=DEFAULT_ATTACK, help=f"AgentDojo attack (default {DEFAULT_ATTACK})")
    add("--defense", default=None, help=f"AgentDojo defense: {', '.join(SUPPORTED_DEFENSES)} (default none)")
    add("--limit", type=positive_int, default=None, help="first N user tasks (default all)")
    add("--injection-limit", type=positive_int, default=None, help="first N injection tasks (default all)")
    add("--max-new-tokens", type=positive_int, default=512, help="tokens per model turn (default 512)")
    add("--num-assistant-tokens", type=positive_int, default=5, help="draft tokens per round k (default 5)")
    add("--device", default="cpu", help="cpu, cuda, cuda:1, ..., or auto")
    add("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="model dtype (default bf16)")
    add("--threads", type=positive_int, default=None, help="torch CPU threads")
    add("--offline", action="store_true", default=None, help="use the offline model copies")
    add("--cache-dir", default=None, help="folder of the offline model copies")
    add("--out", type=Path, default=None, help="also write the result JSON here (it is always printed)")
    add("--no-progress", action="store_true", help="no progress bar")


def check_out_path(path: Path | None) -> None:
    """Refuse an --out that could not be written, before anything is loaded: a folder, a path under
    a file, or one under a folder this process may not write in (missing folders are created)."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"--out {path} is a folder; give a file name, e.g. {path / 'agentdojo.json'}")
    existing = next(parent for parent in path.absolute().parents if parent.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {path}: {existing} is a file, not a folder; choose another path")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"--out {path}: the folder {existing} is not writable; choose another path")


def _decoding(args: argparse.Namespace) -> tuple[Verifier | None, Schedule | None]:
    """The verifier and schedule of the CLI options (None, None with --target-only)."""
    from hf_securesd.bench.plan import parse_schedule, parse_verifier

    if args.target_only:
        if args.verifier is not None or args.schedule is not None:
            raise ValueError("--verifier and --schedule apply to speculative decoding; drop them or --target-only")
        return None, None
    if args.draft is None:
        raise ValueError("--draft is required for speculative decoding (or pass --target-only for the target alone)")
    verifiers = parse_verifier(args.verifier or "lossless")
    if len(verifiers) != 1:
        raise ValueError(f"--verifier needs exactly one knob value (e.g. mars:0.5), got {args.verifier!r}")
    return verifiers[0], parse_schedule(args.schedule or "none")


def load_target(
    name: str, *, device: str, dtype: str, offline: bool | None, cache_dir: str | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """The wrapped target alone (no draft is loaded), its tokenizer, and what it is (for the report)."""
    from hf_securesd.bench.loading import DTYPES, _describe, load_study_models
    from hf_securesd.bench.profiles import TINY

    if name == TINY:
        models = load_study_models(TINY, TINY, device=device, dtype=dtype)
        return models.target, models.tokenizer, {"target": models.ids["target"]}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_securesd.models import resolve_model

    location = resolve_model(name, offline=offline, cache_dir=cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=DTYPES[dtype]).to(device).eval()
    return hf_securesd.wrap(model), tokenizer, {"target": _describe(name, location)}


def load_models(
    args: argparse.Namespace, device: str
) -> tuple[PreTrainedModel, PreTrainedModel | None, PreTrainedTokenizerBase, dict[str, Any]]:
    """(target, draft or None with --target-only, tokenizer, model ids) of the CLI options."""
    from hf_securesd.bench.loading import load_study_models

    where = dict(device=device, dtype=args.dtype, offline=args.offline, cache_dir=args.cache_dir)
    if args.target_only:
        target, tokenizer, ids = load_target(args.target, **where)
        return target, None, tokenizer, ids
    models = load_study_models(args.target, args.draft, **where)
    return models.target, models.draft, models.tokenizer, models.ids


def _one_line(error: BaseException) -> str:
    """The error's message on one line, without a final full stop."""
    return " ".join(str(error).split()).rstrip(".")


def _fail(message: str, code: int = 2) -> int:
    """Print ``error: message`` to stderr and return the exit code."""
    print(f"error: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """``securesd agentdojo``: one decoding configuration on one suite; prints the result JSON (and
    writes it to --out). Bad options are one ``error:`` line and exit 2, before any model loads;
    exit 1 when writing --out failed or no pair ran without an error."""
    from hf_securesd.models import AssemblyError, ModelResolutionError
    from hf_securesd.models.hardware import resolve_device

    try:
        verifier, schedule = _decoding(args)
        check_out_path(args.out)
        plan_run(suite=args.suite, attack=args.attack, defense=args.defense)
        device = resolve_device(args.device)
    except ValueError as error:  # DeviceError is a ValueError
        return _fail(_one_line(error))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    models = f"--target {args.target}" + ("" if args.target_only else f", --draft {args.draft}")
    try:
        target, draft, tokenizer, ids = load_models(args, device)
    except (AssemblyError, ModelResolutionError) as error:  # their messages say what to do
        return _fail(f"could not load the model(s) ({models}): {_one_line(error)}")
    except (OSError, ValueError) as error:  # transformers could not load a folder or reach a Hub id
        return _fail(
            f"could not load the model(s) ({models}): {_one_line(error)}. Give a folder holding a transformers "
            "model, a known name (`securesd models where` lists them), or a Hub id reachable from here"
        )
    try:
        result = run_agentdojo(
            target, draft, tokenizer, suite=args.suite, verifier=verifier, schedule=schedule,
            attack=args.attack, limit=args.limit, injection_limit=args.injection_limit, defense=args.defense,
            max_new_tokens=args.max_new_tokens, num_assistant_tokens=args.num_assistant_tokens,
            progress=not args.no_progress,
        )
    except ValueError as error:
        return _fail(_one_line(error))
    result["models"] = ids
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        try:
            write_result(args.out, text)
        except OSError as error:
            return _fail(f"could not write --out {args.out}: {_one_line(error)} (the result is printed above)", 1)
    return 0 if result["n_scored"] else 1


def write_result(path: Path, text: str) -> None:
    """Write the result JSON to `path`, creating missing folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
