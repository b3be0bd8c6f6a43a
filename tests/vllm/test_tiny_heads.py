"""The tiny EAGLE heads (`hf_securesd.vllm.tiny_heads`) are built for Llama-style targets; another
config is refused with the missing fields named (engine-free: runs everywhere)."""

from __future__ import annotations

import json

import pytest
import transformers

from hf_securesd.vllm.tiny_heads import build_eagle_head


def test_a_target_without_llama_style_fields_is_refused_by_name(tmp_path):
    target = tmp_path / "gpt2"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4).to_dict()))
    with pytest.raises(ValueError, match=r"config.json has no hidden_size, intermediate_size, .*Llama-style targets"):
        build_eagle_head(target, tmp_path / "head")
