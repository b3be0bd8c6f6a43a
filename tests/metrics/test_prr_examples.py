"""`prr`'s `example_ids`: settings of a sweep run on the same examples are resampled together."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hf_securesd.metrics.prr.prr import Prr


def _sweep(copies: int, n: int = 30, seed: int = 3) -> dict:
    """A ΔPRR sweep of `copies` settings that are the same run of the same n examples."""
    rng = np.random.default_rng(seed)
    target, draft = (rng.random(n) < 0.9).astype(float), (rng.random(n) < 0.2).astype(float)
    fragile = rng.random(n)
    method, baseline = np.where(fragile < 0.9, target, draft), np.where(fragile < 0.4, target, draft)
    return dict(
        predictions=np.tile(method, copies).tolist(),
        baseline_predictions=np.tile(baseline, copies).tolist(),
        target_scores=np.tile(target, copies).tolist(),
        draft_scores=np.tile(draft, copies).tolist(),
        settings=[f"knob{k}" for k in range(copies) for _ in range(n)],
        example_ids=[f"prompt{i}" for _ in range(copies) for i in range(n)],
    )


def _compute(**kwargs) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Prr()._compute(n_resamples=500, seed=0, **kwargs)


def test_identical_settings_on_shared_examples_give_the_one_setting_interval():
    """Four settings that are one run of one prompt set carry no more information than one: resampling the
    examples together keeps the one-setting interval (resampling each setting apart shrank it by about half)."""
    one = _compute(**_sweep(1))
    four = _compute(**_sweep(4))
    assert four["delta_prr"] == pytest.approx(one["delta_prr"])
    np.testing.assert_allclose(four["delta_prr_ci"], one["delta_prr_ci"], rtol=1e-9)
    np.testing.assert_allclose(four["prr_ci"], one["prr_ci"], rtol=1e-9)
    apart = _compute(**{name: values for name, values in _sweep(4).items() if name != "example_ids"})
    assert np.diff(apart["delta_prr_ci"])[0] < 0.8 * np.diff(four["delta_prr_ci"])[0]


def test_one_setting_with_example_ids_matches_the_plain_bootstrap():
    """With one row per example the cluster bootstrap draws what the row bootstrap draws."""
    sweep = _sweep(1)
    plain = _compute(**{name: values for name, values in sweep.items() if name != "example_ids"})
    clustered = _compute(**sweep)
    np.testing.assert_allclose(clustered["delta_prr_ci"], plain["delta_prr_ci"], rtol=1e-9)


def test_a_setting_missing_examples_is_resampled_with_the_rest():
    """Examples left out of one setting (no score there) still pair the others: the resamples that draw none
    of a setting's examples are counted as undefined (and warned about), never an error."""
    sweep = _sweep(2, n=30)
    keep = list(range(30)) + [30, 31, 32]  # the second setting keeps three of the 30 examples
    rows = {name: [values[row] for row in keep] for name, values in sweep.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = Prr()._compute(n_resamples=500, seed=0, **rows)
    assert 0 < result["ci_undefined_resamples"] < 500
    assert all(np.isfinite(result["prr_ci"])) and all(np.isfinite(result["delta_prr_ci"]))
    assert any("a setting drew none of its examples" in str(warning.message) for warning in caught)


@pytest.mark.parametrize("ids, message", [
    (["a", "b"], r"`example_ids` has 2 entries but there are 3 score rows"),
    (["a", None, "c"], r"`example_ids\[1\]` is None .* by a string or an int"),
    (["a", 1.5, "c"], r"`example_ids\[1\]` is 1.5 \(float\)"),
    (["a", True, "c"], r"`example_ids\[1\]` is True \(bool\)"),
    ("abc", r"`example_ids` must be a list"),
])
def test_bad_example_ids_are_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        _compute(predictions=[0.5, 0.6, 0.7], target_scores=[1, 1, 1], draft_scores=[0, 0, 0], example_ids=ids)
