"""HF's draft-length controls: num_assistant_tokens, num_assistant_tokens_schedule and
assistant_confidence_threshold, with their precedence, per batch row, and exactness under a
dynamic draft length."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import random_prompts
from transformers import GenerationConfig

from hf_securesd import FLy, MARS, SecureSDConfigError, Step
from hf_securesd.draft_length import DraftLength, DraftLengthController, resolve_draft_length, tuned_thresholds
from hf_securesd.tiny import byte_tokenizer

PROMPT = torch.tensor([[5, 6, 7, 8]])
DRAFT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@pytest.fixture
def draft_settings(llama_pair):
    """Set fields on the draft's generation_config for one test, then restore them."""
    draft, _ = llama_pair
    saved = {name: getattr(draft.generation_config, name) for name in DRAFT_FIELDS}

    def apply(**values):
        for name, value in values.items():
            setattr(draft.generation_config, name, value)

    yield apply
    apply(**saved)


def _rounds(target, draft, prompt=PROMPT, max_new_tokens=40, **kwargs):
    out = target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, assistant_model=draft,
                          verifier="lossless", return_dict_in_generate=True, **kwargs)
    return out, out.speculative_stats


def test_precedence_kwarg_then_passed_config_then_draft_config_then_default(llama_pair, draft_settings):
    draft, target = llama_pair
    assert _rounds(target, draft)[1].drafted_per_round[0] == 5
    draft_settings(num_assistant_tokens=3)
    assert _rounds(target, draft)[1].drafted_per_round[0] == 3
    config = GenerationConfig(num_assistant_tokens=2, max_new_tokens=40, do_sample=False, return_dict_in_generate=True)
    out = target.generate(PROMPT, generation_config=config, assistant_model=draft, verifier="lossless")
    assert out.speculative_stats.drafted_per_round[0] == 2
    assert _rounds(target, draft, num_assistant_tokens=4)[1].drafted_per_round[0] == 4


def test_resolution_reads_each_field_from_the_first_place_that_sets_it():
    passed = GenerationConfig(num_assistant_tokens_schedule="heuristic")
    draft = GenerationConfig(num_assistant_tokens=9, assistant_confidence_threshold=0.3, num_assistant_tokens_schedule="constant")
    resolved = resolve_draft_length({"num_assistant_tokens": 4}, passed, draft)
    assert resolved == DraftLength(num_tokens=4, schedule="heuristic", confidence_threshold=0.3)
    assert resolve_draft_length({}, None, None) == DraftLength(5, "constant", 0.0)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("assistant_lookbehind", 10, "assistant_lookbehind=10 is not supported"),
        ("target_lookbehind", 10, "target_lookbehind=10 is not supported"),
        ("num_assistant_tokens_schedule", "adaptive", "num_assistant_tokens_schedule='adaptive' is not supported"),
        ("assistant_confidence_threshold", 1.5, "assistant_confidence_threshold must be a probability"),
    ],
)
def test_unsupported_settings_are_refused_before_decoding(llama_pair, field, value, match):
    draft, target = llama_pair
    with pytest.raises(SecureSDConfigError, match=match):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="lossless", **{field: value})


@pytest.mark.parametrize("value", [np.float32(0.4), np.float16(0.5), np.float64(0.25), torch.tensor(0.4), 1],
                         ids=["np.float32", "np.float16", "np.float64", "0-d tensor", "int 1"])
def test_a_numpy_or_tensor_confidence_threshold_is_taken_as_its_value(value):
    assert DraftLength(confidence_threshold=value).confidence_threshold == float(value)


@pytest.mark.parametrize("value", ["0.4", True, float("nan"), np.array([0.4]), -0.1])
def test_a_confidence_threshold_that_is_no_probability_is_refused_by_name(value):
    with pytest.raises(SecureSDConfigError, match="assistant_confidence_threshold must be a probability in"):
        DraftLength(confidence_threshold=value)


def _heuristic_steps_hold(drafted: list[int], accepted: list[int], start: int, budgets: list[int]) -> None:
    k = start
    for d, n, budget in zip(drafted, accepted, budgets):
        assert d == min(k, budget), (drafted, accepted)
        k = k + 2 if n == d else max(1, k - 1)


@pytest.mark.parametrize("schedule", ["heuristic", "heuristic_transient"])
def test_heuristic_schedules_follow_hf_rule_and_only_heuristic_persists(llama_pair, draft_settings, schedule):
    draft, target = llama_pair
    draft_settings(num_assistant_tokens=3, num_assistant_tokens_schedule=schedule)
    out, stats = _rounds(target, draft, max_new_tokens=40)
    lengths, budgets = [PROMPT.shape[1]], []
    for n, d in zip(stats.accepted_per_round, stats.drafted_per_round):
        budgets.append(PROMPT.shape[1] + 40 - lengths[-1] - 1)
        lengths.append(lengths[-1] + n + 1)
    _heuristic_steps_hold(stats.drafted_per_round, stats.accepted_per_round, 3, budgets)
    assert len(set(stats.drafted_per_round)) > 1, "k never changed: the test would not exercise the schedule"
    k = 3
    for d, n in zip(stats.drafted_per_round, stats.accepted_per_round):
        k = k + 2 if n == d else max(1, k - 1)
    assert draft.generation_config.num_assistant_tokens == (k if schedule == "heuristic" else 3)


def test_confidence_threshold_stops_drafting_early(llama_pair, draft_settings):
    draft, target = llama_pair
    draft_settings(num_assistant_tokens=8, assistant_confidence_threshold=0.9)
    _, stats = _rounds(target, draft, max_new_tokens=40)
    assert min(stats.drafted_per_round) < 8, "no round stopped early"
    draft_settings(assistant_confidence_threshold=0.0)
    _, stats = _rounds(target, draft, max_new_tokens=40)
    assert set(stats.drafted_per_round[:3]) == {8}


def _reference_threshold(confidence: list[float], outcome: list[int], current: float) -> float:
    """What HF does with scikit-learn's `roc_curve(outcome, confidence)` (drop_intermediate=True), written
    from sklearn's documented rule in plain Python floats: the distinct scores from high to low; the
    points whose false- and true-positive counts both have a zero second difference dropped (the first
    and the last kept); a leading (+inf, 0, 0); the first point minimising fpr + 3 (1 - tpr)."""
    if len(confidence) <= 5 or not {0, 1} <= set(outcome) or current <= 0:
        return current
    thresholds = sorted(set(confidence), reverse=True)
    fps = [sum(1 for c, o in zip(confidence, outcome) if c >= t and o == 0) for t in thresholds]
    tps = [sum(1 for c, o in zip(confidence, outcome) if c >= t and o == 1) for t in thresholds]
    last = len(thresholds) - 1
    kept = [
        i for i in range(len(thresholds))
        if i in (0, last) or fps[i - 1] - 2 * fps[i] + fps[i + 1] or tps[i - 1] - 2 * tps[i] + tps[i + 1]
    ]
    points = [(float("inf"), 0, 0)] + [(thresholds[i], fps[i], tps[i]) for i in kept]
    costs = [fp / fps[-1] + 3 * (1 - tp / tps[-1]) for _, fp, tp in points]
    return points[costs.index(min(costs))][0]


@pytest.mark.parametrize("levels", [3, 6, 40])
def test_threshold_tuning_matches_the_roc_rule(levels):
    """Ties on purpose (few score levels), long histories with collinear ROC points and costs equal up to
    rounding (where float64, as scikit-learn computes, and the dropped points decide)."""
    generator = torch.Generator().manual_seed(levels)
    for trial in range(200):
        width = int(torch.randint(3, 40, (1,), generator=generator))
        confidence = torch.randint(0, levels, (1, width), generator=generator) / (levels - 1.0)
        outcome = torch.randint(-1, 2, (1, width), generator=generator)
        current = torch.tensor([0.4 if trial % 7 else 0.0])
        got = float(tuned_thresholds(confidence, outcome, current)[0])
        kept = [(c, o) for c, o in zip(confidence[0].tolist(), outcome[0].tolist()) if o >= 0]
        expected = _reference_threshold([c for c, _ in kept], [o for _, o in kept], float(current[0]))
        assert got == expected, (confidence, outcome)


def test_a_whole_number_float_draft_length_is_taken_and_a_fraction_refused():
    """6.0 (as some saved configs hold it) is k = 6, as in transformers; 6.5 is refused naming its place."""
    draft_config = GenerationConfig(num_assistant_tokens=6.0)
    assert resolve_draft_length({}, None, draft_config).num_tokens == 6
    draft_config.num_assistant_tokens = 6.5
    with pytest.raises(SecureSDConfigError, match=r"num_assistant_tokens \(in the draft model's generation_config\).*6\.5"):
        resolve_draft_length({}, None, draft_config)


def test_a_heuristic_k_written_back_equal_to_transformers_default_is_kept():
    """k = 20 written back by the "heuristic" schedule starts the next call, though 20 is transformers'
    global default (which otherwise counts as unset in a config)."""
    draft_config = GenerationConfig()
    draft_config.num_assistant_tokens = 20
    assert resolve_draft_length({}, None, draft_config).num_tokens == 5  # 20 set by hand reads as the default
    DraftLengthController(DraftLength(num_tokens=20, schedule="heuristic"), 1, torch.device("cpu")).finish(draft_config)
    assert draft_config.num_assistant_tokens == 20
    assert resolve_draft_length({}, None, draft_config).num_tokens == 20


def test_a_written_back_k_is_at_least_the_verifiers_smallest_k(llama_pair, draft_settings):
    """FLy (window 3) needs k >= 4. A heuristic FLy call whose k shrank stored 3 for the next call, which
    the identical next call then refused ("k is num_assistant_tokens=3"), though the user never set k; and
    a heuristic lossless call that stored k = 1 made the next FLy call on the same draft fail the same way.
    The stored k is at least the call's verifier's smallest k, and a stored k below the next call's is
    raised to it; a k the user set stays refused."""
    draft, target = llama_pair

    def heuristic_call_ending_at_k_1(smallest_k: int) -> int:
        controller = DraftLengthController(DraftLength(num_tokens=5, schedule="heuristic"), 1, torch.device("cpu"),
                                           smallest_k=smallest_k)
        controller.k = [1]  # every draft rejected: HF's rule shrinks k to 1 within the call
        controller.finish(draft.generation_config)
        return draft.generation_config.num_assistant_tokens

    assert heuristic_call_ending_at_k_1(FLy().needs().min_draft_tokens) == 4  # a FLy call stores at least 4
    assert heuristic_call_ending_at_k_1(1) == 1  # a lossless call stores 1
    calls = dict(do_sample=False, max_new_tokens=12, num_assistant_tokens_schedule="heuristic", assistant_model=draft)
    for _ in range(3):
        out = target.generate(PROMPT, verifier="fly", return_dict_in_generate=True, **calls)
        assert out.sequences.shape[1] == PROMPT.shape[1] + 12
        assert draft.generation_config.num_assistant_tokens >= 4
    draft_settings(num_assistant_tokens=3)  # set by hand: FLy's refusal names it
    with pytest.raises(SecureSDConfigError, match="k is num_assistant_tokens=3 here"):
        target.generate(PROMPT, verifier="fly", **calls)



def test_a_k_that_transformers_heuristic_rewrites_is_a_starting_point_too(llama_pair, draft_settings):
    """transformers' own assisted decoding with the draft config's schedule "heuristic" rewrites that config's
    k after every call (to 3 here): a following FLy call passing no k was refused ("k is num_assistant_tokens=3
    here") though no one set k. A k in a draft config whose schedule is "heuristic" is a starting point, raised
    to the verifier's smallest k; with the config's schedule "constant" it stays refused."""
    draft, target = llama_pair
    draft_settings(num_assistant_tokens_schedule="heuristic", num_assistant_tokens=3)  # as transformers leaves it
    calls = dict(do_sample=False, max_new_tokens=12, assistant_model=draft, verifier="fly")
    out = target.generate(PROMPT, return_dict_in_generate=True, **calls)
    assert out.sequences.shape[1] == PROMPT.shape[1] + 12
    assert draft.generation_config.num_assistant_tokens >= 4  # the heuristic FLy call stores at least 4
    draft_settings(num_assistant_tokens_schedule="constant", num_assistant_tokens=3)
    with pytest.raises(SecureSDConfigError, match="k is num_assistant_tokens=3 here"):
        target.generate(PROMPT, **calls)


DYNAMIC = [
    dict(num_assistant_tokens_schedule="heuristic", num_assistant_tokens=2),
    dict(assistant_confidence_threshold=0.6, num_assistant_tokens=6),
    dict(num_assistant_tokens_schedule="heuristic_transient", assistant_confidence_threshold=0.4, num_assistant_tokens=4),
]


@pytest.mark.parametrize("setting", DYNAMIC, ids=["heuristic", "confidence", "both"])
def test_lossless_greedy_equals_target_greedy_under_a_dynamic_draft_length(llama_pair, draft_settings, setting):
    draft, target = llama_pair
    for prompt in random_prompts(6, seed=5):
        draft_settings(**setting)  # heuristic writes k back: start every prompt from the same setting
        reference = target.generate(prompt, max_new_tokens=20, do_sample=False)
        out = target.generate(prompt, max_new_tokens=20, do_sample=False, assistant_model=draft, verifier="lossless")
        assert torch.equal(out, reference)


@pytest.mark.parametrize("setting", DYNAMIC[1:], ids=["confidence", "both"])
def test_batched_equals_one_at_a_time_under_a_dynamic_draft_length(llama_pair, draft_settings, setting):
    """Each row keeps its own k and threshold, so a batch decodes every row as it would alone."""
    draft, target = llama_pair
    tokenizer = byte_tokenizer()
    texts = ("hi", "The quick brown fox", "def add(a, b):", "Once upon a time")
    kwargs = dict(max_new_tokens=16, do_sample=False, assistant_model=draft, verifier=MARS(theta=0.5), secure_schedule=Step(L=2))
    singles = []
    for text in texts:
        draft_settings(**setting)
        single = tokenizer(text, return_tensors="pt")
        singles.append(target.generate(**single, **kwargs)[0, single["input_ids"].shape[1] :].tolist())
    draft_settings(**setting)
    batch = tokenizer(list(texts), return_tensors="pt", padding=True)
    out = target.generate(**batch, **kwargs)
    width = batch["input_ids"].shape[1]
    assert [out[b, width:].tolist()[: len(singles[b])] for b in range(len(texts))] == singles


def test_dynamic_lengths_keep_every_row_within_its_budget(llama_pair, draft_settings):
    draft, target = llama_pair
    draft_settings(num_assistant_tokens=7, num_assistant_tokens_schedule="heuristic")
    for max_new_tokens in (1, 2, 9):
        out, stats = _rounds(target, draft, max_new_tokens=max_new_tokens)
        assert stats.new_tokens == max_new_tokens == out.sequences.shape[1] - PROMPT.shape[1]
        assert all(d <= max_new_tokens - 1 for d in stats.drafted_per_round)
        draft_settings(num_assistant_tokens=7)



def test_a_config_with_every_global_default_filled_in_counts_as_unset():
    """transformers 5.17 pipelines pass a config with HF's defaults filled (k = 20, lookbehind 10,
    threshold 0.4): that is not an explicit request, so our defaults apply and nothing is refused."""
    filled = GenerationConfig(**GenerationConfig._get_default_generation_params())
    assert resolve_draft_length({}, filled, None) == DraftLength()
    assert resolve_draft_length({"num_assistant_tokens": 20}, filled, None).num_tokens == 20
    assert resolve_draft_length({}, GenerationConfig(num_assistant_tokens=7), None).num_tokens == 7


@pytest.mark.parametrize("proposer", ["draft_model", "prompt_lookup"])
def test_a_huge_draft_length_allocates_only_for_the_new_tokens(llama_pair, proposer):
    """k = 10**9 is valid (HF runs it): no round drafts past max_length, so nothing is sized by k (the
    token buffer once asked for 4 * (k + 1) columns per row: tens of GB)."""
    draft, target = llama_pair
    prompts = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8], [9, 5, 6, 7, 8, 5, 6, 7]])
    settings = dict(max_new_tokens=12, do_sample=False, verifier="lossless")
    if proposer == "draft_model":
        huge, usual = dict(assistant_model=draft, num_assistant_tokens=10**9), dict(assistant_model=draft)
    else:
        huge, usual = dict(prompt_lookup_num_tokens=10**9), dict(prompt_lookup_num_tokens=5)
    assert torch.equal(target.generate(prompts, **settings, **huge), target.generate(prompts, **settings, **usual))
