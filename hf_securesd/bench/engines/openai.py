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
so the records equal the ``hf`` and ``vllm`` engines' byte for byte.

Each request names a model: ``--endpoint-model NAME=MODEL`` for endpoint NAME, else ``--model``, else
the first model the server lists. A server that lists its models (``/models``) and not the one its
requests name is warned about before anything is generated (vLLM answers every such request HTTP 404;
other servers accept names they do not list). The model a reply names is compared with the one its request named: a reply from another model
(fallback routing, a swapped model; a hosted API's dated name for the same one) is warned about once
per route, and scored.

API keys come from environment variables and are never written anywhere. Each goes only where the
user sent it: ``--api-key-env VAR`` is the key of ``--base-url``, ``--endpoint-api-key-env NAME=VAR``
the key of endpoint NAME; an endpoint without one gets no Authorization header.

Acceptance rates are recorded where the server returns per-request speculative metrics (vLLM with
``--enable-per-request-metrics --per-request-spec-decode-metrics detailed``). They come from the
server, so they are checked before use (`speculative_metrics_problem`): a reply whose per-step
counts are not plausible is a failed request, never an allocation sized by the server. They are
believed only where the answer's number of tokens is known (``usage.completion_tokens``, else the
number of the returned ``token_ids`` when they are a list of non-negative integers: `listed_tokens`),
so that every step can be checked to lie inside the answer: a reply without it is scored with its
statistics dropped (AR "–", as for a server that sends none).

The answer itself is checked the same way (`reply_problem`, `token_ids_problem`): a reply whose
``finish_reason`` says the server did not finish it (not one of `NORMAL_FINISH_REASONS`: a content
filter, an abort, an error), that claims more tokens than the request's ``max_tokens`` (its
``usage.completion_tokens``, else the number of its ``token_ids``), whose text is longer than
``max_tokens`` tokens can decode to (`MAX_CHARACTERS_PER_TOKEN` a token + `TEXT_SLACK_CHARACTERS`),
or whose ``--token-ids`` are not ``max_tokens`` ids of the tokenizer, is a failed request: recorded,
never scored. So is a reply whose answer is ambiguous (`choice_problem`): more than one choice for a
request that asked for one (n=1), or a choice whose ``index`` is not 0. A reply to a generation
request is capped at `reply_byte_cap` bytes before it is read. Numbers a server sends are shortened
in error messages (`server_count`; one too long to read, by `json_integer`), as its other values are
(`_quoted`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from hf_securesd.bench.engines import register_engine
from hf_securesd.bench.engines.base import (
    REPLY_MODEL_CHARS,
    Answer,
    Engine,
    EngineError,
    Generation,
    GenerationFailure,
    Prompt,
)
from hf_securesd.bench.engines.client import Attempts, ClientSettings, OpenAIClient, RequestFailed
from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.http_deadline import server_count, valid_unicode
from hf_securesd.judges.secrets import api_key_problem, redact, redacted_excerpt, warn_if_unredacted

BASE_ROUTE = "--base-url"  # the route (client) of --base-url; the others are named by their endpoint
MAX_DRAFTS_PER_STEP = 1024  # far above any real k; a server reporting more is not believed
# finish_reason of an answer that ended normally: OpenAI ("stop", "length", "tool_calls",
# "function_call"), vLLM, SGLang and llama.cpp ("stop", "length", "tool_calls"), TGI ("eos_token",
# "stop_sequence", "length"). Any other ("content_filter"; vLLM's "abort", "error", "repetition";
# SGLang's "abort") says the server cut or withheld the answer. A reply without one is accepted.
NORMAL_FINISH_REASONS = frozenset(
    {"stop", "length", "eos", "eos_token", "stop_sequence", "tool_calls", "function_call"}
)
# A token decodes to at most its bytes, each at most one character; the longest token of Qwen2.5's
# vocabulary is 128 bytes (of spaces): twice that is a generous bound.
MAX_CHARACTERS_PER_TOKEN = 256
TEXT_SLACK_CHARACTERS = 1024  # a stop string a server appends, special tokens written out
# A generation reply holds, per token, its text (a real token decodes to at most 128 bytes, JSON-
# escaped to at most 6 bytes a byte: 768), maybe a reasoning text as well, its token id and its
# per-step metrics: under 2 KiB, so 4 KiB is generous. The slack covers the rest of the reply, the
# prompt's token ids a --token-ids reply echoes included (~130,000 of them).
REPLY_BYTES_PER_TOKEN = 4096
REPLY_SLACK_BYTES = 1024 * 1024


# a verifier no plugin accepts: the request that checks --base-url runs hf-securesd's vLLM plugin
PLUGIN_CHECK_VERIFIER = "securesd-plugin-check"
MODELS_SHOWN = 10  # of a server's /models list, in the error for a model it does not list


def securesd_fields(config: RunConfig) -> dict[str, Any]:
    """The plugin's request object for a speculative configuration (`hf_securesd.vllm.request`)."""
    fields: dict[str, Any] = {"verifier": config.verifier.to_dict()}
    if config.schedule is not None:
        fields["secure_schedule"] = config.schedule.to_dict()
    return fields


@dataclass
class OpenAISettings:
    """What the ``openai`` engine reaches and how. `endpoints`: name -> base URL; `model`: the model
    requests name (None: the first each server lists); `endpoint_models`: endpoint name -> the model
    its requests name instead of `model`; `api_key_env`: the variable holding the key of `base_url`;
    `endpoint_key_envs`: endpoint name -> the variable holding that endpoint's key (an endpoint not
    named there is sent no key)."""

    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    chat: bool = False
    token_ids: bool = False
    endpoints: dict[str, str] = field(default_factory=dict)
    endpoint_key_envs: dict[str, str] = field(default_factory=dict)
    endpoint_models: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None
    draft_baseline: str | None = None
    client: ClientSettings = field(default_factory=ClientSettings)

    def __post_init__(self) -> None:
        for flag, name in (("--baseline", self.baseline), ("--draft-baseline", self.draft_baseline)):
            if name is not None and name not in self.endpoints:
                known = ", ".join(self.endpoints) or "none"
                raise EngineError(f"{flag} {name!r} is not an --endpoint NAME=URL (given: {known})")
        if self.baseline is not None and self.baseline == self.draft_baseline:
            raise EngineError(
                f"--baseline and --draft-baseline both name the endpoint {self.baseline!r}: its draft-only "
                "cell would be the target again, and PRR (the share of the target-draft gap a configuration "
                "keeps) undefined; give --draft-baseline an --endpoint that serves the draft alone, or leave "
                "it out"
            )
        if self.baseline is None and self.base_url is None:
            raise EngineError(
                "the openai engine needs --base-url (or --endpoint NAME=URL with --baseline NAME)"
            )
        self._check_keys()
        self._check_endpoint_names("--endpoint-model", self.endpoint_models)
        if self.chat and self.token_ids:
            raise EngineError(
                "--token-ids sends prompts as token ids to /completions; it cannot be combined "
                "with --chat (the server's chat template)"
            )

    def _check_keys(self) -> None:
        """Every key goes to a server the user named for it, named by an environment variable (a value that
        is not a variable name may be the key itself, typed in its place: it is refused without being shown)."""
        names = ([self.api_key_env] if self.api_key_env is not None else []) + list(self.endpoint_key_envs.values())
        if any(not (name.isascii() and name.isidentifier()) for name in names):
            raise EngineError(
                "an API key option takes the NAME of the environment variable that holds the key, not the key "
                "itself; a value given is not a variable name (letters, digits, '_'), so it is not shown here"
            )
        if self.api_key_env is not None and self.base_url is None:
            raise EngineError(
                "--api-key-env is the key of --base-url, and there is no --base-url; give an "
                "endpoint its key with --endpoint-api-key-env NAME=VARIABLE"
            )
        self._check_endpoint_names("--endpoint-api-key-env", self.endpoint_key_envs)

    def _check_endpoint_names(self, flag: str, settings: dict[str, str]) -> None:
        """EngineError when a per-endpoint option (`flag`: NAME -> its value in `settings`) names no
        --endpoint (a misspelt name would leave the endpoint it meant without the setting)."""
        unknown = sorted(set(settings) - set(self.endpoints))
        if unknown:
            known = ", ".join(self.endpoints) or "none"
            raise EngineError(f"{flag} {unknown[0]!r} is not an --endpoint NAME=URL (given: {known})")

    def request_model(self, route: str) -> str | None:
        """The model requests to `route` name as the user gave it: the endpoint's --endpoint-model,
        else --model (None: the first model its server lists)."""
        return self.endpoint_models.get(route, self.model)

    def model_option(self, route: str) -> str:
        """The option that sets the model of `route`'s requests (named in errors)."""
        if route in self.endpoint_models:
            return f"--endpoint-model {route}={self.endpoint_models[route]}"
        return "--model"

    def routes(self) -> dict[str, str]:
        """Route -> base URL: `BASE_ROUTE` for --base-url (when given) and each endpoint's name."""
        routes = {BASE_ROUTE: self.base_url} if self.base_url else {}
        return {**routes, **self.endpoints}

    def api_key(self, route: str) -> str | None:
        """The key sent to `route`, from the variable the user named for it (None when none was
        named; EngineError when the variable is unset)."""
        if route == BASE_ROUTE:
            variable, flag = self.api_key_env, f"--api-key-env {self.api_key_env}"
        else:
            variable = self.endpoint_key_envs.get(route)
            flag = f"--endpoint-api-key-env {route}={variable}"
        if variable is None:
            return None
        key = os.environ.get(variable)
        if not key:
            raise EngineError(f"{flag}: that environment variable is not set")
        problem = api_key_problem(key, flag)
        if problem is not None:
            raise EngineError(problem)
        warn_if_unredacted(key, flag)
        return key


def parse_endpoints(pairs: Sequence[str]) -> dict[str, str]:
    """``NAME=URL`` strings -> {name: url}; names are unique and made of letters, digits, ``._-``."""
    endpoints: dict[str, str] = {}
    for pair in pairs:
        name, separator, url = pair.partition("=")
        if not separator or not name or not url:
            raise EngineError(f"--endpoint takes NAME=URL, got {redact(pair)!r}")
        if not name[0].isalnum() or not all(character.isalnum() or character in "._-" for character in name):
            raise EngineError(
                f"--endpoint name {name!r}: use letters, digits, '.', '_' or '-', starting with a "
                "letter or digit"
            )
        if name in endpoints:
            raise EngineError(f"--endpoint {name!r} is given twice")
        endpoints[name] = url
    return endpoints


def parse_endpoint_key_envs(pairs: Sequence[str]) -> dict[str, str]:
    """``NAME=VARIABLE`` strings (``--endpoint-api-key-env``) -> {endpoint name: variable name};
    the variable's value is never shown (a key typed in its place stays out of the message)."""
    variables: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        name, _, variable = pair.partition("=")
        if not name or not variable.isidentifier():
            raise EngineError(
                f"--endpoint-api-key-env number {number} is not NAME=VARIABLE: an --endpoint name and "
                "the name of the environment variable that holds its key (not the key itself)"
            )
        if name in variables:
            raise EngineError(f"--endpoint-api-key-env {name!r} is given twice")
        variables[name] = variable
    return variables


def parse_endpoint_models(pairs: Sequence[str]) -> dict[str, str]:
    """``NAME=MODEL`` strings (``--endpoint-model``) -> {endpoint name: the model its requests name}."""
    models: dict[str, str] = {}
    for pair in pairs:
        name, separator, model = pair.partition("=")
        if not separator or not name or not model.strip():
            raise EngineError(
                f"--endpoint-model takes NAME=MODEL (an --endpoint name and the model its requests name), "
                f"got {redact(pair)!r}"
            )
        if name in models:
            raise EngineError(f"--endpoint-model {name!r} is given twice")
        models[name] = model
    return models


def _isserver_count(value: Any) -> bool:
    """Whether `value` is a non-negative integer (booleans excluded)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _counts(value: Any) -> bool:
    """Whether `value` is a list of non-negative integers (booleans excluded)."""
    return isinstance(value, list) and all(_isserver_count(count) for count in value)


def speculative_metrics_problem(spec: dict[str, Any], max_new_tokens: int, new_tokens: int | None = None) -> str | None:
    """Why a reply's ``metrics.speculative_decoding`` per-step counts cannot be true, or None.

    They must be lists of non-negative integers of equal length, each step drafting at most
    `MAX_DRAFTS_PER_STEP` tokens and accepting no more than it drafted, and every step must start
    within `max_new_tokens` (the request's max_tokens) + `MAX_DRAFTS_PER_STEP` response positions:
    the per-position statistics are sized by them. With the answer's `new_tokens`, the last step must
    also start inside the answer: each step commits its accepted drafts and one token, and only the
    last one can be cut short (max_tokens, EOS), so every earlier step's tokens are in the answer (a
    step that drafted nothing goes unrecorded, which only moves later steps further in)."""
    drafted, accepted = spec.get("per_step_drafted"), spec.get("per_step_accepted")
    if drafted is None and accepted is None:
        return None
    if not (_counts(drafted) and _counts(accepted) and len(drafted) == len(accepted)):
        return (
            "per_step_drafted and per_step_accepted are not two lists of non-negative integers of "
            "equal length"
        )
    start = 1  # the first step's drafts start at response position 1 (`hf_securesd.vllm.stats`)
    last_start = max_new_tokens + MAX_DRAFTS_PER_STEP
    for step, (step_drafted, step_accepted) in enumerate(zip(drafted, accepted)):
        if step_drafted > MAX_DRAFTS_PER_STEP or step_accepted > step_drafted:
            return (
                f"step {step} drafted {server_count(step_drafted)} and accepted "
                f"{server_count(step_accepted)} tokens "
                f"(at most {MAX_DRAFTS_PER_STEP} drafts a step, and never more accepted than drafted)"
            )
        if start > last_start:
            return (
                f"step {step} starts at response position {start}, past the request's max_tokens "
                f"{max_new_tokens} + {MAX_DRAFTS_PER_STEP}"
            )
        if new_tokens is not None and start >= new_tokens:
            return (
                f"step {step} starts at response position {start}, but the answer holds {new_tokens} "
                "tokens: the steps before it commit more tokens than the answer has"
            )
        start += step_accepted + 1
    return None


def _quoted(value: Any, limit: int = 40) -> str:
    """A value a server sent, for an error message: its JSON when at most `limit` characters, else
    what it is (never clipped, so that `redact` later finds any key in it whole)."""
    text = json.dumps(value)
    return text if len(text) <= limit else f"a {type(value).__name__} of {len(text):,} JSON characters"


def reply_byte_cap(max_new_tokens: int) -> int:
    """The most bytes a reply to a generation request of `max_new_tokens` tokens may take (the
    client's own cap still applies when it is lower): parsing costs a multiple of what is read."""
    return REPLY_SLACK_BYTES + max_new_tokens * REPLY_BYTES_PER_TOKEN


def completion_tokens(usage: Any) -> int | None:
    """``usage.completion_tokens`` when it is a count (a non-negative integer, not a boolean), else
    None: missing, or not a number of tokens, and so not believed."""
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return count if _isserver_count(count) else None


def listed_tokens(token_ids: Any) -> int | None:
    """The number of a reply's ``choices[0].token_ids`` when they are a non-empty list of non-negative
    integers (booleans excluded), else None: not token ids (or none listed), and so not counted (as a
    ``usage.completion_tokens`` that is not a count is not believed)."""
    return len(token_ids) if token_ids and _counts(token_ids) else None


def reply_problem(finish_reason: Any, tokens: int | None, text: str, max_new_tokens: int) -> str | None:
    """Why a reply is not an answer to score, or None: its `finish_reason` says the server did not
    finish it, it claims more completion `tokens` than `max_new_tokens` (the request's max_tokens),
    or its `text` is longer than `max_new_tokens` tokens can decode to (whatever the claimed count:
    a server may send a small count and megabytes of text)."""
    if finish_reason is not None and not (
        isinstance(finish_reason, str) and finish_reason in NORMAL_FINISH_REASONS
    ):
        normal = ", ".join(sorted(NORMAL_FINISH_REASONS))
        return (
            f"the reply's finish_reason is {_quoted(finish_reason)}: the server did not finish the "
            f"answer (a finished one says {normal}); it is not scored"
        )
    if tokens is not None and tokens > max_new_tokens:
        return (
            f"the reply claims {server_count(tokens)} completion tokens, more than the request's max_tokens "
            f"{max_new_tokens:,}"
        )
    most = max_new_tokens * MAX_CHARACTERS_PER_TOKEN + TEXT_SLACK_CHARACTERS
    if len(text) > most:
        return (
            f"the reply's text is {len(text):,} characters, more than the request's max_tokens "
            f"{max_new_tokens:,} can decode to ({MAX_CHARACTERS_PER_TOKEN} a token + "
            f"{TEXT_SLACK_CHARACTERS}: {most:,})"
        )
    return None


def token_ids_problem(token_ids: Any, max_new_tokens: int, vocabulary_size: int) -> str | None:
    """Why a reply's ``choices[0].token_ids`` are not an answer of `max_new_tokens` tokens from a
    vocabulary of `vocabulary_size` ids, or None. They must be a list of at most `max_new_tokens`
    integers (booleans excluded) from 0 to `vocabulary_size` - 1: a tokenizer drops an id outside
    its vocabulary without a word and overflows on a huge one."""
    if not isinstance(token_ids, list):
        return "--token-ids: the reply has no choices[0].token_ids (is it a vLLM server?)"
    if len(token_ids) > max_new_tokens:
        return (
            f"--token-ids: the reply holds {len(token_ids):,} token ids, more than the request's "
            f"max_tokens {max_new_tokens:,}"
        )
    for position, token in enumerate(token_ids):
        if not (_isserver_count(token) and token < vocabulary_size):
            return (
                f"--token-ids: token id {_quoted(token)} at position {position} "
                f"is not an id of the tokenizer (an integer from 0 to {vocabulary_size - 1})"
            )
    return None


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
        self._routes = settings.routes()
        keys = {route: settings.api_key(route) for route in self._routes}
        self._secrets = [key for key in keys.values() if key]
        try:
            self._clients = {
                route: OpenAIClient(url, keys[route], settings.client) for route, url in self._routes.items()
            }
        except ValueError as error:
            raise EngineError(str(error)) from None
        self._models = {route: self._served_model(route) for route in self._clients}
        self._plugin_routes: set[str] = set()  # routes that answered the plugin check (`check_configs`)
        self._warned_reply_models: set[str] = set()  # routes warned about by `_check_reply_model`

    @property
    def tokenizer(self) -> Any | None:
        return self._tokenizer

    def _served_model(self, route: str) -> dict[str, Any]:
        """The model name requests to `route` carry (its --endpoint-model, else --model, else the first
        its server lists) and the names the server reports (None when it does not answer /models; lone
        surrogates replaced by U+FFFD, as in answers). A server that lists models, none of them the one
        asked for, is warned about (`_warn_unlisted_model`)."""
        url = self._routes[route]
        requested = self.settings.request_model(route)
        try:
            listed = self._clients[route].request("GET", "/models")
            names = [
                valid_unicode(entry["id"])
                for entry in listed.get("data", [])
                if isinstance(entry, dict) and isinstance(entry.get("id"), str)
            ]
        except (RequestFailed, TypeError) as error:
            if requested is None:
                raise self._no_model_list(route, error) from None
            names = None
        if requested is None and not names:
            hint = self._endpoint_model_hint(route)
            raise EngineError(f"{url}/models lists no model; pass --model NAME{hint}")
        if requested is not None and names and requested not in names:
            self._warn_unlisted_model(route, requested, names)
        return {"request_model": requested or names[0], "server_models": names}

    def _endpoint_model_hint(self, route: str) -> str:
        """For an endpoint's error about its model: the option that names its model alone."""
        return "" if route == BASE_ROUTE else f" or --endpoint-model {route}=NAME"

    @staticmethod
    def _route_text(route: str) -> str:
        """How messages name `route`: ``--base-url`` or ``endpoint 'NAME'``."""
        return "--base-url" if route == BASE_ROUTE else f"endpoint {route!r}"

    def _warn_unlisted_model(self, route: str, requested: str, names: list[str]) -> None:
        """Warn, before anything is generated, that `route`'s server lists `names` and not `requested`, the
        model its requests name: a vLLM server answers each of them HTTP 404 (every prompt then fails,
        recorded as such), while servers that accept names they do not list (aliases, tags such as Ollama's
        ``llama3`` for ``llama3:latest``, gateways) answer. The listed names come from the server: shown as
        JSON (control characters escaped), at most `MODELS_SHOWN` of them, secrets redacted."""
        shown = ", ".join(_quoted(name, 200) for name in names[:MODELS_SHOWN])
        if len(names) > MODELS_SHOWN:
            shown += f" and {len(names) - MODELS_SHOWN:,} more"
        option = "--model MODEL" if route == BASE_ROUTE else f"--endpoint-model {route}=MODEL"
        message = (
            f"{self._route_text(route)} ({self._routes[route]}) does not list {requested!r}, the model its "
            f"requests name ({self.settings.model_option(route)}): its /models lists {shown}. A server that "
            f"serves only what it lists (vLLM) fails every such request; name one of those with {option}, "
            f"or start that server with --served-model-name {requested}"
        )
        warnings.warn(redact(message, self._secrets), stacklevel=2)

    def _no_model_list(self, route: str, error: Exception) -> EngineError:
        """The error for a `route` whose /models gave no list when --model is not given: a server that
        could not be reached (or sent nothing in time) needs its URL or the server fixed, one that
        answered without a list needs --model. `error` is the client's, its secrets already redacted."""
        url = self._routes[route]
        if isinstance(error, RequestFailed) and not error.replied:
            option = "--base-url" if route == BASE_ROUTE else f"--endpoint {route}=URL"
            return EngineError(
                f"{url}/models could not be reached ({error}); check {option} and that the server is running"
            )
        hint = self._endpoint_model_hint(route)
        return EngineError(f"{url}/models gave no model list ({error}); pass --model NAME{hint}")

    def baseline_configs(self) -> list[RunConfig]:
        return [TARGET, DRAFT] if self.settings.draft_baseline else [TARGET]

    def check_configs(self, configs: Sequence[RunConfig]) -> None:
        speculative = any(config.kind == "speculative" for config in configs)
        if speculative and self.settings.base_url is None:
            raise EngineError(
                "--verifiers/--schedules are sent as request fields to --base-url; give --base-url"
            )
        for config in configs:
            if config.kind == "endpoint" and config.endpoint not in self.settings.endpoints:
                raise EngineError(f"configuration {config.key} names no --endpoint")
        if speculative:
            self._check_securesd_served()

    def _check_securesd_served(self) -> None:
        """EngineError unless --base-url refuses a request whose SecureSD field names no verifier, as
        hf-securesd's vLLM plugin does (HTTP 400 naming it). A server without the plugin (vLLM without
        it, or with it off, answers with its own decoding; other servers ignore `vllm_xargs`) would have
        every --verifiers cell recorded under a label its answers never had. The check costs one request,
        answered by the plugin without generating (elsewhere: at most one token)."""
        url = self._routes[BASE_ROUTE]
        payload = self._payload(TARGET, Prompt("Hi", [{"role": "user", "content": "Hi"}]), BASE_ROUTE, 1)
        payload["vllm_xargs"] = {"securesd": json.dumps({"verifier": PLUGIN_CHECK_VERIFIER})}
        path = "/chat/completions" if self.settings.chat else "/completions"
        try:
            self._clients[BASE_ROUTE].request("POST", path, payload, reply_byte_cap(1))
        except RequestFailed as error:
            text = str(error)  # the plugin's refusal: 'unknown verifier <name>' (not an echo of the request)
            if "HTTP 400" in text and "unknown verifier" in text and PLUGIN_CHECK_VERIFIER in text:
                self._plugin_routes.add(BASE_ROUTE)
                return
            problem = redact(str(error), self._secrets)
            raise EngineError(
                f"--base-url {url} could not be checked for hf-securesd's vLLM plugin ({problem}); --verifiers "
                "need a vLLM server started with SECURESD_VLLM=1 and hf-securesd installed"
            ) from None
        raise EngineError(
            f"--base-url {url} answered a request whose vllm_xargs securesd names no verifier "
            f"({PLUGIN_CHECK_VERIFIER!r}) instead of refusing it: it does not run hf-securesd's vLLM plugin, so "
            "each --verifiers cell would record the server's own decoding under that verifier's name. Start the "
            "server with hf-securesd installed and SECURESD_VLLM=1 (docs/vllm.md), or measure it with "
            "--endpoint NAME=URL"
        )

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
            # the target's requests to the plugin's server switch SecureSD off (`_payload`)
            "target_plain_requests": self._route_for(TARGET) in self._plugin_routes,
            "server_models": {self._routes[route]: models for route, models in self._models.items()},
            "resolved_models": self._resolved_models(),
            "models": {
                config.kind: self._model_entry(self._route_for(config)) for config in self.baseline_configs()
            },
        }

    def _resolved_models(self) -> dict[str, str]:
        """Route -> the model its requests name (its --endpoint-model, else --model, else the first its
        /models lists), each bound to its route (`results.binding_clashes`): a later session that names
        another model there (another option, or a server that lists another model first) would put a
        second model's answers into cells of the first."""
        return {route: models["request_model"] for route, models in self._models.items()}

    def _model_entry(self, route: str) -> dict[str, Any]:
        name = self._models[route]["request_model"]
        return {"name": name, "id": name, "location": self._routes[route]}

    def _route_for(self, config: RunConfig) -> str:
        """The route (`BASE_ROUTE` or an endpoint's name) that serves `config`."""
        if config.kind == "endpoint":
            return config.endpoint
        if config.kind == "draft":
            if self.settings.draft_baseline is None:
                raise EngineError("no --draft-baseline endpoint serves the draft alone")
            return self.settings.draft_baseline
        if config.kind == "target" and self.settings.baseline is not None:
            return self.settings.baseline
        return BASE_ROUTE

    def _payload(self, config: RunConfig, prompt: Prompt, route: str, max_new_tokens: int) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self._models[route]["request_model"],
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
        elif config.kind == "target" and route in self._plugin_routes:
            # the target alone, even where the server applies a SecureSD rule to requests that name none
            # (SECURESD_VLLM_DEFAULT): its answers are the baseline every configuration is compared with
            payload["vllm_xargs"] = {"securesd": "null"}
        return payload

    def _answer(self, reply: dict[str, Any], seconds: float, max_new_tokens: int) -> Answer:
        """A Generation from one reply, or a failure when the reply has no usable answer
        (`reply_problem`, `token_ids_problem`, `speculative_metrics_problem`). A chat reply with null
        content and a `message.refusal` text is that refusal (judged like any reply). The text has its lone
        surrogates replaced by U+FFFD (`valid_unicode`), so it can be written out."""
        from hf_securesd.vllm.stats import speculative_stats

        problem = choice_problem(reply.get("choices"))
        if problem is not None:
            return GenerationFailure(redact(problem, self._secrets))
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] if self.settings.chat else choice["text"]
            finish_reason = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError):
            return GenerationFailure(
                f"the reply has no choices[0].{'message.content' if self.settings.chat else 'text'}"
                f": {self._reply_excerpt(reply)}"
            )
        refused = False
        if self.settings.chat and text is None:
            text = _refusal_text(choice)
            refused = text is not None
        if not isinstance(text, str):
            return GenerationFailure(f"the reply's text is {type(text).__name__}, not a string")
        token_ids = choice.get("token_ids")
        claimed = completion_tokens(reply.get("usage"))
        if claimed is None and not self.settings.token_ids:  # (--token-ids checks the ids themselves)
            claimed = listed_tokens(token_ids)
        problem = reply_problem(finish_reason, claimed, text, max_new_tokens)
        if problem is not None:
            return GenerationFailure(redact(problem, self._secrets))
        if refused:  # no model tokens come with a service's refusal: none recorded, no statistics
            return Generation(valid_unicode(text), 0, seconds, None, None, finish_reason)
        if self.settings.token_ids:
            problem = token_ids_problem(token_ids, max_new_tokens, len(self._tokenizer))
            if problem is not None:
                return GenerationFailure(redact(problem, self._secrets))
            text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        text = valid_unicode(text)
        new_tokens = claimed
        if self.settings.token_ids:  # the ids are the answer: a count that disagrees is not believed
            if claimed is not None and claimed != len(token_ids):
                return GenerationFailure(
                    f"the reply claims {server_count(claimed)} completion tokens but holds "
                    f"{len(token_ids):,} token ids"
                )
            new_tokens = len(token_ids)
        elif new_tokens is None:
            new_tokens = 0
        elif new_tokens == 0 and text:
            return GenerationFailure("the reply claims 0 completion tokens for a non-empty text")
        metrics = reply.get("metrics") or choice.get("metrics")
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        counted = new_tokens if claimed is not None or self.settings.token_ids else None
        problem = speculative_metrics_problem(spec, max_new_tokens, counted) if isinstance(spec, dict) else None
        if problem is not None:
            return GenerationFailure(f"the reply's metrics.speculative_decoding cannot be right: {problem}")
        if counted is None:
            spec = None  # the steps cannot be checked to fit the answer: not believed (AR "–")
        try:
            stats = speculative_stats(spec, new_tokens) if isinstance(spec, dict) else None
        except (ValueError, TypeError):
            stats = None
        if stats is not None:
            stats.new_tokens = new_tokens
        return Generation(text, new_tokens, seconds, stats, None, finish_reason)

    def generate(
        self, config: RunConfig, prompts: Sequence[Prompt], max_new_tokens: int, num_assistant_tokens: int
    ) -> list[Answer]:
        route = self._route_for(config)
        path = "/chat/completions" if self.settings.chat else "/completions"
        payloads = [self._payload(config, prompt, route, max_new_tokens) for prompt in prompts]
        start = time.perf_counter()
        replies = self._clients[route].post_many_counted(path, payloads, reply_byte_cap(max_new_tokens))
        seconds = (time.perf_counter() - start) / len(prompts)  # the batch's time, split evenly over its rows
        for reply, _ in replies:
            self._check_reply_model(route, reply)
        return [self._read(reply, attempts, seconds, max_new_tokens) for reply, attempts in replies]

    def _check_reply_model(self, route: str, reply: dict[str, Any] | RequestFailed) -> None:
        """Warn, once per route, when a reply's ``model`` names another model than its request did: another
        model may have answered (fallback routing, a swapped deployment), or a hosted API named the same
        one by a dated version (``gpt-4o-2024-08-06`` for ``gpt-4o``). The answer is scored either way; a
        reply without a model name says nothing. The name comes from the server: shown as JSON, secrets
        redacted."""
        named = reply.get("model") if isinstance(reply, dict) else None
        requested = self._models[route]["request_model"]
        if not isinstance(named, str) or named == requested or route in self._warned_reply_models:
            return
        self._warned_reply_models.add(route)
        where = self._route_text(route)
        message = (
            f"{where} ({self._routes[route]}) answered a request for {requested!r} with a reply naming the "
            f"model {_quoted(named, 200)}: another model may have answered (fallback routing, a swapped "
            "model), or the server names the same model otherwise (a hosted API's dated name); its answers "
            f"are scored as {where}'s, each generation recording the model its reply named (reply_model; "
            "warned once per endpoint)"
        )
        warnings.warn(redact(message, self._secrets), stacklevel=2)

    def _read(
        self, reply: dict[str, Any] | RequestFailed, attempts: Attempts, seconds: float, max_new_tokens: int
    ) -> Answer:
        """The answer for one request's outcome: its failure, or what its reply holds, with the attempts
        it took and the seconds slept between them (a reply that cannot be read within the available
        memory is a failure, not the end of the run)."""
        if isinstance(reply, RequestFailed):
            return GenerationFailure(str(reply), reply.attempts)
        try:
            answer = self._answer(reply, seconds, max_new_tokens)
        except MemoryError:
            return GenerationFailure(
                "reading the reply ran out of memory; the reply is not a plausible answer"
            )
        except RecursionError:
            return GenerationFailure(
                "reading the reply ran out of stack (JSON nested too deeply); the reply is not a "
                "plausible answer"
            )
        if isinstance(answer, GenerationFailure):
            return dataclasses.replace(answer, attempts=attempts.count)
        return dataclasses.replace(answer, attempts=attempts.count, retry_wait_seconds=attempts.waited_s,
                                   reply_model=self._reply_model(reply))

    def _reply_model(self, reply: dict[str, Any]) -> str | None:
        """The model a reply names, as recorded: valid Unicode, at most `REPLY_MODEL_CHARS` characters,
        secrets redacted (it comes from the server); None when it names none."""
        named = reply.get("model")
        if not isinstance(named, str):
            return None
        return redact(valid_unicode(named), self._secrets)[:REPLY_MODEL_CHARS]  # redacted whole, then cut

    def _reply_excerpt(self, reply: dict[str, Any]) -> str:
        """A redacted excerpt of `reply` for an error message: its JSON, or what it is when it is nested
        too deeply to encode again from here (a reply parsed near the recursion limit in a worker
        thread raised RecursionError in `json.dumps` from this deeper stack)."""
        try:
            text = json.dumps(reply)
        except RecursionError:
            keys = _quoted(sorted(map(str, reply))[:5], 200)
            return redact(f"a JSON object with keys {keys}, nested too deeply to show", self._secrets)
        return redacted_excerpt(text, self._secrets)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()



def choice_problem(choices: Any) -> str | None:
    """Why a reply's ``choices`` do not hold one answer to a request for one (n=1), or None: more than
    one choice (which is the answer?), or a choice whose ``index`` is given (not missing or null) and is
    not 0. A missing or empty list is left to the caller's message, which quotes the reply."""
    if not isinstance(choices, list) or not choices:
        return None
    if len(choices) > 1:
        return (
            f"the reply holds {len(choices):,} choices for a request that asked for one (n=1); which one is "
            "the answer is not clear, so none is scored"
        )
    index = choices[0].get("index") if isinstance(choices[0], dict) else None
    if index is not None and (index != 0 or isinstance(index, bool)):
        return (
            f"the reply's only choice has index {_quoted(index)}, not 0: it is not the answer to the "
            "request's one prompt"
        )
    return None


def _refusal_text(choice: dict[str, Any]) -> str | None:
    """The text of a chat reply's `message.refusal` (OpenAI's structured refusal: the service declined
    to answer, and `content` is null), or None when it holds none."""
    message = choice.get("message")
    refusal = message.get("refusal") if isinstance(message, dict) else None
    return refusal if isinstance(refusal, str) and refusal.strip() else None
