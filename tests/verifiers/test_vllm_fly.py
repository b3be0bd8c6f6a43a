"""vllm_fly: vLLM 0.33's FLy rule, checked against a reference written from vLLM 0.33.0's source, and
Theorem 1 for its one-step output under every schedule.

The reference (`vllm_block`) re-implements, in plain Python over numpy arrays, what vLLM 0.33.0's V1
rejection sampler does to one request's block (file and line numbers of the vllm-0.33.0 wheel):

* vllm/v1/sample/rejection_sampler.py 499-507: target_probs = softmax of the processed target logits
  (after logits processors and, for sampled rows, temperature/top-k/top-p: `apply_sampling_constraints`
  589-645); the entropy is `compute_fly_entropy(target_probs, fly_entropy_top_k)`;
* vllm/v1/spec_decode/fly.py 16-42 `compute_fly_entropy`: float32, top-k probabilities, not
  renormalised, terms with p = 0 skipped;
* vllm/v1/spec_decode/fly.py 47-98 (greedy pre-pass): a mismatch at 0-based pos is deferred iff
  pos + W < n (line 79), entropy >= threshold (80), its processed target logit > -inf (82-87) and the
  next W drafts equal the target argmax (88-97); a deferral overwrites the argmax with the draft (98);
* vllm/v1/spec_decode/fly.py 103-188 (random pre-pass): native acceptance p > 0 and q/p >= u (146-148);
  a natively rejected draft with p > 0, q > 0, pos + W < n and entropy >= threshold (149-156) whose next
  W drafts pass their own native test with their own uniforms (157-187) gets u = 0 (188);
* vllm/v1/sample/rejection_sampler.py 835 (greedy: reject on draft != argmax, emit the argmax), 951
  (random: accept iff p > 0 and q/p >= u), 1111-1128 (recovery from max(q - p, 0), or q without the
  drafted token when there are no draft probabilities);
* vllm/config/speculative.py 652-660 (defaults: window None, threshold 0.3, top-k 3) and 2021-2030
  (num_speculative_tokens >= 2; window None -> min(6, k - 1); window >= k refused).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_securesd import FLy, Linear, Power, Step
from hf_securesd.mixing import one_step_output, verify_round
from hf_securesd.verifiers import VERIFIERS, VLLMFLy, resolve_verifier
from hf_securesd.verifiers.base import RoundInputs

VOCAB = 6


# ---------------------------------------------------------------------------------------------------
# Reference written from vLLM 0.33.0's source (see the module docstring for files and lines).


def vllm_entropy(probs: np.ndarray, top_k: int) -> float:
    top = np.sort(probs.astype(np.float32))[::-1][: min(top_k, len(probs))]
    return float(-sum(p * math.log(p) for p in top if p > 0))


def vllm_window(window: int | None, k: int) -> int:
    return min(6, k - 1) if window is None else window


def vllm_block(
    drafts: list[int], processed: np.ndarray, draft_probs: np.ndarray | None, uniforms: np.ndarray | None,
    greedy: bool, window: int, threshold: float, top_k: int,
) -> int:
    """Accepted drafts of one request's block as vLLM 0.33's V1 sampler decides them.

    processed: [n, V] processed target logits at the drafted positions; draft_probs: [n, V] or None (no
    draft probabilities: p = 1 for the drafted token); uniforms: [n] (sampled rows)."""
    n = len(drafts)
    q = np.exp(processed - processed.max(axis=1, keepdims=True))
    q = q / q.sum(axis=1, keepdims=True)
    entropy = [vllm_entropy(q[pos], top_k) for pos in range(n)]
    if greedy:
        argmax = [int(np.argmax(processed[pos])) for pos in range(n)]
        for pos in range(n):  # fly.py 71-98
            can_defer = drafts[pos] != argmax[pos] and pos + window < n and entropy[pos] >= threshold
            can_defer = can_defer and processed[pos, drafts[pos]] > -math.inf
            for offset in range(1, window + 1):
                future = pos + offset
                can_defer = can_defer and future < n and drafts[future] == argmax[future]
            if can_defer:
                argmax[pos] = drafts[pos]
        accepted = 0
        for pos in range(n):  # rejection_sampler.py 833-835
            if drafts[pos] != argmax[pos]:
                break
            accepted += 1
        return accepted

    def p_of(pos: int) -> float:
        return 1.0 if draft_probs is None else float(draft_probs[pos, drafts[pos]])

    def native(pos: int, u: float) -> bool:
        return p_of(pos) > 0 and q[pos, drafts[pos]] / p_of(pos) >= u

    u = np.array(uniforms, dtype=np.float64)
    for pos in range(n):  # fly.py 128-188
        can_defer = (not native(pos, u[pos]) and p_of(pos) > 0 and q[pos, drafts[pos]] > 0
                     and pos + window < n and entropy[pos] >= threshold)
        for offset in range(1, window + 1):
            future = pos + offset
            can_defer = can_defer and future < n and native(future, u[future])
        if can_defer:
            u[pos] = 0.0
    accepted = 0
    for pos in range(n):  # rejection_sampler.py 951
        if not native(pos, u[pos]):
            break
        accepted += 1
    return accepted


# ---------------------------------------------------------------------------------------------------


def random_block(generator: torch.Generator, k: int, greedy: bool, with_draft_probs: bool, scale: float):
    """Synthetic logits where the gate sometimes fires and drafts often match the target's choice."""
    target = torch.randn(1, k + 1, VOCAB, generator=generator) * scale
    draft_logits = target[:, :k] + torch.randn(1, k, VOCAB, generator=generator) * 1.5
    if not greedy and torch.rand((), generator=generator) < 0.3:  # a top-k style constraint
        position = int(torch.randint(k, (), generator=generator))
        target[0, position, int(torch.randint(VOCAB, (), generator=generator))] = -math.inf
    follow = torch.rand(k, generator=generator) < 0.7
    anything = torch.randint(VOCAB, (k,), generator=generator)
    drafts = torch.where(follow, target[0, :k].argmax(-1), anything)[None]
    return RoundInputs(
        draft_tokens=drafts,
        target_logits=target,
        draft_logits=draft_logits if with_draft_probs else None,
        # the rule must not read the raw logits
        target_raw_logits=target + torch.randn(target.shape, generator=generator),
        draft_raw_logits=draft_logits if with_draft_probs else None,
        greedy=greedy,
    )


def own_uniforms(seed: int, n: int) -> np.ndarray:
    """The rule's own uniforms: the first draw of the row's generator (`RoundInputs.uniforms`)."""
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)).double().numpy()


def library_accepted(verifier: VLLMFLy, inputs: RoundInputs) -> int:
    alpha = verifier.acceptance(inputs, inputs.draft_tokens[..., None])[0, :, 0]
    assert set(alpha.tolist()) <= {0.0, 1.0}
    return int(alpha.long().cumprod(0).sum())


CONFIGS = [
    VLLMFLy(),
    VLLMFLy(window=1),
    VLLMFLy(entropy_threshold=0.6, window=2),
    VLLMFLy(entropy_threshold=0.1, window=3, entropy_top_k=2),
    VLLMFLy(entropy_threshold=0.2, entropy_top_k=5),
]


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
@pytest.mark.parametrize("verifier", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_rule_matches_the_vllm_reference_on_synthetic_logits(verifier, greedy, with_draft_probs):
    generator = torch.Generator().manual_seed(11)
    deferred = 0
    for trial in range(300):
        k = int(torch.randint(2, 7, (), generator=generator))
        if verifier.window is not None and verifier.window >= k:
            continue
        scale = float(torch.rand((), generator=generator)) * 3
        inputs = random_block(generator, k, greedy, with_draft_probs, scale)
        seed = 1000 + trial
        # a row that keeps fewer drafts than the round's width (vLLM: this request drafted n < k tokens)
        n = k - 1 if k > 2 and torch.rand((), generator=generator) < 0.3 else k
        inputs.draft_lengths = torch.tensor([n])
        inputs.generators = [torch.Generator().manual_seed(seed)]
        got = min(library_accepted(verifier, inputs), n)
        uniforms = None if greedy else own_uniforms(seed, n)
        draft_probs = None if not with_draft_probs else inputs.draft_probs[0, :n].numpy()
        # window=None: vLLM's default for a request that drafted num_speculative_tokens = n tokens
        window = vllm_window(verifier.window, n)
        drafts, processed = inputs.draft_tokens[0, :n].tolist(), inputs.target_logits[0, :n].numpy()
        threshold, top_k = verifier.entropy_threshold, verifier.entropy_top_k
        expected = vllm_block(drafts, processed, draft_probs, uniforms, greedy, window, threshold, top_k)
        strict = vllm_block(drafts, processed, draft_probs, uniforms, greedy, window, math.inf, top_k)
        assert got == expected, (trial, k, n, inputs.draft_tokens.tolist())
        deferred += expected > strict
    assert deferred >= 10, f"the FLy deferral fired only {deferred} times: the comparison proves little"


@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
def test_verify_round_without_schedule_is_vllms_block_decision(greedy):
    """End to end through the mixer at eta = 1: the accepted count is vLLM's, the token after it the
    target argmax at T = 0."""
    generator = torch.Generator().manual_seed(5)
    verifier = VLLMFLy(entropy_threshold=0.2)
    for trial in range(200):
        k = 4
        inputs = random_block(generator, k, greedy, True, scale=1.5)
        inputs.generators = [torch.Generator().manual_seed(trial)]
        accepted, next_token, _ = verify_round(verifier, inputs, torch.ones(1, k))
        uniforms = None if greedy else own_uniforms(trial, k)
        expected = vllm_block(inputs.draft_tokens[0].tolist(), inputs.target_logits[0, :k].numpy(),
                              inputs.draft_probs[0].numpy(), uniforms, greedy, 3, 0.2, 3)
        assert int(accepted) == expected
        if greedy:
            assert int(next_token) == int(inputs.target_logits[0, expected].argmax())


def test_window_semantics_differ_from_fly():
    """k = 4, W = 2: x_0 mismatches under an uncertain target, x_1 matches, x_2 mismatches. `fly` checks
    the next W - 1 = 1 draft and forgives x_0; vLLM's rule checks the next W = 2 and does not. At
    position 1 (x_2 next) neither forgives; x_2 itself: `fly` needs 1-based 3 <= k - W = 2 (no), vLLM
    needs 2 + 2 < 4 (no)."""
    flat = torch.tensor([2.01, 2.0, 2.0, -5, -5, -5])
    peaked = torch.tensor([-5.0, -5, -5, 5, -5, -5])
    target = torch.stack([flat, peaked, peaked, peaked, peaked])[None]
    drafts = torch.tensor([[1, 3, 4, 3]])
    inputs = RoundInputs(drafts, target, None, target, None, greedy=True)
    ours = FLy(tau=0.5, window=2).acceptance(inputs, drafts[..., None])[0, :, 0].tolist()
    vllms = VLLMFLy(entropy_threshold=0.5, window=2).acceptance(inputs, drafts[..., None])[0, :, 0].tolist()
    assert ours == [1.0, 1.0, 0.0, 1.0]
    assert vllms == [0.0, 1.0, 0.0, 1.0]
    matching = torch.tensor([[1, 3, 3, 3]])  # with x_2 matching too, vLLM's window holds: 0 + 2 < 4
    inputs = RoundInputs(matching, target, None, target, None, greedy=True)
    alpha = VLLMFLy(entropy_threshold=0.5, window=2).acceptance(inputs, matching[..., None])[0, :, 0]
    assert alpha.tolist() == [1.0] * 4


def test_entropy_reads_the_processed_distribution_not_the_raw_logits():
    """Same processed logits, different raw logits: the verdict is the same (vLLM never sees raw logits);
    different processed logits with the same raw ones: the verdict follows them."""
    uncertain = torch.tensor([1.0, 1.0, 1.0, -9, -9, -9])
    confident = torch.tensor([9.0, 1.0, 1.0, -9, -9, -9])
    sure = torch.tensor([-9.0, -9, -9, 9, -9, -9])
    drafts = torch.tensor([[1, 3, 3]])
    verifier = VLLMFLy(entropy_threshold=0.5, window=2)

    def verdict(processed_first, raw_first):
        processed = torch.stack([processed_first, sure, sure, sure])[None]
        raw = torch.stack([raw_first, sure, sure, sure])[None]
        inputs = RoundInputs(drafts, processed, None, raw, None, greedy=True)
        return verifier.acceptance(inputs, drafts[..., None])[0, 0, 0].item()

    assert verdict(uncertain, uncertain) == verdict(uncertain, confident) == 1.0
    assert verdict(confident, uncertain) == 0.0


def test_defaults_configuration_and_registry():
    verifier = resolve_verifier("vllm_fly")
    assert VERIFIERS["vllm_fly"] is VLLMFLy
    assert (verifier.entropy_threshold, verifier.window, verifier.entropy_top_k) == (0.3, None, 3)
    assert [verifier.window_for(k) for k in (2, 5, 7, 8, 12)] == [1, 4, 6, 6, 6]
    assert resolve_verifier(verifier.to_dict()) == verifier
    assert VLLMFLy(entropy_threshold=math.inf).is_lossless and not verifier.is_lossless
    assert verifier.needs().lookahead and VLLMFLy(window=3).needs().min_draft_tokens == 4
    verifier.check_draft_length(2)
    with pytest.raises(ValueError, match="at least 2 drafted tokens"):
        verifier.check_draft_length(1)
    with pytest.raises(ValueError, match="window W=3 must be smaller than the draft length k = 3"):
        VLLMFLy(window=3).check_draft_length(3)
    for bad, field in (({"entropy_threshold": -1}, "entropy_threshold"), ({"window": 0}, "window"),
                       ({"entropy_top_k": 0}, "entropy_top_k"), ({"window": True}, "window"),
                       ({"entropy_threshold": float("nan")}, "entropy_threshold")):
        with pytest.raises(ValueError, match=field):
            VLLMFLy(**bad)


# ---------------------------------------------------------------------------------------------------
# Theorem 1 at position 0 of a k = 3 block (W = min(6, k - 1) = 2 looks at positions 1 and 2, whose
# drafts are fixed): out(y) = alpha_mix(y) p(y) + (1 - sum_v alpha_mix(v) p(v)) R_mix(y).

N = 20_000
POSITION = 1
SCHEDULES = {"none": None, "step": Step(L=2), "linear": Linear(L=3), "power": Power(L=3, gamma=2.0)}
THEOREM_TARGET = [[1.2, 1.0, 0.9, 0.2, -1.0, -2.0], [0.3, 2.5, 0.1, 0.0, -0.5, -1.0],
                  [1.8, 0.0, 2.0, -1.0, 0.5, 0.0], [0.0] * VOCAB]
THEOREM_DRAFT = [[0.2, 1.5, 1.6, 0.8, 0.0, -1.0], [0.0, 3.0, 0.5, 0.0, 0.0, 0.0],
                 [1.0, 0.0, 2.5, 0.0, 0.0, 0.0]]
# The target's argmax at positions 1 and 2 (T = 0: the window holds), each accepted natively with a
# probability strictly between 0 and 1 at T = 1.
LATER_DRAFTS = [1, 2]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def reference_output(verifier: VLLMFLy, eta: float, greedy: bool) -> np.ndarray:
    """Position 0's one-step output from the rule as written from vLLM's source, averaged over its
    uniforms: a deferral needs the gate (entropy, q > 0 and p > 0) and both later drafts accepted
    natively, each with probability min(1, q/p), independently of position 0's own native test."""
    zt, zd = np.array(THEOREM_TARGET), np.array(THEOREM_DRAFT)
    q = [np.eye(VOCAB)[int(z.argmax())] if greedy else softmax(z) for z in zt]
    p = [np.eye(VOCAB)[int(z.argmax())] if greedy else softmax(z) for z in zd]
    gate = vllm_entropy(softmax(zt[0]), verifier.entropy_top_k) >= verifier.entropy_threshold
    if greedy:
        window = float(all(int(zt[j].argmax()) == x for j, x in zip((1, 2), LATER_DRAFTS)))
    else:
        window = float(np.prod([min(1.0, q[j][x] / p[j][x]) for j, x in zip((1, 2), LATER_DRAFTS)]))
    lossless = np.array([min(1.0, q[0][y] / p[0][y]) if p[0][y] > 0 else float(q[0][y] > 0)
                         for y in range(VOCAB)])
    if greedy:
        native = np.array([float(y == int(zt[0].argmax())) for y in range(VOCAB)])
    else:
        native = np.array([min(1.0, q[0][y] / p[0][y]) if p[0][y] > 0 else 0.0 for y in range(VOCAB)])
    possible = np.array([1.0 if greedy else float(q[0][y] > 0 and p[0][y] > 0) for y in range(VOCAB)])
    relaxed = native + (1 - native) * gate * window * possible
    residual = np.maximum(q[0] - p[0], 0)
    recovery = q[0] if greedy or residual.sum() == 0 else residual / residual.sum()
    alpha = (1 - eta) * lossless + eta * relaxed
    return alpha * p[0] + (1 - (alpha * p[0]).sum()) * recovery


def theorem_inputs(greedy: bool, rows: int) -> RoundInputs:
    zt = torch.tensor(THEOREM_TARGET, dtype=torch.float32)[None].expand(rows, -1, -1)
    zd = torch.tensor(THEOREM_DRAFT, dtype=torch.float32)[None].expand(rows, -1, -1)
    p0 = torch.nn.functional.one_hot(zd[:, 0].argmax(-1), VOCAB).float() if greedy else zd[:, 0].softmax(-1)
    first = torch.multinomial(p0, 1)
    drafts = torch.cat([first, torch.tensor(LATER_DRAFTS).expand(rows, -1)], dim=1)
    return RoundInputs(drafts, zt, zd, zt, zd, greedy=greedy)


@pytest.mark.parametrize("greedy", [True, False], ids=["T0", "T1"])
@pytest.mark.parametrize("schedule_name", list(SCHEDULES))
def test_one_step_output_matches_theorem1(schedule_name, greedy):
    torch.manual_seed(4321)
    verifier = VLLMFLy(entropy_threshold=0.3)
    schedule = SCHEDULES[schedule_name]
    eta_value = 1.0 if schedule is None else float(schedule.eta(torch.tensor(POSITION)))
    expected = reference_output(verifier, eta_value, greedy)
    assert abs(expected.sum() - 1) < 1e-9

    inputs = theorem_inputs(greedy, N)
    accepted, next_token, _ = verify_round(verifier, inputs, torch.full((N, 3), eta_value))
    emitted = torch.where(accepted >= 1, inputs.draft_tokens[:, 0], next_token)
    empirical = torch.bincount(emitted, minlength=VOCAB).double().numpy() / N
    tolerance = 5 * np.sqrt(expected * (1 - expected) / N) + 1e-9
    assert np.all(np.abs(empirical - expected) <= tolerance), (empirical.round(4), expected.round(4))

    analytic = one_step_output(verifier, theorem_inputs(greedy, 1), torch.full((1, 3), eta_value))[0, 0]
    np.testing.assert_allclose(analytic.numpy(), expected, atol=1e-5)


def test_theorem1_case_is_not_vacuous():
    """At eta = 1 the deferral changes position 0's output at T = 1 and at T = 0 (where the greedy
    draft, token 2, is accepted though the target's argmax is token 0)."""
    q = softmax(np.array(THEOREM_TARGET[0]))
    assert 0.5 * np.abs(reference_output(VLLMFLy(entropy_threshold=0.3), 1.0, greedy=False) - q).sum() > 0.01
    greedy = reference_output(VLLMFLy(entropy_threshold=0.3), 1.0, greedy=True)
    np.testing.assert_allclose(greedy, np.eye(VOCAB)[2])
    lossless = reference_output(VLLMFLy(entropy_threshold=math.inf), 1.0, greedy=False)
    np.testing.assert_allclose(lossless, q, atol=1e-12)
