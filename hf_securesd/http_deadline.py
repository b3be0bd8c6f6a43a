"""HTTP exchanges with one total deadline, a size cap and no redirects (the LLM judge and the
benchmark's OpenAI-compatible engine both talk to servers this way).

httpx bounds each socket operation (connect, write, read) but not their sum: a server that sends
its status line and headers one byte at a time, each within the read timeout, holds a call for as
long as it likes. `DeadlineClient.exchange` bounds the whole exchange — connecting, sending the
request, the status line, the headers and the body — by one deadline: a watchdog shuts the
connection's socket down when the deadline passes, which ends any read or write in progress.
Connections are not kept alive, so every exchange has its own socket for the watchdog to watch.

    >>> client = DeadlineClient("http://127.0.0.1:8000/v1")                          # doctest: +SKIP
    >>> reply = client.exchange("POST", "/completions", {"prompt": "hi"}, deadline_s=30,
    ...                         max_bytes=1 << 20)                                    # doctest: +SKIP
    >>> reply.status, reply.body[:20]                                                 # doctest: +SKIP
"""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx


class DeadlineExceeded(Exception):
    """The exchange did not complete within its deadline."""


class ReplyTooLarge(Exception):
    """The reply declared or streamed more bytes than the cap."""


@dataclass(frozen=True)
class Reply:
    """A complete HTTP reply: status code, headers and the whole body (at most the cap)."""

    status: int
    headers: httpx.Headers
    body: bytes


class _Watchdog:
    """Shuts down the socket of one exchange when its deadline passes. It learns the socket from
    httpcore's trace events (TCP connect, then TLS start, which wraps it)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.fired = False
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore ``trace`` extension callback."""
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._socket = sock
            if self._timer is None:
                self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._fire)
                self._timer.daemon = True
                self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._socket is not None:
                try:
                    self._socket.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed
                    pass

    def cancel(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()


class DeadlineClient:
    """An httpx client for `exchange`: base URL, default headers and basic auth as httpx takes
    them; redirects are never followed and connections are not reused."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None,
                 auth: tuple[str, str] | None = None) -> None:
        self._client = httpx.Client(
            base_url=base_url, headers=headers or {}, auth=auth, follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def exchange(self, method: str, path: str, json: Any | None, deadline_s: float, max_bytes: int) -> Reply:
        """One request and its complete reply within `deadline_s` seconds in total.

        Raises `DeadlineExceeded` past the deadline, `ReplyTooLarge` when the reply declares (in
        Content-Length) or streams more than `max_bytes`, and httpx's `TransportError`s (connection
        refused or reset, a reply cut short) as they come."""
        if deadline_s <= 0 or max_bytes <= 0:
            raise ValueError(f"need deadline_s > 0 and max_bytes > 0, got {deadline_s} and {max_bytes}")
        deadline = time.monotonic() + deadline_s
        watchdog = _Watchdog(deadline)
        try:
            with self._client.stream(method, path, json=json, timeout=httpx.Timeout(deadline_s),
                                     extensions={"trace": watchdog.trace}) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise ReplyTooLarge(f"the reply declares {declared} bytes, over the {max_bytes}-byte cap")
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise ReplyTooLarge(f"the reply exceeded the {max_bytes}-byte cap")
                    if time.monotonic() > deadline:
                        raise DeadlineExceeded
                if time.monotonic() > deadline:
                    raise DeadlineExceeded
                return Reply(response.status_code, response.headers, bytes(body))
        except httpx.TransportError:
            if watchdog.fired or time.monotonic() > deadline:
                raise DeadlineExceeded from None
            raise
        finally:
            watchdog.cancel()


def retry_after_seconds(value: str | None, default: float, cap: float) -> float:
    """Seconds a Retry-After header asks for: a finite, non-negative number, capped at `cap`;
    anything else (missing, negative, NaN, infinite, an HTTP date) gives `default`."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return default
    if not math.isfinite(seconds) or seconds < 0:
        return default
    return min(seconds, cap)
