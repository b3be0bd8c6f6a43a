"""The OpenAI-compatible judge backend against a misbehaving server on 127.0.0.1: bad Retry-After
values, a reply dripped one byte at a time, an oversized body, non-200 answers with a valid JSON
body, and a server that echoes the credentials. The stub serves a bounded number of requests and
stops with the test."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import pytest
from support import recording_handler, send_reply as reply, serve_locally, stop_servers

from hf_securesd.judges.backends import JudgeBackendError, OpenAIChatBackend, ResponseTooLarge, retry_after
from hf_securesd.judges.secrets import redact, reject_secret_options

CHAT = [{"role": "user", "content": "hello"}]
BODY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}}]}).encode()
SECRET = "sk-test-0123456789abcdef"
MAX_REQUESTS = 20

Handler = Callable[[BaseHTTPRequestHandler, int], None]


@pytest.fixture
def serve():
    servers: list = []

    def start(handle: Handler) -> tuple[str, dict]:
        RequestHandler, state = recording_handler(handle, refuse_after=MAX_REQUESTS)
        state["sent"] = 0
        server, url = serve_locally(RequestHandler)
        servers.append(server)
        return url, state

    yield start
    stop_servers(servers)


@pytest.mark.parametrize("value, expected", [("-1", 0.25), ("nan", 0.25), ("inf", 0.25), ("-inf", 0.25),
                                             ("1e300", 60.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.25),
                                             (None, 0.25), ("2.5", 2.5), ("0", 0.0)])
def test_retry_after_rules(value, expected):
    assert retry_after(value, default=0.25) == expected


@pytest.mark.parametrize("header", ["-1", "nan", "inf", "1e309"])
def test_bad_retry_after_from_a_server_is_ignored_not_raised(serve, header, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("hf_securesd.judges.backends.time.sleep", slept.append)

    def handle(handler, state):
        if state["requests"] == 1:
            reply(handler, 429, b"{}", **{"Retry-After": header})
        else:
            reply(handler, 200, BODY)

    url, _ = serve(handle)
    with OpenAIChatBackend(base_url=url, model="m", max_retries=1, backoff=0.0, timeout=5) as backend:
        assert backend.complete_one(CHAT) == "ok"
    assert slept == [0.0]  # the backoff, not the header


def test_a_dripping_server_meets_the_overall_deadline(serve):
    total = 200

    def handle(handler, state):
        handler.send_response(200)
        handler.send_header("Content-Length", str(total))
        handler.end_headers()
        for _ in range(total):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            state["sent"] += 1
            time.sleep(0.05)

    url, state = serve(handle)
    with OpenAIChatBackend(base_url=url, model="m", max_retries=0, timeout=1.0) as backend:
        with pytest.raises(JudgeBackendError, match="deadline"):
            backend.complete_one(CHAT)
    assert state["sent"] < total  # the call gave up long before the reply was complete


def test_a_server_dripping_its_headers_meets_the_same_deadline(serve):
    header_bytes = b"X-Padding: " + b"y" * 400 + b"\r\n"

    def handle(handler, state):
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for byte in header_bytes:  # one byte every 50 ms: each read is quick, the whole is 20 s
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            state["sent"] += 1
            time.sleep(0.05)
        handler.wfile.write(b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)

    url, state = serve(handle)
    started = time.monotonic()
    with OpenAIChatBackend(base_url=url, model="m", max_retries=0, timeout=1.0) as backend:
        with pytest.raises(JudgeBackendError, match="deadline"):
            backend.complete_one(CHAT)
    assert time.monotonic() - started < 3.0
    assert state["sent"] < len(header_bytes)


@pytest.mark.parametrize("declare_length", [True, False])
def test_an_oversized_body_is_cut_off(serve, declare_length):
    chunk, chunks = b"x" * 65536, 64  # 4 MiB offered, 1 MiB accepted

    def handle(handler, state):
        handler.send_response(200)
        if declare_length:
            handler.send_header("Content-Length", str(len(chunk) * chunks))
        handler.end_headers()
        for _ in range(chunks):
            handler.wfile.write(chunk)
            state["sent"] += 1

    url, state = serve(handle)
    with OpenAIChatBackend(base_url=url, model="m", max_retries=2, timeout=5,
                           max_response_bytes=1024 * 1024) as backend:
        with pytest.raises(ResponseTooLarge, match="1048576-byte cap"):
            backend.complete_one(CHAT)
    assert state["requests"] == 1  # not retried


@pytest.mark.parametrize("status", [201, 202, 203, 301, 302, 307])
def test_only_http_200_is_an_answer(serve, status):
    url, state = serve(lambda handler, state: reply(handler, status, BODY, Location="http://127.0.0.1:9/v1"))
    with OpenAIChatBackend(base_url=url, model="m", max_retries=2, timeout=5) as backend:
        with pytest.raises(JudgeBackendError, match=f"HTTP {status}.*only HTTP 200"):
            backend.complete_one(CHAT)
    assert state["requests"] == 1


def test_credentials_never_appear_in_exceptions(serve, monkeypatch):
    def echo(handler, state):
        auth = handler.headers.get("Authorization", "")
        reply(handler, 401 if state["requests"] % 2 else 500, json.dumps({"error": f"bad key {auth}"}).encode())

    url, state = serve(echo)
    host = url.split("//")[1]
    monkeypatch.setenv("SECURESD_JUDGE_API_KEY", SECRET)
    for base_url in (url, f"http://judge:{SECRET}@{host}"):
        with OpenAIChatBackend(base_url=base_url, model="m", max_retries=0, timeout=5) as backend:
            for _ in range(2):  # a 401 (not retried) and a 500 (retried, then reported)
                with pytest.raises(JudgeBackendError) as caught:
                    backend.complete_one(CHAT)
                assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
                assert "[redacted]" in str(caught.value)
            assert SECRET not in repr(backend)
    assert any(SECRET in str(headers) for headers in state["headers"])  # it was sent, and echoed
    unreachable = OpenAIChatBackend(base_url=f"http://judge:{SECRET}@127.0.0.1:9/v1", max_retries=0, timeout=1)
    with pytest.raises(JudgeBackendError) as caught:
        unreachable.complete_one(CHAT)
    assert SECRET not in str(caught.value)


def test_secret_options_are_refused_and_text_is_redacted(monkeypatch):
    with pytest.raises(ValueError, match="looks like a secret.*SECURESD_JUDGE_API_KEY"):
        reject_secret_options({"backend": "openai", "backend_kwargs": {"api_key": SECRET}})
    with pytest.raises(ValueError, match="URL with credentials"):
        reject_secret_options({"backend_kwargs": {"base_url": f"https://u:{SECRET}@example.com/v1"}})
    reject_secret_options({"backend": "openai", "threshold": 0.5, "prefix_list": "jailbreakbench"})
    reject_secret_options({"backend_kwargs": {"max_tokens": 64}})  # a count of tokens, not a token
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert redact(f"token {SECRET} at https://user:pw@host/x") == "token [redacted] at https://[redacted]@host/x"


def gzip_bomb(mebibytes: int) -> bytes:
    """`mebibytes` MiB of zeros gzipped twice (for ``Content-Encoding: gzip, gzip``): a few KiB,
    built a MiB at a time."""
    inner = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = b"\0" * (1 << 20)
    layer = b"".join([inner.compress(block) for _ in range(mebibytes)] + [inner.flush()])
    return gzip.compress(layer, 9)


def test_a_gzip_bomb_is_refused_without_inflating_it(serve):
    """Nested gzip of 256 MiB of zeros in ~1 KiB: refused at the 1 MiB cap, without ever holding
    much more than the cap (httpx used to inflate a whole raw chunk at once), and not retried."""
    body = gzip_bomb(256)
    url, state = serve(lambda handler, state: reply(handler, 200, body, **{"Content-Encoding": "gzip, gzip"}))
    with OpenAIChatBackend(base_url=url, model="m", max_retries=2, timeout=30,
                           max_response_bytes=1024 * 1024) as backend:
        tracemalloc.start()
        try:
            with pytest.raises(ResponseTooLarge, match="gzip body decodes to more than the 1048576-byte cap"):
                backend.complete_one(CHAT)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 32 * 1024 * 1024
    assert state["requests"] == 1
    assert state["headers"][0]["Accept-Encoding"] == "identity"


@pytest.mark.parametrize("encoding", ["gzip", "gzip, gzip", "deflate", "x-gzip, identity"])
def test_an_encoded_reply_within_the_cap_is_decoded(serve, encoding):
    """A server that encodes its reply although asked not to is still understood: gzip (nested),
    zlib-wrapped deflate, x-gzip, identity."""
    layers = [coding.strip() for coding in encoding.split(",") if coding.strip() != "identity"]
    body = BODY
    for coding in layers:
        body = zlib.compress(body) if coding == "deflate" else gzip.compress(body)
    url, _ = serve(lambda handler, state: reply(handler, 200, body, **{"Content-Encoding": encoding}))
    with OpenAIChatBackend(base_url=url, model="m", max_retries=0, timeout=5) as backend:
        assert backend.complete_one(CHAT) == "ok"


def test_an_encoding_the_client_does_not_decode_is_refused(serve):
    url, state = serve(lambda handler, state: reply(handler, 200, b"\x8b\x02\x80{}\x03", **{"Content-Encoding": "br"}))
    with OpenAIChatBackend(base_url=url, model="m", max_retries=2, timeout=5) as backend:
        with pytest.raises(JudgeBackendError, match="Content-Encoding 'br' is not gzip or deflate"):
            backend.complete_one(CHAT)
    assert state["requests"] == 1


def test_json_nested_too_deeply_is_a_malformed_reply(serve):
    """200 KB of nested arrays made json.loads raise RecursionError, which escaped complete()."""
    deep = b"[" * 100_000 + b"]" * 100_000
    url, state = serve(lambda handler, state: reply(handler, 200, deep))
    with OpenAIChatBackend(base_url=url, model="m", max_retries=1, backoff=0.0, timeout=5) as backend:
        with pytest.raises(JudgeBackendError, match="failed after 2 attempts.*nested too deeply"):
            backend.complete([CHAT, CHAT])


def test_a_key_straddling_the_excerpt_cut_is_redacted_whole(serve, monkeypatch):
    """The key echoed so that all but its last character fell inside the 200-character excerpt was
    left there, since redaction ran on the excerpt: now the whole body is redacted first."""
    def echo(handler, state):
        key = handler.headers.get("Authorization", "").removeprefix("Bearer ")
        reply(handler, 401, b"x" * (200 - len(key) + 1) + key.encode())

    url, _ = serve(echo)
    monkeypatch.setenv("SECURESD_JUDGE_API_KEY", SECRET)
    with OpenAIChatBackend(base_url=url, model="m", max_retries=0, timeout=5) as backend:
        with pytest.raises(JudgeBackendError, match="HTTP 401") as caught:
            backend.complete_one(CHAT)
    assert SECRET[:8] not in str(caught.value)


def test_a_lone_surrogate_in_the_judge_reply_becomes_a_replacement_character(serve):
    body = b'{"choices": [{"message": {"content": "ok \\ud800"}}]}'
    url, _ = serve(lambda handler, state: reply(handler, 200, body))
    with OpenAIChatBackend(base_url=url, model="m", max_retries=0, timeout=5) as backend:
        assert backend.complete_one(CHAT) == "ok \ufffd"


@pytest.mark.parametrize("key, problem", [
    (SECRET + "\r", "carriage return"),  # a CRLF .env file: h11's error quoted the header, key included
    (SECRET + "\n", "control character"),
    ("sk-\u00e9\u00e9-0123456789", "outside ASCII"),
])
def test_a_judge_key_that_cannot_be_sent_or_redacted_is_refused_without_being_shown(serve, monkeypatch, key,
                                                                                     problem):
    url, state = serve(lambda handler, state: reply(handler, 200, BODY))
    monkeypatch.setenv("SECURESD_JUDGE_API_KEY", key)
    with pytest.raises(ValueError) as caught:
        OpenAIChatBackend(base_url=url, model="m", max_retries=0, timeout=5)
    message = str(caught.value)
    assert message.startswith("SECURESD_JUDGE_API_KEY: ") and problem in message
    assert key.strip() not in message and repr(key)[1:-1] not in message
    monkeypatch.delenv("SECURESD_JUDGE_API_KEY")
    with pytest.raises(ValueError, match=f"the judge backend's api_key: .*{problem}"):
        OpenAIChatBackend(base_url=url, model="m", api_key=key)
    assert state["requests"] == 0


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc/v1", "http://127.0.0.1:18701:5/v1",
                                 "http://judge:pw9Zq/ss@127.0.0.1/v1", "http:///v1",
                                 "http://judge:pw9Zq/ss@127.0.0.1/v1?x=1",  # checked before the query
                                 "http://judge:2024/pw9Zq@127.0.0.1/v1"])  # a valid port: '@' in the path
def test_a_judge_url_httpx_cannot_read_is_a_value_error_without_the_url(url):
    """httpx.InvalidURL (not a ValueError) escaped; with a "/" in the password, urlsplit's error quoted
    the password's head as the port."""
    with pytest.raises(ValueError, match="SECURESD_JUDGE_BASE_URL or base_url.*cannot be used") as caught:
        OpenAIChatBackend(base_url=url, model="m")
    assert "pw9Zq" not in str(caught.value)


@pytest.mark.parametrize("choices, problem", [
    ([{"index": 1, "message": {"content": "1.b 0"}}, {"index": 0, "message": {"content": "ok"}}],
     "2 choices"),
    ([{"index": 1, "message": {"content": "ok"}}], "index other than 0"),
])
def test_a_judge_reply_with_an_ambiguous_answer_is_malformed(serve, choices, problem):
    url, _ = serve(lambda handler, state: reply(handler, 200, json.dumps({"choices": choices}).encode()))
    with OpenAIChatBackend(base_url=url, model="m", max_retries=0, timeout=5) as backend:
        with pytest.raises(JudgeBackendError, match=problem):
            backend.complete_one(CHAT)


def test_a_huge_token_count_is_shortened_in_the_judge_problem():
    from hf_securesd.judges.backends import cut_off_problem

    problem = cut_off_problem(None, {"completion_tokens": 10**4200}, 1024)
    assert "used a number of about 4,201 digits completion tokens" in problem and len(problem) < 200
    assert "1,024 completion tokens" in cut_off_problem(None, {"completion_tokens": 1024}, 1024)
