"""The ``openai`` engine: any OpenAI-compatible server (vLLM, SGLang, TensorRT-LLM, llama.cpp,
a hosted API), greedy (temperature 0), through `client.OpenAIClient`.

Two ways to name configurations, which can be combined:

- **endpoints**: ``--endpoint NAME=URL`` (repeatable), each a deployment whose decoding is whatever
  its server does (cell ``endpoint:NAME``); ``--baseline NAME`` is the one serving the target alone
  (a lossless twin), ``--draft-baseline NAME`` the one serving the draft alone. Without
  ``--baseline`` the target baseline is a plain request to ``--base-url``; without a draft baseline
  there is no draft-only cell and PRR is undefined ("–").
- **request fields** of this package's vLLM plugin on ``--base-url``: each ``--verifiers`` x
  ``--schedules`` configuration is sent as ``"vllm_xargs": {"securesd": "<JSON>"}``.

Requests go to ``/completions`` with the prompt text built by the local target tokenizer's chat
template, or, with ``--chat``, to ``/chat/completions`` with the task's messages (the server applies
its own template; no tokenizer needed). With ``--token-ids`` (vLLM servers) the prompt is sent as
token ids and the response's token ids (``return_token_ids``) are decoded with the local tokenizer,
so the records equal the ``hf`` and ``vllm`` engines' byte for byte. The API key comes from the
environment variable named by ``--api-key-env``; it is never written anywhere. Acceptance rates are
recorded where the server returns per-request speculative metrics (vLLM with
``--enable-per-request-metrics --per-request-spec-decode-metrics detailed``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from hf_securesd.bench.engines import register_engine
from hf_securesd.bench.engines.base import Answer, Engine, EngineError, Generation, GenerationFailure, Prompt
from hf_securesd.bench.engines.client import ClientSettings, OpenAIClient, RequestFailed
from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.judges.secrets import redact


def securesd_fields(config: RunConfig) -> dict[str, Any]:
    """The plugin's request object for a speculative configuration (`hf_securesd.vllm.request`)."""
    fields: dict[str, Any] = {"verifier": config.verifier.to_dict()}
    if config.schedule is not None:
        fields["secure_schedule"] = config.schedule.to_dict()
    return fields


@dataclass
class OpenAISettings:
    """What the ``openai`` engine reaches and how. `endpoints`: name -> base URL."""

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    chat: bool = False
    token_ids: bool = False
    endpoints: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None
    draft_baseline: str | None = None
    client: ClientSettings = field(default_factory=ClientSettings)

    def __post_init__(self) -> None:
        for flag, name in (("--baseline", self.baseline), ("--draft-baseline", self.draft_baseline)):
            if name is not None and name not in self.endpoints:
                known = ", ".join(self.endpoints) or "none"
                raise EngineError(f"{flag} {name!r} is not an --endpoint NAME=URL (given: {known})")
        if self.baseline is None and self.base_url is None:
            raise EngineError(
                "the openai engine needs --base-url (or --endpoint NAME=URL with --baseline NAME)"
            )
        if self.chat and self.token_ids:
            raise EngineError(
                "--token-ids sends prompts as token ids to /completions; it cannot be combined "
                "with --chat (the server's chat template)"
            )

    def api_key(self) -> str | None:
        """The key from the environment variable `api_key_env` (EngineError when it is unset)."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise EngineError(f"--api-key-env {self.api_key_env}: that environment variable is not set")
        return key


def parse_endpoints(pairs: Sequence[str]) -> dict[str, str]:
    """``NAME=URL`` strings -> {name: url}; names are unique and made of letters, digits, ``._-``."""
    endpoints: dict[str, str] = {}
    for pair in pairs:
        name, separator, url = pair.partition("=")
        if not separator or not name or not url:
            raise EngineError(f"--endpoint takes NAME=URL, got {redact(pair)!r}")
        if not all(character.isalnum() or character in "._-" for character in name):
            raise EngineError(f"--endpoint name {name!r}: use letters, digits, '.', '_' or '-'")
        if name in endpoints:
            raise EngineError(f"--endpoint {name!r} is given twice")
        endpoints[name] = url
    return endpoints


@register_engine("openai")
class OpenAIEngine(Engine):
    """Generates through OpenAI-compatible servers (see the module docstring). There is no warm-up
    and no rate probe: both would be requests whose answers are thrown away (and may be billed)."""

    probes_rates = False

    def __init__(self, settings: OpenAISettings, tokenizer: Any | None = None) -> None:
        if not settings.chat and tokenizer is None:
            raise EngineError(
                "the openai engine's completions mode builds prompts with the target tokenizer's "
                "chat template: give --tokenizer (or --target), or use --chat"
            )
        self.settings = settings
        self._tokenizer = tokenizer
        api_key = settings.api_key()
        urls = {*settings.endpoints.values(), *([settings.base_url] if settings.base_url else [])}
        try:
            self._clients = {url: OpenAIClient(url, api_key, settings.client) for url in sorted(urls)}
        except ValueError as error:
            raise EngineError(str(error)) from None
        self._models = {url: self._served_model(url) for url in self._clients}

    @property
    def tokenizer(self) -> Any | None:
        return self._tokenizer

    def _served_model(self, url: str) -> dict[str, Any]:
        """The model name requests to `url` carry (--model, else the first the server lists) and the
        names the server reports (None when it does not answer /models)."""
        try:
            listed = self._clients[url].request("GET", "/models")
            names = [
                entry["id"] for entry in listed.get("data", []) if isinstance(entry, dict) and "id" in entry
            ]
        except (RequestFailed, TypeError) as error:
            if self.settings.model is None:
                raise EngineError(f"{url}/models gave no model list ({error}); pass --model NAME") from None
            names = None
        if self.settings.model is None and not names:
            raise EngineError(f"{url}/models lists no model; pass --model NAME")
        return {"request_model": self.settings.model or names[0], "server_models": names}

    def baseline_configs(self) -> list[RunConfig]:
        return [TARGET, DRAFT] if self.settings.draft_baseline else [TARGET]

    def check_configs(self, configs: Sequence[RunConfig]) -> None:
        if any(config.kind == "speculative" for config in configs) and self.settings.base_url is None:
            raise EngineError(
                "--verifiers/--schedules are sent as request fields to --base-url; give --base-url"
            )
        for config in configs:
            if config.kind == "endpoint" and config.endpoint not in self.settings.endpoints:
                raise EngineError(f"configuration {config.key} names no --endpoint")

    def describe(self) -> dict[str, Any]:
        import hf_securesd

        endpoints = {name: url for name, url in self.settings.endpoints.items()}
        if self.settings.base_url:
            endpoints["--base-url"] = self.settings.base_url
        return {
            "engine": self.name,
            "engine_version": getattr(hf_securesd, "__version__", None),
            "api": "chat/completions" if self.settings.chat else "completions",
            "endpoints": endpoints,
            "baseline_endpoint": self.settings.baseline,
            "draft_baseline_endpoint": self.settings.draft_baseline,
            "server_models": dict(self._models),
            "models": {
                config.kind: self._model_entry(self._url_for(config)) for config in self.baseline_configs()
            },
        }

    def _model_entry(self, url: str) -> dict[str, Any]:
        name = self._models[url]["request_model"]
        return {"name": name, "id": name, "location": url}

    def _url_for(self, config: RunConfig) -> str:
        if config.kind == "endpoint":
            return self.settings.endpoints[config.endpoint]
        if config.kind == "draft":
            if self.settings.draft_baseline is None:
                raise EngineError("no --draft-baseline endpoint serves the draft alone")
            return self.settings.endpoints[self.settings.draft_baseline]
        if config.kind == "target" and self.settings.baseline is not None:
            return self.settings.endpoints[self.settings.baseline]
        return self.settings.base_url

    def _payload(self, config: RunConfig, prompt: Prompt, url: str, max_new_tokens: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self._models[url]["request_model"],
            "max_tokens": max_new_tokens,
            "temperature": 0,
        }
        if self.settings.chat:
            payload["messages"] = prompt.messages
        elif self.settings.token_ids:
            payload["prompt"] = self._tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
            payload["return_token_ids"] = True
        else:
            payload["prompt"] = prompt.text
        if config.kind == "speculative":
            payload["vllm_xargs"] = {"securesd": json.dumps(securesd_fields(config))}
        return payload

    def _answer(self, reply: dict[str, Any], seconds: float) -> Answer:
        """A Generation from one reply, or a failure when the reply has no usable answer."""
        from hf_securesd.vllm.stats import speculative_stats

        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] if self.settings.chat else choice["text"]
        except (KeyError, IndexError, TypeError):
            return GenerationFailure(
                f"the reply has no choices[0].{'message.content' if self.settings.chat else 'text'}"
                f": {json.dumps(reply)[:200]}"
            )
        if not isinstance(text, str):
            return GenerationFailure(f"the reply's text is {type(text).__name__}, not a string")
        token_ids = choice.get("token_ids")
        if self.settings.token_ids:
            if not isinstance(token_ids, list) or not all(isinstance(token, int) for token in token_ids):
                return GenerationFailure(
                    "--token-ids: the reply has no choices[0].token_ids (is it a vLLM server?)"
                )
            text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        new_tokens = usage.get("completion_tokens")
        if not isinstance(new_tokens, int):
            new_tokens = len(token_ids) if isinstance(token_ids, list) else 0
        metrics = reply.get("metrics") or choice.get("metrics")
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        try:
            stats = speculative_stats(spec) if isinstance(spec, dict) else None
        except (ValueError, TypeError):
            stats = None
        if stats is not None:
            stats.new_tokens = new_tokens
        return Generation(text, new_tokens, seconds, stats, None)

    def generate(
        self, config: RunConfig, prompts: Sequence[Prompt], max_new_tokens: int, num_assistant_tokens: int
    ) -> list[Answer]:
        url = self._url_for(config)
        path = "/chat/completions" if self.settings.chat else "/completions"
        payloads = [self._payload(config, prompt, url, max_new_tokens) for prompt in prompts]
        start = time.perf_counter()
        replies = self._clients[url].post_many(path, payloads)
        seconds = (time.perf_counter() - start) / len(prompts)  # the batch's time, split evenly over its rows
        answers: list[Answer] = []
        for reply in replies:
            if isinstance(reply, RequestFailed):
                answers.append(GenerationFailure(str(reply), reply.attempts))
            else:
                answers.append(self._answer(reply, seconds))
        return answers

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
