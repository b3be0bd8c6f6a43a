"""`securesd bench` on the tiny Qwen2 pair through each engine: `--engine vllm` against `--engine hf`
(target alone, draft alone and lossless records equal; MARS + Step(2) equal to `generate` continued
from vLLM's first token with Step(1), the shift vLLM's position 0 requires), then `--engine openai`
against a real vLLM server on 127.0.0.1 (endpoint-per-configuration and request-field
configurations) against `--engine vllm`. Small on purpose: 3 prompts, 10 new tokens."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from vllm_support import NUM_SPECULATIVE_TOKENS, engine_environment, openai_server, requires_vllm

from hf_securesd.bench.results import MANIFEST, RUNS, read_jsonl
from hf_securesd.bench.runner import prepare_tasks
from hf_securesd.cli import main
from hf_securesd.schedules import Step
from hf_securesd.verifiers import MARS

pytestmark = requires_vllm()

LIMIT = 3
NEW_TOKENS = 10
RELAXED = "mars(theta=0.5)+step(L=2)"


def bench(engine: str, out: Path, pair_dir: Path, data_dir: Path, *extra: str) -> dict[str, dict]:
    """Run `securesd bench` and return its finished cells by configuration key."""
    argv = [
        "bench",
        "--engine",
        engine,
        "--tasks",
        "jailbreak",
        "--limit",
        str(LIMIT),
        "--max-new-tokens",
        str(NEW_TOKENS),
        "--batch-size",
        str(LIMIT),
        "--data-dir",
        str(data_dir),
        "--out",
        str(out),
        "--no-progress",
        "--no-report",
        *extra,
    ]
    if engine != "openai":  # the server decides k and dtype: the openai engine refuses both
        argv += [
            "--num-assistant-tokens",
            str(NUM_SPECULATIVE_TOKENS),
            "--dtype",
            "fp32",
            "--target",
            str(pair_dir / "target"),
            "--draft",
            str(pair_dir / "draft"),
            "--verifiers",
            "mars:0.5",
            "--schedules",
            "step:2",
        ]
    if engine == "vllm":
        argv += ["--vllm-option", "max_model_len=256", "--vllm-option", "enforce_eager=true"]
    assert main(argv) == 0
    return {run["config_key"]: run for run in read_jsonl(out / RUNS)}


@pytest.fixture(scope="module")
def engine_env():
    saved = dict(os.environ)
    os.environ.update(engine_environment())
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def hf_cells(tmp_path_factory, pair_dir, data_dir):
    return bench("hf", tmp_path_factory.mktemp("hf"), pair_dir, data_dir)


@pytest.fixture(scope="module")
def vllm_cells(tmp_path_factory, pair_dir, data_dir, engine_env):
    out = tmp_path_factory.mktemp("vllm")
    cells = bench("vllm", out, pair_dir, data_dir)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["engine"] == "vllm" and manifest["engine_version"].startswith("0.32")
    return cells


def shifted_hf_responses(hf_models, pair_dir: Path, data_dir: Path) -> list[str]:
    """What vLLM's MARS + Step(2) must answer: the target's greedy first token, then `generate`
    continued from it with Step(1)."""
    from transformers import AutoTokenizer

    draft, target = hf_models
    tokenizer = AutoTokenizer.from_pretrained(pair_dir / "target")
    prompts = prepare_tasks(["jailbreak"], tokenizer, data_dir=data_dir, limit=LIMIT)[0].prompts
    responses = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            first = target(ids).logits[:, -1].argmax(-1, keepdim=True)
            out = target.generate(
                torch.cat([ids, first], dim=1),
                attention_mask=torch.ones(1, ids.shape[1] + 1),
                assistant_model=draft,
                verifier=MARS(theta=0.5),
                secure_schedule=Step(L=1),
                num_assistant_tokens=NUM_SPECULATIVE_TOKENS,
                max_new_tokens=NEW_TOKENS - 1,
                do_sample=False,
            )
        responses.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    return responses


def test_vllm_engine_equals_hf_for_baselines_and_lossless(hf_cells, vllm_cells):
    for key in ("target", "draft", "lossless"):
        assert vllm_cells[key]["responses"] == hf_cells[key]["responses"], key
        assert vllm_cells[key]["scores"] == hf_cells[key]["scores"], key
    assert vllm_cells["lossless"]["acceptance_rate"] is not None


def test_vllm_relaxed_step2_equals_hf_shifted_by_vllms_first_token(vllm_cells, hf_models, pair_dir, data_dir):
    assert vllm_cells[RELAXED]["responses"] == shifted_hf_responses(hf_models, pair_dir, data_dir)
    assert vllm_cells[RELAXED]["acceptance_rate"] is not None


@pytest.fixture(scope="module")
def server_url(pair_dir, tmp_path_factory):
    """The pair's vLLM server with the plugin and per-request speculative metrics; yields its /v1 URL."""
    log_path = tmp_path_factory.mktemp("bench_server") / "vllm_serve.log"
    metrics = ("--enable-per-request-metrics", "--per-request-spec-decode-metrics", "detailed")
    draws = {"draft_sample_method": "probabilistic"}
    with openai_server(pair_dir, log_path, {"SECURESD_VLLM": "1"}, metrics, draws) as client:
        yield str(client.base_url).rstrip("/") + "/v1"


def test_openai_engine_on_a_vllm_server_equals_the_vllm_engine(
    vllm_cells, server_url, pair_dir, data_dir, tmp_path
):
    cells = bench(
        "openai",
        tmp_path / "openai",
        pair_dir,
        data_dir,
        "--base-url",
        server_url,
        "--token-ids",
        "--tokenizer",
        str(pair_dir / "target"),
        "--endpoint",
        f"twin={server_url}",
        "--baseline",
        "twin",
        "--verifiers",
        "lossless",
        "mars:0.5",
        "--schedules",
        "step:2",
    )
    assert set(cells) == {"target", "lossless", RELAXED}  # no draft endpoint: no draft cell
    for key in cells:  # target via the endpoint, lossless and MARS via the plugin's request fields
        assert cells[key]["responses"] == vllm_cells[key]["responses"], key
    for key in ("lossless", RELAXED):  # the server's per-request metrics give the acceptance rate
        # (reported, not compared: the server batches the requests differently from the in-process engine,
        # and the tiny draft's float32 logits, so its drafts, change with the batch's composition)
        assert 0.0 <= cells[key]["acceptance_rate"] <= 1.0, key
    # the twin here is the speculative server itself: plain requests are lossless there, and it reports
    # their per-request metrics too
    assert cells["target"]["acceptance_rate"] is not None
    manifest = json.loads((tmp_path / "openai" / MANIFEST).read_text())
    assert manifest["engine"] == "openai" and manifest["endpoints"]["twin"] == server_url
    assert manifest["server_models"][server_url]["server_models"] == [str(pair_dir / "target")]
