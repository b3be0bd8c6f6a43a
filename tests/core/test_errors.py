"""Acceptance 6: bad input fails with a clear error, raised before any model forward runs."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import hf_securesd
from hf_securesd import FLy, FSD, MARS, BiLD, Linear, LossySD, NonFiniteLogitsError, Power, SecureSDConfigError, SpecCascade, Step
from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair
from hf_securesd.verifiers import VERIFIERS, Lossless
from hf_securesd.verifiers.base import RoundInputs

PROMPT = torch.tensor([[3, 1, 4, 1, 5]])


@pytest.fixture
def forward_calls(llama_pair):
    """Counts forwards of both models, to prove errors come before any decoding."""
    draft, target = llama_pair
    calls = {"n": 0}

    def count(*_):
        calls["n"] += 1

    handles = [model.register_forward_hook(count) for model in (draft, target)]
    yield calls
    for handle in handles:
        handle.remove()


def expect_error(target, forward_calls, match: str, error=SecureSDConfigError, **kwargs):
    with pytest.raises(error, match=match):
        target.generate(PROMPT, max_new_tokens=8, **kwargs)
    assert forward_calls["n"] == 0, "the error came after decoding had started"


def test_unknown_verifier_lists_valid_names(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, f"unknown verifier 'marz'; valid names: {', '.join(VERIFIERS)}",
                 error=ValueError, assistant_model=draft, verifier="marz")


def test_verifier_of_wrong_type(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "verifier must be a name", error=TypeError, assistant_model=draft, verifier=3)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: LossySD(epsilon=-0.1), "epsilon must be in \\[0, 1\\]"),
        (lambda: LossySD(epsilon=float("nan")), "epsilon must be in \\[0, 1\\]"),
        (lambda: MARS(theta=0.0), "theta must be in \\(0, 1\\]"),
        (lambda: MARS(theta=1.5), "theta must be in \\(0, 1\\]"),
        (lambda: BiLD(tau_rb=-1.0), "tau_rb must be >= 0"),
        (lambda: BiLD(tau_fb=1.5), "tau_fb must be a probability"),
        (lambda: SpecCascade(a=1.2), "a must be in \\[0, 1\\]"),
        (lambda: SpecCascade(rule="cascade"), "rule must be one of"),
        (lambda: FSD(tau=-0.1), "tau must be >= 0"),
        (lambda: FSD(divergence="hellinger"), "divergence must be one of"),
        (lambda: FLy(window=0), "window W must be an integer >= 1"),
        (lambda: FLy(tau=-1.0), "tau must be >= 0"),
        (lambda: Step(L=-1), "L must be an integer >= 0"),
        (lambda: Linear(L=2.5), "L must be an integer >= 0"),
        (lambda: Power(L=3, gamma=0.0), "gamma > 0"),
        (lambda: Power(L=3, gamma=math.inf), "gamma > 0"),
    ],
)
def test_hyperparameter_out_of_range(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_fly_window_must_be_below_draft_length(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "FLy window W=5 needs W <= k-1", error=ValueError,
                 assistant_model=draft, verifier=FLy(window=5), num_assistant_tokens=5)


def test_bad_draft_length(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "num_assistant_tokens .* must be an integer >= 1",
                 assistant_model=draft, verifier="mars", num_assistant_tokens=0)


def test_bad_schedule_type(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "secure_schedule must be Step", error=TypeError,
                 assistant_model=draft, verifier="mars", secure_schedule="step")


def test_schedule_without_verifier(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "secure_schedule was given without a verifier",
                 assistant_model=draft, secure_schedule=Step(L=1))


def test_verifier_without_draft(llama_pair, forward_calls):
    _, target = llama_pair
    expect_error(target, forward_calls, "verifier= needs a draft model: pass assistant_model=", verifier="mars")


def test_vocabulary_mismatch(llama_pair, forward_calls):
    _, target = llama_pair
    other_draft, _ = tiny_pair(TinyPairSpec(vocab_size=300))
    expect_error(target, forward_calls, "vocabulary mismatch: the target scores 259 tokens but the draft scores 300",
                 assistant_model=other_draft, verifier="lossless")


def test_prompt_lookup_with_a_draft_model_is_rejected(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "was given too; transformers would silently use prompt lookup", assistant_model=draft,
                 verifier="mars", prompt_lookup_num_tokens=3)


@pytest.mark.parametrize("verifier", [FSD(tau=0.3), BiLD(tau_rb=2.0, tau_fb=0.5), SpecCascade(a=0.3, rule="chow")])
def test_prompt_lookup_refuses_rules_that_read_the_draft_logits(llama_pair, forward_calls, verifier):
    _, target = llama_pair
    expect_error(target, forward_calls, "prompt lookup has no draft distribution", verifier=verifier,
                 prompt_lookup_num_tokens=3)


def test_different_tokenizer_assistant_is_rejected(llama_pair, forward_calls):
    draft, target = llama_pair
    tokenizer = byte_tokenizer()
    expect_error(target, forward_calls, "different tokenizer", assistant_model=draft, verifier="mars",
                 tokenizer=tokenizer, assistant_tokenizer=tokenizer)


@pytest.mark.parametrize("option, value, message", [
    ("num_beams", 2, "num_beams > 1"),
    ("num_return_sequences", 2, "num_return_sequences > 1"),
    ("output_attentions", True, "output_attentions=True is not supported"),
])
def test_unsupported_generation_options(llama_pair, forward_calls, option, value, message):
    draft, target = llama_pair
    expect_error(target, forward_calls, message, assistant_model=draft, verifier="mars", **{option: value})


@pytest.mark.parametrize("option", ["output_scores", "output_logits"])
def test_per_token_outputs_need_a_single_row(llama_pair, forward_calls, option):
    draft, target = llama_pair
    with pytest.raises(SecureSDConfigError, match=f"{option} supports a single sequence"):
        target.generate(torch.tensor([[1, 2, 3], [4, 5, 6]]), max_new_tokens=4, assistant_model=draft, verifier="mars",
                        return_dict_in_generate=True, **{option: True})
    assert forward_calls["n"] == 0


@pytest.mark.parametrize("who", ["draft", "target"])
def test_nan_logits_raise_at_run_time(llama_pair, who):
    draft, target = llama_pair
    broken = copy.deepcopy(draft if who == "draft" else target)
    with torch.no_grad():
        broken.get_output_embeddings().weight[7, 0] = float("nan")
    models = {"assistant_model": broken, "target": target} if who == "draft" else {"assistant_model": draft, "target": broken}
    runner = models.pop("target")
    with pytest.raises(NonFiniteLogitsError, match=f"the {who} model produced NaN or infinite logits"):
        runner.generate(PROMPT, max_new_tokens=8, verifier="lossless", do_sample=False, **models)


def test_zero_draft_probability_and_empty_residual_never_give_nan():
    """p(x) = 0 for most tokens (top-k) and q == p at one position (empty residual -> q)."""
    target = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]])
    draft = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [float("-inf"), 5.0, float("-inf"), float("-inf")]]])
    inputs = RoundInputs(torch.tensor([[0, 1]]), target, draft, target, draft.nan_to_num(neginf=-30.0), greedy=False)
    everything = torch.arange(4).expand(1, 2, 4)
    for verifier in (cls() for name, cls in VERIFIERS.items() if name not in ("fly", "vllm_fly")):  # no lookahead
        alpha = verifier.acceptance(inputs, everything)
        recovery = verifier.recovery(inputs)
        assert torch.isfinite(alpha).all() and torch.isfinite(recovery).all(), verifier
        assert torch.allclose(recovery.sum(-1), torch.ones(1, 2)), verifier
    lossless_recovery = Lossless().recovery(inputs)
    assert torch.allclose(lossless_recovery[0, 0], target[0, 0].softmax(-1))  # q == p: fall back to q
    assert lossless_recovery[0, 1, 1] == 0  # residual excludes the token p put all its mass on
