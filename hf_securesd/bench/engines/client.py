"""A client for OpenAI-compatible servers that survives real ones: the ``openai`` engine's transport.

- every attempt has one deadline for the whole exchange (`hf_securesd.http_deadline`), and the run
  has a deadline of its own: past it nothing more is sent and every request still waiting fails;
- HTTP 408/409/429/500/502/503/504, connection errors, timeouts and replies that are not complete
  JSON objects (garbage, a body cut short) are retried at most `MAX_RETRIES` times with exponential
  backoff, waiting what the server's Retry-After asks when it is a finite number of seconds, capped
  at `max_retry_after_s`; no wait is longer than `MAX_WAIT_S` (as for the LLM judge);
- redirects are never followed (a 3xx is a failure, like any other status but 200);
- replies are capped at `max_response_bytes` (or the lower cap a request asks for), decoded size
  included (a gzip bomb is refused); JSON nested too deeply to parse, or holding more values than
  `hf_securesd.http_deadline.MAX_JSON_VALUES`, is a malformed reply; at most `concurrency`
  requests are in flight;
- the API key is sent as a bearer token and redacted from every error message; what a server sends
  (a body, a Location header) is redacted whole and only then clipped to an excerpt.

A request that still fails raises `RequestFailed`; `OpenAIClient.post_many` returns it in place of
the reply, so one bad prompt never stops the others.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import httpx

from hf_securesd.http_deadline import (
    MAX_RETRIES,
    MAX_WAIT_S,
    DeadlineClient,
    DeadlineExceeded,
    ReplyTooLarge,
    UndecodableReply,
    json_body,
    retry_after_seconds,
    url_problem,
)
from hf_securesd.judges.secrets import redact, redacted_excerpt, strip_userinfo, url_before_query

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class ClientSettings:
    """Limits of the client. `run_deadline_s` None: no deadline for the run. Every duration is a
    finite number of seconds (an infinite one overflowed the deadline's timer); retries are at most
    `MAX_RETRIES`, and backoff and the Retry-After cap at most `MAX_WAIT_S` seconds."""

    request_timeout_s: float = 300.0
    run_deadline_s: float | None = None
    max_retries: int = 4
    backoff_s: float = 1.0
    max_retry_after_s: float = 60.0
    concurrency: int = 4
    max_response_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        checks = {
            "request timeout": 0 < self.request_timeout_s < math.inf,
            "run deadline": self.run_deadline_s is None or 0 < self.run_deadline_s < math.inf,
            "max retries": 0 <= self.max_retries <= MAX_RETRIES,
            "backoff": 0 <= self.backoff_s <= MAX_WAIT_S,
            "max Retry-After": 0 <= self.max_retry_after_s <= MAX_WAIT_S,
            "concurrency": self.concurrency >= 1,
            "max response bytes": self.max_response_bytes > 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(
                f"client setting {bad[0]} is out of range: {self}; timeouts, deadline, "
                f"concurrency and size must be positive, retries from 0 to {MAX_RETRIES}, backoff and "
                f"Retry-After cap from 0 to {MAX_WAIT_S:g} s, and every number of seconds finite (leave "
                "--run-deadline out for no deadline)"
            )


@dataclass(frozen=True)
class Attempts:
    """How a request that got its reply went: `count` attempts, `waited_s` seconds slept between them
    (backoff and Retry-After), which a timing of the request includes."""

    count: int = 1
    waited_s: float = 0.0


class RequestFailed(Exception):
    """No usable reply after every attempt; `attempts` says how many were made, `replied` whether the
    server sent an HTTP reply to the last one (False: it could not be reached, or sent nothing in time)."""

    def __init__(self, message: str, attempts: int, replied: bool = True) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.replied = replied


@dataclass(frozen=True)
class _Outcome:
    """One attempt: the reply object (None when it gave none), what went wrong, the seconds to wait
    before a retry (negative: backoff) and whether the server sent an HTTP reply at all."""

    reply: dict[str, Any] | None
    problem: str = ""
    wait: float = -1.0
    replied: bool = True


class _NotRetryable(Exception):
    pass


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The reply body as a JSON object; ValueError saying what is wrong otherwise (without the
    body: the caller adds a redacted excerpt)."""
    value = json_body(body)
    if not isinstance(value, dict):
        raise ValueError(f"the reply is JSON but not an object ({type(value).__name__})")
    return value


class OpenAIClient:
    """Requests to one OpenAI-compatible base URL (``http://host:port/v1``). Credentials in the
    URL are refused: give the key through `api_key` (read from the environment by the caller)."""

    def __init__(
        self, base_url: str, api_key: str | None, settings: ClientSettings, run_started: float | None = None
    ) -> None:
        problem = url_problem(base_url)
        if problem is not None:  # the URL is not shown: a bad one may hold a password httpx did not see
            raise ValueError(
                f"an endpoint URL cannot be used: {problem}; give a URL such as http://host:port/v1"
            )
        stripped, userinfo = strip_userinfo(base_url)
        if userinfo is not None:
            raise ValueError(
                f"the endpoint URL {redact(base_url)} carries credentials; give the URL "
                "without user:password@ and the key with --api-key-env NAME (--base-url) or "
                "--endpoint-api-key-env NAME=VARIABLE (--endpoint)"
            )
        if url_before_query(base_url) is not None:
            raise ValueError(
                f"the endpoint URL {url_before_query(base_url)}... carries a query string or fragment, which "
                "would be recorded with it (a key passed as ?api_key=... included) and garbles request paths; "
                "give the base URL alone and the key with --api-key-env NAME (--base-url) or "
                "--endpoint-api-key-env NAME=VARIABLE (--endpoint)"
            )
        self.base_url = base_url.rstrip("/")
        self.settings = settings
        self._secrets = [api_key] if api_key else []
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = DeadlineClient(self.base_url, headers=headers)
        started = time.monotonic() if run_started is None else run_started
        self._run_deadline = None if settings.run_deadline_s is None else started + settings.run_deadline_s
        self._slots = threading.Semaphore(settings.concurrency)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _excerpt(self, text: str | bytes) -> str:
        """What a server sent, for an error message: redacted, then clipped."""
        return redacted_excerpt(text, self._secrets)

    def _remaining(self) -> float:
        return math.inf if self._run_deadline is None else self._run_deadline - time.monotonic()

    def _attempt(self, method: str, path: str, payload: Any | None, max_bytes: int) -> _Outcome:
        """One exchange whose reply is capped at `max_bytes`; `_NotRetryable` for an answer that
        retrying cannot change."""
        timeout = min(self.settings.request_timeout_s, self._remaining())
        try:
            reply = self._http.exchange(method, path, payload, timeout, max_bytes)
        except DeadlineExceeded:
            return _Outcome(None, f"no complete reply within {timeout:.3g} s", replied=False)
        except ReplyTooLarge as error:
            raise _NotRetryable(str(error)) from None
        except UndecodableReply as error:
            raise _NotRetryable(self._excerpt(str(error))) from None
        except httpx.TransportError as error:
            return _Outcome(None, f"{type(error).__name__}: {self._excerpt(str(error))}", replied=False)
        if reply.status in RETRYABLE_STATUS:
            wait = retry_after_seconds(
                reply.headers.get("retry-after"), -1.0, self.settings.max_retry_after_s
            )
            return _Outcome(None, f"HTTP {reply.status}: {self._excerpt(reply.body)!r}", wait)
        if reply.status != 200:
            location = self._excerpt(reply.headers.get("location", ""))
            where = f" to {location!r}" if 300 <= reply.status < 400 else ""
            raise _NotRetryable(
                f"HTTP {reply.status}{where} (only 200 is an answer; redirects are not followed): "
                f"{self._excerpt(reply.body)!r}"
            )
        try:
            return _Outcome(parse_json_object(reply.body))
        except ValueError as error:  # the excerpt only for a failure: a good reply is not scanned twice
            return _Outcome(None, f"{error}: {self._excerpt(reply.body)!r}")

    def _pause(self, wait: float, attempt: int) -> float:
        """Seconds to sleep after failed attempt number `attempt` (from 0): the server's `wait` (its
        Retry-After; negative when none) or exponential backoff, at most `MAX_WAIT_S` and no later than
        the run deadline."""
        pause = wait if wait >= 0 else self.settings.backoff_s * 2**attempt
        return max(0.0, min(pause, MAX_WAIT_S, self._remaining()))

    def request(
        self, method: str, path: str, payload: Any | None = None, max_bytes: int | None = None
    ) -> dict[str, Any]:
        """The JSON object the server answers, after retries; `RequestFailed` otherwise. The reply
        is capped at `max_bytes` when given (never above `max_response_bytes`)."""
        return self.request_counted(method, path, payload, max_bytes)[0]

    def request_counted(
        self, method: str, path: str, payload: Any | None = None, max_bytes: int | None = None
    ) -> tuple[dict[str, Any], Attempts]:
        """`request`, with the attempts it took and the seconds it slept between them."""
        cap = self.settings.max_response_bytes
        if max_bytes is not None:
            cap = min(cap, max_bytes)
        with self._slots:
            outcome, waited = _Outcome(None), 0.0
            for attempt in range(self.settings.max_retries + 1):
                if self._remaining() <= 0:
                    raise RequestFailed(
                        f"{method} {self.base_url}{path}: the run deadline of "
                        f"{self.settings.run_deadline_s:g} s passed"
                        + (f"; last problem: {outcome.problem}" if outcome.problem else ""),
                        attempt,
                        outcome.replied,
                    )
                try:
                    outcome = self._attempt(method, path, payload, cap)
                except _NotRetryable as error:
                    raise RequestFailed(f"{method} {self.base_url}{path}: {error}", attempt + 1) from None
                if outcome.reply is not None:
                    return outcome.reply, Attempts(attempt + 1, waited)
                if attempt < self.settings.max_retries:
                    pause = self._pause(outcome.wait, attempt)
                    time.sleep(pause)
                    waited += pause
            raise RequestFailed(
                f"{method} {self.base_url}{path} failed after {self.settings.max_retries + 1} "
                f"attempts; last problem: {outcome.problem}",
                self.settings.max_retries + 1,
                outcome.replied,
            )

    def post_many(
        self, path: str, payloads: Sequence[dict[str, Any]], max_bytes: int | None = None
    ) -> list[dict[str, Any] | RequestFailed]:
        """POST every payload (at most `concurrency` at once, each reply capped as `request` caps
        it): per payload, in order, the reply or its `RequestFailed`."""
        return [reply for reply, _ in self.post_many_counted(path, payloads, max_bytes)]

    def post_many_counted(
        self, path: str, payloads: Sequence[dict[str, Any]], max_bytes: int | None = None
    ) -> list[tuple[dict[str, Any] | RequestFailed, Attempts]]:
        """`post_many`, each reply with its `Attempts` (a failure with its attempts and no waits
        counted: a failed prompt is not timed)."""

        def one(payload: dict[str, Any]) -> tuple[dict[str, Any] | RequestFailed, Attempts]:
            try:
                return self.request_counted("POST", path, payload, max_bytes)
            except RequestFailed as failure:
                return failure, Attempts(failure.attempts)

        if len(payloads) <= 1 or self.settings.concurrency == 1:
            return [one(payload) for payload in payloads]
        with ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(payloads))) as pool:
            return list(pool.map(one, payloads))
