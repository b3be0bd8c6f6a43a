"""A lookahead rule (FLy, vLLM's FLy) deciding a relaxed position must not read the drafts that a schedule
verifies losslessly later in the block (`Segments` makes the positions after its boundary exact again).

Exactness at an exact position j needs its draft x_j, given that every earlier draft was accepted, to be
distributed as p: true when each earlier acceptance reads only x_<j and independent randomness. A rule
that forgave x_i because x_{i+1}.. "matched" the target tilted x_j towards matching tokens, and the
lossless test at j then gave a distribution other than q (total variation 0.2-0.27 after the boundary at
T = 1 on a tiny pair). So the property tested here: changing the drafts from the first exact position after
a relaxed one changes no acceptance before it."""

from __future__ import annotations

import pytest
import torch

from hf_securesd import FLy
from hf_securesd.mixing import lookahead_ends, one_step_output, verify_round
from hf_securesd.verifiers import VLLMFLy
from hf_securesd.verifiers.base import RoundInputs

VOCAB, K = 12, 6
# eta per row (0 = lossless): relaxed, then exact from position 3 (Segments' after="lossless"); exact from 2
# then relaxed again; relaxed, exact at 2, relaxed, exact at 5 (two boundaries)
ETA = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
FIRST_EXACT = [3, 2, 2]  # where each row's drafts stop being readable for position 0
RULES = [FLy(tau=0.0, window=2), FLy(tau=0.0, window=3), VLLMFLy(entropy_threshold=0.0, window=2),
         VLLMFLy(entropy_threshold=0.0, window=3)]


def block(drafts: torch.Tensor, greedy: bool, seed: int) -> RoundInputs:
    """A round of 3 rows whose target is uncertain everywhere (flat logits: the entropy gate fires)."""
    generator = torch.Generator().manual_seed(100)
    target = torch.randn(3, K + 1, VOCAB, generator=generator) * 0.3
    draft = target[:, :K] + torch.randn(3, K, VOCAB, generator=generator) * 0.3
    return RoundInputs(
        draft_tokens=drafts, target_logits=target, draft_logits=draft, target_raw_logits=target,
        draft_raw_logits=draft, greedy=greedy,
        generators=[torch.Generator().manual_seed(seed + row) for row in range(3)],
    )


def test_lookahead_ends_stop_at_the_next_exact_position() -> None:
    ends = lookahead_ends(ETA, torch.tensor([6, 6, 4]))
    # relaxed positions read up to the next exact one (or the row's end); exact ones' values are unread
    assert ends.tolist() == [[3, 3, 3, 4, 5, 6], [2, 2, 3, 6, 6, 6], [2, 2, 4, 4, 4, 4]]
    assert lookahead_ends(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([4])).tolist() == [[1, 4, 4, 4]]  # Step(2)
    assert lookahead_ends(torch.zeros(2, 0), torch.tensor([0, 0])).shape == (2, 0)  # a round without drafts


@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
@pytest.mark.parametrize("rule", RULES, ids=[repr(rule) for rule in RULES])
def test_acceptance_before_an_exact_position_ignores_the_drafts_from_it(rule, greedy) -> None:
    target_choice = block(torch.zeros(3, K, dtype=torch.long), greedy, 0).target_logits[:, :K].argmax(-1)
    # Drafts that mismatch at the relaxed positions (so only forgiveness can accept them) and match the
    # target's choice from the first exact position on: what made the rules forgive before.
    matching = (target_choice + 1) % VOCAB
    for row, first in enumerate(FIRST_EXACT):
        matching[row, first:] = target_choice[row, first:]
    other = matching.clone()
    for row, first in enumerate(FIRST_EXACT):
        other[row, first:] = (target_choice[row, first:] + 5) % VOCAB
    read_before = False  # whether, without a later exact position, the rule does read those drafts
    for seed in range(20):
        bounded, free = [], []
        for drafts in (matching, other):
            bounded.append(verify_round(rule, block(drafts, greedy, seed), ETA)[2])
            free.append(verify_round(rule, block(drafts, greedy, seed), torch.ones_like(ETA))[2])
        for row, first in enumerate(FIRST_EXACT):
            assert torch.equal(bounded[0][row, :first], bounded[1][row, :first])
            read_before |= not torch.equal(free[0][row, :first], free[1][row, :first])
    assert read_before  # the property above is not vacuous: with eta = 1 throughout, those drafts matter


@pytest.mark.parametrize("rule", RULES, ids=[repr(rule) for rule in RULES])
def test_one_step_output_reads_the_same_bound(rule) -> None:
    """The per-position output (Theorem 1, the deviation statistics) is the rule's as verify_round runs it."""
    target_choice = block(torch.zeros(3, K, dtype=torch.long), False, 0).target_logits[:, :K].argmax(-1)
    drafts = target_choice.clone()
    outputs = []
    for later in (0, 5):
        changed = drafts.clone()
        for row, first in enumerate(FIRST_EXACT):
            changed[row, first:] = (drafts[row, first:] + later) % VOCAB
        outputs.append(one_step_output(rule, block(changed, False, 0), ETA))
    for row, first in enumerate(FIRST_EXACT):
        assert torch.equal(outputs[0][row, :first], outputs[1][row, :first])
