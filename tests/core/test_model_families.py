"""Lossless decoding equals the target's own greedy decoding across model families (the full-attention
row of docs/generate_arguments.md's model table): each builds its positions, masks and cache its own way."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

import hf_securesd
from support import sharp_random_model

VOCAB = 259
SMALL = dict(vocab_size=VOCAB)
FAMILIES = {
    "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, **SMALL),
    "qwen3": lambda: transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, **SMALL),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                     head_dim=16, num_experts=4, num_experts_per_tok=2, **SMALL),
    "phi3": lambda: transformers.Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, **SMALL),
    "opt": lambda: transformers.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                          word_embed_proj_dim=64, max_position_embeddings=256, **SMALL),
    "bloom": lambda: transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, **SMALL),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                   num_attention_heads=4, **SMALL),
    "falcon": lambda: transformers.FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, **SMALL),
}


def _model(family: str, seed: int):
    return sharp_random_model(FAMILIES[family](), seed)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lossless_equals_target_greedy_alone_and_in_a_padded_batch(family):
    draft, target = _model(family, 1), hf_securesd.wrap(_model(family, 0))
    prompt = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 33]])
    expected = target.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=draft, verifier="lossless", max_new_tokens=24,
                                       do_sample=False), expected)
    assert torch.equal(target.generate(prompt, prompt_lookup_num_tokens=3, verifier="lossless", max_new_tokens=24,
                                       do_sample=False), expected)
    batch = torch.tensor([[256, 256, 72, 101, 108, 108], [97, 98, 99, 100, 101, 102]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    expected = target.generate(batch, attention_mask=mask, max_new_tokens=16, do_sample=False)
    ours = target.generate(batch, attention_mask=mask, assistant_model=draft, verifier="lossless", max_new_tokens=16,
                           do_sample=False)
    assert torch.equal(ours, expected)


def test_mpt_runs_one_row_at_a_time_and_refuses_a_batch():
    """MPT's ALiBi bias counts cache slots: a batch's masked slots changed a row's tokens (silently)."""
    config = transformers.MptConfig(d_model=64, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=256,
                                    pad_token_id=256, **SMALL)
    draft, target = sharp_random_model(config, 1), hf_securesd.wrap(sharp_random_model(config, 0))
    prompt = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 33]])
    expected = target.generate(prompt, max_new_tokens=24, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=draft, verifier="lossless", max_new_tokens=24,
                                       do_sample=False), expected)
    batch = torch.tensor([[256, 256, 72, 101, 108, 108], [97, 98, 99, 100, 101, 102]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with pytest.raises(hf_securesd.SecureSDConfigError,
                       match=r"the target model \(MptForCausalLM\) computes its ALiBi attention bias from cache slot "
                             r"numbers: .* Pass one row per generate call"):
        target.generate(batch, attention_mask=mask, assistant_model=draft, verifier="lossless", max_new_tokens=16)


@pytest.mark.parametrize("config", [
    transformers.OpenAIGPTConfig(n_embd=64, n_layer=2, n_head=4, n_positions=256, **SMALL),  # keeps no cache
    transformers.CpmAntConfig(hidden_size=64, dim_ff=128, num_hidden_layers=2, num_attention_heads=4,
                              dim_head=16, prompt_length=8, **SMALL),  # caches prompt slots of its own too
], ids=["openai-gpt", "cpmant"])
@pytest.mark.parametrize("drafting", ["draft model", "prompt lookup"])
def test_a_model_whose_cache_does_not_grow_by_the_tokens_fed_is_refused(config, drafting):
    """openai-gpt ignored the cache it was given and every round re-read only its new tokens: wrong
    tokens at batch 1 without a word."""
    target = hf_securesd.wrap(sharp_random_model(config, 0))
    drafts = (dict(assistant_model=sharp_random_model(config, 1)) if drafting == "draft model"
              else dict(prompt_lookup_num_tokens=3))
    prompt = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 33]])
    with pytest.raises(hf_securesd.SecureSDConfigError,
                       match=r"was fed 8 tokens after 0 cached ones and its KV cache holds \d+ slots: .*Use plain "
                             r"generate"):
        target.generate(prompt, verifier="lossless", max_new_tokens=12, do_sample=False, **drafts)
