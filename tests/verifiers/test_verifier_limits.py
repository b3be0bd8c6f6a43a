"""Each knob's lossless end is the limit of the knob, and FLy's Theorem 1 output averages its own draws.

FLy over a block of k = 3 drafts with W = 2: position 1 is forgiven iff the target is uncertain there
(H_3 >= tau) and x_2 matches one of two samples of q_2, which happens with probability
lam = 1 - (1 - q_2(x_2))^2. Where forgiven alpha = 1, elsewhere the lossless rule, so the one-step
output at position 1 is out = lam * p_1 + (1 - lam) * q_1, recomputed here in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_securesd import FLy, Lossless, Step
from hf_securesd.mixing import one_step_output, total_variation, verify_round
from hf_securesd.verifiers import BiLD
from hf_securesd.verifiers.base import RoundInputs

N = 20_000
FIRST_TARGET = [3.0, 2.8, 1.0, 0.5, -1.0, -2.0]  # flat top: H_3 ~ 0.9 nats
SECOND_TARGET = [0.0, 0.5, 2.0, -1.0, 0.2, 0.1]  # x_2 = 1 has q_2 ~ 0.12
FIRST_DRAFT = [1.5, 2.9, 2.0, -0.5, 0.3, -1.0]
SECOND_DRAFTED = 1


def _block(rows: int, greedy: bool = False) -> RoundInputs:
    """k = 3 drafts: x_1 ~ p_1 per row, x_2 = SECOND_DRAFTED, x_3 = 0."""
    target = torch.tensor([FIRST_TARGET, SECOND_TARGET, FIRST_TARGET, FIRST_TARGET])[None].expand(rows, -1, -1)
    draft = torch.tensor([FIRST_DRAFT, SECOND_TARGET, FIRST_TARGET])[None].expand(rows, -1, -1)
    p1 = draft[:, 0].softmax(-1) if not greedy else torch.nn.functional.one_hot(draft[:, 0].argmax(-1), 6).float()
    first = torch.multinomial(p1, 1)
    drafted = torch.cat([first, torch.full_like(first, SECOND_DRAFTED), torch.zeros_like(first)], dim=1)
    return RoundInputs(drafted, target, draft, target, draft, greedy)


def _softmax(values: list[float]) -> np.ndarray:
    e = np.exp(np.array(values) - max(values))
    return e / e.sum()


def _expected_first_output(eta: float) -> np.ndarray:
    p1, q1, q2 = _softmax(FIRST_DRAFT), _softmax(FIRST_TARGET), _softmax(SECOND_TARGET)
    lam = eta * (1 - (1 - q2[SECOND_DRAFTED]) ** 2)
    return lam * p1 + (1 - lam) * q1


@pytest.mark.parametrize("eta", [1.0, 0.5, 0.0])
def test_fly_one_step_output_averages_its_own_draws(eta):
    torch.manual_seed(3)
    verifier = FLy(tau=0.3, window=2)
    expected = _expected_first_output(eta)
    eta_rows = torch.full((N, 3), eta)
    inputs = _block(N)
    accepted, next_token, _ = verify_round(verifier, inputs, eta_rows)
    emitted = torch.where(accepted >= 1, inputs.draft_tokens[:, 0], next_token)
    empirical = torch.bincount(emitted, minlength=6).double().numpy() / N
    tolerance = 5 * np.sqrt(expected * (1 - expected) / N) + 1e-9
    assert np.all(np.abs(empirical - expected) <= tolerance), (empirical.round(4), expected.round(4))

    single = _block(1)
    analytic = one_step_output(verifier, single, torch.full((1, 3), eta))[0, 0].numpy()
    np.testing.assert_allclose(analytic, expected, atol=1e-5)


def test_fly_deviation_statistic_is_the_marginal_not_a_draw():
    """TV(E[out], q) at position 1, the same whatever FLy's own samples were in this round."""
    q1 = _softmax(FIRST_TARGET)
    truth = 0.5 * np.abs(_expected_first_output(1.0) - q1).sum()
    for seed in range(5):
        torch.manual_seed(seed)
        single = _block(1)
        deviation = total_variation(one_step_output(FLy(tau=0.3, window=2), single, torch.ones(1, 3)), single.verified_target_probs())
        assert abs(float(deviation[0, 0]) - truth) < 1e-5


@pytest.mark.parametrize("greedy", [False, True], ids=["T1", "T0"])
def test_fly_finite_tau_whose_gate_never_fires_is_lossless(greedy):
    single = _block(1, greedy)
    eta = torch.ones(1, 3)
    far = one_step_output(FLy(tau=1e9, window=2), single, eta)
    exact = one_step_output(FLy(tau=float("inf"), window=2), single, eta)
    torch.testing.assert_close(far, single.verified_target_probs(), atol=1e-6, rtol=0)
    torch.testing.assert_close(far, exact, atol=1e-6, rtol=0)


def test_bild_rollback_near_zero_is_lossless_at_t1():
    """The draft over-weights the target's argmax (p(x*) = 0.9 > q(x*) = 0.49): accepting x* outright
    would be lossy, so a tiny tau_rb must still follow the lossless rule there."""
    target = torch.tensor([[FIRST_TARGET, FIRST_TARGET]])
    draft = torch.tensor([[[4.0, 0.5, 0.5, 0.0, 0.0, 0.0]]])
    inputs = RoundInputs(torch.tensor([[0]]), target, draft, target, draft, greedy=False)
    near = one_step_output(BiLD(tau_rb=1e-9), inputs, torch.ones(1, 1))
    torch.testing.assert_close(near, inputs.verified_target_probs(), atol=1e-6, rtol=0)


def test_bild_with_fallback_is_not_short_circuited_to_lossless():
    assert BiLD(tau_rb=0.0).is_lossless
    assert not BiLD(tau_rb=0.0, tau_fb=0.9).is_lossless
    generator = torch.Generator().manual_seed(11)
    target = torch.randn(64, 4, 50, generator=generator)
    draft = torch.randn(64, 3, 50, generator=generator)  # flat: max p~ < 0.9 everywhere, the fallback fires
    drafts = draft.argmax(-1)
    target[:, :3].scatter_(-1, drafts[..., None], 50.0)  # the target agrees with every draft
    inputs = RoundInputs(drafts, target, draft, target, draft, greedy=True)
    eta = torch.ones(64, 3)
    accepted_lossless, _, _ = verify_round(Lossless(), inputs, eta)
    accepted_fallback, _, _ = verify_round(BiLD(tau_rb=0.0, tau_fb=0.9), inputs, eta)
    assert int(accepted_lossless.sum()) == 64 * 3
    assert int(accepted_fallback.sum()) == 0


def test_fly_with_one_draft_token_names_a_fix_that_works():
    with pytest.raises(ValueError, match="at least 2 drafted tokens") as error:
        FLy(window=1).check_draft_length(1)
    assert "window=1" not in str(error.value) and "window=0" not in str(error.value)
    with pytest.raises(ValueError, match=r"FLy\(window=2\)"):
        FLy(window=3).check_draft_length(3)
    FLy(window=2).check_draft_length(3)


def test_fly_lossless_end_under_a_schedule_matches_step():
    """Step(L) with a relaxed FLy keeps positions < L lossless (eta = 0) whatever tau is."""
    single = _block(1)
    eta = Step(L=5).eta(torch.arange(3)[None])
    out = one_step_output(FLy(tau=0.0, window=2), single, eta)
    torch.testing.assert_close(out, single.verified_target_probs(), atol=1e-6, rtol=0)
