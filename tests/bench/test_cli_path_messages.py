"""Errors of `securesd bench` and `securesd report` that misstated what is wrong with a path, or echoed a
long value in full: each is one line naming the actual problem (a file where a folder belongs, a folder
where a file belongs, a model path that does not exist or holds no model, a path too long for the file
system) and the fix, with exit status 2 and nothing generated."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support import run_cli

from hf_securesd.bench.data import ENV_VAR, local_file
from hf_securesd.bench.results import ResultsDir

SMOKE = ("--profile", "smoke", "--tasks", "jailbreak", "--limit", "1", "--max-new-tokens", "2",
         "--verifiers", "mars:0.5", "--schedules", "none", "--no-progress", "--no-report")
LONG = "a" * 5000


def refused(capsys, *argv: str) -> str:
    """Run the CLI in-process; assert exit status 2 and one error line without a traceback, and return it."""
    code, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def bench(tmp_path: Path, *extra: str) -> list[str]:
    return ["bench", *SMOKE, "--out", str(tmp_path / "out"), *extra]


# ---- F5: a path that is a file, not a folder, or a folder, not a file ------------------------------


@pytest.mark.parametrize("origin", ["--data-dir", ENV_VAR])
def test_a_data_dir_that_is_a_file_is_called_a_file(capsys, tmp_path, monkeypatch, origin) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv(ENV_VAR, str(afile))
    line = refused(capsys, *bench(tmp_path, *(["--data-dir", str(afile)] if origin == "--data-dir" else [])))
    named = "--data-dir" if origin == "--data-dir" else f"${ENV_VAR}"
    assert f"{afile} (from {named}) is a file, not a folder" in line and "does not exist" not in line
    assert not (tmp_path / "out").exists()


def test_a_benchmark_file_that_is_a_folder_is_called_a_folder(tmp_path, data_dir) -> None:
    copy = tmp_path / "data"
    shutil.copytree(data_dir / "advbench", copy / "advbench")
    (copy / "advbench" / "harmful_behaviors.csv").unlink()
    (copy / "advbench" / "harmful_behaviors.csv").mkdir()
    with pytest.raises(FileNotFoundError) as caught:
        local_file(copy, "advbench/harmful_behaviors.csv")
    message = str(caught.value)
    assert f"{copy / 'advbench' / 'harmful_behaviors.csv'} is a folder, where a file belongs" in message
    assert "missing" not in message


def test_bench_names_a_benchmark_file_that_is_a_folder(capsys, tmp_path, data_dir) -> None:
    copy = tmp_path / "data"
    shutil.copytree(data_dir / "advbench", copy / "advbench")
    (copy / "advbench" / "harmful_behaviors.csv").unlink()
    (copy / "advbench" / "harmful_behaviors.csv").mkdir()
    line = refused(capsys, *bench(tmp_path, "--data-dir", str(copy)))
    assert "harmful_behaviors.csv is a folder, where a file belongs" in line


def test_report_says_runs_jsonl_is_not_a_regular_file(capsys, tmp_path) -> None:
    ResultsDir(tmp_path).open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s"})
    (tmp_path / "runs.jsonl").mkdir()
    line = refused(capsys, "report", str(tmp_path))
    assert f"{tmp_path / 'runs.jsonl'} is not a regular file" in line and "no finished runs" not in line
    assert f"move it out of the way and rerun `securesd bench --out {tmp_path}`" in line


# ---- F6: --target/--draft paths that do not exist or hold no model ----------------------------------


@pytest.mark.parametrize("extra, named", [
    (("--target", "/nonexistent/model"), "--target /nonexistent/model"),
    (("--target", "/nonexistent/model", "--draft", "/nonexistent/d"), "--target /nonexistent/model"),
    (("--target", "tiny", "--draft", "./no-such-model"), "--draft ./no-such-model"),
    (("--target", "tiny", "--draft", "~/no-such-securesd-model"), "--draft ~/no-such-securesd-model"),
])
def test_a_model_path_that_does_not_exist_is_refused_first(capsys, tmp_path, data_dir, monkeypatch,
                                                          extra, named) -> None:
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, *bench(tmp_path, "--data-dir", str(data_dir), *extra))
    assert line == f"error: {named}: no such folder; give a model folder or a Hub id"
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_model_is_named_in_one_line(capsys, tmp_path, data_dir) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    line = refused(capsys, *bench(tmp_path, "--data-dir", str(data_dir), "--target", str(empty), "--draft",
                                  str(empty)))
    assert line.startswith(f"error: --target {empty}: the folder holds no model (no config.json); give the folder")


def test_a_model_file_is_not_a_model_folder(capsys, tmp_path, data_dir) -> None:
    afile = tmp_path / "model.bin"
    afile.write_text("x")
    line = refused(capsys, *bench(tmp_path, "--data-dir", str(data_dir), "--target", "tiny", "--draft", str(afile)))
    assert line.startswith(f"error: --draft {afile} is a file, not a model folder")


def test_hub_ids_and_registry_names_do_not_look_like_paths(tmp_path, monkeypatch) -> None:
    from hf_securesd.bench.loading import looks_like_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen").mkdir()  # a local folder named like the Hub organisation: the id stays a Hub id
    assert not looks_like_path("Qwen/Qwen2.5-Coder-0.5B-Instruct") and not looks_like_path("qwen-0.5b")
    assert looks_like_path(f".{os.sep}models{os.sep}qwen") and looks_like_path("/abs") and looks_like_path("../up")
    assert looks_like_path("~/models/qwen")


def test_a_peft_adapter_folder_is_a_model_folder(tmp_path) -> None:
    from hf_securesd.bench.loading import model_folder_problem

    (tmp_path / "adapter_config.json").write_text("{}")
    assert model_folder_problem("--target", str(tmp_path)) is None


# ---- F7: long values and paths -------------------------------------------------------------------


def test_a_long_option_value_is_shortened_in_the_error(capsys, tmp_path) -> None:
    verifiers = "mars:0.5" + ",0.5" * 20_000
    line = refused(capsys, "bench", "--profile", "smoke", "--out", str(tmp_path / "out"), "--verifiers", verifiers)
    assert "names the same setting twice" in line and f"[{len(verifiers):,} characters]" in line
    assert len(line) < 400 and line.endswith("give each once")


def test_report_of_a_path_too_long_for_the_file_system_says_so(capsys) -> None:
    line = refused(capsys, "report", LONG)
    assert "the path is too long for the file system" in line and "give a shorter path" in line
    assert "Errno" not in line and len(line) < 500


@pytest.mark.parametrize("option", ["--out", "--data-dir"])
def test_bench_paths_too_long_for_the_file_system_are_one_line(capsys, tmp_path, data_dir, option) -> None:
    argv = bench(tmp_path, "--data-dir", str(data_dir)) + [option, LONG]
    line = refused(capsys, *argv)
    assert line.startswith(f"error: {option} aaaa") and "the path is too long for the file system" in line
