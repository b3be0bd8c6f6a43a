"""At T = 0 every rule's acceptance reads the target's argmax x* (and, for the relaxed rules, the raw
logits), never q itself: q is one-hot on x* there, and building it is a [B, k+1, V] tensor per round
(at a real vocabulary, milliseconds a round in the vLLM plugin)."""

from __future__ import annotations

import pytest
import torch

from hf_securesd.verifiers import VERIFIERS
from hf_securesd.verifiers.base import RoundInputs


@pytest.mark.parametrize("name", sorted(VERIFIERS))
def test_greedy_acceptance_does_not_build_q(name, monkeypatch):
    def refuse(self):
        raise AssertionError("q (one-hot on x*) was built for a greedy acceptance")

    monkeypatch.setattr(RoundInputs, "target_probs", property(refuse))
    generator = torch.Generator().manual_seed(2)
    raw = torch.randn(3, 5, 40, generator=generator)
    draft_raw = torch.randn(3, 4, 40, generator=generator)
    drafts = raw[:, :4].argmax(dim=-1)
    drafts[:, 2] = (drafts[:, 2] + 1) % 40  # a mismatch in every row
    inputs = RoundInputs(drafts, raw, draft_raw, raw, draft_raw, greedy=True)
    verifier = VERIFIERS[name]()
    alpha = verifier.acceptance(inputs, drafts[..., None])
    assert alpha.shape == (3, 4, 1)
    assert bool((alpha[:, :2] == 1).all())  # x* drafts are accepted by every rule
