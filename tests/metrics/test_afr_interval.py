"""`afr_ci` is the exact Clopper-Pearson interval of the failure count. It was a percentile bootstrap of
the mean of binary verdicts, which collapsed at small n: 20 refusals of 20 gave [1.0, 1.0], and at
n = 20 with AFR 0.95 its nominal 95% interval covered the true rate about 64% of the time."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import beta, binom

import evaluate

from hf_securesd import metrics
from hf_securesd.judges import Judge, Verdict

REFUSAL = "I'm sorry, but I can't help with that."
COMPLIANCE = "Sure, here is a step-by-step plan: step 1 ..."


@pytest.fixture(scope="module")
def afr():
    return evaluate.load(metrics.path("afr"))


def clopper_pearson(failures: int, n: int, level: float) -> tuple[float, float]:
    """The exact interval from the beta quantiles (independent of the metric's implementation)."""
    tail = (1 - level) / 2
    low = 0.0 if failures == 0 else beta.ppf(tail, failures, n - failures + 1)
    high = 1.0 if failures == n else beta.ppf(1 - tail, failures + 1, n - failures)
    return low, high


def interval(afr, failures: int, n: int, level: float = 0.95) -> list[float]:
    """`afr_ci` for `failures` refusals among `n` responses (the refusal-prefix judge, through
    `_compute`, which is what `compute` runs once `evaluate` has stored the inputs)."""
    responses = [REFUSAL] * failures + [COMPLIANCE] * (n - failures)
    result = afr._compute(predictions=responses, references=["goal"] * n, confidence_level=level)
    assert result["afr"] == pytest.approx(failures / n)
    return result["afr_ci"]


def test_twenty_refusals_of_twenty_give_the_exact_interval_not_a_point(afr):
    result = afr.compute(predictions=[REFUSAL] * 20, references=["goal"] * 20)
    assert result["afr"] == 1.0
    low, high = result["afr_ci"]
    assert low == pytest.approx(0.025 ** (1 / 20), rel=1e-9)  # 0.8316
    assert (low, high) == pytest.approx(clopper_pearson(20, 20, 0.95), rel=1e-9)


@pytest.mark.parametrize(("failures", "n", "level"), [(0, 20, 0.95), (13, 20, 0.9), (1, 2, 0.95), (1, 1, 0.99),
                                                      (40, 60, 0.95), (199, 200, 0.8)])
def test_the_interval_is_clopper_pearson_at_the_requested_level(afr, failures, n, level):
    assert interval(afr, failures, n, level) == pytest.approx(clopper_pearson(failures, n, level), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("n", range(1, 13))
def test_the_interval_never_has_zero_width_and_holds_the_estimate(afr, n):
    for failures in range(n + 1):
        low, high = interval(afr, failures, n)
        assert 0.0 <= low <= failures / n <= high <= 1.0
        assert high - low > 0.05, (failures, n, low, high)


@pytest.mark.parametrize(("n", "p"), [(10, 0.9), (20, 0.9), (20, 0.95), (20, 0.5)])
def test_exact_coverage_is_at_least_the_level(afr, n, p):
    """Coverage summed over every possible failure count, weighted by its binomial probability."""
    coverage = sum(binom.pmf(k, n, p) for k in range(n + 1) if (lambda ci: ci[0] <= p <= ci[1])(interval(afr, k, n)))
    assert coverage >= 0.95


def test_simulated_coverage_at_twenty_examples_and_afr_095(afr):
    rng = np.random.default_rng(20260)
    n, p, reps = 20, 0.95, 300
    hits = 0
    for _ in range(reps):
        refused = rng.random(n) < p
        responses = [REFUSAL if refuse else COMPLIANCE for refuse in refused]
        low, high = afr._compute(predictions=responses, references=["goal"] * n)["afr_ci"]
        assert high > low
        hits += low <= p <= high
    assert hits / reps >= 0.95 - 0.03  # the bootstrap interval covered about 0.64 here


class Fixed(Judge):
    """Returns the given verdicts in order."""

    name = "fixed"

    def __init__(self, outcomes):
        super().__init__()
        self.outcomes = outcomes

    def _judge(self, prompts, responses):
        return [Verdict.unparsed("?", "no answer") if outcome == "unparsed" else
                Verdict(outcome=outcome, score=float(outcome == "succeeded"), raw="") for outcome in self.outcomes]


@pytest.mark.parametrize(("policy", "failures", "n"), [("success", 2, 5), ("exclude", 2, 3)])
def test_unparsed_verdicts_enter_the_interval_as_they_enter_afr(afr, policy, failures, n):
    """Counted as successful attacks, an unparsed reply is one more trial and no failure; excluded, it
    is no trial."""
    judge = Fixed(["failed", "unparsed", "succeeded", "failed", "unparsed"])
    with pytest.warns(RuntimeWarning, match="2 of 5 judge replies were unparsed"):
        result = afr.compute(predictions=["a"] * 5, references=["g"] * 5, judge=judge, on_unparsed=policy)
    assert result["afr"] == pytest.approx(failures / n)
    assert result["afr_ci"] == pytest.approx(clopper_pearson(failures, n, 0.95), rel=1e-9)


@pytest.mark.parametrize("n_resamples", [1000, 1, -1, 2.0, False, "0"])
def test_a_resample_count_is_refused_naming_the_change(afr, n_resamples):
    with pytest.raises(ValueError, match=r"^`n_resamples` no longer applies to afr: afr_ci is an exact "
                                         r"Clopper-Pearson interval.*n_resamples=0 for no interval"):
        afr.compute(predictions=[REFUSAL, COMPLIANCE], references=["g", "g"], n_resamples=n_resamples)


@pytest.mark.parametrize("seed", [0, 1, -1, "0"])
def test_a_seed_is_refused_naming_the_change(afr, seed):
    with pytest.raises(ValueError, match=r"^`seed` no longer applies to afr: afr_ci is an exact Clopper-Pearson"
                                         r".*nothing is drawn at random.*leave seed out"):
        afr.compute(predictions=[REFUSAL, COMPLIANCE], references=["g", "g"], seed=seed)


def test_n_resamples_zero_still_leaves_the_interval_out(afr):
    result = afr.compute(predictions=[REFUSAL, COMPLIANCE], references=["g", "g"], n_resamples=0)
    assert (result["afr"], result["afr_ci"]) == (0.5, None)
