"""Chat backends that run an LLM judge: a local `transformers` model, or any OpenAI-compatible
chat-completions endpoint reached with `httpx`.

Both turn a list of conversations (each a list of `{"role", "content"}` messages) into one reply
string per conversation, decoded greedily. `complete_replies` also says which replies were cut off
before they ended (`JudgeReply.problem`): an endpoint's `finish_reason` other than a normal stop,
or a local model that reached `max_new_tokens`; a judge counts such a reply as unparsed. Backend
failures raise `JudgeBackendError`; they are never turned into a verdict. Requests made inside
`judge_deadline(deadline)` end by that deadline (a benchmark run's ``--run-deadline`` holds for its
judge as for its engine).
"""

from __future__ import annotations

import base64
import difflib
import inspect
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from hf_securesd.http_deadline import (
    MAX_RETRIES,
    MAX_WAIT_S,
    DeadlineClient,
    DeadlineExceeded,
    Reply,
    RepeatedKey,
    ReplyTooLarge,
    UndecodableReply,
    json_body,
    retry_after_seconds,
    server_count,
    url_problem,
    valid_unicode,
)
from hf_securesd.judges.base import JudgeError
from hf_securesd.schedules import as_real, is_integer
from hf_securesd.judges.secrets import (
    api_key_problem,
    redact,
    redacted_excerpt,
    strip_userinfo,
    url_before_query,
    warn_if_unredacted,
)

Message = dict[str, str]

BASE_URL_ENV = "SECURESD_JUDGE_BASE_URL"
MODEL_ENV = "SECURESD_JUDGE_MODEL"
API_KEY_ENV = "SECURESD_JUDGE_API_KEY"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 60.0
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
# finish_reason of a judge reply that ended on its own: OpenAI, vLLM, SGLang and llama.cpp say "stop",
# TGI "eos_token" or "stop_sequence", some servers "eos". Any other ("length", "content_filter",
# "tool_calls", "abort", ...) says the reply was cut off or withheld. A reply without one is accepted
# unless its usage shows it used all of max_tokens.
FINISHED_REASONS = frozenset({"stop", "eos", "eos_token", "stop_sequence"})
# the `time.monotonic()` past which judge requests are no longer sent (None: no deadline)
_DEADLINE: ContextVar[float | None] = ContextVar("securesd_judge_deadline", default=None)


@dataclass(frozen=True)
class Bounds:
    """The values a numeric backend setting may take: [`low`, `high`], whole numbers only when `integer`."""

    low: float
    high: float
    integer: bool = False

    def problem(self, value: Any) -> str | None:
        """Why `value` is not allowed, naming the range; None when it is. A number is a Python, NumPy or
        0-d tensor one (`schedules.is_integer` / `as_real`), never a bool."""
        number = as_real(value) if not self.integer or is_integer(value) else None
        if number is None or not self.low <= number <= self.high:
            kind_name = "an integer" if self.integer else "a number"
            return f"{value!r} is not {kind_name} in [{self.low}, {self.high}]"
        return None


# the numeric settings of each backend and their ranges: enough for any real judge, and bounded, so that
# no setting (one recorded in a results directory included) can hold a run for days
BACKEND_SETTINGS: Mapping[str, Mapping[str, Bounds]] = {
    "openai": {
        "timeout": Bounds(0.001, 3600), "max_retries": Bounds(0, MAX_RETRIES, integer=True),
        "backoff": Bounds(0, MAX_WAIT_S), "max_tokens": Bounds(1, 1_000_000, integer=True),
        "concurrency": Bounds(1, 256, integer=True), "max_response_bytes": Bounds(1, 1 << 30, integer=True),
    },
    "transformers": {"max_new_tokens": Bounds(1, 32768, integer=True),
                     "batch_size": Bounds(1, 1024, integer=True)},
}


def checked_settings(backend: str, settings: Mapping[str, Any]) -> dict[str, int | float]:
    """`settings` as Python numbers (int where `BACKEND_SETTINGS[backend]` wants one), in their order;
    ValueError naming the first outside its range."""
    bounds = BACKEND_SETTINGS[backend]
    problems = [(name, bounds[name].problem(value)) for name, value in settings.items()]
    wrong = [(name, problem) for name, problem in problems if problem]
    if wrong:
        raise ValueError(f"the {backend} judge backend's {wrong[0][0]!r}: {wrong[0][1]}")
    return {name: (int if bounds[name].integer else float)(as_real(value)) for name, value in settings.items()}


class JudgeBackendError(JudgeError):
    """The judge backend failed to return a reply (HTTP error, timeout, malformed response)."""


@contextmanager
def judge_deadline(deadline: float | None) -> Iterator[None]:
    """Within the block, `OpenAIChatBackend` requests end by `deadline` (a `time.monotonic()` value;
    None: no deadline beyond each attempt's own timeout): attempts are cut short at it, waits
    between retries end at it, and past it nothing more is sent (`JudgeBackendError`)."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def endpoint_settings(base_url: str | None = None, model: str | None = None) -> tuple[str, str]:
    """The judge endpoint's base URL (without a trailing slash) and model, as `OpenAIChatBackend`
    resolves them: the arguments, else `SECURESD_JUDGE_BASE_URL` and `SECURESD_JUDGE_MODEL`, else
    the defaults."""
    url = (base_url or os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL).rstrip("/")
    return url, model or os.environ.get(MODEL_ENV) or DEFAULT_MODEL


@dataclass(frozen=True)
class JudgeReply:
    """One judge reply: its `text`, and `problem`, why it is not a whole answer of its own (it was cut
    off before it ended, the endpoint withheld it, or its JSON was ambiguous), or None; a judge counts a
    reply with a problem as unparsed."""

    text: str
    problem: str | None = None


class ChatBackend(ABC):
    """Turns conversations into replies."""

    @abstractmethod
    def complete(self, conversations: Sequence[Sequence[Message]]) -> list[str]:
        """One greedy reply per conversation, in order."""

    def complete_replies(self, conversations: Sequence[Sequence[Message]]) -> list[JudgeReply]:
        """`complete`, each reply with why it is not a whole answer (`JudgeReply.problem`). A backend
        that cannot tell reports no problem; the built-in backends report cut-off replies."""
        return [JudgeReply(text) for text in self.complete(conversations)]


class TransformersChatBackend(ChatBackend):
    """A local chat model run with `transformers` (greedy decoding, left-padded batches).

    `model` and `tokenizer` are a loaded causal LM and its tokenizer, which must have a chat
    template; `TransformersChatBackend.from_pretrained(model_id)` loads both.
    """

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int = 512, batch_size: int = 8) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the judge tokenizer has no chat template; use an instruct/chat model.")
        max_new_tokens, batch_size = checked_settings(
            "transformers", {"max_new_tokens": max_new_tokens, "batch_size": batch_size}
        ).values()
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(
        cls, model: str, device: str | None = None, max_new_tokens: int = 512, batch_size: int = 8
    ) -> TransformersChatBackend:
        """Load `model` (a Hub id or local folder) with its tokenizer, in its stored dtype."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer = AutoTokenizer.from_pretrained(model)
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype="auto").to(device).eval()
        return cls(loaded, tokenizer, max_new_tokens=max_new_tokens, batch_size=batch_size)

    def complete(self, conversations: Sequence[Sequence[Message]]) -> list[str]:
        """The texts of `complete_replies` (cut-off replies included, without saying so)."""
        return [reply.text for reply in self.complete_replies(conversations)]

    def complete_replies(self, conversations: Sequence[Sequence[Message]]) -> list[JudgeReply]:
        """One greedy reply per conversation; a reply that reached `max_new_tokens` without an
        end-of-sequence token has a `problem`."""
        import torch

        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        replies: list[JudgeReply] = []
        for start in range(0, len(conversations), self.batch_size):
            texts = [self._prompt(list(messages)) for messages in conversations[start:start + self.batch_size]]
            ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
            width = max(len(row) for row in ids)
            input_ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in ids])
            attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids])
            with torch.no_grad():
                output = self.model.generate(
                    input_ids=input_ids.to(self.model.device),
                    attention_mask=attention_mask.to(self.model.device),
                    do_sample=False,
                    max_new_tokens=self.max_new_tokens,
                    pad_token_id=pad_id,
                )
            generated = output[:, width:]
            texts = self.tokenizer.batch_decode(generated, skip_special_tokens=True)
            replies.extend(JudgeReply(text, self._cut_off(row)) for text, row in zip(texts, generated.tolist()))
        return replies

    def _cut_off(self, row: list[int]) -> str | None:
        """Why the generated token ids `row` are not a whole reply: it reached `max_new_tokens` and
        holds no end-of-sequence token (`_eos_ids`); None otherwise."""
        if len(row) < self.max_new_tokens or not self._eos_ids().isdisjoint(row):
            return None
        return (f"the judge model's reply reached max_new_tokens ({self.max_new_tokens}) before its "
                "end-of-sequence token; give the backend a larger max_new_tokens")

    def _eos_ids(self) -> frozenset[int]:
        """The token ids that end a reply: the model's generation config `eos_token_id` (an id or a
        list of ids), else the tokenizer's `eos_token_id`."""
        ids = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if ids is None:
            ids = self.tokenizer.eos_token_id
        if ids is None:
            return frozenset()
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        return frozenset(ids if isinstance(ids, (list, tuple, set, frozenset)) else [ids])

    def _inert(self, text: Any) -> Any:
        """`text` with every special token of the judge's tokenizer (`<|im_end|>`, `<|im_start|>`, ...)
        broken by a word joiner (U+2060) after its first character, so that a judged response quoting
        one stays text: the rendered prompt is tokenized with special tokens parsed, and an intact one
        would open or close a turn of the judge's conversation."""
        if not isinstance(text, str):
            return text
        for token in self._special_texts:
            if token in text:
                text = text.replace(token, token[0] + "\u2060" + token[1:])
        return text

    @cached_property
    def _special_texts(self) -> tuple[str, ...]:
        """The judge tokenizer's special tokens as text, longest first."""
        tokens = set(getattr(self.tokenizer, "all_special_tokens", None) or ())
        decoder = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        tokens |= {str(added) for added in decoder.values() if getattr(added, "special", False)}
        return tuple(sorted((token for token in tokens if len(token) > 1), key=len, reverse=True))

    def _prompt(self, messages: list[Message]) -> str:
        """The conversation through the judge's chat template. Templates that refuse a system turn (Gemma's
        raise "System role not supported") get its text at the head of the first user turn instead, as
        their models are prompted; any other template error is a JudgeBackendError naming it."""
        from jinja2.exceptions import TemplateError

        messages = [{**message, "content": self._inert(message.get("content", ""))} for message in messages]
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateError as error:
            first, rest = messages[0], messages[1:]
            if first.get("role") != "system" or not rest or rest[0].get("role") != "user":
                raise JudgeBackendError(f"the judge's chat template refused the conversation: {error}") from error
            merged = [{"role": "user", "content": f"{first['content']}\n\n{rest[0]['content']}"}, *rest[1:]]
            try:
                return self.tokenizer.apply_chat_template(merged, add_generation_prompt=True, tokenize=False)
            except TemplateError as again:
                raise JudgeBackendError(f"the judge's chat template refused the conversation: {again}") from again


class ResponseTooLarge(JudgeBackendError):
    """The endpoint's reply exceeded `max_response_bytes`."""


class OpenAIChatBackend(ChatBackend):
    """An OpenAI-compatible `/chat/completions` endpoint (OpenAI, vLLM, llama.cpp server, ...).

    Settings come from the arguments, else from the environment: `SECURESD_JUDGE_BASE_URL`
    (default https://api.openai.com/v1), `SECURESD_JUDGE_MODEL` (default gpt-4o-mini, the judge
    of the SecureSD paper) and `SECURESD_JUDGE_API_KEY` (optional for local servers). Keep the key
    in the environment: it is redacted from every message this backend produces, as are
    credentials in the URL (``user:password@``, sent as HTTP basic auth). A URL with a query
    string or fragment (``?api_key=...``) is refused: it would be recorded with the results; so is one
    httpx cannot use (a port that is not a number, no host), and a key that cannot be sent or redacted
    safely (`api_key_problem`: holding whitespace, control or non-ASCII characters, such as the carriage
    return of a CRLF ``.env`` file), without showing it; a key shorter than 6 characters is not
    redacted, with a warning (`warn_if_unredacted`: right for a placeholder such as "EMPTY").

    Each attempt has one deadline of `timeout` seconds for the whole exchange — connecting,
    sending, the status line, the headers and the body (`hf_securesd.http_deadline`) — so a server
    that drips its headers or its body cannot hold an attempt past it (name resolution excepted,
    which the system resolver bounds). Replies are streamed and abandoned past
    `max_response_bytes`, decoded size included (gzip or deflate applied although the request asks
    for none; other encodings are refused). Only HTTP 200 is an answer; redirects are not followed. Timeouts,
    connection errors, HTTP 408/409/429/500/502/503/504 and malformed replies are retried
    `max_retries` times with exponential backoff
    (`backoff`, 2·`backoff`, ... seconds), or the server's Retry-After when it is a finite,
    non-negative number of seconds (capped at `MAX_RETRY_AFTER_S`; other values are ignored);
    no wait is longer than `MAX_WAIT_S`, and every numeric setting must lie in its range
    (`BACKEND_SETTINGS`: at most 20 retries, a timeout of at most an hour, ...), so no settings make
    a request hang; then, like any other HTTP status, they raise `JudgeBackendError`. Inside `judge_deadline`,
    attempts and waits end at its deadline. A reply whose ``finish_reason`` is not a normal stop
    (`FINISHED_REASONS`; "length": it reached `max_tokens`) is returned with its `problem`
    (`complete_replies`), not retried: greedy decoding would cut it off again.
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_tokens: int = 1024,
        concurrency: int = 4,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        timeout, max_retries, backoff, max_tokens, concurrency, max_response_bytes = checked_settings(
            "openai", {"timeout": timeout, "max_retries": max_retries, "backoff": backoff, "max_tokens": max_tokens,
                       "concurrency": concurrency, "max_response_bytes": max_response_bytes},
        ).values()
        url, self.model = endpoint_settings(base_url, model)
        problem = url_problem(url)
        if problem is not None:  # not shown: a URL httpx cannot read may hold a password it did not see
            raise ValueError(f"the judge endpoint URL ({BASE_URL_ENV} or base_url) cannot be used: "
                             f"{problem}; give a URL such as http://host:port/v1")
        before_query = url_before_query(url)
        if before_query is not None:
            shown = f"{redact(before_query)}{url[len(before_query)]}..."
            raise ValueError(
                f"the judge endpoint URL {shown} has a query string or fragment, which would be recorded "
                f"with the results; give {BASE_URL_ENV} without it and the key in {API_KEY_ENV}."
            )
        self.base_url, url_secret = strip_userinfo(url)
        api_key = _checked_key(api_key)
        parts = urlsplit(url)
        auth = (unquote(parts.username or ""), unquote(parts.password or "")) if url_secret else None
        basic = base64.b64encode(":".join(auth).encode()).decode() if auth else None
        # the Authorization header as sent is secret too: a server may echo it back
        self._secrets = [value for value in (api_key, url_secret, basic) if value]
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        self.max_response_bytes = max_response_bytes
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = DeadlineClient(self.base_url, headers=headers, auth=auth)

    def __repr__(self) -> str:
        return f"OpenAIChatBackend(base_url={self.base_url!r}, model={self.model!r})"

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)

    def _excerpt(self, text: str | bytes) -> str:
        """What the server sent, for an error message: redacted, then clipped."""
        return redacted_excerpt(text, self._secrets)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIChatBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def complete(self, conversations: Sequence[Sequence[Message]]) -> list[str]:
        """The texts of `complete_replies` (cut-off replies included, without saying so)."""
        return [reply.text for reply in self.complete_replies(conversations)]

    def complete_replies(self, conversations: Sequence[Sequence[Message]]) -> list[JudgeReply]:
        """One greedy reply per conversation, `concurrency` at a time; a reply whose `finish_reason`
        is not one of `FINISHED_REASONS`, or that has none and used all of `max_tokens`, has a
        `problem`."""
        one = partial(self._complete_before, deadline=_DEADLINE.get())  # worker threads do not see it
        if self.concurrency == 1 or len(conversations) <= 1:
            return [one(messages) for messages in conversations]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(one, conversations))

    def _post(self, payload: dict[str, Any], timeout: float) -> Reply:
        """One request and its whole reply (headers included) within `timeout` and the size cap."""
        try:
            return self._client.exchange("POST", "/chat/completions", payload, timeout,
                                         self.max_response_bytes)
        except ReplyTooLarge as error:
            raise ResponseTooLarge(str(error)) from None
        except UndecodableReply as error:
            raise JudgeBackendError(f"judge endpoint {self.base_url}: {self._excerpt(str(error))}") from None

    def complete_one(self, messages: Sequence[Message]) -> str:
        """The reply to one conversation, with retries (ending by the `judge_deadline` in force)."""
        return self._complete_before(messages, _DEADLINE.get()).text

    def _complete_before(self, messages: Sequence[Message], deadline: float | None) -> JudgeReply:
        """`complete_one` with its run `deadline` (a `time.monotonic()` value, or None)."""
        payload = {
            "model": self.model,
            "messages": list(messages),
            "temperature": 0,
            "max_tokens": self.max_tokens,
        }
        last_problem = ""
        wait = 0.0
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(_pause(wait, deadline))
            timeout = self._attempt_timeout(deadline, last_problem)
            wait = self.backoff * 2**attempt
            try:
                reply = self._post(payload, timeout)
            except DeadlineExceeded:
                last_problem = f"timed out: no complete reply within the {timeout:.3g} s deadline"
                continue
            except httpx.TimeoutException as error:
                last_problem = f"timed out ({type(error).__name__})"
                continue
            except httpx.TransportError as error:
                last_problem = f"could not connect: {self._redact(str(error))}"
                continue
            except ResponseTooLarge as error:
                raise ResponseTooLarge(f"judge endpoint {self.base_url}: {error}") from None
            if reply.status in RETRYABLE_STATUS:
                last_problem = f"HTTP {reply.status}: {self._excerpt(reply.body)!r}"
                wait = retry_after(reply.headers.get("retry-after"), default=wait)
                continue
            if reply.status != 200:
                raise JudgeBackendError(self._http_error(reply.status, self._excerpt(reply.body)))
            try:
                return self._judge_reply(reply.body)
            except ValueError as error:
                last_problem = f"{error}: {self._excerpt(reply.body)!r}"  # only for a failure
        raise JudgeBackendError(
            f"judge endpoint {self.base_url} (model {self.model}) failed after {self.max_retries + 1} "
            f"attempts; last problem: {last_problem}"
        )

    def _judge_reply(self, body: bytes) -> JudgeReply:
        """The reply text of a chat-completions body (`_reply_parts`) and why it is not a whole answer
        (redacted): its JSON gives a key twice (`RepeatedKey`: the text is then an excerpt of the body),
        the judge model refused (`refusal_problem`) or it was cut off (`cut_off_problem`); `ValueError`
        when malformed."""
        try:
            text, choice, usage = _reply_parts(body)
        except RepeatedKey as error:  # the same body again would be as ambiguous: not retried
            return JudgeReply(self._excerpt(body), self._redact(str(error)))
        problem = (refusal_problem(choice.get("message"))
                   or cut_off_problem(choice.get("finish_reason"), usage, self.max_tokens))
        # an endpoint may echo the request's key in its answer: verdicts keep the text as `raw`
        return JudgeReply(self._redact(text), None if problem is None else self._redact(problem))

    def _attempt_timeout(self, deadline: float | None, last_problem: str) -> float:
        """Seconds the next attempt may take: `timeout`, cut to what is left before the run
        `deadline`; `JudgeBackendError` once the deadline has passed."""
        if deadline is None:
            return self.timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise JudgeBackendError(
                f"judge endpoint {self.base_url} (model {self.model}): the run deadline passed before it "
                "answered" + (f"; last problem: {last_problem}" if last_problem else "")
            )
        return min(self.timeout, left)

    def _http_error(self, status: int, text: str) -> str:
        """A message for a non-retryable HTTP status, with the likely fix."""
        hint = {
            401: f"check the API key in {API_KEY_ENV}",
            403: f"check the API key in {API_KEY_ENV} and its access to model {self.model!r}",
            404: f"check {BASE_URL_ENV} (it should end in /v1) and the model name in {MODEL_ENV}",
        }.get(status, "only HTTP 200 is an answer (redirects are not followed); check the endpoint "
                      "settings" if status < 400 else "check the request settings")
        return f"judge endpoint {self.base_url} answered HTTP {status}: {text!r}; {hint}."


# how each backend named by a string is built from its settings (`make_backend`)
BACKEND_BUILDERS: Mapping[str, Any] = {"openai": OpenAIChatBackend,
                                       "transformers": TransformersChatBackend.from_pretrained}
# how backend settings are written on the command line: a JSON list of [name, value] pairs
_PAIRS_EXAMPLE = "--judge-option 'backend_kwargs=[[\"timeout\", 60]]'"


def settings_dict(backend_kwargs: Any) -> dict[str, Any]:
    """`backend_kwargs` as a dict of setting names to values: a mapping with string keys, a list of
    ``[name, value]`` pairs (as ``--judge-option backend_kwargs=[...]`` gives them, each name once) or
    None (no settings); anything else (text such as ``'{"timeout": 5}'`` included) is a ValueError naming
    the forms."""
    if backend_kwargs is None:
        return {}
    if isinstance(backend_kwargs, Mapping):
        pairs = list(backend_kwargs.items())
    elif isinstance(backend_kwargs, (list, tuple)) and all(
            isinstance(pair, (list, tuple)) and len(pair) == 2 for pair in backend_kwargs):
        pairs = [tuple(pair) for pair in backend_kwargs]
    else:
        raise ValueError(f"backend_kwargs must be a dict of judge backend settings (e.g. {{'timeout': 60}}; "
                         f"on the command line {_PAIRS_EXAMPLE}), got {type(backend_kwargs).__name__} "
                         f"{backend_kwargs!r:.60}")
    names = [name for name, _ in pairs]
    wrong = next((name for name in names if not isinstance(name, str)), None)
    if wrong is not None or len(set(names)) != len(names):
        problem = f"a name {wrong!r} that is not text" if wrong is not None else "a setting given twice"
        raise ValueError(f"backend_kwargs has {problem}; give each setting once, by name "
                         f"(e.g. {_PAIRS_EXAMPLE})")
    return dict(pairs)


def check_backend_settings(backend: str, settings: Mapping[str, Any]) -> None:
    """ValueError when backend `backend` cannot be built from `settings`, found without building it (no
    model is loaded, no request made): a name other than those of `BACKEND_BUILDERS`, a setting the
    backend does not take (naming the ones it takes), a ``transformers`` backend without its ``model``, a
    numeric setting outside its range (`checked_settings`)."""
    if backend not in BACKEND_BUILDERS:
        raise ValueError(f"unknown judge backend {backend!r}; use {' or '.join(map(repr, BACKEND_BUILDERS))} "
                         "(or pass a ChatBackend object).")
    taken = list(inspect.signature(BACKEND_BUILDERS[backend]).parameters)
    unknown = next((name for name in settings if name not in taken), None)
    if unknown is not None:
        close = difflib.get_close_matches(unknown, taken, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"the {backend} judge backend takes no setting {unknown!r}{hint}; its settings are "
                         f"{', '.join(taken)}.")
    model = settings.get("model")
    if backend == "transformers" and not (isinstance(model, str) and model):
        raise ValueError(f"the transformers judge backend needs model=<hub id or local folder> in "
                         f"backend_kwargs, got {model!r:.60}.")
    numeric = BACKEND_SETTINGS[backend]
    checked_settings(backend, {name: value for name, value in settings.items() if name in numeric})


def _checked_key(api_key: str | None) -> str | None:
    """The judge endpoint's key: `api_key`, else the one in `API_KEY_ENV` (None when neither is set);
    ValueError, without the key, when it cannot be sent or redacted safely (`api_key_problem`)."""
    where = "the judge backend's api_key" if api_key else API_KEY_ENV
    key = api_key or os.environ.get(API_KEY_ENV) or None
    problem = None if key is None else api_key_problem(key, where)
    if problem is not None:
        raise ValueError(problem)
    if key is not None:
        warn_if_unredacted(key, where)
    return key


def _pause(wait: float, deadline: float | None) -> float:
    """Seconds to sleep before the next attempt: `wait`, at most `MAX_WAIT_S` and no later than the
    run `deadline` (a `time.monotonic()` value, or None)."""
    pause = min(wait, MAX_WAIT_S)
    return pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))


def retry_after(value: str | None, default: float) -> float:
    """Seconds to wait from a Retry-After header: a finite, non-negative number of seconds, capped
    at `MAX_RETRY_AFTER_S`; anything else (missing, negative, NaN, infinite, an HTTP date) gives
    `default`."""
    return retry_after_seconds(value, default, MAX_RETRY_AFTER_S)


def refusal_problem(message: Any) -> str | None:
    """Why a judge reply whose assistant `message` sets ``refusal`` (OpenAI's shape when the judge model
    declines: ``content`` null, ``refusal`` its text, ``finish_reason`` "stop") is not an answer, or None
    when it sets none: only text other than whitespace is a refusal (absent, null, "", " ", and values that
    are not text, such as ``false``, ``[]`` or ``{}`` from a server that fills the field in its own way,
    are not)."""
    refusal = message.get("refusal") if isinstance(message, dict) else None
    if not isinstance(refusal, str) or not refusal.strip():
        return None
    shown = repr(refusal)
    shown = shown if len(shown) <= 120 else f"{shown[:117]}..."
    return (f"the endpoint withheld the reply: the judge model refused to grade (message.refusal is "
            f"{shown}); a judge model that refuses to grade a response cannot be read as scoring it")


def cut_off_problem(finish_reason: Any, usage: Any, max_tokens: int) -> str | None:
    """Why a judge reply with this `finish_reason` and `usage` did not end on its own, or None: its
    finish_reason is not one of `FINISHED_REASONS`, or it has none and its
    ``usage.completion_tokens`` reach the request's `max_tokens`. A reply with no finish_reason whose
    ``completion_tokens`` is not a token count (negative, NaN, infinite, fractional, not a number) is
    a `ValueError`, a malformed reply: nothing says whether it was cut off."""
    if finish_reason is not None:
        if isinstance(finish_reason, str) and finish_reason in FINISHED_REASONS:
            return None
        shown = repr(finish_reason)
        shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
        return (f"the reply's finish_reason is {shown}: the endpoint cut it off or withheld it (a finished "
                f"reply says {', '.join(sorted(FINISHED_REASONS))}); give the backend a larger max_tokens "
                "if it is 'length'")
    given = usage.get("completion_tokens") if isinstance(usage, dict) else None
    tokens = _count(given)
    if given is not None and tokens is None:
        raise ValueError(f"reply JSON has no finish_reason and its usage.completion_tokens is {given!r:.40}, "
                         "not a count of tokens")
    if tokens is not None and tokens >= max_tokens:
        return (f"the reply has no finish_reason and used {server_count(tokens)} completion tokens, the "
                f"request's max_tokens {max_tokens:,}: it may have been cut off")
    return None


def _count(value: Any) -> int | None:
    """A token count as servers write it: a non-negative integer, an integral float (``1024.0``) or a
    string of digits (``"1024"``); None for anything else (-1, NaN, infinity, 1.5, true, a list)."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdecimal() and len(value) <= 30:
        return int(value)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _reply_parts(body: bytes) -> tuple[str, dict[str, Any], Any]:
    """The assistant message of a chat-completions reply (lone surrogates replaced by U+FFFD), its
    choice and its usage; `ValueError` saying what is wrong when malformed (without the body: the
    caller adds a redacted excerpt), or when its answer is ambiguous: more than one choice, or one
    whose ``index`` is not 0 (the request asks for one); its subclass `RepeatedKey` when an object of
    the reply gives a key twice (`json_body`). A message whose ``content`` is null because the endpoint
    withheld it (a ``finish_reason`` that is not a normal stop, or a ``refusal``) has the text "" (the
    reply's problem says why: `refusal_problem`, `cut_off_problem`)."""
    parsed = json_body(body)
    choices = parsed.get("choices") if isinstance(parsed, dict) else None
    choices = choices if isinstance(choices, list) else []
    if len(choices) > 1:
        raise ValueError(f"reply JSON holds {len(choices):,} choices, not the one the request asked for "
                         "(n=1)")
    index = choices[0].get("index") if choices and isinstance(choices[0], dict) else None
    if index is not None and (index != 0 or isinstance(index, bool)):
        raise ValueError("reply JSON's only choice has an index other than 0")
    try:
        choice = parsed["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("reply JSON has no choices[0].message.content") from None
    reason = choice.get("finish_reason") if isinstance(choice, dict) else None
    cut_off = isinstance(reason, str) and reason not in FINISHED_REASONS
    if content is None and (cut_off or refusal_problem(choice["message"]) is not None):
        content = ""  # withheld (a content filter, a refusal): the reply's problem says so
    if not isinstance(content, str):
        raise ValueError(f"reply content is {type(content).__name__}, not text")
    return valid_unicode(content), choice, parsed.get("usage") if isinstance(parsed, dict) else None
