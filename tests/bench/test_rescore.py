"""`securesd rescore`: recorded responses scored again with the current scorers, PRR recomputed
against the re-scored baselines, runs.jsonl rewritten in place."""

from __future__ import annotations

import json

import pytest
from support import record_cells

from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.bench.rescore import rescore
from hf_securesd.bench.results import RUNS, ResultsDir, ResultsDirInUseError, read_jsonl
from hf_securesd.bench.runner import TaskRun
from hf_securesd.bench.tasks import get_task
from hf_securesd.cli import main
from hf_securesd.verifiers import MARS

RELAXED = RunConfig("speculative", MARS(theta=0.5))


@pytest.fixture
def results(tmp_path, data_dir):
    task = get_task("prompt_injection")
    examples = task.examples(data_dir=data_dir, limit=4)
    task_run = TaskRun(task, examples, ["" for _ in examples], 16)
    store = ResultsDir(tmp_path / "results")
    store.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s", "threads": 1})
    answers = [example.fields["injected_answer"] for example in examples]
    plan = [(TARGET, ["I cannot."] * 4), (DRAFT, answers), (RELAXED, answers[:2] + ["I cannot."] * 2)]
    record_cells(store, task_run, plan, new_tokens=4)
    store.close()
    return tmp_path / "results", examples


def _tamper(path, config_key: str, index: int) -> None:
    """Flip one recorded verdict, as an older scorer might have given it."""
    runs = read_jsonl(path / RUNS)
    for run in runs:
        if run["config_key"] == config_key:
            run["scores"][index] = 1.0 - run["scores"][index]
            run["score"] = sum(run["scores"]) / len(run["scores"])
    (path / RUNS).write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")


def test_rescore_restores_the_verdicts_and_recomputes_prr(results, data_dir):
    path, examples = results
    original = {run["config_key"]: run for run in ResultsDir(path).runs()}
    _tamper(path, "target", 0)
    runs = read_jsonl(path / RUNS)
    for run in runs:  # a PRR computed against the old verdicts
        run["prr"] = 0.123 if run["config_key"] == "mars(theta=0.5)" else run.get("prr")
    (path / RUNS).write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")
    changes = {cell.cell: cell.changed for cell in rescore(path, ["prompt_injection"], data_dir)}
    assert changes["target|prompt_injection|n=4|max_new_tokens=16"] == [examples[0].id]
    assert changes["mars(theta=0.5)|prompt_injection|n=4|max_new_tokens=16"] == []
    again = {run["config_key"]: run for run in ResultsDir(path).runs()}
    assert again["target"]["scores"] == original["target"]["scores"]
    assert again["mars(theta=0.5)"]["prr"] == original["mars(theta=0.5)"]["prr"]
    assert len(read_jsonl(path / RUNS)) == 3  # rewritten, not appended


def test_rescore_refuses_unknown_tasks_and_a_directory_in_use(results, data_dir, capsys):
    path, _ = results
    assert main(["rescore", str(path), "--tasks", "jailbrake", "--data-dir", str(data_dir)]) == 2
    assert "unknown task(s) jailbrake" in capsys.readouterr().err
    holder = ResultsDir(path)
    holder.lock()
    with pytest.raises(ResultsDirInUseError):
        rescore(path, ["prompt_injection"], data_dir)
    holder.close()


@pytest.mark.parametrize("bad", ['{"cell": "mars', "[1, 2]", "{}", "null"])
def test_rescore_never_rewrites_a_file_it_could_not_read_whole(results, data_dir, capsys, bad):
    path, _ = results
    lines = (path / RUNS).read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(1, bad + "\n")  # a line in the middle, not a torn last line
    (path / RUNS).write_text("".join(lines), encoding="utf-8")
    before = (path / RUNS).read_bytes()
    assert main(["rescore", str(path), "--tasks", "prompt_injection", "--data-dir", str(data_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path / RUNS}, line 2: ") and err.count("\n") == 1
    assert (path / RUNS).read_bytes() == before


def test_rescore_drops_a_torn_last_line(results, data_dir):
    path, _ = results
    with open(path / RUNS, "a", encoding="utf-8") as handle:
        handle.write('{"cell": "mars')  # a write torn by a killed run
    rescore(path, ["prompt_injection"], data_dir)
    assert (path / RUNS).read_text(encoding="utf-8").endswith("}\n") and len(read_jsonl(path / RUNS)) == 3


def test_a_link_planted_at_the_lock_is_a_one_line_error_and_its_target_kept(results, data_dir, tmp_path, capsys):
    """A results directory received from someone else with `.lock` linked to a file of the user's: taking
    the lock would truncate it and write a pid there."""
    path, _ = results
    kept = tmp_path / "token"
    kept.write_text("hf_secret")
    (path / ".lock").unlink(missing_ok=True)
    (path / ".lock").symlink_to(kept)
    code = main(["rescore", str(path), "--tasks", "prompt_injection", "--data-dir", str(data_dir)])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and error[0].endswith("remove it (securesd recreates it) or start a new --out directory")
    assert kept.read_text() == "hf_secret"


def test_rescore_against_other_contents_of_the_same_examples_is_refused(results, data_dir):
    """A --data-dir whose examples have the recorded ids but other contents would re-score the recorded
    answers against other gold answers than they were generated for."""
    path, _ = results
    runs = read_jsonl(path / RUNS)
    for run in runs:
        run["examples_digest"] = "0" * 64  # what another data version's contents give
    (path / RUNS).write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")
    before = (path / RUNS).read_bytes()
    with pytest.raises(ValueError, match="other contents than those the cell's answers were generated and scored "
                       "for .* nothing was rewritten"):
        rescore(path, ["prompt_injection"], data_dir)
    assert (path / RUNS).read_bytes() == before
