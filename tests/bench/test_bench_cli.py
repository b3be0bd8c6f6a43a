"""The benchmark command line and the machine defaults: --device/--dtype auto, underscore spellings,
fractional --limit, the printed budget and ETA, and what study.json records. Tiny models only."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest
import torch

import hf_securesd.models as models_package
from hf_securesd.bench import cli_bench, runner
from hf_securesd.bench.budget import Budget, format_duration
from hf_securesd.bench.engines.hf import HFEngine
from hf_securesd.bench.loading import load_study_models
from hf_securesd.bench.plan import sweep_configs
from hf_securesd.bench.results import MANIFEST, RUNS, read_jsonl
from hf_securesd.bench.runner import StudySettings, prepare_tasks, run_study
from hf_securesd.models import hardware
from hf_securesd.models.hardware import DeviceError, cpu_flags, resolve_device, resolve_dtype
from hf_securesd.schedules import Step




@pytest.fixture(scope="module")
def tiny_models():
    torch.set_num_threads(1)
    return HFEngine(load_study_models("tiny", "tiny", dtype="fp32"))


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_bench.configure(parser)
    return parser.parse_args(list(argv))


def test_underscore_spellings_parse_like_hyphens() -> None:
    hyphens = parse("--out", "x", "--batch-size", "16", "--max-new-tokens", "8", "--num-assistant-tokens", "3",
                    "--no-progress", "--judge-option", "a=1")
    underscores = parse("--out", "x", "--batch_size", "16", "--max_new_tokens=8", "--num_assistant_tokens", "3",
                        "--no_progress", "--judge_option", "a=1")
    assert vars(hyphens) == vars(underscores)
    assert underscores.batch_size == 16 and underscores.max_new_tokens == 8 and underscores.no_progress
    parser = argparse.ArgumentParser()
    cli_bench.configure(parser)
    assert "--batch_size" not in parser.format_help()  # the alias is not listed twice


def test_limit_takes_a_count_or_a_fraction() -> None:
    assert parse("--out", "x", "--limit", "50").limit == 50
    assert parse("--out", "x", "--limit", "0.25").limit == 0.25
    for bad in ("1.5", "0", "-3", "half"):
        with pytest.raises(SystemExit):
            parse("--out", "x", "--limit", bad)


def test_fractional_limit_takes_the_first_share_of_each_task(data_dir, tiny_models) -> None:
    tokenizer = tiny_models.tokenizer
    fraction = prepare_tasks(["jailbreak", "gsm8k"], tokenizer, data_dir=data_dir, limit=0.06, max_new_tokens=4)
    assert [len(run.examples) for run in fraction] == [12, 12]  # ceil(0.06 x 200)
    counted = prepare_tasks(["jailbreak"], tokenizer, data_dir=data_dir, limit=12, max_new_tokens=4)
    assert [e.id for e in fraction[0].examples] == [e.id for e in counted[0].examples]
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        prepare_tasks(["gsm8k"], tokenizer, data_dir=data_dir, limit=1.5)


def test_device_auto_and_clear_errors(monkeypatch) -> None:
    if not torch.cuda.is_available():
        assert resolve_device("auto") in ("cpu", "mps")
        with pytest.raises(DeviceError, match="use --device cpu or --device auto"):
            resolve_device("cuda")
    with pytest.raises(DeviceError, match="unknown device"):
        resolve_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("CUDA:0") == "cuda:0"
    with pytest.raises(DeviceError, match="1 GPU"):
        resolve_device("cuda:3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_without_cuda_is_a_one_line_error(tmp_path, capsys, monkeypatch) -> None:
    import hf_securesd.bench.tasks as tasks

    monkeypatch.setattr(tasks, "check_isolation", lambda names, isolation: None)  # bubblewrap or not
    code = cli_bench.run(parse("--profile", "smoke", "--device", "cuda", "--out", str(tmp_path / "r")))
    assert code == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --device cuda: CUDA is not available") and "Traceback" not in error


def test_dtype_auto_follows_the_cpu(monkeypatch, tmp_path) -> None:
    assert resolve_dtype("fp32", "cpu") == ("fp32", "requested")
    with pytest.raises(ValueError, match="auto or one of"):
        resolve_dtype("float8", "cpu")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma avx512_bf16\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "fma", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") is None

    def auto(flags, speedup):
        hardware._auto_cpu_dtype.cache_clear()
        monkeypatch.setattr(hardware, "cpu_flags", lambda: flags)
        monkeypatch.setattr(hardware, "bf16_speedup", lambda rows: speedup)
        return resolve_dtype("auto", "cpu", rows=16)

    dtype, reason = auto({"avx2", "fma"}, 5.0)  # emulated bf16: no timing can make it bf16
    assert dtype == "fp32" and "emulated" in reason
    assert auto({"avx2", "avx512_bf16"}, 2.5)[0] == "bf16"
    assert auto({"avx2", "amx_bf16"}, 1.05)[0] == "fp32"
    assert auto(None, 2.0)[0] == "bf16"  # flags unknown: the timing decides
    hardware._auto_cpu_dtype.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert resolve_dtype("auto", "cuda")[0] == "fp16"


def test_bf16_probe_measures_a_ratio() -> None:
    assert hardware.bf16_speedup(rows=2, repeats=2) > 0


def test_load_pair_defaults_to_the_machine_dtype(monkeypatch) -> None:
    from hf_securesd.tiny import byte_tokenizer, tiny_pair

    draft, target = tiny_pair()
    loaded = []
    monkeypatch.setattr(models_package, "resolve_model", lambda name, **kwargs: name)
    monkeypatch.setattr(hardware, "resolve_dtype", lambda spec, device, rows=1: ("fp16", "test")
                        if spec == "auto" else (spec, "requested"))

    class FakeModels:
        @staticmethod
        def from_pretrained(where, dtype):
            loaded.append((where, dtype))
            return draft if where == "d" else target

    import transformers

    monkeypatch.setattr(transformers, "AutoModelForCausalLM", FakeModels)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda where: byte_tokenizer()))
    models_package.load_pair("d", "t")
    assert loaded == [("d", torch.float16), ("t", torch.float16)]
    loaded.clear()
    models_package.load_pair("d", "t", target_dtype="fp32")
    assert loaded == [("d", torch.float16), ("t", torch.float32)]


def test_machine_choices_are_printed(capsys) -> None:
    machine = cli_bench.machine_settings(parse("--profile", "smoke", "--out", "x", "--batch_size", "3"),
                                         cli_bench.get_profile("smoke"))
    printed = capsys.readouterr().out
    assert machine["dtype"] == "fp32" and machine["batch_size"] == 3 and machine["device"] in ("cpu", "cuda", "mps")
    assert "machine: device" in printed and "dtype fp32 (the smoke profile's)" in printed
    assert "batch_size 3 (--batch-size)" in printed
    assert cli_bench.get_profile("cpu-small").batch_size == 8 and cli_bench.get_profile("cpu-small").dtype == "auto"


def test_budget_estimate_and_eta() -> None:
    budget = Budget({"target": 0.5, "speculative": 1.0})
    assert budget.seconds([("target", 4, 10), ("speculative", 2, 10)]) == 40.0
    budget.record(("target", 4, 10), 40.0)  # ran twice as slow as estimated
    assert budget.eta([("speculative", 2, 10)]) == 40.0
    assert format_duration(59) == "59 s" and format_duration(600) == "10 min" and format_duration(7260) == "2 h 01 min"
    line = budget.describe([("target", 4, 10)], 4)
    assert "4 generations" in line and "40 new tokens" in line and "20 s" in line


def test_run_prints_budget_records_provenance_and_per_example_ar(tmp_path, data_dir, tiny_models, capsys,
                                                                monkeypatch) -> None:
    settings = StudySettings("tiny", "tiny", dtype="fp32", batch_size=2)
    tasks = prepare_tasks(["jailbreak"], tiny_models.tokenizer, data_dir=data_dir, limit=3, max_new_tokens=5)
    configs = sweep_configs(["mars:0.5"], [Step(L=1)])
    command = ["securesd", "bench", "--out", "a dir"]
    run_study(settings, tiny_models, tasks, configs, tmp_path, progress=False, command=command)
    err = capsys.readouterr().err
    assert "budget: 12 generations, at most 60 new tokens" in err and "probe of 2 x 4 tokens" in err
    assert "[4/4] mars(theta=0.5)+step(L=1)|jailbreak" in err and "ETA" in err
    session = json.loads((tmp_path / MANIFEST).read_text())["sessions"][-1]
    assert session["command"] == shlex.join(command) == "securesd bench --out 'a dir'"
    assert session["transformers"] and session["torch"] == torch.__version__ and session["hf_securesd"]
    assert session["git_revision"] is None or len(session["git_revision"].split("+")[0]) == 40
    for run in read_jsonl(tmp_path / RUNS):
        if run["config"]["kind"] == "speculative":
            assert sum(run["drafted"]) == sum(run["stats"]["drafted_per_round"]) > 0
            assert sum(run["accepted"]) == sum(run["stats"]["accepted_per_round"])
            assert len(run["accepted"]) == run["n"] == 3
        else:
            assert run["drafted"] is None

    # a resumed run takes its rates from the journal: no probe
    calls = []
    monkeypatch.setattr(HFEngine, "generate", lambda *args, **kwargs: calls.append(args) or [])
    plan = [(c, tasks[0]) for c in (runner.TARGET, runner.DRAFT, *configs)]
    budget = runner.measure_budget(tiny_models, plan, plan,
                                   runner.ResultsDir(tmp_path).generations(), settings)
    assert calls == [] and budget.sources == {"target": "journal", "draft": "journal", "speculative": "journal"}


@pytest.mark.parametrize("option", ["--tolerance", "--spd-tolerance"])
@pytest.mark.parametrize("value", ["nan", "inf", "-0.1", "x"])
def test_calibrate_tolerances_are_finite_and_non_negative(option, value) -> None:
    """A NaN tolerance would make every comparison false, so no L would ever be recommended."""
    from hf_securesd.bench import cli_calibrate

    parser = argparse.ArgumentParser()
    cli_calibrate.configure(parser)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--out", "x", option, value])
    assert exit_info.value.code == 2


def test_calibrate_accepts_underscore_spellings_too() -> None:
    import argparse

    from hf_securesd.bench import cli_calibrate

    parser = argparse.ArgumentParser()
    cli_calibrate.configure(parser)
    args = parser.parse_args(["--out", "x", "--spd_tolerance", "0.2", "--batch_size", "4"])
    assert args.spd_tolerance == 0.2 and args.batch_size == 4


@pytest.mark.parametrize("option", ["--max-new-tokens", "--num-assistant-tokens", "--batch-size", "--threads"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_counts_below_one_are_refused_not_replaced_by_a_default(option, value) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--out", "x", option, value)
    assert exit_info.value.code == 2


def test_an_out_that_is_a_file_or_cannot_be_created_is_a_one_line_error(tmp_path, capsys) -> None:
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "file", tmp_path / "file" / "below"):
        code = cli_bench.run(parse("--profile", "smoke", "--out", str(out)))
        error = capsys.readouterr().err
        assert code == 2 and error.startswith(f"error: --out {out}") and "Traceback" not in error


def test_an_out_holding_other_settings_is_a_one_line_error(tmp_path, data_dir, capsys) -> None:
    base = ("--profile", "smoke", "--tasks", "jailbreak", "--limit", "1", "--max-new-tokens", "2", "--data-dir",
            str(data_dir), "--verifiers", "mars:0.5", "--schedules", "none", "--no-progress", "--no-report",
            "--out", str(tmp_path))
    assert cli_bench.run(parse(*base)) == 0
    capsys.readouterr()
    assert cli_bench.run(parse(*base, "--seed", "3")) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "holds results for other settings (seed: None there, 3 now)" in error


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_benchmark_data_out_of_reach_is_a_one_line_error(command, tmp_path, monkeypatch, capsys) -> None:
    """No --data-dir and no Hub (offline): the error names --data-dir, with no traceback, in both commands."""
    import datasets

    from hf_securesd.bench import cli_calibrate

    def offline(*args, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("SECURESD_DATA_DIR", raising=False)
    import hf_securesd.bench.tasks as tasks

    monkeypatch.setattr(tasks, "check_isolation", lambda names, isolation: None)  # bubblewrap or not
    module = cli_bench if command == "bench" else cli_calibrate
    parser = argparse.ArgumentParser()
    module.configure(parser)
    options = ["--tasks", "jailbreak"] if command == "bench" else []
    code = module.run(parser.parse_args(["--profile", "smoke", *options, "--out", str(tmp_path / "out")]))
    error = capsys.readouterr().err
    assert code == 2 and error.startswith("error: could not load") and "--data-dir" in error
