"""`Health.flag_nonfinite`: a NaN or an infinity anywhere is flagged, finite values never are — also
when their sum overflows (the one-reduction check's exact fallback)."""

from __future__ import annotations

import pytest
import torch

from hf_securesd.prefixes import Health


def problem_for(values: torch.Tensor) -> str | None:
    health = Health()
    health.flag_nonfinite("target_model", values)
    return health.problem()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_one_nonfinite_entry_is_flagged(bad: float) -> None:
    values = torch.randn(3, 6, 259)
    values[2, 5, 258] = bad
    assert problem_for(values) == Health.MESSAGES["target_model"]


def test_infinities_of_both_signs_are_flagged() -> None:
    values = torch.zeros(2, 8)
    values[0, 0], values[1, 1] = float("inf"), float("-inf")  # their sum is NaN
    assert problem_for(values) == Health.MESSAGES["target_model"]


def test_finite_values_whose_sum_overflows_are_not_flagged() -> None:
    values = torch.full((4, 16), 3e38)
    assert not torch.isfinite(values.sum())
    assert problem_for(values) is None
    assert problem_for(-values) is None


def test_flags_are_read_once_and_cleared() -> None:
    health = Health()
    bad = torch.tensor([1.0, float("nan")])
    health.flag_nonfinite("draft_model", torch.ones(3))
    health.flag_nonfinite("target_model", bad)
    assert health.problem() == Health.MESSAGES["target_model"]
    assert health.problem() is None
    health.flag_nonfinite("draft_model", bad)
    health.flag_nonfinite("target_model", bad)
    assert health.problem() == Health.MESSAGES["draft_model"]  # the first in MESSAGES' order
