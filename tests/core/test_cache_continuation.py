"""Continuing from a returned cache (multi-turn), and what a round that ends at EOS leaves behind."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

import hf_securesd
from hf_securesd import SecureSDConfigError
from hf_securesd.tiny import TinyPairSpec, tiny_pair

PROMPT = torch.tensor([[12, 40, 7, 99, 3, 18]])
NEXT_TURN = torch.tensor([[257, 33, 34, 35, 258, 257]])


def _first_turn(target, draft, **kwargs):
    return target.generate(PROMPT, max_new_tokens=8, do_sample=False, assistant_model=draft, verifier="lossless",
                           return_dict_in_generate=True, **kwargs)


@pytest.mark.parametrize("cache_argument", ["past_key_values", "cache"])
def test_second_turn_from_our_cache_equals_greedy_with_and_without_cache(llama_pair, cache_argument):
    draft, target = llama_pair
    if cache_argument not in inspect.signature(target.forward).parameters:
        pytest.skip(f"this transformers version has no {cache_argument}= argument")
    first = _first_turn(target, draft)
    assert first.cache.get_seq_length() == first.sequences.shape[1] - 1, "the cache holds all but the last token"
    conversation = torch.cat([first.sequences, NEXT_TURN], dim=1)
    without_cache = target.generate(conversation, max_new_tokens=8, do_sample=False)
    with_hf_cache = target.generate(conversation, max_new_tokens=8, do_sample=False,
                                    **{cache_argument: copy.deepcopy(first.cache)})
    ours = target.generate(conversation, max_new_tokens=8, do_sample=False, assistant_model=draft, verifier="lossless",
                           return_dict_in_generate=True, **{cache_argument: first.cache})
    assert torch.equal(with_hf_cache, without_cache)
    assert torch.equal(ours.sequences, without_cache)
    assert ours.cache.get_seq_length() == ours.sequences.shape[1] - 1


def test_continuing_from_a_plain_generate_cache(llama_pair):
    draft, target = llama_pair
    plain = target.generate(PROMPT, max_new_tokens=5, do_sample=False, return_dict_in_generate=True)
    conversation = torch.cat([plain.sequences, NEXT_TURN], dim=1)
    reference = target.generate(conversation, max_new_tokens=7, do_sample=False)
    ours = target.generate(conversation, max_new_tokens=7, do_sample=False, assistant_model=draft, verifier="mars",
                           secure_schedule=hf_securesd.Step(L=100), past_key_values=plain.past_key_values if hasattr(plain, "past_key_values") else plain.cache)
    assert torch.equal(ours, reference)


def test_a_cache_that_covers_the_whole_input_is_refused(llama_pair):
    draft, target = llama_pair
    first = _first_turn(target, draft)
    covered = first.sequences[:, : first.cache.get_seq_length()]
    with pytest.raises(SecureSDConfigError, match="cache passed to generate already holds"):
        target.generate(covered, max_new_tokens=4, do_sample=False, assistant_model=draft, verifier="lossless",
                        past_key_values=first.cache)


def test_drafts_after_eos_are_not_counted_and_not_cached():
    """A draft identical to the target accepts everything; the response ends at its 2nd token (EOS)."""
    draft, target = tiny_pair(TinyPairSpec(draft_noise=0.0))
    target = hf_securesd.wrap(target)
    greedy = target.generate(PROMPT, max_new_tokens=6, do_sample=False)
    eos = int(greedy[0, PROMPT.shape[1] + 1])
    assert eos not in greedy[0, PROMPT.shape[1] :][:1].tolist(), "the first token must not already be the EOS"
    out = target.generate(PROMPT, max_new_tokens=20, do_sample=False, assistant_model=draft, verifier="lossless",
                          eos_token_id=eos, num_assistant_tokens=5, return_dict_in_generate=True)
    stats = out.speculative_stats
    assert out.sequences[0, PROMPT.shape[1] :].tolist() == greedy[0, PROMPT.shape[1] : PROMPT.shape[1] + 2].tolist()
    assert stats.new_tokens == 2
    assert (stats.drafted_tokens, stats.accepted_tokens) == (2, 2)
    assert out.cache.get_seq_length() == out.sequences.shape[1] - 1
