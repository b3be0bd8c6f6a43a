"""Arguments of the `evaluate` metrics that `evaluate`, `datasets` or Python used to refuse with a raw
error (an OverflowError from datasets' features, "object of type 'NoneType' has no len()", an
unexpected keyword argument of `_compute`, "'str' object is not callable"): each is now a ValueError
naming the argument and the fix, raised before `evaluate` stores the inputs."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import evaluate
import numpy as np
import pytest

from hf_securesd import metrics

NAMES = ("prr", "afr", "flips")
GOOD_INPUTS = {
    "prr": {"predictions": [0.5], "target_scores": [1.0], "draft_scores": [0.0]},
    "afr": {"predictions": ["I'm sorry, I can't."], "references": ["goal"]},
    "flips": {"predictions": [1, 0], "references": [1, 1]},
}


@pytest.fixture(scope="module")
def loaded() -> dict[str, evaluate.EvaluationModule]:
    """The three metric modules, loaded once."""
    return {name: evaluate.load(metrics.path(name)) for name in NAMES}


# -- numbers beyond the float64 range -------------------------------------------------------------

# finite numbers beyond float64 (a long double holds 1e400 where it is wider than a double, as on x86)
HUGE = [10**400, -(10**400), Fraction(10**400, 3), Decimal("1e400"),
        *([np.longdouble("1e400")] if np.isfinite(np.longdouble("1e400")) else [])]


@pytest.mark.parametrize("huge", HUGE)
@pytest.mark.parametrize("column", ["predictions", "target_scores", "draft_scores"])
def test_prr_refuses_a_score_beyond_float64_naming_the_entry(loaded, column: str, huge) -> None:
    inputs = {**GOOD_INPUTS["prr"], column: [huge]}
    with pytest.raises(ValueError, match=rf"`{column}\[0\]` is a number beyond the float64 range.*rescale"):
        loaded["prr"].compute(**inputs)


def test_prr_refuses_a_huge_baseline_score_and_a_huge_added_score(loaded) -> None:
    with pytest.raises(ValueError, match=r"`baseline_predictions\[1\]` is a number beyond the float64"):
        loaded["prr"].compute(predictions=[0.5, 0.5], target_scores=[1, 1], draft_scores=[0, 0],
                              baseline_predictions=[0.1, 10**400])
    with pytest.raises(ValueError, match="`predictions` is a number beyond the float64 range"):
        loaded["prr"].add(predictions=10**400, target_scores=1.0, draft_scores=0.0)


def test_flips_refuses_an_outcome_beyond_float64(loaded) -> None:
    with pytest.raises(ValueError, match=r"`references\[1\]` is a number beyond the float64 range"):
        loaded["flips"].compute(predictions=[1, 0], references=[1, 10**400])


def test_the_largest_float64_and_big_ints_within_it_still_pass(loaded) -> None:
    result = loaded["prr"].compute(predictions=[10**300], target_scores=[2 * 10**300], draft_scores=[0])
    assert result["prr"] == pytest.approx(0.5)
    assert loaded["prr"].compute(predictions=[1.7e308], target_scores=[1.7e308], draft_scores=[0.0])["prr"] == 1.0


# -- a column given as None -----------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_a_column_given_as_none_is_named_as_missing(loaded, name: str) -> None:
    for column in GOOD_INPUTS[name]:
        inputs = {**GOOD_INPUTS[name], column: None}
        with pytest.raises(ValueError, match=rf"`{column}` is missing \(None\); pass a list with one"):
            loaded[name].compute(**inputs)


# -- no input column at all -----------------------------------------------------------------------

ADDED_BY_BATCH = ("prr", "afr", "flips")  # every module names the missing columns of a compute() without inputs


@pytest.mark.parametrize("name", ADDED_BY_BATCH)
def test_every_column_none_or_no_input_at_all_is_named_as_missing(loaded, name: str) -> None:
    """`evaluate` skips `add_batch` when every input column is None, and used to fail with "Evaluation
    module cache file doesn't exist" instead of naming the missing columns."""
    nothing = {column: None for column in GOOD_INPUTS[name]}
    for inputs in (nothing, {}):
        with pytest.raises(ValueError, match=r"`predictions` is missing \(None\), and so is every other input"):
            loaded[name].compute(**inputs)


def _one(column: str) -> str:
    """The keyword `add` takes for one entry of `column`: `evaluate` names predictions and references in the
    singular, every other input column as it is."""
    return {"predictions": "prediction", "references": "reference"}.get(column, column)


@pytest.mark.parametrize("name", ADDED_BY_BATCH)
def test_compute_without_inputs_still_computes_on_added_examples(loaded, name: str) -> None:
    module = loaded[name]
    module.add_batch(**GOOD_INPUTS[name])
    batched = module.compute()
    for example in zip(*GOOD_INPUTS[name].values()):
        module.add(**{_one(column): value for column, value in zip(GOOD_INPUTS[name], example)})
    assert module.compute(**{column: None for column in GOOD_INPUTS[name]}) == batched
    assert batched == module.compute(**GOOD_INPUTS[name])


# -- a misspelled option --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "typo", "suggestion"), [
    ("prr", "higher_is_beter", "higher_is_better"),
    ("prr", "thresold", None),
    ("prr", "n_resample", "n_resamples"),
    ("afr", "on_unparse", "on_unparsed"),
    ("afr", "judge_kwarg", "judge_kwargs"),
    ("flips", "alpha", None),
    ("flips", "alternatives", "alternative"),
])
def test_a_misspelled_option_is_refused_with_the_valid_ones(loaded, name, typo, suggestion) -> None:
    with pytest.raises(ValueError) as raised:
        loaded[name].compute(**GOOD_INPUTS[name], **{typo: 1})
    message = str(raised.value)
    assert message.startswith(f"{name}.compute takes no argument {typo!r}")
    assert ("did you mean" in message) == (suggestion is not None)
    if suggestion:
        assert f"did you mean {suggestion!r}?" in message
    listed = message.split("its arguments are ", 1)[1]
    for argument in (*GOOD_INPUTS[name], "confidence_level", "n_resamples", "seed"):
        assert argument in listed


def test_valid_options_still_pass(loaded) -> None:
    prr = loaded["prr"].compute(**GOOD_INPUTS["prr"], higher_is_better=True, n_resamples=0, seed=1)
    assert prr["prr"] == 0.5
    flips = loaded["flips"].compute(**GOOD_INPUTS["flips"], alternative="less", n_resamples=0)
    assert flips["n_lost"] == 1
    afr = loaded["afr"].compute(**GOOD_INPUTS["afr"], judge="refusal_prefix", on_unparsed="exclude")
    assert afr["afr"] == 1.0


def test_prr_still_refuses_references_with_its_own_message(loaded) -> None:
    with pytest.raises(ValueError, match="PRR takes no `references`"):
        loaded["prr"].compute(**GOOD_INPUTS["prr"], references=[1.0])


# -- afr's success_checker and judge_kwargs -------------------------------------------------------


@pytest.mark.parametrize("checker", ["abc", 3, ["yes"]])
def test_afr_refuses_a_success_checker_that_is_not_callable(loaded, checker) -> None:
    with pytest.raises(ValueError, match=r"`success_checker` must be a function \(response, expected_output\)"):
        loaded["afr"].compute(predictions=["yes"], references=["x"], injected_outputs=["yes"],
                              success_checker=checker)


def test_afr_refuses_a_judge_option_the_judge_does_not_take(loaded) -> None:
    expected = "judge 'refusal_prefix' takes no option 'prefix_lst'; its options are prefix_list, prefixes, match."
    with pytest.raises(ValueError) as raised:
        loaded["afr"].compute(**GOOD_INPUTS["afr"], judge_kwargs={"prefix_lst": "gcg_evaluate"})
    assert str(raised.value) == expected


@pytest.mark.parametrize("threshold", ["0.5", False])
def test_afr_passes_on_the_strongreject_threshold_check(loaded, threshold) -> None:
    options = {"threshold": threshold, "rubric": "{forbidden_prompt}\n{response}"}
    with pytest.raises(TypeError, match=r"threshold must be a number in \[0, 1\)"):
        loaded["afr"].compute(**GOOD_INPUTS["afr"], judge="strongreject", judge_kwargs=options)


# -- an entry of the wrong type in a per-row list ------------------------------------------------
# `evaluate` checked only a column's first entry against its feature (a generic multi-line message
# without the entry's index), stored a later text entry of another type as its text (1 as "1") and a
# None score as NaN; each entry is now checked, and a wrong one named by argument and index.

TEXT_COLUMNS = {"predictions": "the model's response", "references": "the forbidden prompt"}
NOT_TEXTS = [None, math.nan, 1, True, ["x"], b"x", {"x": 1}]
NOT_NUMBERS = [None, [0.5], (1,), {"a": 1}, 1j, np.complex64(1), np.array([1.0]), np.array(None), object()]
NUMERIC_COLUMNS = [
    *(("prr", column) for column in ("predictions", "target_scores", "draft_scores", "baseline_predictions")),
    *(("flips", column) for column in ("predictions", "references")),
]
NOT_A_NUMBER = r", not a number; pass one number \(an int or a float\) per row\.$"


def _two_rows(name: str) -> dict[str, list]:
    """Two valid rows of every per-row list of `name` ("prr" or "flips")."""
    if name == "prr":
        return {"predictions": [0.5, 0.5], "target_scores": [1.0, 1.0], "draft_scores": [0.0, 0.0],
                "baseline_predictions": [0.2, 0.2]}
    return {"predictions": [1, 0], "references": [1, 1]}


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("bad", NOT_TEXTS, ids=repr)
@pytest.mark.parametrize("column", TEXT_COLUMNS)
def test_afr_refuses_an_entry_that_is_not_a_string_naming_its_index(loaded, column, bad, index) -> None:
    inputs = {"predictions": ["I'm sorry.", "Sure."], "references": ["goal", "goal"]}
    inputs[column][index] = bad
    expected = (rf"^`{column}\[{index}\]` must be a string \({TEXT_COLUMNS[column]}\), got .*; "
                r"pass one string per response\.$")
    with pytest.raises(ValueError, match=expected):
        loaded["afr"].compute(**inputs)


def test_afr_names_a_none_response_and_refuses_a_number_in_add(loaded) -> None:
    expected = r"^`predictions\[0\]` must be a string \(the model's response\), got None \(NoneType\)"
    with pytest.raises(ValueError, match=expected):
        loaded["afr"].compute(predictions=[None], references=["x"])
    metric = evaluate.load(metrics.path("afr"))
    with pytest.raises(ValueError, match=r"^`reference` must be a string \(the forbidden prompt\), got 3 "):
        metric.add(prediction="Sure.", reference=3)
    metric.add(prediction="Sure.", reference="goal")
    assert metric.compute(n_resamples=0)["verdicts"] == [True]


def test_afr_still_takes_numpy_strings(loaded) -> None:
    result = loaded["afr"].compute(predictions=np.array(["I'm sorry.", "Sure."]),
                                   references=np.array(["g", "g"]), n_resamples=0)
    assert result["verdicts"] == [False, True]


@pytest.mark.parametrize("bad", NOT_NUMBERS, ids=repr)
@pytest.mark.parametrize(("name", "column"), NUMERIC_COLUMNS)
def test_a_score_or_outcome_that_is_not_a_number_is_named_with_its_index(loaded, name, column, bad) -> None:
    inputs = _two_rows(name)
    inputs[column] = [inputs[column][0], bad]
    with pytest.raises(ValueError, match=rf"^`{column}\[1\]` is .*{NOT_A_NUMBER}"):
        loaded[name].compute(**inputs)


@pytest.mark.parametrize(("name", "others"), [("prr", {"target_scores": 1.0, "draft_scores": 0.0}),
                                               ("flips", {"reference": 1})])
def test_none_is_not_a_number_rather_than_nan(loaded, name, others) -> None:
    inputs = {**GOOD_INPUTS[name], "predictions": [None] * len(GOOD_INPUTS[name]["predictions"])}
    with pytest.raises(ValueError, match=rf"^`predictions\[0\]` is None \(NoneType\){NOT_A_NUMBER}"):
        loaded[name].compute(**inputs)
    with pytest.raises(ValueError, match=rf"^`prediction` is None \(NoneType\){NOT_A_NUMBER}"):
        evaluate.load(metrics.path(name)).add(prediction=None, **others)


def test_prr_names_the_first_nan_or_infinite_score(loaded) -> None:
    with pytest.raises(ValueError, match=r"^`draft_scores\[2\]` is inf: NaN or infinite scores are refused"):
        loaded["prr"].compute(predictions=[0.5] * 3, target_scores=[1.0] * 3,
                              draft_scores=[0.0, 0.0, math.inf])
    with pytest.raises(ValueError, match=r"^`baseline_predictions\[1\]` is nan: NaN or infinite"):
        loaded["prr"].compute(**_two_rows("prr") | {"baseline_predictions": [0.2, math.nan]})


NUMERIC_SCALARS = [np.float32(0.5), np.float64(0.5), np.int64(1), np.bool_(False), np.array(0.5), np.array(1),
                   Fraction(1, 2), Decimal("0.5"), True, False, 1, 0.5]


@pytest.mark.parametrize("value", NUMERIC_SCALARS, ids=repr)
def test_numeric_scalars_of_any_kind_are_still_scores(loaded, value) -> None:
    result = loaded["prr"].compute(predictions=[value, 0.5], target_scores=[1, 1], draft_scores=[0, 0],
                                   baseline_predictions=[value, 0.0], n_resamples=0)
    assert result["prr"] == pytest.approx((float(value) + 0.5) / 2)
    assert result["baseline_prr"] == pytest.approx(float(value) / 2)


def test_outcomes_may_be_numpy_scalars_bools_and_arrays(loaded) -> None:
    outcomes = [np.int64(1), np.bool_(False), np.array(1), True, np.float64(0.0), 1.0]
    result = loaded["flips"].compute(predictions=outcomes, references=np.array([1, 1, 0, 0, 0, 1]),
                                     n_resamples=0)
    assert (result["n_lost"], result["n_gained"]) == (1, 2)


def test_tensors_are_still_scores(loaded) -> None:
    torch = pytest.importorskip("torch")
    result = loaded["prr"].compute(predictions=torch.tensor([0.5, 0.25]),
                                   target_scores=[torch.tensor(1.0)] * 2,
                                   draft_scores=[torch.tensor(0), torch.tensor(False)], n_resamples=0)
    assert result["prr"] == pytest.approx(0.375)
