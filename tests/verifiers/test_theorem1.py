"""Acceptance 3: every verifier's one-step output distribution matches Theorem 1,

    out(y) = alpha_mix(y) p(y) + (1 - sum_v alpha_mix(v) p(v)) R_mix(y),

where alpha and R are recomputed here, independently of the library, straight from the rules in
the rules (README, *Verifiers*; numpy, one token at a time), then mixed with eta as in README, *SecureSD schedules*. The empirical
distribution comes from the library's own accept/recover code (`verify_round`) on N drafted tokens
x ~ p. Tolerance: every cell within 5 standard errors of a multinomial proportion,
5 * sqrt(out(y) (1 - out(y)) / N), plus 1e-9; with N = 20,000 that is <= 0.018 per cell.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_securesd import FSD, MARS, BiLD, FLy, Linear, Lossless, LossySD, Power, SpecCascade, Step
from hf_securesd.mixing import greedy_deviation, one_step_output, verify_round
from hf_securesd.verifiers.base import RoundInputs

N = 20_000
POSITION = 1  # 0-based response position of the verified token
# eta at POSITION: None -> 1 (pure relaxed), Step(2) -> 0 (lossless), Linear(3) -> 1/3, Power(3, 2) -> 1/9
SCHEDULES = {"none": None, "step": Step(L=2), "linear": Linear(L=3), "power": Power(L=3, gamma=2.0)}
VERIFIERS = {
    "lossless": Lossless(),
    "lossysd": LossySD(epsilon=0.2),
    "bild": BiLD(tau_rb=1.5),
    "bild_fallback": BiLD(tau_rb=1.5, tau_fb=0.95),
    "speccascade": SpecCascade(a=0.5),
    "speccascade_chow": SpecCascade(a=0.6, rule="chow"),
    "fsd": FSD(tau=0.3),
    "fly": FLy(tau=0.3, window=1),
    "mars": MARS(theta=0.9),
}
# Target logits chosen so that the lenient branches fire: top-2 ratio 2.8/3.0 > 0.9 (MARS),
# a flat top (SpecCascade, LossySD), moderate surprisal (BiLD).
TARGET_LOGITS = [3.0, 2.8, 1.0, 0.5, -1.0, -2.0]
DRAFT_LOGITS = [1.5, 2.9, 2.0, -0.5, 0.3, -1.0]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def one_hot(index: int, size: int) -> np.ndarray:
    v = np.zeros(size)
    v[index] = 1.0
    return v


def residual(minuend: np.ndarray, p: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    r = np.maximum(minuend - p, 0.0)
    return r / r.sum() if r.sum() > 0 else fallback


def js(a: np.ndarray, b: np.ndarray) -> float:
    m = (a + b) / 2
    kl = lambda u, v: float(sum(ui * math.log(ui / vi) for ui, vi in zip(u, v) if ui > 0))
    return 0.5 * kl(a, m) + 0.5 * kl(b, m)


def reference_rule(name: str, verifier, zt: np.ndarray, zd: np.ndarray, greedy: bool):
    """(alpha [V], R [V]) of the relaxed rule, token by token from the rules (README, *Verifiers*)."""
    V = len(zt)
    qt, pt = softmax(zt), softmax(zd)  # q~, p~: raw softmax
    q = one_hot(int(zt.argmax()), V) if greedy else qt
    p = one_hot(int(zd.argmax()), V) if greedy else pt
    x_star = int(zt.argmax())
    lossless_alpha = np.array([min(1.0, q[x] / p[x]) if p[x] > 0 else float(q[x] > 0) for x in range(V)])
    lossless_R = residual(q, p, q)
    alpha, R = np.zeros(V), (q if greedy else lossless_R)
    for x in range(V):
        if name == "lossless":
            alpha[x] = lossless_alpha[x]
        elif name == "lossysd":
            alpha[x] = float(x == x_star or qt[x] > qt.max() - verifier.epsilon) if greedy else min(1.0, lossless_alpha[x] + verifier.epsilon)
        elif name.startswith("bild"):
            lenient = (greedy and x == x_star) or -math.log(qt[x]) < verifier.tau_rb
            alpha[x] = 1.0 if lenient else (0.0 if greedy else lossless_alpha[x])
            if pt.max() < verifier.tau_fb:
                alpha[x] = 0.0
        elif name.startswith("speccascade"):
            if verifier.rule == "chow":
                keep = np.full(V, pt.max() > 1 - verifier.a)
            else:
                keep = qt > (1 - verifier.a) * qt.max()
            if greedy:
                alpha[x] = float(x == x_star or keep[x])
            else:
                pi = p * keep + (1 - (p * keep).sum()) * q
                alpha[x] = min(1.0, pi[x] / p[x]) if p[x] > 0 else float(pi[x] > 0)
        elif name == "fsd":
            close = js(qt, pt) < verifier.tau
            alpha[x] = float(close or (greedy and x == x_star))
        elif name == "fly":  # one drafted position: nothing can be forgiven (i <= k - W fails), lossless rule
            alpha[x] = lossless_alpha[x]
        elif name == "mars":
            order = np.argsort(-zt)
            z1, z2 = zt[order[0]], zt[order[1]]
            close = z1 > 0 and z2 / z1 > verifier.theta
            lenient = close and x in (order[0], order[1])
            alpha[x] = float(x == x_star or lenient) if greedy else (1.0 if lenient else lossless_alpha[x])
    if name.startswith("bild") and pt.max() < verifier.tau_fb:
        R = q
    if name.startswith("speccascade") and not greedy:
        keep = np.full(V, pt.max() > 1 - verifier.a) if verifier.rule == "chow" else qt > (1 - verifier.a) * qt.max()
        pi = p * keep + (1 - (p * keep).sum()) * q
        R = residual(pi, p, q)
    if name == "fsd" and not greedy:
        R = q
    return alpha, R, lossless_alpha, lossless_R, p, q


def reference_output(name: str, verifier, eta: float, greedy: bool) -> np.ndarray:
    zt, zd = np.array(TARGET_LOGITS), np.array(DRAFT_LOGITS)
    alpha, R, alpha_L, R_L, p, q = reference_rule(name, verifier, zt, zd, greedy)
    V = len(zt)
    a = (1 - eta) * alpha_L + eta * alpha
    r = (1 - eta) * R_L + eta * R
    return a * p + (1 - (a * p).sum()) * r


def round_inputs(greedy: bool, rows: int) -> RoundInputs:
    zt = torch.tensor([TARGET_LOGITS, TARGET_LOGITS], dtype=torch.float32)[None].expand(rows, -1, -1)
    zd = torch.tensor([DRAFT_LOGITS], dtype=torch.float32)[None].expand(rows, -1, -1)
    p = torch.nn.functional.one_hot(zd.argmax(-1), 6).float() if greedy else zd.softmax(-1)
    drafted = torch.multinomial(p[:, 0], 1)
    return RoundInputs(
        draft_tokens=drafted, target_logits=zt, draft_logits=zd, target_raw_logits=zt, draft_raw_logits=zd, greedy=greedy
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
@pytest.mark.parametrize("verifier_name", list(VERIFIERS))
def test_one_step_output_matches_theorem1(verifier_name, schedule_name, greedy):
    torch.manual_seed(1234)
    verifier, schedule = VERIFIERS[verifier_name], SCHEDULES[schedule_name]
    eta_value = 1.0 if schedule is None else float(schedule.eta(torch.tensor(POSITION)))
    expected = reference_output(verifier_name, verifier, eta_value, greedy)
    assert abs(expected.sum() - 1) < 1e-9

    inputs = round_inputs(greedy, N)
    eta = torch.full((N, 1), eta_value)
    accepted, next_token, _ = verify_round(verifier, inputs, eta)
    emitted = torch.where(accepted == 1, inputs.draft_tokens[:, 0], next_token)
    empirical = torch.bincount(emitted, minlength=6).double().numpy() / N

    tolerance = 5 * np.sqrt(expected * (1 - expected) / N) + 1e-9
    assert np.all(np.abs(empirical - expected) <= tolerance), (empirical.round(4), expected.round(4))

    single = round_inputs(greedy, 1)
    analytic = one_step_output(verifier, single, torch.full((1, 1), eta_value))[0, 0].numpy()
    np.testing.assert_allclose(analytic, expected, atol=1e-5)
    if greedy:  # the closed form the decoding loop uses at T = 0
        _, _, alpha = verify_round(verifier, single, torch.full((1, 1), eta_value))
        q = single.verified_target_probs()[0, 0].numpy()
        assert abs(float(greedy_deviation(single, alpha)[0, 0]) - 0.5 * np.abs(expected - q).sum()) < 1e-6


@pytest.mark.parametrize("greedy", [True, False])
def test_lossless_one_step_output_is_the_target(greedy):
    generator = torch.Generator().manual_seed(7)
    for _ in range(20):
        zt = torch.randn(1, 2, 50, generator=generator) * 3
        zd = torch.randn(1, 1, 50, generator=generator) * 3
        p = torch.nn.functional.one_hot(zd.argmax(-1), 50).float() if greedy else zd.softmax(-1)
        inputs = RoundInputs(torch.multinomial(p[:, 0], 1), zt, zd, zt, zd, greedy)
        out = one_step_output(Lossless(), inputs, torch.zeros(1, 1))
        assert torch.allclose(out, inputs.verified_target_probs(), atol=1e-6)
        relaxed_with_eta0 = one_step_output(MARS(theta=0.5), inputs, torch.zeros(1, 1))
        assert torch.allclose(relaxed_with_eta0, inputs.verified_target_probs(), atol=1e-6)


def test_relaxed_rules_actually_deviate():
    """Guard against a vacuous suite: at eta = 1 each relaxed rule's output differs from q here
    (BiLD's fallback fires on this draft, so there the target decides and the output is q; FLy cannot
    forgive the last drafted position, so with one position it is lossless — see test_verifier_limits)."""
    q = softmax(np.array(TARGET_LOGITS))
    for name, verifier in VERIFIERS.items():
        out = reference_output(name, verifier, 1.0, greedy=False)
        deviation = 0.5 * np.abs(out - q).sum()
        if name in ("lossless", "bild_fallback", "fly"):
            assert deviation < 1e-12, name
        else:
            assert deviation > 0.01, name


def test_fly_lookahead_forgives_a_mismatch_the_target_corrects():
    """Greedy block of k=4, W=2: x_1 != x*_1 with an uncertain target and x_2 == x*_2 -> x_1 accepted."""
    V = 8
    flat = torch.zeros(V)
    flat[:3] = 2.0  # three-way tie at the top: H_3 = 3 * (1/3.something) large
    peaked = torch.full((V,), -5.0)
    target = torch.stack([flat, peaked.clone(), peaked.clone(), peaked.clone(), peaked.clone()])
    target[1, 4] = 5.0
    target[2, 5] = 5.0
    target[3, 6] = 5.0
    target[4, 7] = 5.0
    target[0, 0] = 2.01  # x*_1 = 0
    drafted = torch.tensor([[1, 4, 3, 6]])  # x_1 = 1 (mismatch, but in the flat top), x_2 matches, x_3 mismatches
    draft_logits = torch.nn.functional.one_hot(drafted, V).float()[0] * 10
    inputs = RoundInputs(drafted, target[None], draft_logits[None], target[None], draft_logits[None], greedy=True)
    alpha = FLy(tau=0.5, window=2).acceptance(inputs, drafted[..., None])[0, :, 0]
    assert alpha.tolist() == [1.0, 1.0, 0.0, 1.0]  # x_3 is a mismatch whose lookahead (x_4) matches but 3 > k - W
    strict = FLy(tau=float("inf"), window=2).acceptance(inputs, drafted[..., None])[0, :, 0]
    assert strict.tolist() == [0.0, 1.0, 0.0, 1.0]
