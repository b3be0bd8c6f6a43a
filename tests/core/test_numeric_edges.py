"""Exact at the numeric edges: huge schedule lengths, bad custom schedules, huge max_new_tokens, and
inputs HF accepts (int32 ids, NumPy / 0-d tensor integers) or refuses with a clear error."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, GenerationConfig, StoppingCriteria, StoppingCriteriaList

import hf_securesd
from hf_securesd import LossySD, Power, SecureSDConfigError, Step
from hf_securesd.schedules import Schedule, resolve_schedule

PROMPT = torch.tensor([[3, 9, 27, 81]])
HUGE = [10**30, 18446744073709551621, 2**63, 2**63 - 1, 2**62]


@pytest.mark.parametrize("L", HUGE)
def test_huge_lengths_are_lossless_everywhere_and_never_overflow(L):
    positions = torch.tensor([0, 1, 5, 2**40, 2**62])
    assert Step(L=L).eta(positions).tolist() == [0.0] * 5
    power = Power(L=L, gamma=1.0).eta(positions).double()
    expected = (positions.double() / float(L)).clamp(max=1.0)
    assert torch.allclose(power, expected, rtol=1e-6, atol=0) and power[0] == 0
    assert resolve_schedule({"schedule": "step", "L": L}) == Step(L=L)


@pytest.mark.parametrize("L", [2**63, 10**30])
def test_step_beyond_int64_equals_target_greedy_with_an_accept_everything_verifier(llama_pair, L):
    draft, target = llama_pair
    plain = target.generate(PROMPT, max_new_tokens=12, do_sample=False)
    ours = target.generate(PROMPT, max_new_tokens=12, do_sample=False, assistant_model=draft,
                           verifier=LossySD(epsilon=1.0), secure_schedule=Step(L=L))
    assert torch.equal(ours, plain)


class Constant(Schedule):
    def __init__(self, value: float) -> None:
        object.__setattr__(self, "value", value)

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.full(positions.shape, self.value)


@pytest.mark.parametrize("value", [2.0, -0.5, math.nan])
def test_a_custom_schedule_outside_zero_one_is_refused(llama_pair, value):
    draft, target = llama_pair
    with pytest.raises(ValueError, match=r"schedule Constant returned eta = .* must lie in \[0, 1\]"):
        target.generate(PROMPT, max_new_tokens=6, assistant_model=draft, verifier="mars",
                        secure_schedule=Constant(value))


def test_a_custom_schedule_inside_zero_one_runs(llama_pair):
    draft, target = llama_pair
    plain = target.generate(PROMPT, max_new_tokens=6, do_sample=False)
    ours = target.generate(PROMPT, max_new_tokens=6, do_sample=False, assistant_model=draft, verifier="mars",
                           secure_schedule=Constant(0.0))
    assert torch.equal(ours, plain)


class ComparisonStep(Schedule):
    """Step(L) written as a comparison: eta is a bool tensor (or an integer one with `as_long`)."""

    def __init__(self, length: int, as_long: bool = False) -> None:
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "as_long", as_long)

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        above = positions >= self.length
        return above.long() if self.as_long else above


@pytest.mark.parametrize("as_long", [False, True])
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_custom_schedule_of_bool_or_integer_weights_runs_as_step(llama_pair, as_long, do_sample):
    """A bool eta used to crash inside torch ("Subtraction ... with a bool tensor is not supported"): 0/1
    weights of any real dtype are read as float32, so the comparison schedule decodes as Step(L)."""
    draft, target = llama_pair
    outputs = []
    for schedule in (ComparisonStep(3, as_long), Step(L=3)):
        torch.manual_seed(0)
        outputs.append(target.generate(PROMPT, max_new_tokens=10, do_sample=do_sample, assistant_model=draft,
                                       verifier=LossySD(epsilon=1.0), secure_schedule=schedule))
    assert torch.equal(outputs[0], outputs[1])


class ComplexWeights(Schedule):
    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.zeros(positions.shape, dtype=torch.complex64)


def test_a_custom_schedule_of_complex_weights_is_refused_naming_it(llama_pair):
    draft, target = llama_pair
    with pytest.raises(ValueError, match="schedule ComplexWeights returned eta of dtype torch.complex64"):
        target.generate(PROMPT, max_new_tokens=6, assistant_model=draft, verifier="mars",
                        secure_schedule=ComplexWeights())
    with pytest.raises(ValueError, match="schedule ComplexWeights returned eta of dtype"):
        target.generate(PROMPT, max_new_tokens=6, assistant_model=draft, verifier="mars",
                        secure_schedule=hf_securesd.Segments([5], before=ComplexWeights()))


class StopAfter(StoppingCriteria):
    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def test_a_huge_max_new_tokens_allocates_nothing_up_front(llama_pair):
    """Buffers grow as tokens arrive: 10**9 new tokens would need 16 GB if they were preallocated."""
    draft, target = llama_pair
    stop = StoppingCriteriaList([StopAfter(PROMPT.shape[1] + 10)])
    out = target.generate(PROMPT, max_new_tokens=10**9, do_sample=False, assistant_model=draft, verifier="lossless",
                          stopping_criteria=stop)
    plain = target.generate(PROMPT, max_new_tokens=10, do_sample=False)
    assert torch.equal(out, plain)


def test_integer_types_hf_accepts_are_accepted(llama_pair):
    draft, target = llama_pair
    plain = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    for ids, k in ((PROMPT.to(torch.int32), 3), (PROMPT, np.int64(3)), (PROMPT, torch.tensor(3))):
        out = target.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=draft, verifier="lossless",
                              num_assistant_tokens=k)
        assert torch.equal(out, plain)
    assert Step(L=np.int64(2)).to_dict() == {"schedule": "step", "L": 2}
    assert Step(L=torch.tensor(2)) == Step(L=2)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(max_new_tokens=2.0), r"max_new_tokens \(in the call or its generation_config\) must be an integer >= 1"),
        (dict(max_length=20.0), r"max_length \(in the call or its generation_config\) must be an integer >= 0"),
    ],
)
def test_non_integer_lengths_in_a_generation_config_are_refused_before_decoding(llama_pair, config, message):
    draft, target = llama_pair
    with pytest.raises(SecureSDConfigError, match=message):
        target.generate(PROMPT, generation_config=GenerationConfig(**config), assistant_model=draft, verifier="mars")


def test_zero_new_tokens_is_refused_with_the_smallest_valid_value(llama_pair):
    draft, target = llama_pair
    with pytest.raises(SecureSDConfigError, match="max_new_tokens must be an integer >= 1, got 0"):
        target.generate(PROMPT, max_new_tokens=0, assistant_model=draft, verifier="mars")


def test_bad_inputs_get_clear_errors(llama_pair):
    draft, target = llama_pair
    cases = [
        (dict(inputs=PROMPT, max_new_tokens=2.5), "max_new_tokens must be an integer"),
        (dict(inputs=PROMPT, attention_mask=torch.ones(1, 7, dtype=torch.long)), "attention_mask has shape"),
        (dict(inputs=torch.zeros(1, 0, dtype=torch.long)), "the prompt is empty"),
        (dict(inputs=torch.tensor([[5, 6, 100_000]])), r"input_ids holds token id 100000, but the target model embeds"),
        (dict(inputs=torch.tensor([[5, -1, 7]])), r"input_ids holds token id -1, but the target model embeds ids 0\.\."),
        (dict(inputs=torch.zeros(0, 5, dtype=torch.long)), r"input_ids holds no rows \(shape \(0, 5\)\)"),
        (dict(inputs=torch.zeros(0, 5, dtype=torch.long), attention_mask=torch.ones(0, 5, dtype=torch.long)),
         "input_ids holds no rows"),
    ]
    for kwargs, match in cases:
        kwargs.setdefault("max_new_tokens", 4)
        with pytest.raises(SecureSDConfigError, match=match):
            target.generate(assistant_model=draft, verifier="mars", **kwargs)
    bert = BertModel(BertConfig(vocab_size=259, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16))
    with pytest.raises(SecureSDConfigError, match="the draft model is a BertModel, which has no language-model head"):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=bert, verifier="mars")


@pytest.mark.parametrize("bad, match", [
    ({"schedule": {"a": 1}}, "unknown schedule"),
    ({"schedule": "step", "X": 1}, r"has no option\(s\) \['X'\]"),
    ({"schedule": "step", "L": -1}, "must be an integer >= 0"),
    ({"schedule": "power", "L": 2, "gamma": math.nan}, "finite gamma"),
    ([1], "secure_schedule must be"),
])
def test_malformed_schedules_name_the_problem(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        resolve_schedule(bad)


def _invalid_logits(module, args, kwargs, output):
    """Every logit of token 7 -inf, of token 11 NaN, and of token 13 +inf after each input token divisible
    by 5: non-finite values that depend only on the token, so every forward layout gives the same ones."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    logits = output.logits
    logits[..., 7] = float("-inf")
    logits[..., 11] = float("nan")
    logits[..., 13] = torch.where(ids[:, -logits.shape[1]:] % 5 == 0, float("inf"), logits[..., 13])
    return output


@pytest.fixture
def invalid_logits_pair(llama_pair):
    draft, target = llama_pair
    hooks = [model.register_forward_hook(_invalid_logits, with_kwargs=True) for model in (draft, target)]
    yield draft, target
    for hook in hooks:
        hook.remove()


@pytest.mark.parametrize("proposer", ["draft", "prompt_lookup"])
def test_remove_invalid_values_is_honoured_for_the_models_own_nan_and_infinities(invalid_logits_pair, proposer):
    draft, target = invalid_logits_pair
    prompt = torch.tensor([[3, 9, 27, 81, 5, 44, 3, 9]])
    plain = target.generate(prompt, max_new_tokens=16, do_sample=False, remove_invalid_values=True)
    assert (plain[0, prompt.shape[1]:] == 13).any()  # the +inf token is chosen where it appears
    drafting = dict(assistant_model=draft) if proposer == "draft" else dict(prompt_lookup_num_tokens=3)
    ours = target.generate(prompt, max_new_tokens=16, do_sample=False, remove_invalid_values=True,
                           verifier="lossless", **drafting)
    assert torch.equal(ours, plain)
    torch.manual_seed(0)
    relaxed = target.generate(prompt, max_new_tokens=16, do_sample=True, remove_invalid_values=True,
                              verifier="mars", secure_schedule=Step(L=2), **drafting)
    assert relaxed.shape == plain.shape
    with pytest.raises(hf_securesd.NonFiniteLogitsError, match="produced NaN or infinite logits"):
        target.generate(prompt, max_new_tokens=16, do_sample=False, verifier="lossless", **drafting)


class _ClimbingSchedule(Schedule):
    """A custom position schedule whose eta leaves [0, 1] from response position 3 on."""

    def eta(self, positions):
        return (positions >= 3).float() * 1.5


def test_a_custom_schedule_leaving_the_unit_interval_is_refused_in_the_round_that_uses_it(llama_pair):
    """A custom schedule is evaluated only through `round_eta`, as decoding calls it (its shape and the
    rows it weighs are the schedule's own business): a weight outside [0, 1] stops the call there."""
    draft, target = llama_pair
    for schedule in (_ClimbingSchedule(), hf_securesd.Segments([3], before=_ClimbingSchedule())):
        with pytest.raises(ValueError, match=r"schedule _ClimbingSchedule returned eta = 1.5"):
            target.generate(PROMPT, max_new_tokens=8, assistant_model=draft, verifier="mars",
                            secure_schedule=schedule, num_assistant_tokens=2)
    out = target.generate(PROMPT, max_new_tokens=3, assistant_model=draft, verifier="mars",
                          secure_schedule=_ClimbingSchedule(), num_assistant_tokens=1, do_sample=False)
    assert out.shape[1] == PROMPT.shape[1] + 3  # positions 0..2 only: never a bad weight


@pytest.mark.parametrize("value", ["no", "False", 2, 0.0])
def test_output_deviation_takes_only_true_or_false(llama_pair, value):
    draft, target = llama_pair
    with pytest.raises(SecureSDConfigError, match=r"output_deviation must be True or False"):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="mars", output_deviation=value)
    stats = target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="mars", do_sample=True,
                            output_deviation=np.bool_(True), return_dict_in_generate=True).speculative_stats
    assert stats.position_tv_sum
    stats = target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="mars", do_sample=True,
                            output_deviation=np.int64(1), return_dict_in_generate=True).speculative_stats
    assert stats.position_tv_sum  # 1 and 0 are flags, as transformers reads its own
