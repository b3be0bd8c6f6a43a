"""The `securesd/prr` evaluate module: definition, orientation, aggregation, sweeps, CI, errors."""

from __future__ import annotations

import math
import sys
from decimal import Decimal
import warnings

import evaluate
import numpy as np
import pytest
import torch

from hf_securesd import metrics


@pytest.fixture(scope="module")
def prr():
    return evaluate.load(metrics.path("prr"))


def _quiet(prr, **kwargs):
    """compute() with warnings turned into errors, so unexpected warnings fail the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return prr.compute(**kwargs)


def _few_rows(prr, **kwargs):
    """`_quiet` for a handful of rows, whose bootstrap rightly warns that many resamples were undefined."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=r".* bootstrap resamples were undefined", category=RuntimeWarning)
        return prr.compute(**kwargs)


def test_path_points_at_the_module_folder():
    assert metrics.path("prr").endswith("prr")
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.path("bleu")


def test_module_info_follows_the_template(prr):
    assert "SecureSD" in prr.citation
    assert "PRR" in prr.description
    assert set(prr.features) == {"predictions", "target_scores", "draft_scores"}
    assert "higher_is_better" in prr.inputs_description


@pytest.mark.parametrize(
    ("target", "draft", "expected"),
    [(0.895, 0.195, 0.744), (0.915, 0.105, 0.719)],  # Table 3 raw AFRs, Table 1 safety PRRs
)
def test_paper_table_3_numbers(prr, target, draft, expected):
    method = expected * (target - draft) + draft
    result = _quiet(prr, predictions=[method], target_scores=[target], draft_scores=[draft])
    assert result["prr"] == pytest.approx(expected, abs=1e-12)
    assert result["undefined"] is False
    assert result["target_gap"] == pytest.approx(target - draft)
    assert result["prr_ci"] is None  # aggregate scores: no bootstrap


def test_zero_at_draft_one_at_target_and_beyond(prr):
    kwargs = dict(target_scores=[0.8], draft_scores=[0.2])
    assert _quiet(prr, predictions=[0.2], **kwargs)["prr"] == pytest.approx(0.0)
    assert _quiet(prr, predictions=[0.8], **kwargs)["prr"] == pytest.approx(1.0)
    assert _quiet(prr, predictions=[0.5], **kwargs)["prr"] == pytest.approx(0.5)
    assert _quiet(prr, predictions=[0.9], **kwargs)["prr"] == pytest.approx(7 / 6)
    assert _quiet(prr, predictions=[0.1], **kwargs)["prr"] == pytest.approx(-1 / 6)


def test_lower_is_better_scores_give_the_same_prr(prr):
    afr = _quiet(prr, predictions=[0.6], target_scores=[0.9], draft_scores=[0.2])
    asr = _quiet(prr, predictions=[0.4], target_scores=[0.1], draft_scores=[0.8], higher_is_better=False)
    assert asr["prr"] == pytest.approx(afr["prr"]) == pytest.approx(4 / 7)
    assert asr["target_gap"] == pytest.approx(0.7)
    assert asr["target_score"] == pytest.approx(0.1)  # raw scores are reported as given


def test_wrong_orientation_warns(prr):
    with pytest.warns(UserWarning, match="orientation"):
        result = prr.compute(predictions=[0.4], target_scores=[0.1], draft_scores=[0.8])
    assert result["target_gap"] == pytest.approx(-0.7)


def test_per_example_scores_are_averaged_before_the_ratio(prr):
    method = [1, 1, 0, 0]
    target = [1, 1, 1, 0]
    draft = [0, 1, 0, 0]
    result = _few_rows(prr, predictions=method, target_scores=target, draft_scores=draft)
    # means 0.5, 0.75, 0.25 -> (0.5 - 0.25) / (0.75 - 0.25)
    assert result["prr"] == pytest.approx(0.5)
    assert result["method_score"] == pytest.approx(0.5)
    assert result["n_examples"] == 4


def test_sweep_averages_per_setting_prr(prr):
    result = _quiet(
        prr, predictions=[0.5, 0.9], target_scores=[1.0, 1.0], draft_scores=[0.0, 0.6], settings=["a", "b"]
    )
    assert result["per_setting"] == {"a": {"prr": pytest.approx(0.5)}, "b": {"prr": pytest.approx(0.75)}}
    assert result["prr"] == pytest.approx((0.5 + 0.75) / 2)
    pooled = (0.7 - 0.3) / (1.0 - 0.3)  # what ignoring the settings would give
    assert result["prr"] != pytest.approx(pooled)


def test_delta_prr_is_paired_and_averaged_over_the_sweep(prr):
    result = _quiet(
        prr,
        predictions=[0.8, 0.7, 0.6],
        baseline_predictions=[0.4, 0.5, 0.6],
        target_scores=[0.9, 0.9, 0.9],
        draft_scores=[0.1, 0.1, 0.1],
        settings=["a", "b", "c"],
    )
    with_secure = np.array([0.7, 0.6, 0.5]) / 0.8
    without = np.array([0.3, 0.4, 0.5]) / 0.8
    assert result["prr"] == pytest.approx(with_secure.mean())
    assert result["baseline_prr"] == pytest.approx(without.mean())
    assert result["delta_prr"] == pytest.approx((with_secure - without).mean())
    assert result["per_setting"]["c"]["delta_prr"] == pytest.approx(0.0)
    assert result["delta_prr"] > 0


def _binary_scores(seed: int, n: int = 120):
    rng = np.random.default_rng(seed)
    return {
        "predictions": (rng.random(n) < 0.7).astype(float).tolist(),
        "target_scores": (rng.random(n) < 0.9).astype(float).tolist(),
        "draft_scores": (rng.random(n) < 0.2).astype(float).tolist(),
    }


def test_bootstrap_ci_is_seeded(prr):
    scores = _binary_scores(0)
    first = _quiet(prr, **scores, seed=7, n_resamples=500)
    again = _quiet(prr, **scores, seed=7, n_resamples=500)
    other = _quiet(prr, **scores, seed=8, n_resamples=500)
    assert first["prr_ci"] == again["prr_ci"]
    assert first["prr_ci"] != other["prr_ci"]
    low, high = first["prr_ci"]
    assert low < first["prr"] < high
    assert 0.05 < high - low < 0.6


def test_delta_prr_ci_is_paired(prr):
    scores = _binary_scores(1)
    shifted = [min(1.0, s + 1.0) if i % 5 == 0 else s for i, s in enumerate(scores["predictions"])]
    result = _quiet(
        prr, **{**scores, "predictions": shifted}, baseline_predictions=scores["predictions"], seed=3
    )
    low, high = result["delta_prr_ci"]
    assert 0 < low <= result["delta_prr"] <= high
    # pairing makes the difference much tighter than either PRR
    assert high - low < (result["prr_ci"][1] - result["prr_ci"][0]) / 2


def test_narrower_confidence_level_gives_narrower_interval(prr):
    scores = _binary_scores(2)
    wide = _quiet(prr, **scores, confidence_level=0.95)["prr_ci"]
    narrow = _quiet(prr, **scores, confidence_level=0.5)["prr_ci"]
    assert wide[0] < narrow[0] < narrow[1] < wide[1]


def test_undefined_prr_is_nan_with_field_and_warning(prr):
    with pytest.warns(RuntimeWarning, match="undefined"):
        result = prr.compute(predictions=[0.5, 0.7], target_scores=[0.6, 0.6], draft_scores=[0.6, 0.6])
    assert math.isnan(result["prr"])
    assert result["undefined"] is True
    assert result["prr_ci"] is None


def test_one_undefined_setting_makes_the_sweep_undefined(prr):
    with pytest.warns(RuntimeWarning, match=r"\['b'\]"):
        result = prr.compute(
            predictions=[0.5, 0.5], target_scores=[1.0, 0.3], draft_scores=[0.0, 0.3], settings=["a", "b"]
        )
    assert math.isnan(result["prr"])
    assert result["per_setting"]["a"]["prr"] == pytest.approx(0.5)


def test_empty_inputs_raise_a_clear_error(prr):
    with pytest.raises(ValueError, match="at least one score"):
        prr.compute(predictions=[], target_scores=[], draft_scores=[])


def test_mismatched_lengths_raise_clear_errors(prr):
    with pytest.raises(ValueError, match="Mismatch in the number of predictions"):
        prr.compute(predictions=[0.1, 0.2], target_scores=[0.9], draft_scores=[0.1, 0.1])
    with pytest.raises(ValueError, match="baseline_predictions"):
        prr.compute(
            predictions=[0.5], target_scores=[0.9], draft_scores=[0.1], baseline_predictions=[0.1, 0.2]
        )
    with pytest.raises(ValueError, match="one setting per row"):
        prr.compute(predictions=[0.5], target_scores=[0.9], draft_scores=[0.1], settings=["a", "b"])


def test_non_finite_scores_and_bad_level_are_rejected(prr):
    with pytest.raises(ValueError, match="NaN or infinite"):
        prr.compute(predictions=[float("nan")], target_scores=[0.9], draft_scores=[0.1])
    with pytest.raises(ValueError, match="confidence_level"):
        prr.compute(predictions=[0.5], target_scores=[0.9], draft_scores=[0.1], confidence_level=95)


def test_settings_group_by_value_not_by_its_text(prr):
    kwargs = dict(predictions=[1, 0, 0, 0], target_scores=[1, 1, 1, 1], draft_scores=[0, 0, 0, 0])
    same = _quiet(prr, settings=[1, 1.0, 1.0, 0.5], **kwargs)  # 1 == 1.0: one setting
    assert list(same["per_setting"]) == [1, 0.5]
    assert same["prr"] == _quiet(prr, settings=[1.0, 1.0, 1.0, 0.5], **kwargs)["prr"] == pytest.approx(1 / 6)
    apart = _quiet(prr, settings=[None, None, "None", "None"], **kwargs)  # None != "None": two
    assert list(apart["per_setting"]) == [None, "None"]
    assert apart["per_setting"][None]["prr"] == pytest.approx(0.5)
    assert list(_quiet(prr, settings=[np.float32(0.1)] * 3 + [0.1], **kwargs)["per_setting"]) == [
        np.float32(0.1), 0.1]  # float32(0.1) != 0.1


def test_unhashable_settings_are_grouped_by_their_repr(prr):
    kwargs = dict(predictions=[1, 0, 0, 0], target_scores=[1, 1, 1, 1], draft_scores=[0, 0, 0, 0])
    result = _quiet(prr, settings=[[1, 2], [1, 2], {"k": 3}, {"k": 3}], **kwargs)
    assert result["per_setting"] == {"[1, 2]": {"prr": 0.5}, "{'k': 3}": {"prr": 0.0}}
    with pytest.raises(ValueError, match="one type"):
        prr.compute(settings=[[1, 2], [1, 2], "[1, 2]", "[1, 2]"], **kwargs)
    with pytest.raises(ValueError, match=r"`settings\[1\]` is or holds NaN"):
        prr.compute(settings=[0.5, float("nan"), 0.5, 0.5], **kwargs)


@pytest.mark.parametrize("make", [torch.tensor, np.array])
def test_equal_0d_tensor_or_array_settings_form_one_group(prr, make):
    """A torch tensor hashes by identity: two equal 0-d tensors used to form two groups (a wrong PRR and
    no interval). Arrays and tensors are read as their values."""
    kwargs = dict(predictions=[0.5, 0.85], target_scores=[1, 1], draft_scores=[0, 0.8])
    expected = _quiet(prr, settings=[0.25, 0.25], **kwargs)
    result = _quiet(prr, settings=[make(0.25), make(0.25)], **kwargs)
    assert list(result["per_setting"]) == [0.25] and result["prr"] == expected["prr"]
    assert result["prr_ci"] == expected["prr_ci"] is not None
    column = _quiet(prr, settings=make([0.25, 0.25]), **kwargs)
    assert column["prr"] == expected["prr"]


@pytest.mark.parametrize("setting", [
    (float("nan"),), ("a", (1, float("nan"))), Decimal("NaN"), Decimal("sNaN"),
])
def test_a_setting_holding_nan_is_refused(prr, setting):
    kwargs = dict(predictions=[0.5, 0.85], target_scores=[1, 1], draft_scores=[0, 0.8])
    with pytest.raises(ValueError, match=r"`settings\[0\]` is or holds NaN"):
        prr.compute(settings=[setting, setting], **kwargs)


@pytest.mark.parametrize("column", ["predictions", "target_scores"])
def test_a_decimal_nan_score_is_refused_naming_it(prr, column):
    kwargs = dict(predictions=[0.5, 0.85], target_scores=[1, 1], draft_scores=[0, 0.8])
    kwargs[column] = [kwargs[column][0], Decimal("sNaN")]
    with pytest.raises(ValueError, match=rf"`{column}\[1\]` is Decimal sNaN: NaN is refused"):
        prr.compute(**kwargs)


def test_n_resamples_zero_gives_no_interval_and_negative_is_refused(prr):
    kwargs = dict(predictions=[1, 0], target_scores=[1, 1], draft_scores=[0, 0], baseline_predictions=[0, 0])
    result = _quiet(prr, n_resamples=0, **kwargs)
    assert result["prr"] == 0.5 and result["prr_ci"] is None and result["delta_prr_ci"] is None
    for bad in (-1, 2.5, "many"):
        with pytest.raises(ValueError, match="`n_resamples` must be a whole number from 0"):
            prr.compute(n_resamples=bad, **kwargs)


BAD_ARGUMENTS = [
    ("n_resamples", "from 0 .* to 100000", [math.inf, 10**30, 100_001, 1000.0, True, "1000", None]),
    ("confidence_level", "strictly between 0 and 1", ["0.9", None, 0, 1, 1.5, math.nan, True]),
    ("seed", "whole number >= 0", [-1, 1.5, True, "0", None]),
    ("higher_is_better", "True or False", ["False", "True", None, 0, 1]),
]


@pytest.mark.parametrize(
    ("name", "valid", "bad"), [(name, valid, bad) for name, valid, values in BAD_ARGUMENTS for bad in values]
)
def test_bad_arguments_are_refused_naming_the_argument_and_its_range(prr, name, valid, bad):
    kwargs = dict(predictions=[0.5, 0.6], target_scores=[1.0, 1.0], draft_scores=[0.0, 0.1])
    with pytest.raises(ValueError, match=f"`{name}` must be .*{valid}.*; pass"):
        prr.compute(**kwargs, **{name: bad})


def test_numpy_scalars_are_valid_arguments(prr):
    kwargs = dict(predictions=[0.5, 0.6], target_scores=[1.0, 1.0], draft_scores=[0.0, 0.1])
    numpy_args = dict(n_resamples=np.int64(200), confidence_level=np.float32(0.9), seed=np.int64(4))
    result = _quiet(prr, **kwargs, **numpy_args, higher_is_better=np.bool_(True))
    assert result["prr_ci"] == _quiet(prr, **kwargs, n_resamples=200, confidence_level=float(np.float32(0.9)),
                                      seed=4)["prr_ci"]


@pytest.mark.parametrize(
    ("name", "bad"),
    [("settings", "ab"), ("settings", {"a": 1, "b": 2}), ("baseline_predictions", "01"),
     ("predictions", "01"), ("target_scores", {1.0, 0.9})],
)
def test_a_string_or_mapping_is_not_read_as_one_value_per_row(prr, name, bad):
    kwargs = dict(predictions=[0.5, 0.6], target_scores=[1.0, 0.9], draft_scores=[0.0, 0.1])
    with pytest.raises(ValueError, match=f"`{name}` must be a list with one .* per row.*pass a list"):
        prr.compute(**{**kwargs, name: bad})


def test_scores_near_the_float_limit_do_not_overflow(prr):
    single = _quiet(prr, predictions=[1e300], target_scores=[1.5e308], draft_scores=[-1.5e308])
    assert single["prr"] == pytest.approx(0.5 + 1e300 / 1.5e308 / 2)  # 3e308 overflows
    assert single["target_gap"] == math.inf  # 3e308 is beyond float64; the ratio is not
    assert single["target_score"] == 1.5e308
    rows = _quiet(prr, predictions=[0.0, 1e308], target_scores=[1.7e308] * 2, draft_scores=[-1.7e308] * 2,
                  baseline_predictions=[-1.7e308, 0.0], seed=1)
    assert rows["prr"] == pytest.approx(0.5 + 0.25 / 1.7)
    assert rows["baseline_prr"] == pytest.approx(0.25)
    assert rows["undefined"] is False and rows["prr_ci"] is not None and rows["delta_prr_ci"] is not None


def test_equality_tolerance_is_relative_to_the_scores_scale(prr):
    tiny = _quiet(prr, predictions=[1.5e-13], target_scores=[2e-13], draft_scores=[1e-13])
    assert tiny["undefined"] is False and tiny["prr"] == pytest.approx(0.5)
    with pytest.warns(RuntimeWarning, match="undefined"):
        large = prr.compute(predictions=[1e6], target_scores=[1e6 * (1 + 1e-14)], draft_scores=[1e6])
    assert large["undefined"] is True and math.isnan(large["prr"])


def test_a_setting_of_tiny_scores_beside_one_of_huge_scores_keeps_its_prr(prr):
    """Each setting is rescaled on its own: one common power of two flushed setting b's 1e-300 scores
    to 0 and reported it as undefined."""
    result = _quiet(prr, predictions=[1e308, 2e-300], target_scores=[1.5e308, 3e-300],
                    draft_scores=[0.0, 1e-300], settings=["a", "b"])
    alone = _quiet(prr, predictions=[2e-300], target_scores=[3e-300], draft_scores=[1e-300])["prr"]
    assert result["per_setting"]["b"]["prr"] == alone == pytest.approx(0.5)
    assert result["per_setting"]["a"]["prr"] == pytest.approx(2 / 3)
    assert result["undefined"] is False and result["prr"] == pytest.approx((2 / 3 + alone) / 2)
    assert (result["method_score"], result["target_score"]) == (pytest.approx(5e307), pytest.approx(7.5e307))


def test_true_is_the_same_setting_as_1_and_1_0(prr):
    kwargs = dict(predictions=[1, 0, 1], target_scores=[1, 1, 1], draft_scores=[0, 0, 0])
    assert list(_quiet(prr, settings=[1, 1.0, True], **kwargs)["per_setting"]) == [1]


@pytest.mark.parametrize("call", ["compute", "add_batch"])
def test_references_are_refused_naming_the_score_arguments(prr, call):
    with pytest.raises(ValueError, match="PRR takes no `references`.*target_scores.*draft_scores"):
        getattr(prr, call)(predictions=[1, 0], references=[1, 1], target_scores=[1, 1], draft_scores=[0, 0])
    with pytest.raises(ValueError, match="PRR takes no `reference`"):
        prr.add(prediction=1.0, reference=1.0, target_scores=1.0, draft_scores=0.0)


@pytest.mark.parametrize("text", ["abc", "0.5"])
@pytest.mark.parametrize("name", ["predictions", "target_scores", "draft_scores", "baseline_predictions"])
def test_scores_given_as_text_are_refused_naming_the_argument(prr, name, text):
    kwargs = dict(predictions=[0.5, 0.5], target_scores=[0.9, 0.9], draft_scores=[0.1, 0.1],
                  baseline_predictions=[0.4, 0.4])
    kwargs[name] = [0.5, text]
    with pytest.raises(ValueError, match=rf"`{name}\[1\]` is the text '{text}', not a number"):
        prr.compute(**kwargs)


def _unblocked_bootstrap_means(columns, groups, n_resamples, rng):
    """The bootstrap as it was before it drew in blocks: every resample's indices at once."""
    resampled = {name: np.empty((n_resamples, len(groups))) for name in columns}
    for position, rows in enumerate(groups.values()):
        picks = rows[rng.integers(0, len(rows), size=(n_resamples, len(rows)))]
        for name, column in columns.items():
            resampled[name][:, position] = column[picks].mean(axis=1)
    return resampled


def test_the_bootstrap_in_blocks_draws_the_same_resamples(prr, monkeypatch):
    module = sys.modules[type(prr).__module__]
    draws = np.random.default_rng(7)
    columns = {"method": draws.random(23), "target": draws.random(23) + 1, "draft": draws.random(23)}
    groups = {"a": np.arange(0, 23, 2), "b": np.arange(1, 23, 2)}  # 12 and 11 rows
    expected = _unblocked_bootstrap_means(columns, groups, 101, np.random.default_rng(5))
    monkeypatch.setattr(module, "_BLOCK_INDICES", 4 * 11 + 3)  # 3 or 4 resamples per block, last one short
    blocked = module._bootstrap_means(columns, groups, 101, np.random.default_rng(5))
    assert all(np.array_equal(blocked[name], expected[name]) for name in columns)


def test_compute_gives_the_same_intervals_whatever_the_block_size(prr, monkeypatch):
    kwargs = dict(predictions=[1, 0, 1, 1, 0, 1, 0, 1], target_scores=[1, 1, 1, 1, 1, 0, 1, 1],
                  draft_scores=[0, 0, 1, 0, 0, 0, 1, 0], baseline_predictions=[0, 0, 1, 1, 0, 0, 0, 1],
                  settings=["x", "y"] * 4, seed=11)
    whole = _few_rows(prr, **kwargs)
    assert None not in (whole["prr_ci"], whole["delta_prr_ci"])
    monkeypatch.setattr(sys.modules[type(prr).__module__], "_BLOCK_INDICES", 5)
    blocked = _few_rows(prr, **kwargs)
    assert (blocked["prr_ci"], blocked["delta_prr_ci"]) == (whole["prr_ci"], whole["delta_prr_ci"])


def test_a_pandas_series_with_another_index_is_read_by_position(prr):
    """A filtered DataFrame's column keeps its row labels: `evaluate` read its first entry as column[0], a
    label lookup that failed with a bare KeyError: 0."""
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame({"method": [1, 0, 1, 1], "target": [1, 1, 1, 1], "draft": [0, 0, 0, 1],
                              "keep": [False, True, True, True]})
    kept = frame[frame.keep]  # index 1, 2, 3
    result = _quiet(prr, predictions=kept.method, target_scores=kept.target, draft_scores=kept.draft, n_resamples=0)
    assert result == _quiet(prr, predictions=[0, 1, 1], target_scores=[1, 1, 1], draft_scores=[0, 0, 1], n_resamples=0)
