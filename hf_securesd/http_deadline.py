"""HTTP exchanges with one total deadline, a size cap and no redirects (the LLM judge and the
benchmark's OpenAI-compatible engine both talk to servers this way).

httpx bounds each socket operation (connect, write, read) but not their sum: a server that sends
its status line and headers one byte at a time, each within the read timeout, holds a call for as
long as it likes. `DeadlineClient.exchange` bounds the whole exchange — connecting, sending the
request, the status line, the headers and the body — by one deadline: a watchdog shuts the
connection's socket down when the deadline passes, which ends any read or write in progress.
Connections are not kept alive, so every exchange has its own socket for the watchdog to watch.

The size cap holds for the decoded body too: requests ask for ``Accept-Encoding: identity``, the
body is read as the server sent it, and a gzip or deflate encoding applied anyway (nested ones
included) is undone here with the cap on every layer's output, so a few kilobytes that inflate to
gigabytes are refused after `max_bytes`; other encodings (br, zstd, ...) are refused.
`json_body` reads a reply's JSON, turning input nested too deeply for the parser, or holding more
values than `MAX_JSON_VALUES` (counted before parsing, so a reply of millions of ``{}`` is refused
before it becomes millions of dicts), into a `ValueError` like any other malformed reply; an object
that gives a key twice is one too (`RepeatedKey`, a `ValueError`: the reply is ambiguous).

    >>> client = DeadlineClient("http://127.0.0.1:8000/v1")                          # doctest: +SKIP
    >>> reply = client.exchange("POST", "/completions", {"prompt": "hi"}, deadline_s=30,
    ...                         max_bytes=1 << 20)                                    # doctest: +SKIP
    >>> reply.status, reply.body[:20]                                                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import re
import socket
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx


class DeadlineExceeded(Exception):
    """The exchange did not complete within its deadline."""


class ReplyTooLarge(Exception):
    """The reply declared, streamed or decoded to more bytes than the cap."""


class UndecodableReply(Exception):
    """The reply's Content-Encoding is one this client does not decode, or its body does not decode."""


class RepeatedKey(ValueError):
    """The reply's JSON has an object that gives one key twice: which value counts is up to the parser
    (Python's keeps the last, others the first), so the reply is ambiguous and is not read."""


MAX_CONTENT_CODINGS = 4
# Parsing costs up to ~70 bytes of Python objects per JSON value (an empty dict, for "{}" of 2 bytes):
# a reply may hold at most this many values (~17 MiB of objects), far above any real reply.
MAX_JSON_VALUES = 250_000
# Retries of an HTTP client (the engines' and the LLM judge's): at most MAX_RETRIES, none waiting longer
# than MAX_WAIT_S, whatever its backoff or a Retry-After header asks for (20 minutes at most between the
# first attempt and the last, and backoff never grows past a float)
MAX_RETRIES = 20
MAX_WAIT_S = 60.0
_ZLIB_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


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


def server_count(value: int, limit: int = 10**15) -> str:
    """A non-negative integer a server sent, for an error message: with thousands separators below
    `limit`, else its approximate number of digits (a count of 10**4200 took 5,600 characters, and
    Python refuses to print an integer of more than 4,300 digits)."""
    if value < limit:
        return f"{value:,}"
    return f"a number of about {int(value.bit_length() * 0.30103) + 1:,} digits"


def json_integer(digits: str) -> int:
    """`json.loads`'s ``parse_int``: the integer `digits` spell. One longer than Python converts
    (`sys.get_int_max_str_digits`, 4,300 digits by default) is a ValueError that names its length as
    `server_count` shortens a number, not Python's advice to raise the limit."""
    try:
        return int(digits)
    except ValueError:
        length = len(digits.lstrip("-"))
        raise ValueError(
            f"a number of about {length:,} digits, more than the {sys.get_int_max_str_digits():,} a number "
            "may have"
        ) from None


def url_problem(url: str) -> str | None:
    """Why `url` is not an http(s) URL with a host that httpx can send requests to, or None. The
    message quotes no part of the URL (it may hold credentials: in ``http://user:pa/ss@host`` httpx
    reads ``pa`` as the port, in ``http://user:2024/ss@host`` host ``user``, port 2024 and a path
    holding ``@``, refused too), only the kind of problem httpx found (``Invalid port``). Callers check
    it before anything that shows the URL."""
    if not url.startswith(("http://", "https://")):
        return "the URL does not start with http:// or https://"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        reason = re.split(r"[:,]", str(error), maxsplit=1)[0].strip() or "not a URL"
        hint = "; leave out any user:password@ (refused: keys go in the environment)" if "@" in url else ""
        return f"the URL does not parse ({reason}{hint})"
    if not parsed.host:
        return "the URL names no host"
    if "@" in parsed.path:
        return ("the URL's path holds '@' (a user:password@ whose password holds '/' reads as a host, a port "
                "and a path; refused: keys go in the environment)")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        return "the URL's port is not from 1 to 65535"
    return None


class DeadlineClient:
    """An httpx client for `exchange`: base URL, default headers and basic auth as httpx takes
    them; redirects are never followed and connections are not reused. A base URL httpx cannot
    use (`url_problem`) is a ValueError, not httpx's InvalidURL."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None,
                 auth: tuple[str, str] | None = None) -> None:
        problem = url_problem(base_url)
        if problem is not None:
            raise ValueError(f"{problem}; give a URL such as http://host:port/v1")
        self._client = httpx.Client(
            base_url=base_url, headers={**(headers or {}), "Accept-Encoding": "identity"}, auth=auth,
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def exchange(self, method: str, path: str, json: Any | None, deadline_s: float, max_bytes: int) -> Reply:
        """One request and its complete reply within `deadline_s` seconds in total.

        Raises `DeadlineExceeded` past the deadline, `ReplyTooLarge` when the reply declares (in
        Content-Length), streams or decodes to more than `max_bytes`, `UndecodableReply` for a
        Content-Encoding other than gzip/deflate (or a body that does not decode), and httpx's
        `TransportError`s (connection refused or reset, a reply cut short) as they come."""
        if not (0 < deadline_s < math.inf and max_bytes > 0):
            raise ValueError(
                f"need a finite deadline_s > 0 and max_bytes > 0, got {deadline_s} and {max_bytes}"
            )
        deadline = time.monotonic() + deadline_s
        watchdog = _Watchdog(deadline)
        try:
            with self._client.stream(method, path, json=json, timeout=httpx.Timeout(deadline_s),
                                     extensions={"trace": watchdog.trace}) as response:
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise ReplyTooLarge(f"the reply declares {declared} bytes, over the {max_bytes}-byte cap")
                body = bytearray()
                for chunk in response.iter_raw():
                    body += chunk
                    if len(body) > max_bytes:
                        raise ReplyTooLarge(f"the reply exceeded the {max_bytes}-byte cap")
                    if time.monotonic() > deadline:
                        raise DeadlineExceeded
                decoded = decode_content(bytes(body), response.headers.get("content-encoding", ""), max_bytes)
                if time.monotonic() > deadline:
                    raise DeadlineExceeded
                return Reply(response.status_code, response.headers, decoded)
        except httpx.TransportError:
            if watchdog.fired or time.monotonic() > deadline:
                raise DeadlineExceeded from None
            raise
        finally:
            watchdog.cancel()


def decode_content(body: bytes, content_encoding: str, max_bytes: int) -> bytes:
    """`body` with the codings of its Content-Encoding header undone, last applied first: gzip
    (x-gzip) and deflate, at most `MAX_CONTENT_CODINGS` of them; identity is skipped.
    `ReplyTooLarge` when a layer decodes to more than `max_bytes`; `UndecodableReply` for another
    coding or a body that does not decode. An empty body is empty in every coding."""
    if not body:
        return body
    codings = [coding.strip().lower() for coding in content_encoding.split(",") if coding.strip()]
    codings = [coding for coding in codings if coding != "identity"]
    if len(codings) > MAX_CONTENT_CODINGS:
        raise UndecodableReply(
            f"the reply's Content-Encoding {content_encoding!r} nests more than {MAX_CONTENT_CODINGS} codings"
        )
    for coding in reversed(codings):
        if coding not in _ZLIB_WBITS:
            raise UndecodableReply(
                f"the reply's Content-Encoding {content_encoding!r} is not gzip or deflate, although "
                "the request asked for identity (no encoding)"
            )
        body = _inflate(body, coding, max_bytes)
    return body


def _inflate(data: bytes, coding: str, max_bytes: int) -> bytes:
    """One gzip or deflate layer undone, its output capped at `max_bytes`; a gzip body may hold
    several members, a deflate body may be zlib-wrapped or raw (as servers send both)."""
    try:
        return _inflate_with(data, coding, _ZLIB_WBITS[coding], max_bytes)
    except UndecodableReply:
        if coding != "deflate":
            raise
        return _inflate_with(data, coding, _RAW_DEFLATE_WBITS, max_bytes)


def _inflate_with(data: bytes, coding: str, wbits: int, max_bytes: int) -> bytes:
    """`data` inflated with zlib's `wbits`, member after member, never more than `max_bytes + 1`
    bytes at a time (zlib's `max_length`)."""
    out = bytearray()
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            out += inflater.decompress(data, max_bytes + 1 - len(out))
        except zlib.error as error:
            raise UndecodableReply(f"the reply's {coding} body does not decode ({error})") from None
        if len(out) > max_bytes:
            raise ReplyTooLarge(f"the reply's {coding} body decodes to more than the {max_bytes}-byte cap")
        if not inflater.eof:
            raise UndecodableReply(f"the reply's {coding} body is cut short")
        data = inflater.unused_data
        if not data:
            return bytes(out)
        if coding == "deflate":
            raise UndecodableReply(f"the reply's {coding} body has data after its end")


def json_value_bound(body: bytes) -> int:
    """An upper bound on the number of values `body` parses to: one per ``,``, ``{`` and ``[``,
    plus one (those inside strings are counted too; counting them costs no memory)."""
    return body.count(b",") + body.count(b"{") + body.count(b"[") + 1


def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s ``object_pairs_hook``: the object's pairs as a dict; `RepeatedKey` naming a key the
    object gives twice (a reply with two ``content`` or two ``choices`` keys would otherwise be read by its
    last one, silently)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        counts = Counter(key for key, _ in pairs)
        repeated = next(key for key, _ in pairs if counts[key] > 1)
        shown = repr(repeated) if len(repeated) <= 40 else f"{repeated[:40]!r}..."
        raise RepeatedKey(f"the reply's JSON gives the key {shown} twice in one object (a parser reads "
                          "only one of them, so the reply is ambiguous); it is not read")
    return value


def json_body(body: bytes) -> Any:
    """The reply body parsed as JSON. `ValueError` when it is not: invalid JSON or UTF-8, more than
    `MAX_JSON_VALUES` values (checked before parsing: 15 MiB of ``{},`` took ~380 MiB to parse),
    nested too deeply for the parser (its RecursionError: 200 KB of ``[`` is enough) or its
    memory, or holding an integer longer than Python converts (`json_integer`); its subclass
    `RepeatedKey` when an object gives a key twice (`json_object`), anywhere in the reply."""
    values = json_value_bound(body)
    if values > MAX_JSON_VALUES:
        raise ValueError(
            f"the reply holds up to {values:,} JSON values (commas and brackets), more than the "
            f"{MAX_JSON_VALUES:,} a reply may hold; it is not parsed"
        )
    try:
        return json.loads(body, parse_int=json_integer, object_pairs_hook=json_object)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"the reply is not complete JSON ({error})") from None
    except (RecursionError, MemoryError):
        raise ValueError("the reply is JSON nested too deeply (or too large) to parse") from None
    except RepeatedKey:
        raise
    except ValueError as error:  # `json_integer`'s
        raise ValueError(f"the reply holds {error}; it is not read") from None


def valid_unicode(text: str) -> str:
    """`text` with every lone surrogate (what JSON's ``"\\ud800"`` parses to: a Python str, but
    not Unicode that UTF-8 can encode) replaced by U+FFFD."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def has_lone_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (see `valid_unicode`): UTF-8 cannot encode it."""
    return _LONE_SURROGATE.search(text) is not None


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
