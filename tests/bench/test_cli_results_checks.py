"""The CLI refuses bad input with one line (exit 2) before creating or generating anything: results
folders that are not results directories, records with mistyped fields, unwritable --json paths,
calibrate settings out of range, and judge-validate options the chosen judge would ignore."""

from __future__ import annotations

import json
import math

import pytest
from support import record_cells

from hf_securesd.bench.plan import DRAFT, TARGET
from hf_securesd.bench.results import MANIFEST, RUNS, ResultsDir, read_jsonl
from hf_securesd.bench.runner import TaskRun
from hf_securesd.bench.tasks import get_task
from hf_securesd.cli import main


def _error(capsys) -> str:
    """The one stderr line of a refused command."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def results(tmp_path, data_dir):
    task = get_task("prompt_injection")
    examples = task.examples(data_dir=data_dir, limit=2)
    store = ResultsDir(tmp_path / "results")
    store.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s", "threads": 1})
    record_cells(store, TaskRun(task, examples, ["" for _ in examples], 16),
                 [(TARGET, ["I cannot."] * 2), (DRAFT, ["ok"] * 2)], new_tokens=4)
    store.close()
    return tmp_path / "results"


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
def test_rescore_and_report_create_nothing_outside_a_results_directory(tmp_path, capsys, where) -> None:
    path = tmp_path / "x"
    if where == "empty":
        path.mkdir()
    elif where == "file":
        path.write_text("not a folder", encoding="utf-8")
    before = sorted(tmp_path.rglob("*"))
    for command in (["rescore", str(path), "--tasks", "gsm8k"], ["report", str(path)]):
        assert main(command) == 2
        error = _error(capsys)
        assert ("is a file, not a results directory" if where == "file" else "is not a results directory") in error
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command", ["report", "rescore"])
def test_a_file_given_as_results_is_named_with_what_to_pass_not_sent_to_bench(tmp_path, capsys, command) -> None:
    """bench refuses a file for --out, so "run `securesd bench --out FILE` first" would lead nowhere."""
    path = tmp_path / "afile"
    path.write_text("not a folder", encoding="utf-8")
    argv = [command, str(path)] + (["--tasks", "gsm8k"] if command == "rescore" else [])
    assert main(argv) == 2
    error = _error(capsys)
    assert f"{path} is a file, not a results directory" in error
    assert "the folder `securesd bench --out` wrote" in error and f"--out {path}" not in error


@pytest.mark.parametrize("command", [["rescore", "", "--tasks", "gsm8k"], ["report", ""]])
def test_an_empty_results_path_is_refused(tmp_path, monkeypatch, capsys, command) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as caught:
        main(command)
    assert caught.value.code == 2
    assert "RESULTS is empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_manifest_seed_that_is_not_an_integer_is_refused(results, capsys) -> None:
    manifest = json.loads((results / MANIFEST).read_text(encoding="utf-8")) | {"seed": math.nan}
    (results / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert main(["report", str(results)]) == 2
    assert "'seed' is nan, not an integer" in _error(capsys)
    assert not (results / "report").exists()


AGREEMENT = {"agreement": 0.8, "kappa": 0.6, "precision": 0.7, "recall": 0.9, "n": 100, "labels": "human",
             "match": "start"}


@pytest.mark.parametrize("agreement, problem", [({"match": "start"}, "'agreement'"),
                                                ({**AGREEMENT, "kappa": "high"}, "'kappa'"),
                                                ({**AGREEMENT, "n": None}, "'n'")])
def test_a_mistyped_judge_agreement_is_refused_in_one_line(results, capsys, agreement, problem) -> None:
    manifest = json.loads((results / MANIFEST).read_text(encoding="utf-8")) | {"judge_agreement": agreement}
    (results / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert main(["report", str(results)]) == 2
    assert f"'judge_agreement' has no valid {problem}" in _error(capsys)


@pytest.mark.parametrize("changes, problem", [
    ({"agreement": 10**400}, "no valid 'agreement'"), ({"kappa": 10**400}, "no valid 'kappa'"),
    ({"agreement": 7}, "'agreement' 7, outside [0, 1]"), ({"recall": -0.1}, "'recall' -0.1, outside [0, 1]"),
    ({"kappa": -1.5}, "'kappa' -1.5, outside [-1, 1]"),
])
def test_an_impossible_judge_agreement_is_refused_in_one_line(results, capsys, changes, problem) -> None:
    """A rate beyond float range overflowed the report's formatting (a traceback); one outside its
    range showed as, say, "700 % agreement"."""
    manifest = json.loads((results / MANIFEST).read_text(encoding="utf-8"))
    manifest["judge_agreement"] = AGREEMENT | changes
    (results / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert main(["report", str(results)]) == 2
    assert f"{results / MANIFEST}: 'judge_agreement' has {problem}" in _error(capsys)


@pytest.mark.parametrize("threads", ['<img src="https://attacker.example/p.png">', "2", [1], 0, -1, True,
                                     10**400, 1.5])
def test_session_threads_that_are_not_a_positive_integer_are_refused(results, capsys, threads) -> None:
    """The report's cost section showed the recorded thread counts raw: HTML and links reached
    report.md, and mixed types or lists ended in a traceback."""
    manifest = json.loads((results / MANIFEST).read_text(encoding="utf-8"))
    manifest["sessions"].append({"id": "planted", "threads": threads})
    (results / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert main(["report", str(results)]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: {results / MANIFEST}: 'sessions' item 1 has 'threads' ")
    assert "not a positive integer (or null)" in line
    assert not (results / "report").exists()


def test_session_threads_show_as_numbers(results) -> None:
    manifest = json.loads((results / MANIFEST).read_text(encoding="utf-8"))
    manifest["sessions"] += [{"id": "two", "threads": 2}, {"id": "unknown", "threads": None}]
    (results / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert main(["report", str(results)]) == 0
    assert "Torch threads per session: 1, 2." in (results / "report" / "report.md").read_text(encoding="utf-8")


def test_recorded_judge_options_the_judge_does_not_take_are_named(results, capsys, monkeypatch, data_dir) -> None:
    """Without a recorded agreement, report measures the recorded judge with the recorded options;
    an option it does not take was a TypeError traceback."""
    monkeypatch.setenv("SECURESD_DATA_DIR", str(data_dir))
    manifest = json.loads((results / MANIFEST).read_text(encoding="utf-8"))
    manifest.pop("judge_agreement", None)
    manifest["judge_options"] = {"bogus": 1}
    (results / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert main(["report", str(results)]) == 2
    line = _error(capsys)
    assert "study.json: 'judge_options' {'bogus': 1} cannot build the recorded judge" in line
    assert "takes no option 'bogus'" in line


def test_a_judge_agreement_without_a_rate_shows_a_dash(results, capsys) -> None:
    """A rate that was not finite when measured is written as null (strict JSON)."""
    manifest = json.loads((results / MANIFEST).read_text(encoding="utf-8"))
    manifest["judge_agreement"] = {**AGREEMENT, "kappa": None, "agreement": None}
    (results / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert main(["report", str(results)]) == 0
    text = (results / "report" / "report.md").read_text(encoding="utf-8")
    assert "– agreement with human labels, Cohen's κ –, precision 0.70" in text


@pytest.mark.parametrize("field, value", [
    ("acceptance_rate", "x"), ("wall_time", "fast"), ("stats", "x"), ("scores", ["x", 1.0]),
    # the right JSON type, an impossible value (an OverflowError or a numpy casting error before)
    ("score", 10**400), ("wall_time", 10**400), ("cpu_time", 10**400), ("seconds", [10**400, 1.0]),
    ("wall_time", -1.0), ("cpu_time", -1.0), ("seconds", [-(10**30), 1.0]), ("new_tokens", [-1, 4]),
    ("prr_ci", ["low", 1.0]), ("prr_ci", [10**400, 1.0]), ("prr_ci", [0.1]),
])
def test_mistyped_run_fields_stop_report_and_rescore(results, capsys, field, value) -> None:
    runs = read_jsonl(results / RUNS)
    runs[0][field] = value
    text = "".join(json.dumps(run) + "\n" for run in runs)
    (results / RUNS).write_text(text, encoding="utf-8")
    assert main(["report", str(results)]) == 2
    line = _error(capsys)
    assert line.startswith(f"error: {results / RUNS}, line 1: ") and repr(field) in line
    assert main(["rescore", str(results), "--tasks", "prompt_injection"]) == 2
    assert f"{results / RUNS}, line 1" in _error(capsys)
    assert (results / RUNS).read_text(encoding="utf-8") == text  # nothing rewritten
    assert not (results / "report").exists()


def test_report_names_a_report_file_in_the_way(results, capsys) -> None:
    (results / "report").write_text("in the way", encoding="utf-8")
    assert main(["report", str(results)]) == 2
    assert "is not a folder" in _error(capsys)


def test_demo_refuses_an_unwritable_json_before_loading_anything(capsys) -> None:
    assert main(["demo", "--json", "/proc/securesd-test.json"]) == 2
    assert "--json /proc/securesd-test.json cannot be written" in _error(capsys)


@pytest.mark.parametrize("option, message", [
    (["--spd-tolerance", "2"], "--spd-tolerance 2.0: give a fraction"),
    (["--tolerance", "1.5"], "--tolerance 1.5: give the allowed safety-PRR shortfall from lossless between "
                             "0 and 1 (PRR runs from 0, the draft alone, to 1, the target alone), e.g. "
                             "--tolerance 0.05"),
    (["--tolerance", "1e9"], "--tolerance 1000000000.0: give the allowed safety-PRR shortfall"),
    (["--L", "-1"], "--L -1: each L must be"),
])
def test_calibrate_refuses_out_of_range_settings_before_generating(tmp_path, capsys, option, message) -> None:
    out = tmp_path / "out"
    assert main(["calibrate", "--profile", "smoke", "--tasks", "jailbreak", "--limit", "1", "--no-progress",
                 "--out", str(out), *option]) == 2
    assert message in _error(capsys)
    assert not out.exists()


def test_calibrate_checks_boundary_ids_against_the_vocabulary() -> None:
    from types import SimpleNamespace

    from hf_securesd.bench.calibrate import calibration_configs, check_boundaries_in_vocabulary
    from hf_securesd.segments import Segments

    config = SimpleNamespace(get_text_config=lambda: SimpleNamespace(vocab_size=100))
    target = SimpleNamespace(config=config, get_output_embeddings=lambda: None)
    engine = SimpleNamespace(models=SimpleNamespace(target=target))
    configs = calibration_configs(["mars:0.5"], [1], Segments([[999]], before="lossless", after="lossless"))
    with pytest.raises(ValueError, match="--segment-boundary: .*outside this model's vocabulary"):
        check_boundaries_in_vocabulary(configs, engine)
    check_boundaries_in_vocabulary(calibration_configs(["mars:0.5"], [1], Segments([[99]])), engine)


@pytest.mark.parametrize("options, message", [
    (["--backend", "transformers"], "--backend is used only by strongreject"),
    (["--threshold", "nan"], "--threshold is used only by strongreject"),
    (["--max-new-tokens", "7"], "--max-new-tokens is used only by strongreject with --backend transformers"),
    (["--judge", "strongreject", "--prefix-list", "jailbreakbench"], "--prefix-list is used only by refusal_prefix"),
    (["--judge", "strongreject", "--threshold", "nan"], "--threshold nan: give a finite number"),
])
def test_judge_validate_refuses_options_the_judge_ignores(data_dir, capsys, options, message) -> None:
    assert main(["judge-validate", "--data-dir", str(data_dir), *options]) == 2
    assert message in _error(capsys)


def test_judge_validate_names_a_model_that_cannot_be_loaded(data_dir, tmp_path, capsys) -> None:
    missing = tmp_path / "nosuch-model"
    assert main(["judge-validate", "--data-dir", str(data_dir), "--judge", "strongreject", "--backend",
                 "transformers", "--model", str(missing)]) == 2
    line = _error(capsys)
    assert f"--model {missing}: the judge model could not be loaded" in line
    assert not missing.exists()
