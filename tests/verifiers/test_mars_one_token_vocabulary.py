"""MARS on a one-token vocabulary: there is no runner-up, nothing is ever "close", and the rule is the
lossless one (before the fix `topk(2)` raised "selected index k out of range")."""

from __future__ import annotations

import pytest
import torch

from hf_securesd import MARS, Lossless, Step
from hf_securesd.step import RowSpec, VerificationRound, verify_step

K = 3


def one_token_round(verifier, greedy: bool, one_hot: bool, schedule=None) -> VerificationRound:
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(2, K + 1, 1, generator=generator) + 1.0  # z1 > 0: the case that would fire
    draft = None if one_hot else torch.randn(2, K, 1, generator=generator)
    return VerificationRound(
        rows=[RowSpec(verifier, schedule)] * 2, draft_tokens=torch.zeros(2, K, dtype=torch.long),
        draft_counts=torch.tensor([K, 1]), starts=torch.zeros(2, dtype=torch.long), target_logits=target,
        target_raw_logits=target, greedy=greedy, draft_logits=draft, draft_raw_logits=draft,
    )


@pytest.mark.parametrize("schedule", [None, Step(L=1)])
@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-model", "one-hot"])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_mars_with_one_token_verifies_as_lossless(greedy, one_hot, schedule):
    out = verify_step(one_token_round(MARS(theta=0.5), greedy, one_hot, schedule), collect_deviation=True)
    lossless = verify_step(one_token_round(Lossless(), greedy, one_hot, schedule), collect_deviation=True)
    assert out.accepted.tolist() == lossless.accepted.tolist() == [K, 1]
    assert out.next_tokens.tolist() == [0, 0]
    assert torch.equal(out.alpha, lossless.alpha) and float(out.deviation.abs().max()) == 0.0
