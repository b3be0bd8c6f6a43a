"""The safety–utility asymmetry section of `securesd report`: per configuration, PRR on a safety
and a utility task and their difference with a bootstrap interval."""

from __future__ import annotations

import numpy as np
import pytest
from support import scored_cell as _cell

from hf_securesd.bench.analysis import compute_prr
from hf_securesd.bench.report_asymmetry import asymmetry_rows, asymmetry_section, prr_resamples, runs_both_kinds
from hf_securesd.bench.results import baselines


def _study(safety_method: list[int], utility_method: list[int], safety_draft: list[int] | None = None) -> list[dict]:
    """A jailbreak task of 40 prompts (target refuses all, draft 10) and a GSM8K task of 40
    problems (target solves 30, draft 0), with one speculative configuration on both."""
    safety_target = [1] * 40
    safety_draft = [1] * 10 + [0] * 30 if safety_draft is None else safety_draft
    utility_target = [1] * 30 + [0] * 10
    utility_draft = [0] * 40
    return [
        _cell("target", "target", "jailbreak", "safety", safety_target),
        _cell("draft", "draft", "jailbreak", "safety", safety_draft),
        _cell("speculative", "fsd", "jailbreak", "safety", safety_method, ar=0.9),
        _cell("target", "target", "gsm8k", "utility", utility_target),
        _cell("draft", "draft", "gsm8k", "utility", utility_draft),
        _cell("speculative", "fsd", "gsm8k", "utility", utility_method, ar=0.95),
    ]


def test_safety_lost_and_utility_kept_is_a_positive_asymmetry_with_an_interval_above_zero() -> None:
    # safety: the method refuses like the draft (PRR 0); utility: it solves the target's 30 (PRR 1)
    cells = _study(safety_method=[1] * 10 + [0] * 30, utility_method=[1] * 30 + [0] * 10)
    (row,) = asymmetry_rows(cells, baselines(cells))
    assert row["config"] == "fsd"
    assert row["safety"]["prr"] == pytest.approx(0.0) and row["utility"]["prr"] == pytest.approx(1.0)
    assert row["difference"] == pytest.approx(1.0)
    assert row["difference_ci"] == pytest.approx([1.0, 1.0])
    assert (row["safety"]["acceptance_rate"], row["utility"]["acceptance_rate"]) == (0.9, 0.95)


def test_no_asymmetry_gives_an_interval_around_zero() -> None:
    # both halfway: safety 25 of 40 refused (draft 10, target 40), utility 15 of the target's 30
    safety = [1] * 25 + [0] * 15
    utility = [1] * 15 + [0] * 25
    cells = _study(safety_method=safety, utility_method=utility)
    (row,) = asymmetry_rows(cells, baselines(cells))
    assert row["difference"] == pytest.approx(0.0)
    low, high = row["difference_ci"]
    assert low < -0.1 and high > 0.1  # 40 prompts each: a wide interval on both sides of 0


def test_each_tasks_interval_is_the_prr_modules_own() -> None:
    rng = np.random.default_rng(3)
    safety = list(rng.integers(0, 2, 40))
    utility = list(rng.integers(0, 2, 40))
    cells = _study(safety_method=safety, utility_method=utility)
    (row,) = asymmetry_rows(cells, baselines(cells), seed=5)
    for kind, index in (("safety", 0), ("utility", 3)):
        method, target, draft = (cells[index + offset]["scores"] for offset in (2, 0, 1))
        reference = compute_prr(method, target, draft, seed=5)
        assert row[kind]["prr"] == pytest.approx(reference["prr"])
        assert row[kind]["prr_ci"] == pytest.approx(reference["prr_ci"])


def test_a_safety_task_without_a_measurable_gap_is_left_out() -> None:
    # the draft refuses 39 of the target's 40: the gap's interval holds 0, PRR means nothing there
    cells = _study(safety_method=[1] * 40, utility_method=[1] * 30 + [0] * 10, safety_draft=[1] * 39 + [0])
    assert asymmetry_rows(cells, baselines(cells)) == []
    assert runs_both_kinds(cells)
    text = "\n".join(asymmetry_section([], both_kinds=True))  # the section says why it has no row
    assert text.startswith("## Safety–utility asymmetry per configuration") and "do not differ measurably" in text
    assert asymmetry_section([], both_kinds=False) == []  # nothing ran on both kinds: no section
    assert not runs_both_kinds([cell for cell in cells if cell["task_kind"] == "safety"])


def test_resamples_are_nan_where_the_resampled_gap_vanishes() -> None:
    prr, gap = prr_resamples([1.0, 0.0], [1.0, 0.0], [0.0, 0.0], np.random.default_rng(0))
    vanished = gap == 0.0  # both picks were the second example
    assert vanished.any() and np.isnan(prr[vanished]).all()
    assert np.allclose(prr[~vanished], 1.0)


def test_section_renders_one_row_per_pair() -> None:
    cells = _study(safety_method=[1] * 10 + [0] * 30, utility_method=[1] * 30 + [0] * 10)
    text = "\n".join(asymmetry_section(asymmetry_rows(cells, baselines(cells)), runs_both_kinds(cells)))
    assert "## Safety–utility asymmetry per configuration" in text
    assert "| fsd | jailbreak | 0.900 | 0.000 [0.00, 0.00] | gsm8k | 0.950 | 1.000 [1.00, 1.00] | 1.000 [1.00, 1.00] |" in text


def test_an_excluded_verdict_is_left_out_as_in_the_per_configuration_tables() -> None:
    """A judge verdict excluded by `unparsed=exclude` (score NaN) used to make the section say
    "undefined" while the cell's own table showed its PRR: both now leave the example out."""
    from hf_securesd.bench.analysis import derived_fields

    safety_method = [1.0] * 25 + [0.0] * 14 + [float("nan")]
    cells = _study(safety_method=safety_method, utility_method=[1] * 15 + [0] * 25)
    for each in cells:
        each["seconds"], each["sessions"] = [1.0] * len(each["scores"]), ["s"]
    base = baselines(cells)
    cell = cells[2]
    own = derived_fields(cell, base, seed=0)
    (row,) = asymmetry_rows(cells, base, seed=0)
    reference = (25 / 39 - 10 / 39) / (1.0 - 10 / 39)  # the excluded prompt left out of all three cells
    assert own["prr"] == pytest.approx(reference) and row["safety"]["prr"] == pytest.approx(reference)
    assert row["safety"]["prr_ci"] == pytest.approx(own["prr_ci"])
    assert row["difference"] == pytest.approx(0.5 - reference)


def test_an_example_recorded_twice_in_a_cell_is_refused_not_misaligned() -> None:
    from hf_securesd.bench.analysis import aligned

    cell = _cell("target", "target", "jailbreak", "safety", [1, 0, 1])
    cell["example_ids"] = ["a", "a", "b"]
    with pytest.raises(ValueError, match="holds example 'a' more than once"):
        aligned(cell, "scores", ["a", "b"])


def test_a_task_of_one_example_has_no_interval_as_in_the_per_configuration_tables() -> None:
    """The section drew its own bootstrap, which gave [1.0, 1.0] for one example where the `prr`
    module (the per-configuration tables) gives no interval; the difference had one too."""
    cells = _study(safety_method=[1] * 10 + [0] * 30, utility_method=[1] * 30 + [0] * 10)[:3] + [
        _cell("target", "target", "gsm8k", "utility", [1]),
        _cell("draft", "draft", "gsm8k", "utility", [0]),
        _cell("speculative", "fsd", "gsm8k", "utility", [1], ar=0.95),
    ]
    (row,) = asymmetry_rows(cells, baselines(cells))
    assert compute_prr([1], [1], [0])["prr_ci"] is None
    assert row["utility"]["prr"] == 1.0 and row["utility"]["prr_ci"] is None
    assert row["difference"] == pytest.approx(1.0) and row["difference_ci"] is None
    assert row["undefined_resamples"] == 0
    assert "| gsm8k | 0.950 | 1.000 | 1.000 |" in "\n".join(asymmetry_section([row], both_kinds=True))


def _scaled_study(scale: float, utility_gap: float) -> list[dict]:
    """`_study`'s safety task, and a utility task of 40 examples scored `scale` by the target,
    `scale - utility_gap` by the draft and halfway between by the configuration."""
    safety = _study(safety_method=[1] * 25 + [0] * 15, utility_method=[0] * 40)[:3]
    return safety + [
        _cell("target", "target", "gsm8k", "utility", [scale] * 40),
        _cell("draft", "draft", "gsm8k", "utility", [scale - utility_gap] * 40),
        _cell("speculative", "fsd", "gsm8k", "utility", [scale - utility_gap / 2] * 40, ar=0.95),
    ]


def _utility_prr(cells: list[dict]) -> dict:
    """The `prr` module's result for the utility task of `_scaled_study`."""
    target, draft, method = (cell["scores"] for cell in cells[3:])
    return compute_prr(method, target, draft)


def test_a_target_draft_tie_is_the_prr_modules_relative_one() -> None:
    """The section's tie rule was an absolute 1e-12: it gave a PRR where the module's (relative to the
    scores' magnitude) calls it undefined, and dropped the row of scores near 1e-12 whose PRR is 0.5."""
    huge = _scaled_study(1e6, 5e-7)  # a gap of 5e-7 in scores of 1e6: a rounding tie, PRR undefined
    assert _utility_prr(huge)["undefined"]
    assert asymmetry_rows(huge, baselines(huge)) == []
    tiny = _scaled_study(1e-12, 5e-13)  # a real gap between tiny scores: PRR 0.5
    (row,) = asymmetry_rows(tiny, baselines(tiny))
    assert row["utility"]["prr"] == pytest.approx(0.5) == _utility_prr(tiny)["prr"]
    assert row["difference_ci"] is not None and row["undefined_resamples"] == 0


def test_resamples_tie_by_the_prr_modules_relative_rule() -> None:
    # a resampled gap of 1e-7 between means near 1e6 is a tie; near 1e-12 a gap of 5e-13 is not
    huge, _ = prr_resamples([1e6] * 2, [1e6 + 1e-7] * 2, [1e6] * 2, np.random.default_rng(0))
    assert np.isnan(huge).all()
    tiny, _ = prr_resamples([7.5e-13] * 2, [1e-12] * 2, [5e-13] * 2, np.random.default_rng(0))
    assert np.allclose(tiny, 0.5)
