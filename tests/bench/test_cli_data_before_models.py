"""`securesd bench` and `securesd calibrate` read the benchmark examples before loading any model: a
data problem (a data folder that lacks a task's file, a --limit above a task's size) is one error line in
seconds, not after the models have loaded (minutes for a real pair); the prompts are then built with the
engine's tokenizer as before."""

from __future__ import annotations

import pytest
from support import cli_refusal

from hf_securesd.bench.runner import prepare_tasks, with_prompts
from hf_securesd.tiny import byte_tokenizer

BASE = ("--profile", "smoke", "--tasks", "gsm8k", "--max-new-tokens", "2", "--no-progress")
SCHEDULES = {"bench": ("--verifiers", "mars:0.5", "--schedules", "none"), "calibrate": ("--L", "1")}


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_a_data_folder_without_the_tasks_file_is_refused_before_any_model_loads(
        command, capsys, tmp_path, no_loading) -> None:
    empty = tmp_path / "data"
    empty.mkdir()
    error = cli_refusal(capsys, [command, *BASE, *SCHEDULES[command], "--limit", "1", "--data-dir", str(empty),
                                 "--out", str(tmp_path / "out")])
    assert str(empty / "gsm8k") in error


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_a_limit_above_a_tasks_size_is_refused_before_any_model_loads(
        command, capsys, tmp_path, data_dir, no_loading) -> None:
    error = cli_refusal(capsys, [command, *BASE, *SCHEDULES[command], "--limit", "100000000",
                                 "--data-dir", str(data_dir), "--out", str(tmp_path / "out")])
    assert "task gsm8k has" in error and "fewer than the 100000000 asked" in error


def test_prompts_built_afterwards_are_those_built_with_the_examples(data_dir) -> None:
    tokenizer = byte_tokenizer()
    together = prepare_tasks(["jailbreak", "gsm8k"], tokenizer, data_dir=data_dir, limit=3, max_new_tokens=4)
    examples_first = prepare_tasks(["jailbreak", "gsm8k"], None, data_dir=data_dir, limit=3, max_new_tokens=4)
    assert all(prompt is None for run in examples_first for prompt in run.prompts)
    assert with_prompts(examples_first, tokenizer) == together
    assert all(isinstance(prompt, str) and prompt for run in together for prompt in run.prompts)
