"""Theorem 1 with segment eta, for every verifier: through the shared verification step
(`step.verify_step`, which evaluates the schedule with the round's committed response tokens), the
distribution of the token emitted at a round's second drafted position matches

    out(y) = alpha_mix(y) p(y) + (1 - sum_v alpha_mix(v) p(v)) R_mix(y)

recomputed independently (tests/verifiers/test_theorem1.py's numpy reference), with eta taken from the
independent segment reference (tests/core/test_segments.py) at that position.

The round: the first draft is a fixed token that every rule accepts (target and draft are certain of
it), the second is drawn from p over tests/verifiers/test_theorem1.py's logits. The cases place the
boundary so that the second position's eta needs each part of the rule: a boundary completed by the
first draft (in-round), one split over the last committed token and the first draft, a boundary in the
committed tokens (a ramp in the after segment), a second occurrence that restarts it, and no boundary at all.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_segments import reference_eta
from verifiers.test_theorem1 import DRAFT_LOGITS, TARGET_LOGITS, VERIFIERS, reference_output

from hf_securesd import Linear, Power, Segments, Step
from hf_securesd.step import RowSpec, VerificationRound, verify_step

N = 20_000
V = len(TARGET_LOGITS)
FIXED = 4  # the first draft of the round
CASES = {
    # boundary completed by the first draft: the second position is the after segment's position 0
    "in_round": dict(boundaries=[(FIXED,)], before="lossless", after=None, response=[0, 1, 2]),
    # split: the last committed token and the first draft
    "split": dict(boundaries=[(5, FIXED)], before=Step(L=50), after=None, response=[0, 5]),
    # boundary in the committed tokens, a ramp in the after segment: eta = 2/4
    "ramp": dict(boundaries=[(3,)], before=None, after=Linear(L=4), response=[0, 1, 3, 1]),
    # a second occurrence restarts the after segment: eta = (1/4)^2, not the first one's 1
    "restart": dict(boundaries=[(3,)], before=None, after=Power(L=4, gamma=2.0), response=[3, 1, 1, 1, 1, 3]),
    # no boundary: before alone, eta = 2/3 at position 2
    "none": dict(boundaries=[(5, 5)], before=Linear(L=3), after="lossless", response=[1]),
}


def round_for(case: dict, greedy: bool, rows: int) -> VerificationRound:
    certain = torch.full((V,), -60.0)
    certain[FIXED] = 60.0
    target = torch.stack([certain, torch.tensor(TARGET_LOGITS), torch.tensor(TARGET_LOGITS)])
    draft = torch.stack([certain, torch.tensor(DRAFT_LOGITS)])
    p = torch.nn.functional.one_hot(draft[1].argmax(), V).float() if greedy else draft[1].softmax(-1)
    second = torch.multinomial(p.expand(rows, -1), 1)
    drafts = torch.cat([torch.full((rows, 1), FIXED), second], dim=1)
    schedule = Segments([list(b) for b in case["boundaries"]], before=case["before"], after=case["after"])
    response = case["response"]
    return VerificationRound(
        rows=[RowSpec(case["verifier"], schedule)] * rows,
        draft_tokens=drafts,
        draft_counts=None,
        starts=torch.full((rows,), len(response)),
        target_logits=target.expand(rows, -1, -1),
        target_raw_logits=target.expand(rows, -1, -1),
        greedy=greedy,
        draft_logits=draft.expand(rows, -1, -1),
        draft_raw_logits=draft.expand(rows, -1, -1),
        responses=[response] * rows,
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("verifier_name", list(VERIFIERS))
def test_segment_eta_one_step_output_matches_theorem1(verifier_name, case_name, greedy):
    torch.manual_seed(4321)
    case = {**CASES[case_name], "verifier": VERIFIERS[verifier_name]}
    eta = reference_eta(case["response"] + [FIXED], case["boundaries"], case["before"], case["after"])
    expected = reference_output(verifier_name, case["verifier"], eta, greedy)

    round_ = round_for(case, greedy, N)
    out = verify_step(round_)
    assert float(out.eta[0, 1]) == pytest.approx(eta, abs=1e-6)
    assert bool((out.accepted >= 1).all())  # the fixed first draft is always accepted
    emitted = torch.where(out.accepted == 2, round_.draft_tokens[:, 1], out.next_tokens)
    empirical = torch.bincount(emitted, minlength=V).double().numpy() / N
    tolerance = 5 * np.sqrt(expected * (1 - expected) / N) + 1e-9
    assert np.all(np.abs(empirical - expected) <= tolerance), (eta, empirical.round(4), expected.round(4))


def test_the_cases_need_the_segment_rule():
    """Each case's eta differs from what the segment's other schedule would give (a wrong segment
    would be visible in the distribution for the relaxed verifiers)."""
    etas = {
        name: reference_eta(c["response"] + [FIXED], c["boundaries"], c["before"], c["after"])
        for name, c in CASES.items()
    }
    assert etas == {
        "in_round": 1.0,
        "split": 1.0,
        "ramp": 0.5,
        "restart": 0.0625,
        "none": pytest.approx(2 / 3),
    }
