"""Shared fixtures: tiny random draft/target pairs (no network, no Hub)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import hf_securesd  # noqa: E402
from hf_securesd.tiny import TinyPairSpec, tiny_pair  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is fastest and avoids oversubscription


@pytest.fixture(scope="session")
def llama_pair():
    """(draft, wrapped target) tiny Llama models sharing a 259-token vocabulary."""
    draft, target = tiny_pair(TinyPairSpec(architecture="llama"))
    return draft, hf_securesd.wrap(target)


@pytest.fixture(scope="session")
def qwen_pair():
    draft, target = tiny_pair(TinyPairSpec(architecture="qwen2", seed=1))
    return draft, hf_securesd.wrap(target)


@pytest.fixture(scope="module")
def data_dir() -> Path:
    """The benchmark data directory (resolved): $SECURESD_DATA_DIR, else ../shared/data beside the
    checkout. Skips when it is missing; pass `str(data_dir)` where a string is needed (argv, env)."""
    from hf_securesd.bench.data import ENV_VAR

    chosen = Path(os.environ.get(ENV_VAR) or Path(__file__).resolve().parents[2] / "shared" / "data")
    if not chosen.is_dir():
        pytest.skip(f"no benchmark data at {chosen}: set {ENV_VAR}, or stage ../shared/data "
                    "beside the checkout")
    return chosen.resolve()
