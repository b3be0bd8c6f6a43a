"""calibration.json is standard JSON (an undefined figure is null, never the NaN token), and a rule
check that could not be made (a figure it compares is undefined) is null / "–", never "no"."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hf_securesd.bench.calibrate import Recommendation, check_text, left_out_note, recommend
from hf_securesd.bench.plan import LOSSLESS, RunConfig
from hf_securesd.schedules import Step
from hf_securesd.verifiers import MARS
from support import calibration_cell

VERIFIER = "mars(theta=0.5)"


def _cells(lossless_safety: float | None, safety: dict[int | None, float | None],
           spd: dict[int | None, float | None]) -> list[dict[str, Any]]:
    """Lossless, the relaxed verifier (None) and each swept L, on one safety and one utility task."""
    cells = [calibration_cell(LOSSLESS, "safety", lossless_safety, 1.2),
             calibration_cell(LOSSLESS, "utility", None, 1.2)]
    for length, prr in safety.items():
        config = RunConfig("speculative", MARS(theta=0.5), None if length is None else Step(L=length))
        cells += [calibration_cell(config, "safety", prr, spd[length]),
                  calibration_cell(config, "utility", None, spd[length])]
    return cells


def _strict(recommendation: Recommendation) -> Any:
    """calibration.json's text of `recommendation`, read back by a parser that refuses NaN tokens."""
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} token in calibration.json")

    return json.loads(json.dumps([recommendation.to_dict()], indent=2), parse_constant=refuse)[0]


def test_calibration_json_writes_an_undefined_prr_as_null_not_nan() -> None:
    chosen = recommend(_cells(None, {None: None, 1: None, 2: None}, {None: 0.47, 1: 1.72, 2: 0.46}), VERIFIER)
    written = _strict(chosen)
    assert written["lossless_safety_prr"] is None
    assert written["relaxed"]["safety_prr"] is None and written["relaxed"]["utility_prr"] is None
    assert all(level["safety_prr"] is None and level["utility_prr"] is None for level in written["levels"])
    assert written["levels"][0]["spd"] == pytest.approx(1.72)


def test_undefined_lossless_safety_leaves_the_safety_check_unmade_not_failed() -> None:
    chosen = recommend(_cells(None, {None: None, 1: None, 2: None}, {None: 0.47, 1: 1.72, 2: 0.30}), VERIFIER)
    assert chosen.L is None and "undefined" in chosen.reason
    # the SPD check compares defined figures, so it is made; the safety check is not
    assert [(level.L, level.safe, level.fast) for level in chosen.levels] == [(1, None, True), (2, None, False)]
    assert [(level["safe"], level["fast"]) for level in _strict(chosen)["levels"]] == [(None, True), (None, False)]
    assert [check_text(level.safe) for level in chosen.levels] == ["–", "–"]


def test_the_relaxed_verifier_row_holds_no_checks() -> None:
    chosen = recommend(_cells(1.0, {None: 0.4, 1: 1.0}, {None: 2.0, 1: 2.0}), VERIFIER)
    assert chosen.L == 1 and (chosen.relaxed.safe, chosen.relaxed.fast) == (None, None)
    assert (_strict(chosen)["relaxed"]["safe"], _strict(chosen)["relaxed"]["fast"]) == (None, None)


def test_a_level_without_a_safety_prr_is_unchecked_and_the_next_defined_level_is_chosen() -> None:
    chosen = recommend(_cells(1.0, {None: 0.4, 1: None, 2: 0.98}, {None: 2.0, 1: 2.0, 2: 1.9}), VERIFIER)
    assert [(level.L, level.safe, level.fast) for level in chosen.levels] == [(1, None, True), (2, True, True)]
    assert chosen.L == 2


def test_no_defined_safety_prr_at_any_level_is_said_so_not_called_unsafe() -> None:
    chosen = recommend(_cells(1.0, {None: 0.4, 1: None, 2: None}, {None: 2.0, 1: 2.0, 2: 2.0}), VERIFIER)
    assert chosen.L is None and all(level.safe is None for level in chosen.levels)
    assert "undefined at every L in [1, 2]" in chosen.reason and "try larger L" not in chosen.reason


def test_an_undefined_spd_leaves_the_speed_check_unmade() -> None:
    chosen = recommend(_cells(1.0, {None: 0.4, 1: 1.0}, {None: None, 1: 2.0}), VERIFIER)
    assert [(level.L, level.safe, level.fast) for level in chosen.levels] == [(1, True, None)]
    assert chosen.L is None and "was not checked" in chosen.reason and "below" not in chosen.reason
    assert _strict(chosen)["relaxed"]["spd"] is None


def test_a_larger_safe_L_whose_spd_is_undefined_is_named_not_called_too_slow() -> None:
    """L=1 is safe but slow and L=2 is safe with an undefined SPD: the reason said "no L keeps the
    speed-up", though L=2's speed was never checked."""
    chosen = recommend(_cells(1.0, {None: 0.4, 1: 1.0, 2: 1.0, 4: 1.0}, {None: 2.0, 1: 1.0, 2: None, 4: 1.1}),
                       VERIFIER)
    assert [(level.L, level.safe, level.fast) for level in chosen.levels] == [
        (1, True, False), (2, True, None), (4, True, False)]
    assert chosen.L is None and "no L keeps the speed-up" not in chosen.reason
    assert chosen.reason.startswith(
        "Step(L=1) is the smallest L within 0.05 of lossless safety, but its SPD 1.00 is below 90%")
    assert "the SPD of Step(L=2) (also within 0.05 of lossless safety) is undefined" in chosen.reason
    assert "not checked" in chosen.reason and "Step(L=4)" not in chosen.reason


def test_safe_levels_that_are_all_too_slow_are_said_to_lose_the_speed_up() -> None:
    chosen = recommend(_cells(1.0, {None: 0.4, 1: 1.0, 2: 1.0}, {None: 2.0, 1: 1.0, 2: 1.1}), VERIFIER)
    assert chosen.L is None and chosen.reason.endswith("no L keeps the speed-up")
    assert "not checked" not in chosen.reason


def test_check_text_shows_each_outcome() -> None:
    assert [check_text(True), check_text(False), check_text(None)] == ["yes", "no", "–"]


def _two_safety_tasks(safety: dict[int | None, tuple[float | None, float | None]]) -> list[dict[str, Any]]:
    """Lossless, the relaxed verifier (None) and each swept L on two safety tasks and one utility task;
    `safety` gives each configuration's PRR on the two safety tasks (the utility PRR is 0.9)."""
    cells = []
    for length, prrs in safety.items():
        config = LOSSLESS if length == 0 else RunConfig(
            "speculative", MARS(theta=0.5), None if length is None else Step(L=length))
        cells += [calibration_cell(config, "safety", prr, 2.0) for prr in prrs]
        cells.append(calibration_cell(config, "utility", 0.9, 2.0))
    return cells


def test_a_safety_prr_averaged_over_the_defined_tasks_says_how_many_it_left_out() -> None:
    """The mean over the safety tasks whose PRR is defined silently dropped the undefined ones (the `prr`
    module would call such a mean undefined); the policy stays, but the output now counts them."""
    cells = _two_safety_tasks({0: (0.95, None), None: (0.4, 0.6), 1: (0.95, None), 2: (0.95, 0.97)})
    chosen = recommend(cells, VERIFIER)
    assert chosen.lossless_safety_prr == 0.95 and chosen.lossless_safety_prr_left_out == 1
    assert [(level.L, level.safety_prr_left_out) for level in chosen.levels] == [(1, 1), (2, 0)]
    assert [level.safety_prr for level in chosen.levels] == pytest.approx([0.95, 0.96])
    assert chosen.relaxed.safety_prr_left_out == 0 and chosen.L == 1
    written = _strict(chosen)
    assert written["lossless_safety_prr_left_out"] == 1
    assert [level["safety_prr_left_out"] for level in written["levels"]] == [1, 0]
    assert [level["utility_prr_left_out"] for level in written["levels"]] == [0, 0]
    note = left_out_note(chosen)
    assert note is not None and "lossless safety PRR leaves out 1 task, safety PRR of L=1 leaves out 1 task" in note
    assert "whose PRR is undefined" in note and "L=2" not in note and "relaxed" not in note


def test_no_note_when_every_figure_averages_all_its_tasks_or_is_undefined() -> None:
    assert left_out_note(recommend(_two_safety_tasks({0: (1.0, 0.9), None: (0.4, 0.5), 1: (1.0, 0.9)}),
                                   VERIFIER)) is None
    # an undefined figure (every task left out) already shows as undefined; JSON still counts them
    undefined = recommend(_two_safety_tasks({0: (1.0, 0.9), None: (0.4, 0.5), 1: (None, None)}), VERIFIER)
    assert left_out_note(undefined) is None
    assert _strict(undefined)["levels"][0]["safety_prr"] is None
    assert _strict(undefined)["levels"][0]["safety_prr_left_out"] == 2
