"""Which statistics a call returns: the exact per-position TV deviation is free at T = 0 (closed form)
and opt-in at T > 0 (`output_deviation=True`), where it costs a vocabulary-wide pass per round."""

from __future__ import annotations

import math

import torch
from transformers import GenerationConfig

PROMPT = torch.tensor([[5, 6, 7, 8]])


def _stats(target, draft, **kwargs):
    return target.generate(PROMPT, max_new_tokens=12, assistant_model=draft, verifier="mars",
                           return_dict_in_generate=True, **kwargs).speculative_stats


def test_greedy_deviation_comes_with_every_dict_output(llama_pair):
    draft, target = llama_pair
    stats = _stats(target, draft, do_sample=False)
    assert stats.position_tv_sum and all(not math.isnan(tv) for tv in stats.position_tv[:3])


def test_sampled_deviation_is_opt_in(llama_pair):
    draft, target = llama_pair
    torch.manual_seed(0)
    assert _stats(target, draft, do_sample=True).position_tv_sum == []
    stats = _stats(target, draft, do_sample=True, output_deviation=True)
    assert stats.position_tv_sum and all(0.0 <= tv <= 1.0 for tv in stats.position_tv if tv == tv)
    config = GenerationConfig(do_sample=True, max_new_tokens=12, return_dict_in_generate=True, output_deviation=True)
    out = target.generate(PROMPT, generation_config=config, assistant_model=draft, verifier="mars")
    assert out.speculative_stats.position_tv_sum


def test_sampled_deviation_is_exactly_zero_where_the_rule_is_lossless(llama_pair):
    """At T > 0 the TV is a float sum over the vocabulary; where the mixed rule is the lossless one
    (the lossless verifier, or eta = 0 under Step) the output is q exactly and the deviation reads 0."""
    draft, target = llama_pair
    torch.manual_seed(0)
    lossless = target.generate(PROMPT, max_new_tokens=12, assistant_model=draft, verifier="lossless",
                               do_sample=True, output_deviation=True, return_dict_in_generate=True).speculative_stats
    assert lossless.position_tv_sum and all(tv == 0.0 for tv in lossless.position_tv_sum)
    from hf_securesd import MARS

    torch.manual_seed(0)
    at_lossless_end = target.generate(PROMPT, max_new_tokens=12, assistant_model=draft, verifier=MARS(theta=1.0),
                                      do_sample=True, output_deviation=True,
                                      return_dict_in_generate=True).speculative_stats
    assert at_lossless_end.position_tv_sum and all(tv == 0.0 for tv in at_lossless_end.position_tv_sum)
    from hf_securesd import Step

    torch.manual_seed(0)
    stepped = _stats(target, draft, do_sample=True, output_deviation=True, secure_schedule=Step(L=3))
    assert stepped.position_tv_sum[:3] == [0.0, 0.0, 0.0]
    assert any(tv > 0 for tv in stepped.position_tv_sum[3:])
