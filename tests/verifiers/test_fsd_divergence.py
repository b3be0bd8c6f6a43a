"""FSD where processors forbid tokens: q~ and p~ are both renormalised over the allowed tokens, so the
divergence compares the two on the same support. Before, p~ kept its mass on forbidden tokens and KL
clamped q~ there at float32's `tiny`, a large but arbitrary value; a draft logit that is NaN is never
close, whatever the divergence."""

from __future__ import annotations

import math

import pytest
import torch

from hf_securesd import FSD
from hf_securesd.step import RowSpec, VerificationRound, verify_step
from hf_securesd.verifiers.fsd import divergence

RAW_TARGET = torch.tensor([[[4.0, 3.9, 0.0, 0.0], [4.0, 3.9, 0.0, 0.0]]])  # [1, k+1 = 2, V = 4]
DRAFT = torch.tensor([[[3.9, 4.0, 0.0, -2.0]]])  # x = 1 != x* = 0; p~(3) ~ 3e-3


def masked_round(kind: str, tau: float, draft: torch.Tensor = DRAFT) -> VerificationRound:
    processed = RAW_TARGET.clone()
    processed[..., 3] = -math.inf  # token 3 forbidden (bad_words_ids, top-k, ...)
    return VerificationRound(
        rows=[RowSpec(FSD(tau=tau, divergence=kind))], draft_tokens=torch.tensor([[1]]), draft_counts=None,
        starts=torch.tensor([5]), target_logits=processed, target_raw_logits=RAW_TARGET, greedy=True,
        draft_logits=draft, draft_raw_logits=draft,
    )


def over_allowed(logits: torch.Tensor) -> torch.Tensor:
    return logits[:3].double().softmax(-1)


def test_kl_is_infinite_where_the_draft_has_mass_the_target_does_not():
    target = torch.tensor([[0.6, 0.4, 0.0]])
    assert divergence(target, torch.tensor([[0.5, 0.4, 0.1]]), "kl").item() == math.inf
    finite = divergence(target, torch.tensor([[0.5, 0.5, 0.0]]), "kl").item()  # zero mass adds nothing
    assert finite == pytest.approx(0.5 * math.log(0.5 / 0.6) + 0.5 * math.log(0.5 / 0.4), rel=1e-5)


@pytest.mark.parametrize("kind", ["kl", "js", "tv"])
def test_both_distributions_are_compared_over_the_allowed_tokens(kind):
    q, p = over_allowed(RAW_TARGET[0, 0]), over_allowed(DRAFT[0, 0])
    expected = {
        "kl": float((p * (p / q).log()).sum()),
        "tv": float(0.5 * (p - q).abs().sum()),
        "js": float(0.5 * (p * (2 * p / (p + q)).log()).sum() + 0.5 * (q * (2 * q / (p + q)).log()).sum()),
    }[kind]
    assert 0 < expected < 0.05
    for tau, close in ((expected * 1.01, True), (expected * 0.99, False)):
        out = verify_step(masked_round(kind, tau), collect_deviation=True)
        assert out.alpha.tolist() == [[1.0 if close else 0.0]], (kind, tau)
        assert out.next_tokens.tolist() == [0]  # x* after a rejection; after an accepted x = 1, the bonus


@pytest.mark.parametrize("kind", ["kl", "js", "tv"])
def test_a_nan_draft_logit_is_never_close(kind):
    draft = DRAFT.clone()
    draft[0, 0, 2] = math.nan
    out = verify_step(masked_round(kind, tau=0.6), collect_deviation=True)
    assert out.alpha.tolist() == [[1.0]]  # the same round with finite draft logits is close at this tau
    out = verify_step(masked_round(kind, tau=0.6, draft=draft), collect_deviation=True)
    assert out.alpha.tolist() == [[0.0]] and out.next_tokens.tolist() == [0]


def test_a_draft_with_no_mass_on_the_allowed_tokens_is_never_close():
    draft = torch.tensor([[[-math.inf, -math.inf, -math.inf, 0.0]]])  # all of p~ on the forbidden token
    out = verify_step(masked_round("tv", tau=0.6, draft=draft), collect_deviation=True)
    assert out.alpha.tolist() == [[0.0]]
