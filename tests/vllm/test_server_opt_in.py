"""The OpenAI server (`vllm serve`) on 127.0.0.1 with hf-securesd installed but not enabled (no
SECURESD_VLLM, no SECURESD_VLLM_DEFAULT): a request carrying SecureSD fields in `vllm_xargs` gets HTTP
400 saying how to enable the plugin, a plain request gets 200 with the tokens of vLLM without the
package (the in-process engine with `VLLM_PLUGINS=""`, conftest's `probe_without_plugin`: same model,
draft, k, prompts and greedy decoding). One server, a few short requests."""

from __future__ import annotations

import json

import pytest
from vllm_support import openai_server, requires_vllm

from hf_securesd.vllm import DEFAULT_ENV, OPT_IN_ENV

pytestmark = requires_vllm()

ENABLE_HINT = "plugin is off in this server: start vLLM with SECURESD_VLLM=1"


@pytest.fixture(scope="module")
def server_without_opt_in(pair_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server_without_opt_in") / "vllm_serve.log"
    unset = {OPT_IN_ENV: None, DEFAULT_ENV: None, "VLLM_USE_V2_MODEL_RUNNER": None, "VLLM_PLUGINS": None}
    with openai_server(pair_dir, log_path, unset) as client:
        yield client


def completion(client, prompt: list[int], max_tokens: int, **fields):
    body = {"model": client.get("/v1/models").json()["data"][0]["id"], "prompt": prompt,
            "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    return client.post("/v1/completions", json={**body, **fields})


@pytest.mark.parametrize(
    "securesd",
    [{"verifier": "lossless"}, {"verifier": {"verifier": "mars", "theta": 0.5},
                                 "secure_schedule": {"schedule": "step", "L": 1}}],
    ids=["lossless", "mars-step1"],
)
def test_a_securesd_request_gets_400_saying_how_to_enable_the_plugin(server_without_opt_in, securesd):
    from conftest import PROBE_PROMPTS

    xargs = {"securesd": json.dumps(securesd)}
    response = completion(server_without_opt_in, PROBE_PROMPTS[0], 4, vllm_xargs=xargs)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert ENABLE_HINT in message and DEFAULT_ENV in message


def test_beam_search_and_top_level_securesd_requests_get_400_too(server_without_opt_in):
    from conftest import PROBE_PROMPTS

    xargs = {"securesd": "lossless"}
    response = completion(server_without_opt_in, PROBE_PROMPTS[0], 4, vllm_xargs=xargs, use_beam_search=True, n=2)
    assert response.status_code == 400, response.text
    assert ENABLE_HINT in response.json()["error"]["message"]
    plain = completion(server_without_opt_in, PROBE_PROMPTS[0], 4, use_beam_search=True, n=2)
    assert plain.status_code == 200, plain.text
    top_level = completion(server_without_opt_in, PROBE_PROMPTS[0], 4, securesd="lossless")
    assert top_level.status_code == 400, top_level.text
    assert ENABLE_HINT in top_level.json()["error"]["message"]


def test_plain_requests_get_the_tokens_of_vllm_without_the_package(
    server_without_opt_in, probe_without_plugin
):
    """At T = 0 both are the target's greedy tokens, whatever the draft proposes."""
    from conftest import PROBE_NEW_TOKENS, PROBE_PROMPTS

    tokens = []
    for prompt in PROBE_PROMPTS:
        response = completion(server_without_opt_in, prompt, PROBE_NEW_TOKENS)
        assert response.status_code == 200, response.text
        tokens.append(response.json()["choices"][0]["token_ids"])
    assert tokens == probe_without_plugin["tokens"]
    assert all(len(sequence) > 1 for sequence in tokens)
