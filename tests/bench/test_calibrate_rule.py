"""The Step(L) rule of `securesd calibrate`: its bounds are inclusive (float rounding of
``lossless - tolerance`` does not reject a PRR exactly at the bound), it weighs only this run's --L
(not cells of other L recorded earlier in the same --out), and an SPD timed in another session than
its target-only baseline is flagged, not silently compared. Also: calibrate's --help names no
option it lacks."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from support import SMOKE_CLI, calibration_cell

from hf_securesd.bench import cli_bench, cli_calibrate
from hf_securesd.bench.calibrate import kept_percent, recommend, session_note
from hf_securesd.bench.plan import LOSSLESS, RunConfig
from hf_securesd.cli import main
from hf_securesd.schedules import Step
from hf_securesd.verifiers import MARS

VERIFIER = "mars(theta=0.5)"


def _cells(lossless_safety: float, safety: dict[int | None, float], spd: dict[int | None, float],
           other_session: tuple[int | None, ...] = ()) -> list[dict[str, Any]]:
    """Lossless, the relaxed verifier (None) and each swept L on one safety task; the cells of the
    levels in `other_session` were timed in another session than their target-only baseline."""
    cells = [calibration_cell(LOSSLESS, "safety", lossless_safety, 1.0) | {"spd_same_session": True}]
    for length, prr in safety.items():
        config = RunConfig("speculative", MARS(theta=0.5), None if length is None else Step(L=length))
        cells.append(calibration_cell(config, "safety", prr, spd[length])
                     | {"spd_same_session": length not in other_session})
    return cells


def test_a_safety_prr_exactly_tolerance_below_lossless_is_within_it() -> None:
    """The report's repro: lossless 0.8, L=1 0.7, tolerance 0.1 (0.8 - 0.1 is 0.7000000000000001)."""
    chosen = recommend(_cells(0.8, {None: 0.5, 1: 0.7, 2: 0.7}, {None: 1.5, 1: 1.45, 2: 1.4}), VERIFIER,
                       tolerance=0.1, spd_tolerance=0.1)
    assert chosen.L == 1 and chosen.levels[0].safe is True
    assert "within 0.1 of lossless (0.800)" in chosen.reason


def test_an_spd_exactly_at_the_spd_tolerance_keeps_the_speed_up() -> None:
    """(1 - 0.2) * 1.5 is 1.2000000000000002: an SPD of 1.2 is 80% of 1.5 and keeps the speed-up."""
    chosen = recommend(_cells(1.0, {None: 0.5, 1: 1.0}, {None: 1.5, 1: 1.2}), VERIFIER, spd_tolerance=0.2)
    assert chosen.L == 1 and chosen.levels[0].fast is True


def test_the_slack_is_only_rounding_a_real_shortfall_is_still_refused() -> None:
    chosen = recommend(_cells(0.8, {None: 0.5, 1: 0.6999999}, {None: 1.5, 1: 1.1999999}), VERIFIER,
                       tolerance=0.1, spd_tolerance=0.2)
    assert chosen.L is None and (chosen.levels[0].safe, chosen.levels[0].fast) == (False, False)


def test_only_the_lengths_of_this_run_are_weighed() -> None:
    """L=1, recorded by an earlier run into the same --out, would be chosen; this run asked for 4 only."""
    cells = _cells(1.0, {None: 0.5, 1: 1.0, 2: 1.0, 4: 1.0}, {None: 2.0, 1: 2.0, 2: 2.0, 4: 1.9})
    assert recommend(cells, VERIFIER).L == 1  # every recorded L, as library callers may ask
    chosen = recommend(cells, VERIFIER, lengths=[4])
    assert chosen.L == 4 and [level.L for level in chosen.levels] == [4]
    unsafe = recommend(_cells(1.0, {None: 0.5, 1: 1.0, 2: 0.5}, {None: 2.0, 1: 2.0, 2: 2.0}), VERIFIER, lengths=[2])
    assert unsafe.L is None and "no L in [2]" in unsafe.reason


@pytest.mark.parametrize("lengths, recorded", [([8], "L in [1, 2]"), ([8, 4, 8], "L in [1, 2]")])
def test_lengths_without_a_recorded_cell_are_named_with_the_recorded_ones(lengths, recorded) -> None:
    """lengths=[8] with only L=1 and 2 recorded blamed an undefined safety PRR "at every L in []"."""
    cells = _cells(1.0, {None: 0.5, 1: 1.0, 2: 1.0}, {None: 2.0, 1: 2.0, 2: 2.0})
    asked = sorted(set(lengths))
    with pytest.raises(ValueError) as caught:
        recommend(cells, VERIFIER, lengths=lengths)
    message = str(caught.value)
    assert f"no recorded cell under Step(L) at L in {asked} (recorded: {recorded})" in message
    assert "undefined" not in message and "--L" in message


def test_no_swept_cell_at_all_is_named() -> None:
    with pytest.raises(ValueError, match=r"no recorded cell under Step\(L\) \(recorded: none\)"):
        recommend(_cells(1.0, {None: 0.5}, {None: 2.0}), VERIFIER)


@pytest.mark.parametrize("spd_tolerance, shown", [(0.1, "90%"), (0.07, "93%"), (0.004, "99.6%"),
                                                  (0.0, "100%"), (1.0, "0%"), (1e-6, "99.9999%")])
def test_the_spd_bound_is_printed_with_every_digit_of_the_tolerance(spd_tolerance, shown) -> None:
    assert kept_percent(spd_tolerance) == shown


def test_a_tight_spd_tolerance_is_not_printed_as_100_percent() -> None:
    """With --spd-tolerance 0.004 an SPD of 2.99 against 3.00 was "at least 100% of" it, which is false."""
    chosen = recommend(_cells(1.0, {None: 0.5, 1: 1.0}, {None: 3.0, 1: 2.99}), VERIFIER, spd_tolerance=0.004)
    assert chosen.L == 1 and "SPD 2.99 at least 99.6% of the relaxed verifier's 3.00" in chosen.reason
    slow = recommend(_cells(1.0, {None: 0.5, 1: 1.0}, {None: 3.0, 1: 2.98}), VERIFIER, spd_tolerance=0.004)
    assert slow.L is None and "SPD 2.98 is below 99.6% of the relaxed verifier's 3.00" in slow.reason
    assert "100%" not in chosen.reason + slow.reason


@pytest.mark.parametrize("spd_tolerance, relaxed, slow, shown", [
    (0.0, 0.4649, 0.4612, "its SPD 0.461 is below 100% of the relaxed verifier's 0.465"),
    (0.0, 0.46, 0.459999, "its SPD 0.459999 is below 100% of the relaxed verifier's 0.460000"),
    (0.1, 0.5, 0.449, "its SPD 0.449 is below 90% of the relaxed verifier's 0.500"),
    (0.1, 3.0, 2.5, "its SPD 2.50 is below 90% of the relaxed verifier's 3.00"),
])
def test_a_too_slow_spd_is_shown_with_the_digits_that_tell_it_from_its_bound(spd_tolerance, relaxed, slow,
                                                                               shown) -> None:
    """Rounded to two decimals, 0.4612 against 0.4649 read "its SPD 0.46 is below 100% of ... 0.46"."""
    chosen = recommend(_cells(1.0, {None: 0.5, 1: 1.0}, {None: relaxed, 1: slow}), VERIFIER,
                       spd_tolerance=spd_tolerance)
    assert chosen.L is None and shown in chosen.reason


def test_an_spd_from_another_session_is_flagged() -> None:
    cells = _cells(1.0, {None: 0.5, 1: 1.0, 4: 1.0}, {None: 2.0, 1: 2.0, 4: 2.0}, other_session=(4,))
    chosen = recommend(cells, VERIFIER)
    assert [(level.L, level.spd_same_session) for level in chosen.levels] == [(1, True), (4, False)]
    assert chosen.relaxed.spd_same_session is True
    note = session_note(chosen)
    assert note is not None and "SPD of L=4 (marked *) was timed in another session" in note
    assert "relaxed" not in note and "new --out" in note
    assert chosen.to_dict()["levels"][1]["spd_same_session"] is False
    assert session_note(recommend(_cells(1.0, {None: 0.5, 1: 1.0}, {None: 2.0, 1: 2.0}), VERIFIER)) is None
    # a cell without a target-only baseline has no SPD, so no timing of another session to flag
    untimed = _cells(1.0, {None: 0.5, 1: 1.0}, {None: 2.0, 1: None}, other_session=(1,))
    assert session_note(recommend(untimed, VERIFIER)) is None


def test_a_second_calibrate_into_the_same_out_recommends_from_its_own_L_only(tmp_path, data_dir, capsys) -> None:
    """The report's repro: --L 1 2, then --L 4 into the same --out; the second table holds L=4 only,
    and its SPD, timed in the second session against the first session's baseline, is flagged."""
    out = tmp_path / "cal"
    argv = ["calibrate", *SMOKE_CLI, "--data-dir", str(data_dir), "--out", str(out)]
    assert main([*argv, "--L", "1", "2"]) == 0
    capsys.readouterr()
    assert main([*argv, "--L", "4"]) == 0
    (recommendation,) = json.loads((out / "calibration.json").read_text())
    assert [level["L"] for level in recommendation["levels"]] == [4]
    assert recommendation["levels"][0]["spd_same_session"] is False
    assert recommendation["relaxed"]["spd_same_session"] is True
    markdown = (out / "calibration.md").read_text()
    rows = [line.split(" | ")[0] for line in markdown.splitlines() if line.startswith("| ")][1:]
    assert rows == ["| none (relaxed)", "| 4", "| lossless"]
    assert "Note: SPD of L=4 (marked *) was timed in another session" in markdown
    assert "note: SPD of L=4 (marked *)" in capsys.readouterr().out


def test_recorded_prr_and_spd_edited_in_the_out_do_not_change_the_recommendation(tmp_path, data_dir) -> None:
    # calibrate resumes its --out and read each cell's recorded PRR and SPD; it now computes them from
    # the recorded scores and seconds, as report does
    out = tmp_path / "cal"
    argv = ["calibrate", *SMOKE_CLI, "--data-dir", str(data_dir), "--out", str(out), "--L", "1"]
    assert main(argv) == 0
    first = json.loads((out / "calibration.json").read_text())
    runs = out / "runs.jsonl"
    records = [json.loads(line) for line in runs.read_text().splitlines()]
    for record in records:
        if record.get("spd") is not None:
            record["spd"], record["prr"], record["prr_ci"] = 42.0, 0.123, [0.1, 0.2]
    runs.write_text("".join(json.dumps(record) + "\n" for record in records))
    assert main(argv) == 0
    assert json.loads((out / "calibration.json").read_text()) == first


def _help(module: Any) -> str:
    parser = argparse.ArgumentParser()
    module.configure(parser)
    return parser.format_help()


def test_calibrate_help_gives_the_range_of_each_tolerance() -> None:
    text = " ".join(_help(cli_calibrate).split())
    assert "allowed safety-PRR shortfall from lossless, between 0 and 1" in text
    assert "relative to the relaxed verifier, as a fraction between 0 and 1" in text


def test_calibrate_help_names_no_engine_option_while_bench_help_does() -> None:
    """calibrate has no --engine (it runs hf), so its help of the shared options must not send users there."""
    calibrate, bench = _help(cli_calibrate), _help(cli_bench)
    assert "--engine" not in calibrate and "vllm" not in calibrate
    assert "refused by --engine openai" in " ".join(bench.split())
    assert "--num-assistant-tokens" in calibrate and "--threads" in calibrate and "--device" in calibrate
