"""Segment schedules in the harness: `securesd bench --schedules` parses them (JSON), their keys and
recorded dicts round-trip, text boundaries are resolved with the target tokenizer without changing the
key, and `securesd calibrate` sweeps L of the answer segment."""

from __future__ import annotations

import argparse

import pytest

from hf_securesd import Linear, Segments, Step
from hf_securesd.bench import cli_calibrate
from hf_securesd.bench.calibrate import calibration_configs, recommend
from hf_securesd.bench.cli_calibrate import segments_template
from hf_securesd.bench.plan import (
    LOSSLESS,
    RunConfig,
    parse_schedule,
    resolve_text_boundaries,
    schedule_label,
    sweep_configs,
)
from hf_securesd.tiny import byte_tokenizer
from hf_securesd.verifiers import MARS

SPEC = (
    '{"schedule": "segments", "boundary": "</think>", "before": null, '
    '"after": {"schedule": "step", "L": 4}}'
)


def test_bench_parses_a_json_segment_schedule():
    schedule = parse_schedule(SPEC)
    assert schedule == Segments("</think>", before=None, after=Step(L=4))
    assert schedule_label(schedule) == "segments(boundary='</think>',before=none,after=step(L=4))"
    assert schedule_label(Segments([[1, 2], "x"], before=Step(L=1))) == (
        "segments(boundary=[[1, 2], 'x'],before=step(L=1),after=lossless)"
    )
    configs = sweep_configs(["mars:0.5"], [None, schedule])
    assert [config.key for config in configs] == [
        "lossless",
        "mars(theta=0.5)",
        "mars(theta=0.5)+segments(boundary='</think>',before=none,after=step(L=4))",
    ]
    assert RunConfig.from_dict(configs[2].to_dict()) == configs[2]
    assert parse_schedule('{"schedule": "step", "L": 2}') == Step(L=2)  # any schedule's dict form


@pytest.mark.parametrize(
    "spec, match",
    [
        ("{nope", "not valid JSON"),
        ('{"L": 1}', "object with a 'schedule' name"),
        ('{"schedule": "segments"}', r"needs the option\(s\) \['boundary'\]"),
        ('{"schedule": "segments", "boundary": "x", "after": "exact"}', "'lossless'"),
        ('{"schedule": "segments", "boundary": "x", "bogus": 1}', r"no option\(s\) \['bogus'\]"),
    ],
)
def test_bad_json_schedules_are_refused(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_schedule(spec)


def test_text_boundaries_are_resolved_and_keys_kept():
    configs = sweep_configs(["mars:0.5"], [parse_schedule(SPEC.replace("</think>", "ab")), Step(L=1)])
    resolved = resolve_text_boundaries(configs, byte_tokenizer())
    assert [config.key for config in resolved] == [config.key for config in configs]
    assert [config.to_dict() for config in resolved] == [config.to_dict() for config in configs]
    assert resolved[1].schedule.token_boundaries == ((97, 98),)
    assert resolved[2] is configs[2]


def test_calibrate_sweeps_the_answer_segment():
    template = segments_template(["</think>", "ids:7,8"], "step:1")
    assert template == Segments(["</think>", [7, 8]], before=Step(L=1))
    configs = calibration_configs(["mars:0.5"], [2, 1], template)
    assert [config.schedule for config in configs] == [
        None,
        None,
        Segments(["</think>", [7, 8]], before=Step(L=1), after=Step(L=1)),
        Segments(["</think>", [7, 8]], before=Step(L=1), after=Step(L=2)),
    ]
    with pytest.raises(ValueError, match="needs --segment-boundary"):
        segments_template(None, "step:1")
    with pytest.raises(ValueError, match="ids:151668"):
        segments_template(["ids:x"], "none")
    assert segments_template(["a"], "lossless").before == "lossless"


def _cell(config: RunConfig, kind: str, prr: float, spd: float) -> dict:
    return {
        "cell": f"{config.key}|{kind}",
        "config_key": config.key,
        "config": config.to_dict(),
        "knob_value": None if config.verifier.name == "lossless" else config.verifier.theta,
        "schedule_label": None if config.schedule is None else schedule_label(config.schedule),
        "task_kind": kind,
        "prr": prr,
        "spd": spd,
        "acceptance_rate": 0.5,
    }


def test_recommend_reads_only_the_answer_segment_sweep():
    template = Segments("</think>", before=None)
    cells = [_cell(LOSSLESS, "safety", 1.0, 1.2), _cell(LOSSLESS, "utility", 1.0, 1.2)]
    relaxed = RunConfig("speculative", MARS(theta=0.5))
    cells += [_cell(relaxed, "safety", 0.5, 2.0), _cell(relaxed, "utility", 0.9, 2.0)]
    for length, safety in ((1, 0.6), (2, 0.97), (4, 1.0)):
        config = RunConfig("speculative", MARS(theta=0.5), Segments("</think>", None, Step(L=length)))
        cells += [_cell(config, "safety", safety, 1.9), _cell(config, "utility", 0.9, 1.9)]
    # Step(L) cells and another template's cells in the same results are not part of this sweep
    for other in (Step(L=1), Segments("</think>", Step(L=1), Step(L=1))):
        config = RunConfig("speculative", MARS(theta=0.5), other)
        cells += [_cell(config, "safety", 1.0, 2.0), _cell(config, "utility", 0.9, 2.0)]
    chosen = recommend(cells, "mars(theta=0.5)", tolerance=0.05, segments=template)
    assert chosen.L == 2 and [level.L for level in chosen.levels] == [1, 2, 4]
    assert chosen.reason.startswith("Segments(after=Step(L=2)) is the smallest L")
    assert recommend(cells, "mars(theta=0.5)", tolerance=0.05).L == 1  # the plain Step(L) sweep


def test_calibrate_command_line_takes_the_segment_options():
    parser = argparse.ArgumentParser()
    cli_calibrate.configure(parser)
    args = parser.parse_args(
        ["--out", "unused", "--segment-boundary", "</think>", "--segment-before", "step:1", "--L", "2", "4"]
    )
    assert segments_template(args.segment_boundary, args.segment_before) == Segments("</think>", Step(L=1))


@pytest.mark.parametrize("before, expected", [("none", None), (" Lossless ", "lossless"), ("linear:3", Linear(L=3))])
def test_segment_before_takes_its_forms(before, expected):
    assert segments_template(["</think>"], before) == Segments("</think>", expected)


@pytest.mark.parametrize(
    "before, message",
    [
        ("exact", r"^--segment-before 'exact' is not a schedule of the segment before the boundary: use none, "
                  r"lossless, step:L"),
        ('{"schedule": "segments", "boundary": "x"}', r"^--segment-before .* is not a schedule of the segment"),
        ("step:x", r"^--segment-before 'step:x': invalid literal for int\(\) with base 10: 'x'; use none, "
                   r"lossless, step:L, linear:L or power:L:GAMMA \(e.g. --segment-before step:1\)$"),
        ("power:2", r"^--segment-before 'power:2' is not a schedule of the segment before the boundary: use none, "
                    r"lossless, step:L, linear:L or power:L:GAMMA \(e.g. --segment-before step:1\)$"),
        ("none:1", r"^--segment-before 'none:1' is not a schedule of the segment"),
        ("step:0", r"^--segment-before: schedule 'step:0': L=0 verifies no token losslessly"),
    ],
)
def test_segment_before_refuses_other_values_naming_the_option(before, message):
    with pytest.raises(ValueError, match=message):
        segments_template(["</think>"], before)


def _read_runs(path):
    import json

    return [json.loads(line) for line in (path / "runs.jsonl").read_text().splitlines() if line.strip()]


def test_bench_and_calibrate_run_a_text_boundary_end_to_end(tmp_path, data_dir, capsys):
    """Through the command lines on the tiny pair: the text boundary is resolved with the target
    tokenizer (a run without it would refuse every segment cell), the recorded key keeps the text."""
    from hf_securesd.bench import cli_bench

    common = ["--profile", "smoke", "--tasks", "gsm8k", "--limit", "2", "--no-progress"]
    common += ["--data-dir", str(data_dir)]
    parser = argparse.ArgumentParser()
    cli_bench.configure(parser)
    spec = '{"schedule": "segments", "boundary": "e", "before": null, "after": "lossless"}'
    bench = parser.parse_args(
        [*common, "--verifiers", "mars:0.5", "--schedules", spec, "--no-report", "--out", str(tmp_path / "b")]
    )
    assert cli_bench.run(bench) == 0
    keys = {run["config_key"]: run for run in _read_runs(tmp_path / "b")}
    cell = keys["mars(theta=0.5)+segments(boundary='e',before=none,after=lossless)"]
    assert cell["n"] == 2 and cell["config"]["schedule"]["boundary"] == "e"

    parser = argparse.ArgumentParser()
    cli_calibrate.configure(parser)
    calibrate = parser.parse_args(
        [*common, "--verifier", "mars:0.5", "--segment-boundary", "e", "--L", "1", "2"]
        + ["--out", str(tmp_path / "c")]
    )
    assert cli_calibrate.run(calibrate) == 0
    swept = [run["config"]["schedule"] for run in _read_runs(tmp_path / "c") if run["schedule_label"]]
    assert sorted(schedule["after"]["L"] for schedule in swept) == [1, 2]
    assert all(schedule["boundary"] == "e" and schedule["before"] is None for schedule in swept)
    assert "Answer-segment Step(L)" in (tmp_path / "c" / "calibration.md").read_text()
