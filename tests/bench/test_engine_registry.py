"""Engines are registered by name; a new engine is one class, and the runner, the results files and the
report work the same whoever generates (here a stand-in engine that answers without a model)."""

from __future__ import annotations

import json

import pytest

from hf_securesd.bench.engines import (
    Engine,
    EngineError,
    Generation,
    engine_class,
    engine_names,
    register_engine,
)
from hf_securesd.bench.plan import RunConfig, sweep_configs
from hf_securesd.bench.report import write_report
from hf_securesd.bench.results import MANIFEST, RUNS, read_jsonl
from hf_securesd.bench.runner import StudySettings, prepare_tasks, run_study
from hf_securesd.schedules import Step
from hf_securesd.tiny import byte_tokenizer

REFUSAL = "I'm sorry, but I cannot help with that."


@register_engine("stand-in")
class StandInEngine(Engine):
    """Refuses as the target, complies as anything else."""

    def describe(self):
        return {"engine": self.name, "engine_version": "1", "models": {}}

    def baseline_configs(self):
        return [RunConfig("target")]

    def generate(self, config, prompts, max_new_tokens, num_assistant_tokens):
        text = REFUSAL if config.kind == "target" else "Sure, here is how."
        return [Generation(text, 3, 0.01, None) for _ in prompts]


def test_the_built_in_engines_are_registered_by_name():
    assert {"hf", "vllm", "openai"} <= set(engine_names())
    assert engine_class("hf").__name__ == "HFEngine" and engine_class("openai").name == "openai"
    with pytest.raises(EngineError, match="unknown engine 'nope'; choose one of .*hf.*openai.*vllm"):
        engine_class("nope")
    with pytest.raises(ValueError, match="registered already"):
        register_engine("stand-in")(type("Other", (StandInEngine,), {}))


def test_a_new_engine_is_one_class_and_the_report_does_not_know_it(tmp_path, data_dir):
    tasks = prepare_tasks(["jailbreak"], byte_tokenizer(), data_dir=data_dir, limit=3, max_new_tokens=4)
    configs = [RunConfig("endpoint", endpoint="prod"), *sweep_configs(["mars:0.5"], [Step(L=1)])]
    outcome = run_study(StudySettings("t", "d"), StandInEngine(), tasks, configs, tmp_path, progress=False)
    assert (outcome.generated, outcome.cells_finished, outcome.failed) == (4 * 3, 4, 0)
    runs = {run["config_key"]: run for run in read_jsonl(tmp_path / RUNS)}
    assert set(runs) == {"target", "endpoint:prod", "lossless", "mars(theta=0.5)+step(L=1)"}
    assert runs["target"]["score"] == 1.0 and runs["endpoint:prod"]["score"] == 0.0
    assert runs["endpoint:prod"].get("prr") is None  # no draft-alone baseline: no PRR
    assert json.loads((tmp_path / MANIFEST).read_text())["engine"] == "stand-in"
    report = write_report(tmp_path).read_text()
    assert "endpoint:prod" in report


def test_a_results_directory_takes_one_engine(tmp_path, data_dir):
    tasks = prepare_tasks(["jailbreak"], byte_tokenizer(), data_dir=data_dir, limit=1, max_new_tokens=4)
    run_study(StudySettings("t", "d"), StandInEngine(), tasks, [], tmp_path, progress=False)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["engine"] = "hf"
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="engine: 'hf' there, 'stand-in' now"):
        run_study(StudySettings("t", "d"), StandInEngine(), tasks, [], tmp_path, progress=False)


def test_in_process_engines_refuse_endpoints():
    from hf_securesd.bench.engines.hf import HFEngine

    with pytest.raises(EngineError, match="use --engine openai for --endpoint"):
        HFEngine(None).check_configs([RunConfig("endpoint", endpoint="prod")])
    with pytest.raises(ValueError, match="endpoint run needs an endpoint name"):
        RunConfig("endpoint")
