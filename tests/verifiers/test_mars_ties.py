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


def test_mars_at_a_real_vocabulary_decides_from_torchs_top_two():
    """At a vocabulary large enough for `vocab_top_two`'s chunked pass (32,000), greedy MARS accepts
    exactly what the rule gives with v1, v2 taken by torch's argmax (then argmax with v1 set aside):
    the runner-up tied with the maximum, in its chunk or another, and drafts on v1, v2 and elsewhere."""
    vocab, theta = 32000, 0.8
    generator = torch.Generator().manual_seed(11)
    raw = torch.randn(6, 3, vocab, generator=generator)
    raw[0, :, [40, 41]] = torch.tensor([9.0, 8.0])  # close runner-up in the maximum's chunk
    raw[1, :, [17000, 3]] = torch.tensor([9.0, 9.0])  # tied maximum: v1 = 3, v2 = 17000
    raw[2, :, [5, 31999]] = torch.tensor([9.0, 1.0])  # far runner-up
    raw[3, :, [100, 200, 300]] = 9.0  # three-way tie
    raw[4, :, [7, 8]] = torch.tensor([-1.0, -1.5]) + 20 * torch.finfo(torch.float32).eps  # tiny logits
    v1 = raw.argmax(dim=-1)
    v2 = raw.scatter(-1, v1[..., None], float("-inf")).argmax(dim=-1)
    drafts = torch.stack([v1[:, 0], v2[:, 1], (v2[:, 0] + 1) % vocab], dim=1)  # [6, 3] on v1, v2, neither
    z1, z2 = raw.gather(-1, v1[..., None])[..., 0], raw.gather(-1, v2[..., None])[..., 0]
    close = (z1 > 0) & (z2 > theta * z1) & (v2 != v1)
    expected = ((drafts == v1[:, :3]) | (close[:, :3] & ((drafts == v1[:, :3]) | (drafts == v2[:, :3])))).float()
    logits = torch.cat([raw, raw[:, :1]], dim=1)  # [6, 4, V]: k = 3 drafts and the bonus position
    out = verify_step(VerificationRound(
        rows=[RowSpec(MARS(theta=theta))] * 6, draft_tokens=drafts, draft_counts=None,
        starts=torch.zeros(6, dtype=torch.long), target_logits=logits, target_raw_logits=logits, greedy=True,
    ))
    assert torch.equal(out.alpha, expected)
