"""Verifiers with a deterministic proposer (prompt lookup, n-gram, greedy EAGLE): p = 1_x.

Theorem 1 with a one-hot draft, out(y) = alpha(x) 1[y = x] + (1 - alpha(x)) R(y), for every verifier
that can run without the draft's logits x every schedule x T in {0, 1}, against a reference written
here from the rules (README, *Verifiers*) with p = 1_x (numpy, token by token), and the library's accept/recover code
sampled N times. The rules that read the draft's raw logits refuse a one-hot proposer by declaration.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_securesd import FSD, MARS, BiLD, FLy, Linear, Lossless, LossySD, Power, SpecCascade, Step
from hf_securesd.mixing import one_step_output, verify_round
from hf_securesd.verifiers import VERIFIERS
from hf_securesd.verifiers.base import RoundInputs
from hf_securesd.verifiers.vllm_fly import VLLMFLy

N = 20_000
TARGET = np.array([3.0, 2.8, 1.0, 0.5, -1.0, -2.0])
ONE_HOT = {
    "lossless": Lossless(),
    "lossysd": LossySD(epsilon=0.2),
    "bild": BiLD(tau_rb=1.5),
    "speccascade": SpecCascade(a=0.5),
    "fly": FLy(tau=0.3, window=1),
    "mars": MARS(theta=0.9),
    "vllm_fly": VLLMFLy(entropy_threshold=0.0, window=1),
}
SCHEDULES = {"none": None, "step": Step(L=2), "linear": Linear(L=3), "power": Power(L=3, gamma=2.0)}
POSITION = 1


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def reference(name: str, verifier, x: int, greedy: bool) -> tuple[float, np.ndarray, float, np.ndarray]:
    """(alpha, R, alpha_lossless, R_lossless) for a one-hot draft on token x."""
    V = len(TARGET)
    q_raw = softmax(TARGET)
    star = int(TARGET.argmax())
    q = np.eye(V)[star] if greedy else q_raw
    if greedy:
        lossless_alpha, lossless_R = float(x == star), np.eye(V)[star]
    else:
        lossless_alpha = min(1.0, q[x])
        rest = q.copy()
        rest[x] = max(q[x] - 1.0, 0.0)
        lossless_R = rest / rest.sum() if rest.sum() > 0 else q
    if name in ("lossless", "fly", "vllm_fly"):  # the FLy rules cannot forgive the last drafted position
        return lossless_alpha, lossless_R, lossless_alpha, lossless_R
    if name == "lossysd":
        lenient = q_raw[x] > q_raw.max() - verifier.epsilon
        alpha = float(x == star or lenient) if greedy else min(1.0, q[x] + verifier.epsilon)
    elif name == "bild":
        lenient = -math.log(q_raw[x]) < verifier.tau_rb
    elif name == "speccascade":
        lenient = q_raw[x] > (1 - verifier.a) * q_raw.max()
    elif name == "mars":
        order = np.argsort(-TARGET)
        z1, z2 = TARGET[order[0]], TARGET[order[1]]
        lenient = z1 > 0 and z2 / z1 > verifier.theta and x in (order[0], order[1])
    if name != "lossysd":
        alpha = float(x == star or lenient) if greedy else (1.0 if lenient else lossless_alpha)
    R = lossless_R
    if name == "speccascade" and not greedy and lenient:
        R = q  # pi = 1_x inside A: (pi - p)+ has no mass, so the recovery falls back to q
    return alpha, R, lossless_alpha, lossless_R


def reference_output(name: str, verifier, x: int, eta: float, greedy: bool) -> np.ndarray:
    alpha, R, alpha_L, R_L = reference(name, verifier, x, greedy)
    a = (1 - eta) * alpha_L + eta * alpha
    r = (1 - eta) * R_L + eta * R
    return a * np.eye(len(TARGET))[x] + (1 - a) * r


def one_hot_round(x: int, greedy: bool, rows: int) -> RoundInputs:
    logits = torch.tensor(TARGET, dtype=torch.float32)[None, None].expand(rows, 2, -1)
    return RoundInputs(
        draft_tokens=torch.full((rows, 1), x), target_logits=logits, draft_logits=None, target_raw_logits=logits,
        draft_raw_logits=None, greedy=greedy,
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
@pytest.mark.parametrize("x", [0, 1, 3])
@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
@pytest.mark.parametrize("name", list(ONE_HOT))
def test_one_step_output_with_a_one_hot_draft_matches_theorem1(name, schedule_name, x, greedy):
    torch.manual_seed(99)
    verifier, schedule = ONE_HOT[name], SCHEDULES[schedule_name]
    eta_value = 1.0 if schedule is None else float(schedule.eta(torch.tensor(POSITION)))
    expected = reference_output(name, verifier, x, eta_value, greedy)
    assert abs(expected.sum() - 1) < 1e-9

    inputs = one_hot_round(x, greedy, N)
    accepted, next_token, _ = verify_round(verifier, inputs, torch.full((N, 1), eta_value))
    emitted = torch.where(accepted == 1, inputs.draft_tokens[:, 0], next_token)
    empirical = torch.bincount(emitted, minlength=len(TARGET)).double().numpy() / N
    tolerance = 5 * np.sqrt(expected * (1 - expected) / N) + 1e-9
    assert np.all(np.abs(empirical - expected) <= tolerance), (empirical.round(4), expected.round(4))

    analytic = one_step_output(verifier, one_hot_round(x, greedy, 1), torch.full((1, 1), eta_value))[0, 0]
    np.testing.assert_allclose(analytic.numpy(), expected, atol=1e-5)


def test_lossless_with_a_one_hot_draft_is_the_target_at_any_temperature():
    generator = torch.Generator().manual_seed(3)
    for _ in range(20):
        logits = torch.randn(1, 2, 40, generator=generator) * 3
        x = int(torch.randint(0, 40, (1,), generator=generator))
        inputs = RoundInputs(torch.tensor([[x]]), logits, None, logits, None, greedy=False)
        out = one_step_output(Lossless(), inputs, torch.zeros(1, 1))
        assert torch.allclose(out, inputs.verified_target_probs(), atol=1e-6)


def test_every_registered_verifier_declares_whether_it_needs_the_draft_logits():
    needing = {name for name, cls in VERIFIERS.items() if cls().needs().raw_draft_logits is not None}
    assert "fsd" in needing and not needing & set(ONE_HOT)
    assert set(VERIFIERS) - needing == set(ONE_HOT)  # every verifier admitted for one-hot drafts is tested above
    for verifier in (FSD(), BiLD(tau_rb=1.0, tau_fb=0.5), SpecCascade(a=0.3, rule="chow")):
        with pytest.raises(ValueError, match="prompt lookup has no draft distribution") as error:
            verifier.check_proposer("prompt lookup", has_raw_draft_logits=False)
        assert "mars" in str(error.value) and "assistant_model" in str(error.value)
        verifier.check_proposer("a draft model", has_raw_draft_logits=True)
    for verifier in ONE_HOT.values():
        verifier.check_proposer("prompt lookup", has_raw_draft_logits=False)
