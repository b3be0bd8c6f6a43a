"""The seconds recorded for an openai generation include the client's retries and its Retry-After and
backoff sleeps, and nothing recorded said so: the client now counts each request's attempts and the
seconds it slept, and the runner journals an engine's `attempts` and `retry_wait_seconds` with the
generation."""

from __future__ import annotations

from typing import Any, Sequence

import pytest
from support import recording_handler, send_reply, serve_locally, stop_servers

from hf_securesd.bench.engines.base import Engine, Generation, Prompt
from hf_securesd.bench.engines.client import Attempts, ClientSettings, OpenAIClient
from hf_securesd.bench.plan import TARGET, RunConfig
from hf_securesd.bench.results import GENERATIONS, read_jsonl
from hf_securesd.bench.runner import StudySettings, prepare_tasks, run_study


def busy_once(handler, state) -> None:
    """The first request gets 503 with Retry-After 0.2, every later one an answer."""
    if state["requests"] == 1:
        send_reply(handler, 503, b"{}", **{"Retry-After": "0.2"})
    else:
        send_reply(handler, 200, b'{"choices": [{"text": "ok"}]}')


def test_the_client_counts_attempts_and_the_seconds_it_slept():
    handler, _ = recording_handler(busy_once)
    server, url = serve_locally(handler)
    try:
        client = OpenAIClient(url, None, ClientSettings(max_retries=2, concurrency=1))
        (reply, attempts), = client.post_many_counted("/completions", [{"prompt": "x"}])
    finally:
        stop_servers([server])
    assert reply["choices"][0]["text"] == "ok"
    assert attempts.count == 2 and attempts.waited_s == pytest.approx(0.2)


class RetriedEngine(Engine):
    """Answers every prompt as an engine whose client retried once after a 0.2 s wait."""

    name = "retried"
    probes_rates = False

    def baseline_configs(self) -> list[RunConfig]:
        return [TARGET]

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name}

    def generate(self, config: RunConfig, prompts: Sequence[Prompt], max_new_tokens: int,
                 num_assistant_tokens: int) -> list[Generation]:
        retried = Attempts(2, 0.2)
        return [Generation("I cannot.", 2, 0.25, None, attempts=retried.count,
                           retry_wait_seconds=retried.waited_s) for _ in prompts]


def test_the_runner_journals_attempts_and_retry_waits(tmp_path, data_dir):
    tasks = prepare_tasks(["jailbreak"], None, data_dir=data_dir, limit=1, max_new_tokens=4)
    settings = StudySettings("t", "d", device=None, dtype=None, num_assistant_tokens=None)
    run_study(settings, RetriedEngine(), tasks, [], tmp_path, progress=False)
    record, = read_jsonl(tmp_path / GENERATIONS)
    assert (record["attempts"], record["retry_wait_seconds"], record["seconds"]) == (2, 0.2, 0.25)
