"""`HFPromptingLLM`: the AgentDojo pipeline element that answers with `generate` on a local Hugging
Face chat model, from rendering the conversation into a prompt to parsing the reply into tool calls."""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch
from agentdojo.agent_pipeline import BasePipelineElement, PromptingLLM
from agentdojo.functions_runtime import EmptyEnv, Env, FunctionsRuntime
from agentdojo.types import (
    ChatAssistantMessage,
    ChatMessage,
    get_text_content_as_str,
    text_content_block_from_string,
)
from openai.types.chat import ChatCompletionMessage
from transformers import PreTrainedModel, PreTrainedTokenizerBase

import hf_securesd
from hf_securesd.bench.agentdojo.choices import _require_positive_int
from hf_securesd.bench.agentdojo.control_tokens import (
    ControlTokenError,
    _control_strings,
    break_encoded_controls,
    break_lookalikes,
    control_ids,
    lookalike_pattern,
    token_variants,
)
from hf_securesd.bench.agentdojo.replies import CALL_OPEN, _assistant_text, _check_reply, _parse_error_text
from hf_securesd.bench.runner import chat_prompt
from hf_securesd.schedules import Schedule
from hf_securesd.verifiers import Lossless, Verifier, resolve_verifier

PIPELINE_NAME = "local"  # AgentDojo's name for a locally served model ("Local model" in its attacks)


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
        self._controls = lookalike_pattern(controls)
        self._control_ids = control_ids(tokenizer, controls)
        self._check_token_break(controls)
        self.calls: list[dict[str, Any]] = []

    def _check_token_break(self, controls: Sequence[str]) -> None:
        """Refuse a tokenizer that still reads a neutralised control string, or a look-alike of one
        (case and fullwidth variants, see `token_variants`), as the control token: e.g. a
        normalizer that drops zero-width characters before matching added tokens."""
        for control in controls:
            for variant in token_variants(control):
                try:
                    broken = self.neutralise(variant)
                except ControlTokenError:
                    raise ValueError(
                        f"the tokenizer reads {variant!r} as its control token {control!r} even with "
                        "zero-width spaces inserted, so text from tools could forge chat turns; use a "
                        "tokenizer that does not drop zero-width spaces before matching its added tokens"
                    ) from None
                tokens = self.tokenizer.tokenize(broken)
                if control in tokens or set(self.tokenizer.convert_tokens_to_ids(tokens)) & self._control_ids:
                    raise ValueError(
                        f"the tokenizer reads {broken!r} as its control token {control!r}, so text from "
                        "tools could forge chat turns; use a tokenizer that does not drop zero-width spaces"
                    )

    def neutralise(self, text: str) -> str:
        """`text` with every control-token string, and every look-alike the tokenizer may normalise
        into one (fullwidth forms, other case), broken by a zero-width space; then whatever the
        tokenizer still encodes to a control token is broken where it reads it. Raises
        `ControlTokenError` (a ValueError) for text that stays a control token."""
        text = break_lookalikes(text, self._controls)
        return break_encoded_controls(self.tokenizer, self._control_ids, text)

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
