"""Acceptance 2: lossless speculative sampling follows the target's distribution exactly.

The target's joint distribution of the first three response tokens is enumerated exactly (6^3 = 216
sequences, each probability a product of the target's processed next-token distributions), and
compared with seeded samples from `generate(..., verifier="lossless", do_sample=True)`:
6,000 drawn as batches of 200 copies of the prompt (rows advance independently, so this also
checks batched sampling per row) and 1,500 drawn one at a time.

Noise floor: the 99.9th percentile of TV(exact, empirical) over 300 simulated runs of as many samples
drawn directly from the exact joint; the speculative samples must fall below it. The same check on
a relaxed verifier must fail, which shows the test can tell a biased sampler from the target.
"""

from __future__ import annotations

import pytest
import torch
from support import empirical_tv, exact_joint, noise_floor

import hf_securesd
from hf_securesd.tiny import TinyPairSpec, tiny_pair

VOCAB = 6
NEW_TOKENS = 3
BATCHED_SAMPLES = 6_000
BATCH = 200
SINGLE_SAMPLES = 1_500
PROMPT = torch.tensor([[1, 4, 2]])
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=5, top_p=1.0)


@pytest.fixture(scope="module")
def small_vocab_pair():
    draft, target = tiny_pair(TinyPairSpec(vocab_size=VOCAB, hidden_size=32, initializer_range=0.6, draft_noise=0.3, seed=3))
    for model in (draft, target):
        model.generation_config.eos_token_id = None
    return draft, hf_securesd.wrap(target)


def speculative_samples(draft, target, verifier, count: int, batch: int) -> list[tuple[int, ...]]:
    torch.manual_seed(2024)
    samples = []
    for _ in range(count // batch):
        out = target.generate(
            PROMPT.expand(batch, -1), max_new_tokens=NEW_TOKENS, assistant_model=draft, verifier=verifier,
            num_assistant_tokens=2, **SAMPLING,
        )
        samples += [tuple(row[PROMPT.shape[1] :].tolist()) for row in out]
    return samples


@pytest.fixture(scope="module")
def exact(small_vocab_pair):
    joint = exact_joint(small_vocab_pair[1], PROMPT, VOCAB, NEW_TOKENS, SAMPLING)
    assert abs(sum(joint.values()) - 1.0) < 1e-5
    return joint


@pytest.mark.parametrize("count, batch", [(BATCHED_SAMPLES, BATCH), (SINGLE_SAMPLES, 1)], ids=["batched", "single"])
def test_lossless_sampling_matches_target_joint(small_vocab_pair, exact, count, batch):
    draft, target = small_vocab_pair
    floor = noise_floor(exact, count)
    assert floor < 0.2  # the test has resolving power at this sample size
    tv = empirical_tv(exact, speculative_samples(draft, target, "lossless", count, batch))
    assert tv <= floor, f"TV {tv:.4f} above the noise floor {floor:.4f}"


def test_the_same_check_detects_a_lossy_verifier(small_vocab_pair, exact):
    draft, target = small_vocab_pair
    floor = noise_floor(exact, BATCHED_SAMPLES)
    tv = empirical_tv(exact, speculative_samples(draft, target, hf_securesd.LossySD(epsilon=0.5), BATCHED_SAMPLES, BATCH))
    assert tv > floor, f"a lossy verifier (TV {tv:.4f}) went undetected (floor {floor:.4f})"
