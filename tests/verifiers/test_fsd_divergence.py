"""FSD's divergences where q~ gives a token no mass: KL(p~ || q~) is +inf when the draft puts mass on a
token the processors mask out of q~, so the position is never close (before the fix q~ was clamped at
float32's `tiny` and a large-but-finite KL let such a draft through under a moderate tau)."""

from __future__ import annotations

import math

import pytest
import torch

from hf_securesd import FSD
from hf_securesd.step import RowSpec, VerificationRound, verify_step
from hf_securesd.verifiers.fsd import divergence


def masked_round(kind: str, tau: float) -> VerificationRound:
    raw_target = torch.tensor([[[4.0, 3.9, 0.0, 0.0], [4.0, 3.9, 0.0, 0.0]]])  # [1, k+1 = 2, V = 4]
    processed = raw_target.clone()
    processed[..., 3] = -math.inf  # token 3 masked (bad_words_ids, say)
    draft = torch.tensor([[[3.9, 4.0, 0.0, -2.0]]])  # p~(3) ~ 3e-3, on the masked token
    return VerificationRound(
        rows=[RowSpec(FSD(tau=tau, divergence=kind))], draft_tokens=torch.tensor([[1]]), draft_counts=None,
        starts=torch.tensor([5]), target_logits=processed, target_raw_logits=raw_target, greedy=True,
        draft_logits=draft, draft_raw_logits=draft,
    )


def test_kl_is_infinite_where_the_draft_has_mass_the_target_does_not():
    target = torch.tensor([[0.6, 0.4, 0.0]])
    assert divergence(target, torch.tensor([[0.5, 0.4, 0.1]]), "kl").item() == math.inf
    # zero draft mass on the target's zero adds nothing: the ordinary finite KL
    finite = divergence(target, torch.tensor([[0.5, 0.5, 0.0]]), "kl").item()
    assert finite == pytest.approx(0.5 * math.log(0.5 / 0.6) + 0.5 * math.log(0.5 / 0.4), rel=1e-5)


def test_kl_fsd_rejects_a_draft_with_mass_on_a_masked_token():
    out = verify_step(masked_round("kl", tau=0.3), collect_deviation=True)
    assert out.alpha.tolist() == [[0.0]] and out.accepted.tolist() == [0]
    assert out.next_tokens.tolist() == [0]  # x*, recovered
    assert out.deviation.tolist() == [[0.0]]


@pytest.mark.parametrize("kind", ["js", "tv"])
def test_bounded_divergences_stay_finite_on_a_masked_token(kind):
    target = torch.tensor([[0.6, 0.4, 0.0]])
    value = divergence(target, torch.tensor([[0.5, 0.4, 0.1]]), kind).item()
    assert math.isfinite(value) and 0.0 < value <= math.log(2.0)
