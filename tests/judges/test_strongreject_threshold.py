"""StrongREJECT's `threshold`: a bool or a string (even "0.5") is refused naming the range, never compared
(a TypeError from `<=`) or read as 0.0; the same message reaches `--judge-option`, and judge options
the judge does not take are refused by `get_judge` as by `securesd bench`."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf_securesd.judges import check_judge_options, get_judge
from hf_securesd.judges.strongreject import StrongRejectJudge, check_threshold

RUBRIC = "{forbidden_prompt}\n{response}"


@pytest.mark.parametrize("threshold", ["0.5", "abc", False, True, None, [0.5], np.bool_(False)])
def test_a_threshold_that_is_not_a_number_is_a_type_error_naming_the_range(threshold) -> None:
    with pytest.raises(TypeError, match=r"threshold must be a number in \[0, 1\) \(the StrongREJECT score"):
        StrongRejectJudge(backend="openai", rubric=RUBRIC, threshold=threshold)


@pytest.mark.parametrize("threshold", [1.0, -0.1, math.nan, math.inf])
def test_a_threshold_out_of_range_is_a_value_error_naming_the_range(threshold) -> None:
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\)"):
        check_threshold(threshold)


@pytest.mark.parametrize(("threshold", "expected"), [(0, 0.0), (0.25, 0.25), (np.float32(0.75), 0.75)])
def test_numbers_in_range_are_kept_as_floats(threshold, expected: float) -> None:
    judge = StrongRejectJudge(backend="openai", rubric=RUBRIC, threshold=threshold)
    assert judge.threshold == expected and type(judge.threshold) is float


@pytest.mark.parametrize("backend", ["openai", "transformers"])
def test_judge_option_threshold_text_is_refused_before_generation(backend: str) -> None:
    """`securesd bench --judge-option threshold=abc` (the CLI passes the text on): one ValueError naming
    the option and its range, also for the transformers backend, whose judge is not built here."""
    with pytest.raises(ValueError, match=r"judge 'strongreject' options .*threshold must be a number in \[0, 1\)"):
        check_judge_options("strongreject", {"backend": backend, "rubric": RUBRIC, "threshold": "abc"})
    # a transformers judge needs its model named (checked before generation too, without loading it)
    check_judge_options("strongreject", {"backend": "transformers", "threshold": 0.25,
                                         "backend_kwargs": {"model": "org/judge"}})


def test_get_judge_names_an_option_the_judge_does_not_take() -> None:
    with pytest.raises(ValueError, match="judge 'refusal_prefix' takes no option 'prefix_lst'; its options are "
                                         r"prefix_list, prefixes, match\.$"):
        get_judge("refusal_prefix", prefix_lst="gcg_evaluate")
    with pytest.raises(ValueError, match=r"takes no option 'foo'; .* \(--judge-option KEY=VALUE\)\.$"):
        check_judge_options("refusal_prefix", {"foo": 1})
