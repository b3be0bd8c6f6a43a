"""`Verdict` enforces what it documents: a parsed verdict's score is a number in [0, 1], an unparsed
verdict's is NaN, so a custom judge's bad score fails where it is made instead of reaching a rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf_securesd.judges import Verdict


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
@pytest.mark.parametrize("score", [7.0, -3.0, 1.0000001, math.nan, math.inf, -math.inf])
def test_a_parsed_verdict_with_a_score_outside_the_unit_interval_is_refused(outcome: str, score: float) -> None:
    with pytest.raises(ValueError, match=rf"a '{outcome}' Verdict's score must lie in \[0, 1\] .*fix the judge"):
        Verdict(outcome=outcome, score=score, raw="")


@pytest.mark.parametrize("score", ["0.5", None, True, [0.5]])
def test_a_score_that_is_not_a_number_is_refused(score: object) -> None:
    with pytest.raises(ValueError, match="a Verdict's score must be a number"):
        Verdict(outcome="succeeded", score=score, raw="")


@pytest.mark.parametrize("score", [0.0, 1.0, 0.0625, 1, np.float32(0.5)])
def test_scores_in_range_are_kept(score: float) -> None:
    assert Verdict(outcome="succeeded", score=score, raw="").score == score


def test_an_unparsed_verdict_has_score_nan_and_no_other() -> None:
    assert math.isnan(Verdict.unparsed("raw", "why").score)
    with pytest.raises(ValueError, match=r"an unparsed Verdict's score must be NaN .*Verdict.unparsed\(raw, error\)"):
        Verdict(outcome="unparsed", score=0.0, raw="", error="why")
