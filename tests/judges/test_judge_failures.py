"""The OpenAI-compatible judge backend under a run deadline, with a URL that carries a key in its
query string, and what `describe_judge` records of it. Servers on 127.0.0.1 that this test
controls; each serves a bounded number of requests."""

from __future__ import annotations

import json
import time

import pytest
from support import recording_handler, send_reply as reply, serve_locally, stop_servers

from hf_securesd.judges import describe_judge, get_judge
from hf_securesd.judges.backends import (
    DEFAULT_BASE_URL,
    DEFAULT_MODEL,
    JudgeBackendError,
    OpenAIChatBackend,
    judge_deadline,
)

CHAT = [{"role": "user", "content": "hello"}]
BODY = json.dumps({"choices": [{"message": {"role": "assistant", "content": "ok"}}]}).encode()
SECRET = "sk-judge-query-0123456789abcdef"


@pytest.fixture
def serve():
    servers: list = []

    def start(handle) -> str:
        RequestHandler, _ = recording_handler(handle, refuse_after=40)
        server, url = serve_locally(RequestHandler)
        servers.append(server)
        return url

    yield start
    stop_servers(servers)


def _throttling(handler, state):
    reply(handler, 429, b"slow down", **{"Retry-After": "20"})


def _stalling(handler, state):
    time.sleep(4)
    reply(handler, 200, BODY)


@pytest.mark.parametrize("respond, problem", [(_throttling, "HTTP 429"), (_stalling, "timed out")])
@pytest.mark.parametrize("conversations", [1, 3])
def test_requests_end_at_the_run_deadline(serve, respond, problem, conversations):
    """Retry-After: 20 with three retries held a judge call for a minute past a 5 s run deadline;
    now waits and attempts end at the deadline, in the worker threads of a batch too."""
    backend = OpenAIChatBackend(base_url=serve(respond), api_key=SECRET, timeout=30, max_retries=3,
                                concurrency=3)
    started = time.monotonic()
    with judge_deadline(started + 1.0), pytest.raises(JudgeBackendError) as caught:
        backend.complete([CHAT] * conversations)
    assert time.monotonic() - started < 3.0
    message = str(caught.value)
    assert "the run deadline passed" in message and problem in message and SECRET not in message


def test_without_a_deadline_the_backend_still_answers(serve):
    url = serve(lambda handler, state: reply(handler, 200, BODY))
    backend = OpenAIChatBackend(base_url=url, max_retries=0)
    with judge_deadline(None):
        assert backend.complete([CHAT, CHAT]) == ["ok", "ok"]
    assert backend.complete_one(CHAT) == "ok"


@pytest.mark.parametrize("tail", [f"?api_key={SECRET}", f"#{SECRET}"])
def test_a_judge_url_with_a_query_string_is_refused_without_showing_it(monkeypatch, tail):
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", f"http://127.0.0.1:9/v1{tail}")
    with pytest.raises(ValueError, match="query string or fragment") as caught:
        get_judge("strongreject", backend="openai", rubric="{forbidden_prompt} {response}")
    assert SECRET not in str(caught.value) and "http://127.0.0.1:9/v1" in str(caught.value)


def test_describe_judge_records_the_model_and_the_endpoint_without_credentials(monkeypatch):
    monkeypatch.delenv("SECURESD_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("SECURESD_JUDGE_MODEL", raising=False)
    assert describe_judge("refusal_prefix", {}) is None
    assert describe_judge("strongreject", {}) == {"kind": "openai", "model": DEFAULT_MODEL,
                                                  "endpoint": DEFAULT_BASE_URL}
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", f"http://user:{SECRET}@127.0.0.1:8000/v1/")
    monkeypatch.setenv("SECURESD_JUDGE_MODEL", "judge-model")
    assert describe_judge("strongreject", {"backend": "openai"}) == {
        "kind": "openai", "model": "judge-model", "endpoint": "http://127.0.0.1:8000/v1"}
    options = {"backend": "openai", "backend_kwargs": {"base_url": "http://127.0.0.1:7/v1", "model": "m"}}
    assert describe_judge("strongreject", options)["endpoint"] == "http://127.0.0.1:7/v1"
    local = {"backend": "transformers", "backend_kwargs": {"model": "org/judge"}}
    assert describe_judge("strongreject", local) == {"kind": "transformers", "model": "org/judge"}
