"""MARS with tied top logits: v1 and v2 are the two lowest indices among the tied maxima (v1 is argmax's
x*), the same on every device. Before the fix they were `topk(2)`'s, whose order among equal values is
unspecified: with five tied tokens a draft of index 4 could be accepted while index 2 was not."""

from __future__ import annotations

import torch

from hf_securesd import MARS
from hf_securesd.step import RowSpec, VerificationRound, verify_step
from hf_securesd.verifiers.mars import top_two


def tied_alpha(draft: int, greedy: bool) -> float:
    raw = torch.tensor([0.0, 2.0, 2.0, 2.0, 2.0, 2.0]).expand(1, 2, 6).clone()
    # the draft puts a little more mass than q on every tied token: the lossless rule accepts each with
    # probability q / p < 1
    drafted = torch.tensor([[[-5.0, 2.0, 2.0, 2.0, 2.0, 2.0]]])
    out = verify_step(VerificationRound(
        rows=[RowSpec(MARS(theta=0.9))], draft_tokens=torch.tensor([[draft]]), draft_counts=None,
        starts=torch.tensor([3]), target_logits=raw, target_raw_logits=raw, greedy=greedy,
        draft_logits=None if greedy else drafted, draft_raw_logits=None if greedy else drafted,
    ))
    return float(out.alpha[0, 0])


def test_top_two_breaks_ties_by_lowest_index():
    v1, v2 = top_two(torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0]]))
    assert (v1.item(), v2.item()) == (1, 3)
    v1, v2 = top_two(torch.tensor([[5.0, 1.0, 4.0]]))
    assert (v1.item(), v2.item()) == (0, 2)


def test_greedy_mars_accepts_exactly_the_two_lowest_tied_tokens():
    assert [tied_alpha(x, greedy=True) for x in range(6)] == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_sampled_mars_accepts_the_two_lowest_tied_tokens_outright():
    alphas = [tied_alpha(x, greedy=False) for x in range(6)]
    assert alphas[1] == alphas[2] == 1.0
    assert all(alpha < 1.0 for alpha in alphas[3:])  # the lossless rule's q / p
