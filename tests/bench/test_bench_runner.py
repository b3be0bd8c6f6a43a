"""The benchmark runner, report and calibration: the smoke profile end to end, resuming a killed
run, PRR and ΔPRR computed from recorded runs, and the Step(L) recommendation rule.

Needs the local benchmark data ($SECURESD_DATA_DIR, else ../shared/data beside the checkout)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from support import needs_bwrap

from hf_securesd.bench import cli_bench, cli_calibrate, cli_report
from hf_securesd.bench.calibrate import calibration_configs, recommend
from hf_securesd.bench.engines.hf import HFEngine
from hf_securesd.bench.loading import load_study_models
from hf_securesd.bench.plan import (
    DRAFT,
    LOSSLESS,
    TARGET,
    RunConfig,
    parse_schedule,
    parse_verifier,
    sweep_configs,
)
from hf_securesd.bench.report import write_report
from hf_securesd.bench.results import GENERATIONS, RUNS, ResultsDir, read_jsonl
from hf_securesd.bench.runner import StudySettings, TaskRun, finish_cell, prepare_tasks, run_study
from hf_securesd.schedules import Step
from hf_securesd.stats import SpeculativeStats
from hf_securesd.verifiers import MARS
from support import calibration_cell




@pytest.fixture(scope="module")
def tiny_models():
    torch.set_num_threads(1)
    return HFEngine(load_study_models("tiny", "tiny", dtype="fp32"))


def bench_args(*argv: str, command=cli_bench) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.configure(parser)
    return parser.parse_args(list(argv))


def test_plan_parsing() -> None:
    assert all(not verifier.is_lossless for verifier in parse_verifier("mars"))
    assert [verifier.theta for verifier in parse_verifier("mars:0.9,0.5")] == [0.9, 0.5]
    assert parse_schedule("none") is None and parse_schedule("step:4") == Step(L=4)
    with pytest.raises(ValueError, match="step:L"):
        parse_schedule("step")
    with pytest.raises(ValueError, match="choose from"):
        parse_verifier("nope")
    keys = [config.key for config in sweep_configs(["mars:0.5"], [None, Step(L=1)])]
    assert keys == ["lossless", "mars(theta=0.5)", "mars(theta=0.5)+step(L=1)"]
    # naming lossless runs it where it is named (here last), once
    keys = [config.key for config in sweep_configs(["mars:0.5", "lossless", "lossless"], [None, Step(L=1)])]
    assert keys == ["mars(theta=0.5)", "mars(theta=0.5)+step(L=1)", "lossless"]


@needs_bwrap  # the smoke profile scores HumanEval
def test_smoke_profile_end_to_end_then_resume_redoes_nothing(tmp_path, data_dir, capsys) -> None:
    out = tmp_path / "smoke"
    assert (
        cli_bench.run(
            bench_args("--profile", "smoke", "--out", str(out), "--data-dir", str(data_dir), "--no-progress")
        )
        == 0
    )
    first = capsys.readouterr().out
    report = out / "report"
    for name in ("report.md", "summary.json", "prr_vs_ar.png", "position_tv.png"):
        assert (report / name).stat().st_size > 0, name
    runs = read_jsonl(out / RUNS)
    tasks = {run["task"] for run in runs}
    assert {"humaneval", "gsm8k", "jailbreak", "prompt_injection", "prompt_injection_adaptive"} == tasks
    configs = {run["config_key"] for run in runs}
    assert {"target", "draft", "lossless", "mars(theta=0.5)", "mars(theta=0.5)+step(L=1)"} <= configs
    speculative = [run for run in runs if run["config"]["kind"] == "speculative"]
    assert all(run["stats"]["position_tv_sum"] and run["acceptance_rate"] is not None for run in speculative)
    assert all(run["spd"] is not None and run["n"] == 3 for run in runs)
    text = (report / "report.md").read_text()
    for needle in (
        "tiny random llama pair",
        "refusal_prefix",
        "seed",
        "95% percentile bootstrap",
        "Table 1 analog",
        "Table 5 analog",
        "| examples |",
    ):
        assert needle in text, needle
    assert "55 cells finished" in first

    generations = (out / GENERATIONS).read_text()
    assert (
        cli_bench.run(
            bench_args(
                "--profile",
                "smoke",
                "--out",
                str(out),
                "--data-dir",
                str(data_dir),
                "--no-progress",
                "--no-report",
            )
        )
        == 0
    )
    assert "0 cells finished, 55 already recorded, 0 generations" in capsys.readouterr().out
    assert (out / GENERATIONS).read_text() == generations
    assert len(read_jsonl(out / RUNS)) == len(runs)
    (report / "report.md").unlink()
    assert cli_report.run(bench_args(str(out), command=cli_report)) == 0
    rewritten = (report / "report.md").read_text()
    assert "**sessions**: 2" in rewritten  # the resume is recorded; the numbers are the same
    assert rewritten.split("### Tasks and baselines")[1] == text.split("### Tasks and baselines")[1]


def test_calibrate_command_runs_the_L_sweep(tmp_path, data_dir, capsys) -> None:
    args = bench_args(
        "--profile",
        "smoke",
        "--out",
        str(tmp_path),
        "--data-dir",
        str(data_dir),
        "--no-progress",
        "--tasks",
        "jailbreak",
        "gsm8k",
        "--limit",
        "2",
        "--max-new-tokens",
        "6",
        "--verifier",
        "mars:0.5",
        "--L",
        "1",
        "2",
        command=cli_calibrate,
    )
    assert cli_calibrate.run(args) == 0
    keys = {run["config_key"] for run in read_jsonl(tmp_path / RUNS)}
    assert {"lossless", "mars(theta=0.5)", "mars(theta=0.5)+step(L=1)", "mars(theta=0.5)+step(L=2)"} <= keys
    (recommendation,) = json.loads((tmp_path / "calibration.json").read_text())
    assert recommendation["verifier"] == "mars(theta=0.5)"
    assert [level["L"] for level in recommendation["levels"]] == [1, 2]
    assert "mars(theta=0.5)" in capsys.readouterr().out and (tmp_path / "calibration.md").is_file()


def test_killed_run_resumes_without_redoing_examples(tmp_path, data_dir, tiny_models, monkeypatch) -> None:
    settings = StudySettings("tiny", "tiny", dtype="fp32")
    tasks = prepare_tasks(
        ["jailbreak", "gsm8k"], tiny_models.tokenizer, data_dir=data_dir, limit=2, max_new_tokens=6
    )
    configs = sweep_configs(["mars:0.5"], [None, Step(L=1)])
    total = (2 + len(configs)) * 2 * 2
    real_generate = HFEngine.generate
    calls = {"count": 0}

    def dying_generate(*args, **kwargs):
        calls["count"] += 1
        if calls["count"] > 13:  # 3 warm-up calls, 3 rate probes, then 7 recorded examples
            raise KeyboardInterrupt
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", dying_generate)
    with pytest.raises(KeyboardInterrupt):
        run_study(settings, tiny_models, tasks, configs, tmp_path, progress=False)
    assert len(read_jsonl(tmp_path / GENERATIONS)) == 7
    with open(tmp_path / GENERATIONS, "a") as handle:  # a write torn by the kill
        handle.write('{"cell": "target|jails')
    monkeypatch.setattr(HFEngine, "generate", real_generate)

    outcome = run_study(settings, tiny_models, tasks, configs, tmp_path, progress=False)
    assert outcome.generated == total - 7
    # 7 examples at 2 per cell: three cells were finished and recorded before the kill
    assert (outcome.cells_already_done, outcome.cells_finished) == (3, (2 + len(configs)) * 2 - 3)
    pairs = [(record["cell"], record["example_id"]) for record in read_jsonl(tmp_path / GENERATIONS)]
    assert len(pairs) == len(set(pairs)) == total
    again = run_study(settings, tiny_models, tasks, configs, tmp_path, progress=False)
    assert (again.generated, again.cells_finished, again.cells_already_done) == (0, 0, (2 + len(configs)) * 2)

    with pytest.raises(ValueError, match="new --out"):
        run_study(
            StudySettings("tiny", "tiny", dtype="fp32", batch_size=2),
            tiny_models,
            tasks,
            configs,
            tmp_path,
            progress=False,
        )
    with pytest.raises(ValueError, match="new --out"):
        run_study(
            StudySettings("tiny", "tiny", dtype="fp32", seed=3),
            tiny_models,
            tasks,
            configs,
            tmp_path,
            progress=False,
        )


def test_batched_generation_fills_every_cell(tmp_path, data_dir, tiny_models) -> None:
    settings = StudySettings("tiny", "tiny", dtype="fp32", batch_size=2)
    tasks = prepare_tasks(
        ["jailbreak", "gsm8k"], tiny_models.tokenizer, data_dir=data_dir, limit=3, max_new_tokens=6
    )
    configs = sweep_configs(["mars:0.5"], [Step(L=1)])
    outcome = run_study(settings, tiny_models, tasks, configs, tmp_path, progress=False)
    assert (outcome.generated, outcome.cells_finished) == (4 * 2 * 3, 4 * 2)
    speculative = [run for run in read_jsonl(tmp_path / RUNS) if run["config"]["kind"] == "speculative"]
    for run in speculative:
        stats = run["stats"]
        assert sum(stats["drafted_per_round"]) > 0 and len(stats["position_tv_sum"]) <= 6
        assert all(0 < tokens <= 6 for tokens in run["new_tokens"])


def test_a_rerun_that_draws_other_examples_is_refused_before_generating(tmp_path, data_dir, tiny_models,
                                                                          monkeypatch) -> None:
    """Another --data-dir (or dataset version) draws other examples under the same cell names: refused
    before any generation, naming the cell, instead of failing once the new cell is done."""
    settings = StudySettings("tiny", "tiny", dtype="fp32", batch_size=2)
    (task_run,) = prepare_tasks(["jailbreak"], tiny_models.tokenizer, data_dir=data_dir, limit=4, max_new_tokens=2)
    first = TaskRun(task_run.task, task_run.examples[:2], task_run.prompts[:2], task_run.max_new_tokens)
    run_study(settings, tiny_models, [first], [], tmp_path, progress=False)
    other = TaskRun(task_run.task, task_run.examples[2:], task_run.prompts[2:], task_run.max_new_tokens)
    monkeypatch.setattr(HFEngine, "generate", lambda *args, **kwargs: pytest.fail("generated"))
    with pytest.raises(ValueError, match=r"holds target\|jailbreak\|n=2\|max_new_tokens=2 on other examples"):
        run_study(settings, tiny_models, [other], sweep_configs(["mars:0.5"], [None]), tmp_path, progress=False)


def test_a_rerun_with_the_same_ids_but_other_answers_is_refused_before_generating(tmp_path, data_dir, tiny_models,
                                                                                 monkeypatch) -> None:
    """Another --data-dir holding the same ids with other gold answers: the new cells were scored against
    the new answers and the finished ones kept the old, silently (a PRR of -0.5 where one set of answers
    gives 0)."""
    import dataclasses

    settings = StudySettings("tiny", "tiny", dtype="fp32", batch_size=2)
    (task_run,) = prepare_tasks(["gsm8k"], tiny_models.tokenizer, data_dir=data_dir, limit=2, max_new_tokens=2)
    run_study(settings, tiny_models, [task_run], [], tmp_path, progress=False)
    edited = [dataclasses.replace(example, fields={**example.fields, "answer": "12345"}) for example in task_run.examples]
    other = TaskRun(task_run.task, edited, task_run.prompts, task_run.max_new_tokens)
    monkeypatch.setattr(HFEngine, "generate", lambda *args, **kwargs: pytest.fail("generated"))
    with pytest.raises(ValueError, match=r"holds target\|gsm8k\|n=2\|max_new_tokens=2 on the same example ids with "
                       "other contents"):
        run_study(settings, tiny_models, [other], sweep_configs(["mars:0.5"], [None]), tmp_path, progress=False)
    run_study(settings, tiny_models, [task_run], [], tmp_path, progress=False)  # the same data: accepted


def _stats(accepted: int, tv: list[float]) -> dict:
    stats = SpeculativeStats()
    stats.record_round(0, 5, accepted, tv)
    stats.new_tokens = accepted + 1
    return stats.to_dict()


def _record(
    task_run: TaskRun,
    config: RunConfig,
    responses: list[str],
    seconds: float,
    finished: dict,
    accepted: int | None = None,
    tv: list[float] | None = None,
) -> dict:
    journal = {
        example.id: {
            "response": response,
            "seconds": seconds,
            "new_tokens": 6,
            "session": "s",
            "stats": None if accepted is None else _stats(accepted, tv),
        }
        for example, response in zip(task_run.examples, responses)
    }
    cell = finish_cell(config, task_run, journal, finished, StudySettings("tiny", "tiny"))
    finished[cell["cell"]] = cell
    return cell


def test_prr_and_delta_prr_from_recorded_runs(tmp_path, data_dir) -> None:
    from hf_securesd.bench.tasks import get_task

    jailbreak = get_task("jailbreak")
    examples = jailbreak.examples(data_dir=data_dir, limit=4)
    task_run = TaskRun(jailbreak, examples, ["" for _ in examples], 16)
    refuse, comply = "I'm sorry, but I cannot help with that.", "Sure, here is how to do it."
    plan = (
        [  # config, AFR per example (1 = refused), seconds per example, accepted of 5, TV at positions 0, 1
            (TARGET, [1, 1, 1, 1], 1.0, None, None),
            (DRAFT, [0, 0, 0, 0], 0.25, None, None),
            (LOSSLESS, [1, 1, 1, 1], 0.8, 1, [0.0, 0.0]),
            (RunConfig("speculative", MARS(theta=0.5)), [1, 0, 0, 0], 0.5, 4, [1.0, 0.0]),
            (RunConfig("speculative", MARS(theta=0.5), Step(L=1)), [1, 1, 1, 0], 0.625, 4, [0.0, 1.0]),
            (RunConfig("speculative", MARS(theta=0.9)), [1, 1, 0, 0], 0.5, 2, [1.0, 0.0]),
            (RunConfig("speculative", MARS(theta=0.9), Step(L=1)), [1, 1, 1, 1], 0.5, 2, [0.0, 0.0]),
        ]
    )
    finished: dict = {}
    results = ResultsDir(tmp_path)
    results.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s"})
    for config, afr, seconds, accepted, tv in plan:
        cell = _record(
            task_run, config, [refuse if value else comply for value in afr], seconds, finished, accepted, tv
        )
        assert cell["scores"] == [float(value) for value in afr]
        results.add_run(cell)
    recorded = {cell["config_key"]: cell for cell in results.runs()}
    assert recorded["mars(theta=0.5)"]["prr"] == pytest.approx(0.25)
    assert recorded["mars(theta=0.9)+step(L=1)"]["prr"] == pytest.approx(1.0)
    assert recorded["mars(theta=0.5)"]["spd"] == pytest.approx(2.0)
    assert recorded["mars(theta=0.5)"]["acceptance_rate"] == pytest.approx(0.8)

    write_report(tmp_path)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    (delta,) = summary["deltas"]
    jail = delta["tasks"]["jailbreak"]
    # ΔPRR: theta=0.5 .75 - .25, theta=0.9 1 - .5; averaged over the sweep
    assert jail["delta_prr"] == pytest.approx(0.5)
    assert jail["delta_prr_ci"][0] <= 0.5 <= jail["delta_prr_ci"][1]
    # ΔSPD: theta=0.5 1.6 - 2, theta=0.9 2 - 2
    assert delta["delta_spd"] == pytest.approx(-0.2)
    bins = {row["ar_bin"]: row for row in summary["ar_bins"]}
    assert bins["[0.7, 0.9)"]["safety"]["prr"][0] == pytest.approx(0.25)
    assert bins["[0.3, 0.5)"]["safety"]["prr"][0] == pytest.approx(0.5)
    assert bins["all"]["safety"]["cells"] == 2
    (bars,) = summary["position_tv"].values()
    assert bars["no schedule"][:2] == [1.0, 0.0] and bars["step(L=1)"][:2] == [0.0, 1.0]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "0.500 [" in text and "mars(theta=0.5)+step(L=1)" in text


def _calibration_cells(
    safety_by_length: dict[int | None, float], spd_by_length: dict[int | None, float]
) -> list:
    cells = [calibration_cell(LOSSLESS, "safety", 1.0, 1.2), calibration_cell(LOSSLESS, "utility", 1.0, 1.2)]
    for length, safety in safety_by_length.items():
        config = RunConfig("speculative", MARS(theta=0.5), None if length is None else Step(L=length))
        cells += [
            calibration_cell(config, "safety", safety, spd_by_length[length]),
            calibration_cell(config, "utility", 0.9, spd_by_length[length]),
        ]
    return cells


def test_calibrate_recommends_smallest_safe_L_that_keeps_speed() -> None:
    assert [config.key for config in calibration_configs(["mars:0.5"], [2, 1])] == [
        "lossless",
        "mars(theta=0.5)",
        "mars(theta=0.5)+step(L=1)",
        "mars(theta=0.5)+step(L=2)",
    ]
    cells = _calibration_cells({None: 0.4, 1: 0.8, 2: 0.97, 4: 1.0}, {None: 2.0, 1: 1.95, 2: 1.9, 4: 1.5})
    chosen = recommend(cells, "mars(theta=0.5)", tolerance=0.05, spd_tolerance=0.1)
    assert chosen.L == 2 and "smallest L" in chosen.reason
    assert [(level.L, level.safe, level.fast) for level in chosen.levels] == [
        (1, False, True),
        (2, True, True),
        (4, True, False),
    ]
    assert recommend(cells, "mars(theta=0.5)", tolerance=0.25).L == 1
    slow = recommend(cells, "mars(theta=0.5)", tolerance=0.05, spd_tolerance=0.02)
    assert slow.L is None and "no L keeps the speed-up" in slow.reason
    unsafe = recommend(
        _calibration_cells({None: 0.4, 1: 0.5, 2: 0.6}, {None: 2.0, 1: 2.0, 2: 2.0}), "mars(theta=0.5)"
    )
    assert unsafe.L is None and "try larger L" in unsafe.reason
    with pytest.raises(ValueError, match="lossless"):
        recommend(cells[2:], "mars(theta=0.5)")
