"""Acceptance 1: lossless greedy speculative decoding reproduces target greedy decoding token for
token, and HF's own assisted generation, on tiny Llama and Qwen2 models."""

from __future__ import annotations

import pytest
import torch
from support import random_prompts

DRAFT_LENGTHS = (1, 3, 5, 8)
PROMPTS_PER_MODEL = 13  # 13 prompts x 4 draft lengths x 2 architectures = 104 cases


@pytest.mark.parametrize("pair_name", ["llama_pair", "qwen_pair"])
def test_lossless_greedy_equals_target_greedy(pair_name, request):
    draft, target = request.getfixturevalue(pair_name)
    cases = mismatches = 0
    total_accepted = 0
    for prompt in random_prompts(PROMPTS_PER_MODEL, seed=hash(pair_name) % 1000):
        reference = target.generate(prompt, max_new_tokens=24, do_sample=False)
        hf_assisted = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=draft)
        assert torch.equal(hf_assisted, reference), "HF assisted generation itself differs from greedy"
        for k in DRAFT_LENGTHS:
            out = target.generate(
                prompt,
                max_new_tokens=24,
                do_sample=False,
                assistant_model=draft,
                verifier="lossless",
                num_assistant_tokens=k,
                return_dict_in_generate=True,
            )
            cases += 1
            mismatches += int(not torch.equal(out.sequences, reference))
            stats = out.speculative_stats
            assert max(stats.drafted_per_round) <= k
            assert stats.new_tokens == reference.shape[1] - prompt.shape[1]
            total_accepted += stats.accepted_tokens
    assert cases >= 52
    assert mismatches == 0
    assert total_accepted > 0, "the draft never agreed with the target: the test would not exercise acceptance"


def test_draft_length_is_honoured(llama_pair):
    draft, target = llama_pair
    prompt = torch.tensor([[5, 6, 7, 8]])
    for k in (1, 2, 7):
        out = target.generate(
            prompt, max_new_tokens=30, do_sample=False, assistant_model=draft, verifier="lossless",
            num_assistant_tokens=k, return_dict_in_generate=True,
        )
        rounds = out.speculative_stats.drafted_per_round
        # constant k; only the rounds at the end, capped by the length budget, may draft fewer
        first_short = next((i for i, drafted in enumerate(rounds) if drafted < k), len(rounds))
        assert rounds[0] == k and set(rounds[:first_short]) == {k}, rounds
        assert rounds[first_short:] == sorted(rounds[first_short:], reverse=True), rounds


def test_default_draft_length_is_five(llama_pair):
    draft, target = llama_pair
    out = target.generate(
        torch.tensor([[5, 6, 7, 8]]), max_new_tokens=30, do_sample=False, assistant_model=draft, verifier="lossless",
        return_dict_in_generate=True,
    )
    assert out.speculative_stats.new_tokens > 5, "pick a prompt whose first round does not end the response"
    assert out.speculative_stats.drafted_per_round[0] == 5


def test_lossless_greedy_equals_target_greedy_with_a_vocabulary_the_argmax_splits():
    """A 32,000-token vocabulary (as Llama 2's): the drafts and the target's choice are taken by the
    two-level CPU argmax (`hf_securesd.argmax`), batched rows included."""
    import hf_securesd
    from hf_securesd.argmax import SPLIT_FROM, chunk_size
    from hf_securesd.tiny import TinyPairSpec, tiny_pair

    vocab = 32000
    assert vocab >= SPLIT_FROM and chunk_size(vocab) is not None
    draft, target = tiny_pair(TinyPairSpec(vocab_size=vocab, hidden_size=32, seed=5))
    target = hf_securesd.wrap(target)
    prompts = torch.randint(0, vocab, (3, 7), generator=torch.Generator().manual_seed(1))
    reference = target.generate(prompts, max_new_tokens=12, do_sample=False)
    out = target.generate(
        prompts, max_new_tokens=12, do_sample=False, assistant_model=draft, verifier="lossless",
        num_assistant_tokens=4, return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, reference)
    assert out.speculative_stats.accepted_tokens > 0
