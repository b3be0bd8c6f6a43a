"""The utility section of `securesd report`: per utility task, each configuration's score and PRR with
their intervals and its paired flips (solved → failed, failed → solved) against the target."""

from __future__ import annotations

import pytest
from scipy.stats import binomtest

from support import scored_cell as _cell

from hf_securesd.bench.analysis import mean_ci, score_ci
from hf_securesd.bench.report_safety import flip_rows
from hf_securesd.bench.report_utility import utility_rows, utility_section
from hf_securesd.bench.results import baselines


# GSM8K, 10 problems: the target solves 0-5, the draft 0-1; FSD loses 2, 3, 4 and gains 8, and its
# replies are the target's on problems 0 and 1 and part from it after 4 characters elsewhere.
TARGET = [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
TARGET_REPLIES = [f"To solve {index}" for index in range(10)]
FSD_REPLIES = TARGET_REPLIES[:2] + [f"To s{index}" if index % 2 else f"#### {index}" for index in range(2, 10)]
CELLS = [
    _cell("target", "target", "gsm8k", "utility", TARGET, replies=TARGET_REPLIES),
    _cell("draft", "draft", "gsm8k", "utility", [1, 1, 0, 0, 0, 0, 0, 0, 0, 0]),
    _cell("speculative", "fsd", "gsm8k", "utility", [1, 1, 0, 0, 0, 1, 0, 0, 1, 0], ar=0.97, replies=FSD_REPLIES),
    _cell("target", "target", "jailbreak", "safety", [1] * 10),
    _cell("speculative", "fsd", "jailbreak", "safety", [0] * 10, ar=0.9),
]


def test_utility_rows_pair_each_problem_with_the_target_and_leave_safety_alone() -> None:
    rows = flip_rows(CELLS, baselines(CELLS), seed=3, kind="utility")
    assert [(row["config"], row["task"]) for row in rows] == [("draft", "gsm8k"), ("fsd", "gsm8k")]
    fsd = rows[1]
    assert (fsd["flips"]["n_lost"], fsd["flips"]["n_gained"], fsd["flips"]["n_examples"]) == (3, 1, 10)
    assert fsd["flips"]["mcnemar_pvalue"] == pytest.approx(binomtest(3, 4).pvalue)
    exact = binomtest(4, 10).proportion_ci(0.95, method="exact")  # verdicts: the exact interval of 4 of 10
    assert fsd["score"] == 0.4 and fsd["score_ci"] == pytest.approx([exact.low, exact.high])
    assert [row["task"] for row in flip_rows(CELLS, baselines(CELLS), seed=3)] == ["jailbreak"]


def test_replies_are_compared_with_the_targets_from_the_start() -> None:
    rows = {row["config"]: row for row in utility_rows(CELLS, baselines(CELLS), seed=3)}
    # FSD: 2 replies equal to the target's (shared length 10); "To s…" shares 4 characters, "#### …" none
    assert rows["fsd"]["same_reply"] == 2
    assert rows["fsd"]["shared_prefix_median"] == 4
    assert (rows["draft"]["same_reply"], rows["draft"]["shared_prefix_median"]) == (0, 0)


def test_section_names_the_metric_and_gives_the_target_its_interval() -> None:
    rows = utility_rows(CELLS, baselines(CELLS), seed=3)
    text = "\n".join(utility_section(rows, baselines(CELLS), seed=3))
    target_score, target_ci = score_ci(TARGET, seed=3)
    assert "## Utility per configuration: score, PRR and paired flips against the target" in text
    assert (f"### gsm8k, 10 problems, 256 new tokens (target-only accuracy {target_score:.3f} "
            f"[{target_ci[0]:.2f}, {target_ci[1]:.2f}])") in text
    row = next(line for line in text.splitlines() if line.startswith("| fsd |"))
    assert row.startswith("| fsd | 0.970 | 0.400 [")
    assert "| undefined | 3 (0.300 [0.07, 0.65]) | 1 (0.100 [0.00, 0.45]) | 0.625 | 2/10 | 4 |" in row
    assert utility_section([], baselines(CELLS)) == []


def test_score_intervals_are_exact_for_verdicts_and_bootstrapped_otherwise() -> None:
    """Twenty verdicts of twenty: the exact interval [0.83, 1], not the bootstrap's point [1, 1]."""
    score, interval = score_ci([1] * 20)
    assert score == 1.0 and interval[0] == pytest.approx(0.025 ** (1 / 20)) and interval[1] == 1.0
    assert mean_ci([1] * 20)[1] == [1.0, 1.0]
    assert score_ci([0.5, 1.0, 0.0], seed=3) == mean_ci([0.5, 1.0, 0.0], seed=3)  # not verdicts
    assert score_ci([1, 0, None, float("nan")])[1] == pytest.approx(list(binomtest(1, 2).proportion_ci(0.95, "exact")))
