"""Two properties every verifier must have, whatever its knob:

* Constraints: a token the processed target distribution forbids (logit -inf after processors or an
  engine's masks: allowed ids, bad words, min-tokens EOS suppression, top-k/top-p) is never accepted
  and never recovered, also when the draft proposes it (a one-hot proposer or an unconstrained draft).
* Precision: the recovery distribution equals a float64 reference computed from the same rule on
  adversarial logits (confident drafts, ties, tiny masses), so float32 cancellation cannot move it.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from hf_securesd import FSD, MARS, BiLD, FLy, Lossless, LossySD, SpecCascade
from hf_securesd.mixing import mixed_acceptance, mixed_recovery, one_step_output, verify_round
from hf_securesd.verifiers import VERIFIERS
from hf_securesd.verifiers.base import RoundInputs
from hf_securesd.verifiers.vllm_fly import VLLMFLy

LENIENT = {
    "lossless": Lossless(),
    "lossysd": LossySD(epsilon=1.0),
    "bild": BiLD(tau_rb=50.0),
    "speccascade": SpecCascade(a=1.0),
    "speccascade_chow": SpecCascade(a=1.0, rule="chow"),
    "fsd": FSD(tau=0.7),
    "fly": FLy(tau=0.0, window=1),
    "mars": MARS(theta=0.01),
    "vllm_fly": VLLMFLy(entropy_threshold=0.0, window=1),
}
mpmath.mp.dps = 50
V = 12
FORBIDDEN = [0, 1, 2, 5]


def constrained_round(greedy: bool, one_hot: bool, rows: int = 64, k: int = 3) -> RoundInputs:
    generator = torch.Generator().manual_seed(5)
    raw = torch.randn(rows, k + 1, V, generator=generator) * 2
    raw[..., FORBIDDEN] += 6.0  # the raw target prefers exactly the forbidden tokens
    processed = raw.clone()
    processed[..., FORBIDDEN] = float("-inf")
    drafts = torch.tensor(FORBIDDEN)[torch.randint(0, len(FORBIDDEN), (rows, k), generator=generator)]
    draft_raw = None if one_hot else torch.nn.functional.one_hot(drafts, V).float() * 8.0
    return RoundInputs(drafts, processed, draft_raw, raw, draft_raw, greedy=greedy)


@pytest.mark.parametrize("one_hot", [True, False], ids=["one_hot", "draft_model"])
@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
@pytest.mark.parametrize("name", list(LENIENT))
def test_no_verifier_accepts_or_recovers_a_forbidden_token(name, greedy, one_hot):
    verifier = LENIENT[name]
    if one_hot and verifier.needs().raw_draft_logits is not None:
        pytest.skip("refused for one-hot proposers by declaration")
    inputs = constrained_round(greedy, one_hot)
    eta = torch.ones(inputs.draft_tokens.shape)
    alpha = mixed_acceptance(verifier, inputs, eta, inputs.draft_tokens[..., None])[..., 0]
    assert float(alpha.max()) == 0.0, name
    for _ in range(5):
        accepted, token, _ = verify_round(verifier, inputs, eta)
        assert int(accepted.max()) == 0
        assert not bool(torch.isin(token, torch.tensor(FORBIDDEN)).any())
    recovery = mixed_recovery(verifier, inputs, eta)
    assert float(recovery[..., FORBIDDEN].sum()) == 0.0
    if not greedy:
        out = one_step_output(verifier, inputs, eta)
        assert float(out[..., FORBIDDEN].sum()) < 1e-6


def test_every_registered_verifier_is_checked_for_constraints():
    assert {type(verifier).name for verifier in LENIENT.values()} == set(VERIFIERS)


def test_relaxed_rules_read_the_constrained_target():
    """MARS's top-2 and the entropy/lenient sets are taken over the tokens the constraints allow."""
    inputs = constrained_round(greedy=True, one_hot=True, rows=4)
    allowed = [v for v in range(V) if v not in FORBIDDEN]
    assert bool((inputs.target_raw_probs[..., FORBIDDEN] == 0).all())
    assert torch.allclose(inputs.target_raw_probs[..., allowed].sum(-1), torch.ones(4, 4))
    assert bool(torch.isinf(inputs.constrained_raw_logits[..., FORBIDDEN]).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mark", [None, "-inf", "nan"])
def test_constrained_raw_logits_equal_the_masked_raw_logits_bit_for_bit(dtype, mark):
    """Processed logits given as a tensor of their own: with no -inf entry (nothing masked) the raw logits
    are read as they are, without building the mask; with one (or a NaN) the mask is applied. Either way
    the result is the raw logits masked where the processed ones are -inf, and the lenient sets agree."""
    generator = torch.Generator().manual_seed(3)
    raw = (torch.randn(3, 4, V, generator=generator) * 2).to(dtype)
    processed = raw / 0.7
    if mark is not None:
        processed[1, 2, 4] = float(mark)
    drafts = torch.randint(0, V, (3, 3), generator=generator)
    inputs = RoundInputs(drafts, processed, None, raw, None, greedy=True)
    expected = raw.masked_fill(processed == float("-inf"), float("-inf"))
    assert torch.equal(inputs.constrained_raw_logits, expected)
    assert inputs.masks_nothing == (mark is None and dtype != torch.bfloat16)
    allowed = inputs.allowed_at(drafts[..., None])
    assert torch.equal(allowed, (processed[:, :3] != float("-inf")).gather(-1, drafts[..., None]))


def _exact_softmax(z: np.ndarray) -> list:
    """softmax of float32 logits at 50 significant digits."""
    values = [mpmath.mpf(float(np.float32(v))) for v in z]
    top = max(values)
    exps = [mpmath.exp(v - top) for v in values]
    total = mpmath.fsum(exps)
    return [e / total for e in exps]


def _normalised_positive(diff: list, fallback: list) -> np.ndarray:
    positive = [max(d, mpmath.mpf(0)) for d in diff]
    mass = mpmath.fsum(positive)
    chosen = [v / mass for v in positive] if mass > 0 else fallback
    return np.array([float(v) for v in chosen])


def reference_speccascade_recovery(zt: np.ndarray, zd: np.ndarray, a: float, rule: str) -> np.ndarray:
    """normalize((pi - p)+) straight from the definition pi = p 1_A + (1 - p(A)) q, at 50 digits."""
    q, p = _exact_softmax(zt), _exact_softmax(zd)
    q_raw = [float(v) for v in q]
    if rule == "chow":
        keep = [max(float(v) for v in p) > 1 - a] * len(p)
    else:
        keep = [v > (1 - a) * max(q_raw) for v in q_raw]
    deferred = mpmath.fsum(pv for pv, k in zip(p, keep) if not k)  # 1 - p(A), exactly (p sums to 1)
    pi = [(pv if k else 0) + deferred * qv for pv, qv, k in zip(p, q, keep)]
    return _normalised_positive([x - y for x, y in zip(pi, p)], q)


def reference_residual(zt: np.ndarray, zd: np.ndarray) -> np.ndarray:
    """normalize((q - p)+) at 50 digits, q where it has no mass."""
    q, p = _exact_softmax(zt), _exact_softmax(zd)
    return _normalised_positive([x - y for x, y in zip(q, p)], q)


def adversarial_cases(count: int = 400) -> list[tuple[np.ndarray, np.ndarray]]:
    """(target logits, draft logits) float64: confident drafts, ties, tiny masses, near-copies, top-k."""
    rng = np.random.default_rng(11)
    cases = []
    for i in range(count):
        vocab = int(rng.integers(4, 64))
        zt = rng.normal(0, 3, vocab)
        kind = i % 7
        if kind == 0:  # very confident draft on the target's top token
            zd = rng.normal(0, 1, vocab)
            zd[int(zt.argmax())] = 30.0
        elif kind == 1:  # ties in the target
            zt[:3] = zt.max() + 1.0
            zd = zt + rng.normal(0, 1e-3, vocab)
        elif kind == 2:  # tiny masses
            zt = rng.normal(0, 12, vocab)
            zd = rng.normal(0, 12, vocab)
        elif kind == 6:  # confident on a token the target likes, a little mass (1e-8 .. 1e-4) elsewhere
            zd = rng.normal(0, 1, vocab)
            zd[int(zt.argmax())] = rng.uniform(10.0, 20.0)
        elif kind == 3:  # the draft nearly equals the target
            zd = zt + rng.normal(0, 1e-4, vocab)
        else:  # top-k filtered (-inf outside each model's top 5), confident or spread drafts
            zd = rng.normal(0, 4 if kind == 4 else 1, vocab)
            for z in (zt, zd):
                z[np.argsort(z)[:-5]] = -np.inf
        cases.append((zt, zd))
    return cases


def softmax64(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def recovery_of(verifier, zt: np.ndarray, zd: np.ndarray) -> np.ndarray:
    """The library's T > 0 recovery at one drafted position with these (float32) logits: [V] float64."""
    t = torch.tensor(zt, dtype=torch.float32)[None, None].expand(1, 2, -1)
    d = torch.tensor(zd, dtype=torch.float32)[None, None]
    inputs = RoundInputs(d.argmax(-1), t, d, t, d, greedy=False)
    return verifier.sampled_recovery(inputs)[0, 0].double().numpy()


def tv(first: np.ndarray, second: np.ndarray) -> float:
    return 0.5 * float(np.abs(first - second).sum())


@pytest.mark.parametrize("rule", ["token", "chow"])
def test_speccascade_recovery_has_no_cancellation(rule):
    verifier = SpecCascade(a=0.97 if rule == "chow" else 0.5, rule=rule)
    worst = max(
        tv(recovery_of(verifier, zt, zd), reference_speccascade_recovery(zt, zd, verifier.a, rule))
        for zt, zd in adversarial_cases()
    )
    assert worst < 1e-6, worst


@pytest.mark.parametrize("name", ["lossless", "lossysd", "bild", "mars", "fly", "vllm_fly"])
def test_residual_recoveries_match_a_float64_reference(name):
    worst = max(tv(recovery_of(LENIENT[name], zt, zd), reference_residual(zt, zd)) for zt, zd in adversarial_cases())
    assert worst < 1e-6, worst


def test_fsd_recovers_from_q_exactly():
    for zt, zd in adversarial_cases(50):
        assert tv(recovery_of(FSD(), zt, zd), softmax64(zt)) < 1e-5


def test_subnormal_probabilities_are_divided_exactly():
    """alpha = min(1, q/p) with q(x) = e^-90, p(x) = e^-91 (float32 subnormals) is 1 (a clamp of p to the
    smallest normal float made it 0.07), and a residual whose whole mass is subnormal in float64 is still
    normalised (target [1, 1.3e-315] over draft [1, 0] recovers token 1 with probability 1)."""
    target = torch.tensor([[[0.0, -90.0], [0.0, 0.0]]])
    draft = torch.tensor([[[0.0, -91.0]]])
    inputs = RoundInputs(draft_tokens=torch.tensor([[1]]), target_logits=target, draft_logits=draft,
                         target_raw_logits=target, draft_raw_logits=draft, greedy=False)
    assert float(Lossless().acceptance(inputs, torch.tensor([[[1]]]))) == 1.0
    tiny = float(np.log(1.3e-315))  # float64 only: q(1) / q(0) = 1.3e-315
    target = torch.tensor([[[0.0, tiny], [0.0, 0.0]]], dtype=torch.float64)
    draft = torch.tensor([[[0.0, float("-inf")]]], dtype=torch.float64)
    inputs = RoundInputs(draft_tokens=torch.tensor([[0]]), target_logits=target, draft_logits=draft,
                         target_raw_logits=target, draft_raw_logits=draft, greedy=False)
    recovery = Lossless().recovery(inputs)[0, 0]
    assert recovery.tolist() == [0.0, 1.0]
