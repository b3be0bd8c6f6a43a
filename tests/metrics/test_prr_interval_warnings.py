"""`prr` flags bootstrap intervals that cannot be read as confidence intervals."""

from __future__ import annotations

import warnings

import pytest

from hf_securesd.metrics.prr.prr import Prr


def _warnings_of(**kwargs) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Prr()._compute(**kwargs)
    return [str(warning.message) for warning in caught if warning.category is RuntimeWarning]


def test_a_zero_width_interval_is_flagged():
    """The method matches the target on all 20 examples: every resample gives PRR 1, which is no interval."""
    messages = _warnings_of(predictions=[1] * 20, target_scores=[1] * 20, draft_scores=[0] * 10 + [1] * 10)
    assert any("prr_ci = [1.0, 1.0] has zero width" in message for message in messages)


def test_a_zero_width_delta_interval_is_flagged():
    messages = _warnings_of(predictions=[1] * 20, baseline_predictions=[0] * 10 + [1] * 10, target_scores=[1] * 20,
                            draft_scores=[0] * 10 + [1] * 10)
    assert any("delta_prr_ci = [1.0, 1.0] has zero width" in message for message in messages)


def test_an_interval_on_a_minority_of_resamples_is_flagged():
    """Target and draft differ on one example of 10: about a third of the resamples miss it and are dropped."""
    messages = _warnings_of(predictions=[0] + [1] * 9, target_scores=[1] * 10, draft_scores=[0] + [1] * 9)
    assert any(message.startswith("34") and "bootstrap resamples were undefined" in message for message in messages)


def test_an_ordinary_interval_is_not_flagged():
    target = [1, 1, 1, 1, 1, 1, 1, 1, 0, 1] * 3
    draft = [0, 0, 1, 0, 0, 1, 0, 0, 0, 0] * 3
    method = [1, 0, 1, 1, 0, 1, 1, 0, 0, 1] * 3
    assert _warnings_of(predictions=method, target_scores=target, draft_scores=draft) == []


@pytest.mark.parametrize("n_resamples", [0])
def test_no_interval_no_warning(n_resamples):
    assert _warnings_of(predictions=[1] * 20, target_scores=[1] * 20, draft_scores=[0] * 20,
                        n_resamples=n_resamples) == []
