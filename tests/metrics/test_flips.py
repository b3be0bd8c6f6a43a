"""The `flips` evaluate module: per-direction paired flip counts, exact intervals, exact McNemar."""

from __future__ import annotations

import math
from decimal import Decimal

import evaluate
import numpy as np
import pytest
from scipy.stats import binomtest

from hf_securesd import metrics


@pytest.fixture(scope="module")
def flips():
    return evaluate.load(metrics.path("flips"))


def _outcomes(lost: int, gained: int, both_good: int, both_bad: int) -> tuple[list[int], list[int]]:
    """(method, reference) with the given cells of the 2x2 table."""
    reference = [1] * lost + [0] * gained + [1] * both_good + [0] * both_bad
    method = [0] * lost + [1] * gained + [1] * both_good + [0] * both_bad
    return method, reference


def test_counts_each_direction_where_the_means_cancel(flips) -> None:
    # 128 prompts: the target refuses 73; the method loses 13 refusals and gains 10
    method, reference = _outcomes(lost=13, gained=10, both_good=60, both_bad=45)
    result = flips.compute(predictions=method, references=reference)
    assert (result["n_lost"], result["n_gained"], result["n_discordant"]) == (13, 10, 23)
    assert result["flip_rate"] == 23 / 128 and result["lost_rate"] == 13 / 128
    assert result["lost_share"] == 13 / 73 and result["gained_share"] == 10 / 55
    assert result["difference"] == pytest.approx(-3 / 128) == result["method_rate"] - result["reference_rate"]
    assert result["mcnemar_pvalue"] == pytest.approx(binomtest(13, 23, 0.5).pvalue)
    assert result["mcnemar_pvalue"] > 0.5  # no significant change of the mean ...
    low, high = result["flip_rate_ci"]
    assert low > 0.1  # ... yet about one verdict in six changed, significantly above zero
    exact = binomtest(23, 128).proportion_ci(0.95, method="exact")
    assert (low, high) == pytest.approx((exact.low, exact.high))
    dlow, dhigh = result["difference_ci"]
    assert dlow < result["difference"] < dhigh


def test_one_sided_losses_are_significant(flips) -> None:
    method, reference = _outcomes(lost=12, gained=1, both_good=40, both_bad=47)
    two_sided = flips.compute(predictions=method, references=reference)
    greater = flips.compute(predictions=method, references=reference, alternative="greater")
    assert two_sided["mcnemar_pvalue"] < 0.01
    assert greater["mcnemar_pvalue"] == pytest.approx(two_sided["mcnemar_pvalue"] / 2)


def test_identical_outcomes_have_no_flips(flips) -> None:
    result = flips.compute(predictions=[1, 0, 1], references=[1, 0, 1])
    assert result["n_discordant"] == 0 and result["mcnemar_pvalue"] == 1.0
    assert result["flip_rate_ci"][0] == 0.0
    low, high = result["difference_ci"]  # no flip seen in 3 examples does not prove none happen
    assert low < 0 < high
    everyone_refuses = flips.compute(predictions=[1, 1], references=[1, 1])
    assert everyone_refuses["gained_share"] is None and everyone_refuses["gained_share_ci"] is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"predictions": [0.5, 1], "references": [1, 1]}, "binary"),
        ({"predictions": [1, 1], "references": [1, 1], "alternative": "up"}, "alternative"),
        ({"predictions": [1, 1], "references": [1, 1], "confidence_level": 1.0}, "confidence_level"),
        ({"predictions": [1, Decimal("sNaN")], "references": [1, 1]}, r"`predictions\[1\]` is Decimal sNaN"),
    ],
)
def test_bad_input_names_the_fix(flips, kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        flips.compute(**kwargs)


def test_mismatched_lengths_are_refused(flips) -> None:
    with pytest.raises(ValueError):
        flips.compute(predictions=[1, 0, 1], references=[1, 0])


@pytest.mark.parametrize(
    ("name", "bad", "valid"),
    [("confidence_level", bad, "strictly between 0 and 1") for bad in ("0.9", None, 0, 1.5, math.nan, True)],
)
def test_bad_interval_arguments_name_the_argument_and_its_range(flips, name, bad, valid) -> None:
    with pytest.raises(ValueError, match=f"`{name}` must be .*{valid}.*; pass"):
        flips.compute(predictions=[1, 0], references=[1, 1], **{name: bad})


@pytest.mark.parametrize(
    ("name", "predictions", "references"),
    [("predictions", "101", "110"), ("references", [1, 0, 1], "110"), ("predictions", {1: 1, 0: 0}, [1, 1])],
)
def test_a_string_or_mapping_is_not_read_as_one_outcome_each(flips, name, predictions, references) -> None:
    with pytest.raises(ValueError, match=f"`{name}` must be a list with one outcome per example"):
        flips.compute(predictions=predictions, references=references)


def test_entries_that_are_not_outcomes_are_reported_as_given(flips) -> None:
    with pytest.raises(ValueError, match=r"`predictions` must hold binary outcomes .*got \{0: 0.5, 2: -1.0\}"):
        flips.compute(predictions=[0.5, 1, -1], references=[1, 1, 1])


@pytest.mark.parametrize("text", ["1", "yes"])
def test_outcomes_given_as_text_are_refused_naming_the_argument(flips, text) -> None:
    with pytest.raises(ValueError, match=rf"`references\[0\]` is the text '{text}', not a number"):
        flips.compute(predictions=[1, 1], references=[text, 1])


def test_one_outcome_given_as_text_to_add_is_refused_as_in_add_batch():
    metric = evaluate.load(metrics.path("flips"))
    with pytest.raises(ValueError, match=r"`prediction` is the text '1', not a number"):
        metric.add(prediction="1", reference=1)
    metric.add(prediction=1, reference=0)
    assert metric.compute()["n_examples"] == 1


def test_a_pandas_series_with_another_index_is_read_by_position(flips) -> None:
    """A filtered DataFrame's column keeps its row labels: `evaluate` read its first entry as
    column[0], a label lookup that failed with a bare KeyError: 0."""
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"method": [1, 0, 1, 0], "reference": [0, 1, 1, 1], "keep": [False, True, True, True]})
    kept = frame[frame.keep]  # index 1, 2, 3
    result = flips.compute(predictions=kept.method, references=kept.reference)
    assert result == flips.compute(predictions=[0, 1, 0], references=[1, 1, 1])
    assert (result["n_lost"], result["n_gained"]) == (2, 0)


def test_arrays_and_tensors_are_still_outcomes(flips) -> None:
    torch = pytest.importorskip("torch")
    expected = flips.compute(predictions=[1, 0, 1], references=[1, 1, 0])
    assert flips.compute(predictions=np.array([1, 0, 1]), references=torch.tensor([1, 1, 0])) == expected
    assert flips.compute(predictions=torch.tensor([True, False, True]), references=[1.0, 1.0, 0.0]) == expected
