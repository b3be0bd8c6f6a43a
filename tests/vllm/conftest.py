"""Fixtures for the vLLM plugin tests: a tiny random Qwen2 draft/target pair saved to disk (vLLM loads
models from a folder), and the HF reference models loaded from the same folder.

Engine tests run only where vLLM is installed (.ci/vllm.sh builds that environment); elsewhere they
skip with the reason. The engine-free tests (test_sampler.py, test_request.py) run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from vllm_support import PAIR_SPEC

from hf_securesd.tiny import byte_tokenizer, tiny_pair


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
