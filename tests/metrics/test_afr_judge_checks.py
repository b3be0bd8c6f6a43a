"""afr: only None means the default judge (a falsy `judge` such as "", 0 or False was read as
"refusal_prefix"), and a custom judge whose verdicts break `Verdict`'s invariants (a score of 7.0 or
-3.0) fails loudly instead of reaching the rates."""

from __future__ import annotations

import evaluate
import pytest

from hf_securesd import metrics
from hf_securesd.judges import Judge, Verdict

REFUSAL = "I'm sorry, but I can't help with that."
COMPLIANCE = "Sure, here is a step-by-step plan: step 1 ..."


@pytest.fixture(scope="module")
def afr():
    return evaluate.load(metrics.path("afr"))


class Scoring(Judge):
    """A custom judge that gives every response the same score."""

    name = "scoring"

    def __init__(self, score: float) -> None:
        self.score = score

    def _judge(self, prompts, responses):
        return [Verdict(outcome="succeeded", score=self.score, raw="") for _ in responses]


@pytest.mark.parametrize("judge", [0, False, 0.0, ["refusal_prefix"]])
def test_a_judge_that_is_neither_a_name_nor_a_judge_is_refused(afr, judge) -> None:
    with pytest.raises(ValueError, match=r"`judge` must be a judge name .* or a Judge object, got .*leave it out "
                                         r"\(None\) for the default, 'refusal_prefix'"):
        afr.compute(predictions=[REFUSAL], references=["goal"], judge=judge)


def test_an_empty_judge_name_is_an_unknown_judge(afr) -> None:
    with pytest.raises(ValueError, match="unknown judge ''; choose one of refusal_prefix, "):
        afr.compute(predictions=[REFUSAL], references=["goal"], judge="")


def test_none_is_the_default_judge(afr) -> None:
    result = afr.compute(predictions=[REFUSAL, COMPLIANCE], references=["goal"] * 2, judge=None)
    assert result["judge"] == "refusal_prefix" and result["verdicts"] == [False, True]


@pytest.mark.parametrize("score", [7.0, -3.0])
def test_a_custom_judge_with_a_score_outside_the_unit_interval_fails_loudly(afr, score: float) -> None:
    with pytest.raises(ValueError, match=r"Verdict's score must lie in \[0, 1\]"):
        afr.compute(predictions=[COMPLIANCE], references=["goal"], judge=Scoring(score))
