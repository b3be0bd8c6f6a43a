"""Fixtures for the vLLM plugin tests: a tiny random Qwen2 draft/target pair saved to disk (vLLM loads
models from a folder), and the HF reference models loaded from the same folder.

Engine tests run only where vLLM is installed (.ci/vllm.sh builds that environment); elsewhere they
skip with the reason. The engine-free tests (test_sampler.py, test_request.py) run everywhere.

The plugin changes nothing in vLLM until the operator opts in, so this suite opts in for every engine
and server it starts (SECURESD_VLLM=1 in this process, inherited by the subprocesses); test_opt_in.py
removes it where it checks the behaviour without the opt-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vllm_support import NUM_SPECULATIVE_TOKENS, PAIR_SPEC, engine_environment

from hf_securesd.tiny import byte_tokenizer, tiny_pair
from hf_securesd.vllm import OPT_IN_ENV

os.environ.setdefault(OPT_IN_ENV, "1")

PROBE_PROMPTS = [list(b"hello world"), list(b"def add(a, b):")]
PROBE_NEW_TOKENS = 16
# One in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) in a fresh interpreter: its plain greedy
# tokens, what a SecureSD request gets, the runner variable after start-up and whether the runner was
# patched. With argv[4] == "fake-mismatch" the signature of GPUModelRunner._sample is altered (its
# code is not) before vLLM loads the plugin, as a release that changed it would look.
ENGINE_PROBE = """
import inspect, json, os, sys
target, draft, prompts, mode = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
if mode == "fake-mismatch":
    sample = GPUModelRunner._sample
    params = list(inspect.signature(sample).parameters.values())
    extra = inspect.Parameter("sampling_state", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    sample.__signature__ = inspect.Signature(params + [extra])
from vllm import LLM, SamplingParams
speculative = {"method": "draft_model", "model": draft, "num_speculative_tokens": %d,
               "draft_sample_method": "probabilistic"}
llm = LLM(model=target, speculative_config=speculative, max_model_len=256, max_num_seqs=4, enforce_eager=True,
          dtype="float32", seed=0)
plain = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=%d, temperature=0),
                     use_tqdm=False)
try:
    asked = SamplingParams(max_tokens=2, temperature=0, extra_args={"securesd": {"verifier": "lossless"}})
    llm.generate([{"prompt_token_ids": prompts[0]}], asked, use_tqdm=False)
    refusal = None
except Exception as error:
    refusal = type(error).__name__ + ": " + str(error)
print("RESULT " + json.dumps({
    "tokens": [list(o.outputs[0].token_ids) for o in plain], "refusal": refusal,
    "runner_env": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
    "patched": GPUModelRunner._sample.__qualname__ != "GPUModelRunner._sample",
}))
""" % (NUM_SPECULATIVE_TOKENS, PROBE_NEW_TOKENS)


@pytest.fixture(scope="session")
def pair_dir(tmp_path_factory) -> Path:
    """Folder with draft/ and target/ (weights, config, byte tokenizer), built with save_pretrained."""
    root = tmp_path_factory.mktemp("tiny_qwen2_pair")
    draft, target = tiny_pair(PAIR_SPEC)
    tokenizer = byte_tokenizer()
    for name, model in (("draft", draft), ("target", target)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


@pytest.fixture(scope="session")
def hf_models(pair_dir):
    """(draft, wrapped target) loaded back from `pair_dir` in float32, as vLLM sees them."""
    import hf_securesd
    from transformers import AutoModelForCausalLM

    target = hf_securesd.wrap(AutoModelForCausalLM.from_pretrained(pair_dir / "target", dtype=torch.float32).eval())
    draft = AutoModelForCausalLM.from_pretrained(pair_dir / "draft", dtype=torch.float32).eval()
    return draft, target


def run_engine_probe(pair_dir: Path, environment: dict[str, str | None], mode: str = "plain") -> dict:
    """Run ENGINE_PROBE in a fresh interpreter with os.environ changed by `environment` (None removes a
    variable); returns its result and, under "stderr", what it logged."""
    env = {**os.environ, **engine_environment(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    for name, value in environment.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    command = [sys.executable, "-c", ENGINE_PROBE, str(pair_dir / "target"), str(pair_dir / "draft"),
               json.dumps(PROBE_PROMPTS), mode]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"engine probe failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return {**json.loads(lines[-1][len("RESULT "):]), "stderr": done.stderr}


@pytest.fixture(scope="session")
def probe_without_plugin(pair_dir) -> dict:
    """The engine probe with hf-securesd's plugin not loaded at all (VLLM_PLUGINS="")."""
    unset = {OPT_IN_ENV: None, "VLLM_USE_V2_MODEL_RUNNER": None}
    return run_engine_probe(pair_dir, {"VLLM_PLUGINS": "", **unset})
