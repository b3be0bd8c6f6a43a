"""Records securesd could never have written stop `report` (and a resumed `bench`) with one line naming
the file, the line and the field, never a traceback or a silently wrong number: a PRR, interval or SPD
the cell's scores and seconds do not give (the report computes them again, as `bench` did), identity
fields that disagree (a record relabelled took another cell's or baseline's place), speculative
statistics whose items are not counts or TV sums within their counts, and text holding a lone
surrogate (which no UTF-8 report can hold)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
from support import record_cells, tiny_results

from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.bench.results import GENERATIONS, RUNS, CorruptResultsError, ResultsDir
from hf_securesd.bench.runner import TaskRun
from hf_securesd.bench.tasks import get_task
from hf_securesd.cli import main
from hf_securesd.schedules import Step
from hf_securesd.stats import SpeculativeStats
from hf_securesd.verifiers import MARS

REFUSE, COMPLY = "I'm sorry, but I cannot help with that.", "Sure, here is how | step 1:\nget"
RELAXED = RunConfig("speculative", MARS(theta=0.5))
SECURE = RunConfig("speculative", MARS(theta=0.5), Step(L=1))
# 1 = refused (attack failed): the target and the draft differ, so every PRR is defined
REFUSED = [(TARGET, [1, 1, 1, 1, 0, 0]), (DRAFT, [0, 0, 1, 0, 0, 0]), (RELAXED, [0, 1, 1, 0, 0, 1]),
           (SECURE, [1, 1, 1, 0, 0, 0])]
# 1 = solved
SOLVED = [(TARGET, [1, 1, 1, 0]), (DRAFT, [0, 0, 1, 0]), (RELAXED, [1, 0, 1, 0]), (SECURE, [1, 1, 0, 0])]
Change = Callable[[dict[str, Any]], None]


def _stats(accepted: int) -> dict[str, Any]:
    stats = SpeculativeStats()
    stats.record_round(0, 5, accepted, [0.5] * (accepted + 1))
    stats.new_tokens = accepted + 1
    return stats.to_dict()


def _record(store: ResultsDir, task: str, data_dir: Path, plan: list,
            answers: Callable[[Any, int], str]) -> None:
    """Record one cell per configuration of `plan` on `task` through the runner's own `finish_cell`, each
    configuration timed differently so that every SPD differs."""
    examples = get_task(task).examples(data_dir=data_dir, limit=len(plan[0][1]))
    task_run = TaskRun(get_task(task), examples, ["" for _ in examples], 16)
    finished: dict = {}
    for index, (config, outcomes) in enumerate(plan):
        responses = [answers(example, outcome) for example, outcome in zip(examples, outcomes)]
        record_cells(store, task_run, [(config, responses)], finished, speculative_stats=_stats(3),
                     seconds=2.0 + 0.37 * index)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, data_dir) -> Path:
    """A study as `bench` records it: jailbreak and gsm8k, target, draft and MARS with and without Step."""
    store = ResultsDir(tmp_path_factory.mktemp("checks") / "clean")
    store.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"},
               {"id": "s", "threads": 1})
    _record(store, "jailbreak", data_dir, REFUSED, lambda example, refused: REFUSE if refused else COMPLY)
    _record(store, "gsm8k", data_dir, SOLVED,
            lambda example, solved: f"#### {example.fields['answer'] if solved else -1}")
    store.close()
    return store.path


@pytest.fixture
def copy(clean, tmp_path) -> Path:
    path = tmp_path / "results"
    shutil.copytree(clean, path, ignore=shutil.ignore_patterns(".lock", "report"))
    return path


def _runs(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / RUNS).read_text(encoding="utf-8").splitlines()]


def _write_runs(path: Path, runs: list[dict[str, Any]]) -> None:
    (path / RUNS).write_text("".join(json.dumps(run) + "\n" for run in runs), encoding="utf-8")


def _index(runs: list[dict[str, Any]], config: str, task: str = "jailbreak") -> int:
    return next(index for index, run in enumerate(runs)
                if run["config_key"] == config and run["task"] == task)


def _edit(path: Path, config: str, change: Change, task: str = "jailbreak") -> int:
    """Apply `change` to the record of `config` on `task`; returns its line number in runs.jsonl."""
    runs = _runs(path)
    index = _index(runs, config, task)
    change(runs[index])
    _write_runs(path, runs)
    return index + 1


def _set(key: str, value: Any) -> Change:
    return lambda record: record.__setitem__(key, value)


def _set_stats(key: str, value: Any) -> Change:
    return lambda record: record["stats"].__setitem__(key, value)


def _refused(path: Path, capsys) -> str:
    """The one error line `securesd report` exits with (status 2), having written no report."""
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (path / "report" / "report.md").exists()
    return err


def _report(path: Path) -> tuple[str, str]:
    """report.md (its path written as RESULTS) and summary.json of `securesd report`."""
    assert main(["report", str(path)]) == 0
    text = (path / "report" / "report.md").read_text(encoding="utf-8").replace(str(path), "RESULTS")
    return text, (path / "report" / "summary.json").read_text(encoding="utf-8")


# F1: the report computes each cell's PRR, interval and SPD from its scores and seconds


def test_a_clean_study_reports_what_bench_recorded(copy) -> None:
    """The recomputation is `bench`'s own: a clean study's tables show the recorded PRR and interval."""
    runs = {run["cell"]: run for run in _runs(copy)}
    _, summary = _report(copy)
    rows = json.loads(summary)["flips"] + json.loads(summary)["utility_flips"]
    speculative = [row for row in rows if row["config"] != "draft"]
    assert len(speculative) == 4 and all(row["prr"] is not None for row in speculative)
    assert [(row["prr"], row["prr_ci"]) for row in speculative] == [
        (runs[row["cell"]]["prr"], runs[row["cell"]]["prr_ci"]) for row in speculative]


def _recorded_before_its_baselines(record: dict[str, Any]) -> None:
    """What a cell finished before its baselines holds (no PRR fields, no SPD), had its refresh been lost."""
    for key in ("prr", "prr_ci", "prr_undefined", "target_score", "draft_score"):
        record.pop(key)
    record["spd"] = None


@pytest.mark.parametrize("change", [
    lambda record: record.update(prr=0.97, prr_ci=[0.5, 0.99], spd=3.5),  # edited, within their ranges
    _recorded_before_its_baselines,
], ids=["edited", "stale"])
def test_recorded_prr_and_spd_the_scores_do_not_give_are_not_shown(clean, copy, tmp_path, change) -> None:
    """A recorded PRR was printed as is in the tables, Table 1, Figure 1 and All runs, beside the
    asymmetry section's PRR computed from the scores."""
    reference = tmp_path / "reference"
    shutil.copytree(clean, reference, ignore=shutil.ignore_patterns(".lock", "report"))
    for config in (RELAXED.key, SECURE.key):
        _edit(copy, config, change)
    assert _report(copy) == _report(reference)


@pytest.mark.parametrize("field, value, problem", [
    ("spd", -3.5, "'spd' hold a negative time, count or speed-up"),
    ("prr_ci", [0.99, -7.0], "'prr_ci' [0.99, -7.0] has its lower bound above its upper one"),
])
def test_a_negative_spd_or_a_reversed_interval_is_refused(copy, capsys, field, value, problem) -> None:
    line = _edit(copy, RELAXED.key, _set(field, value))
    assert f"{copy / RUNS}, line {line}: a run whose {problem}" in _refused(copy, capsys)


@pytest.mark.parametrize("field, value", [("seconds", [1e308] * 6), ("seconds", [0.5] * 5 + [2e9]),
                                          ("wall_time", 1e308), ("cpu_time", 1e10)])
def test_a_time_no_run_takes_is_refused(copy, capsys, field, value) -> None:
    """Seconds of 1e308 passed and overflowed the report's sums (numpy warnings, an SPD of 0.00, a
    300-digit wall-time column); a time above 1e9 seconds is refused like a negative one."""
    line = _edit(copy, RELAXED.key, _set(field, value))
    error = _refused(copy, capsys)
    assert f"{copy / RUNS}, line {line}: a run whose {field!r} hold a time above 1e+09 seconds" in error
    assert "RuntimeWarning" not in error


def test_a_time_of_a_long_real_run_is_read() -> None:
    """The bound is far above any real run: a cell of a month per example is still a record."""
    from hf_securesd.bench.run_records import duration_problem

    month = 31 * 24 * 3600.0
    assert duration_problem({"seconds": [month] * 3, "wall_time": 3 * month, "cpu_time": 48 * month}) is None


@pytest.mark.parametrize("field", ["seconds", "sessions"])
def test_a_record_without_the_timing_its_spd_is_computed_from_is_refused(copy, capsys, field) -> None:
    """`bench` always records them; without them the SPD the report computes was a KeyError traceback."""
    line = _edit(copy, RELAXED.key, lambda record: record.pop(field))
    assert f"{copy / RUNS}, line {line}: a record without a valid {field!r}" in _refused(copy, capsys)


# F2: identity fields agree, so no record takes another cell's or baseline's place


def _rename(config_key: str, cell: str) -> Change:
    return lambda record: record.update(config_key=config_key, cell=cell)


IDENTITY: dict[str, tuple[str, Change, str]] = {
    # name: (configuration whose jailbreak record is edited, the edit, what the error names)
    "speculative cell named as the target's": (
        RELAXED.key, _set("cell", "target|jailbreak|n=6|max_new_tokens=16"),
        "'cell' is 'target|jailbreak|n=6|max_new_tokens=16', not 'mars(theta=0.5)|jailbreak|n=6|"),
    "speculative config_key of the target": (
        RELAXED.key, _rename("target", "target|jailbreak|n=6|max_new_tokens=16"),
        "'config_key' is 'target', not 'mars(theta=0.5)', the key of its 'config'"),
    "another verifier's config_key": (
        RELAXED.key, _rename(SECURE.key, f"{SECURE.key}|jailbreak|n=6|max_new_tokens=16"),
        f"'config_key' is '{SECURE.key}', not 'mars(theta=0.5)'"),
    "draft run as the target": (
        "draft", lambda record: record["config"].update(kind="target"),
        "'config_key' is 'draft', not 'target'"),
    "cell of another task and size": (
        RELAXED.key, _set("cell", "mars(theta=0.5)|gsm8k|n=999|max_new_tokens=16"),
        "'cell' is 'mars(theta=0.5)|gsm8k"),
    "baseline_id of another length": (
        RELAXED.key, _set("baseline_id", "jailbreak|n=6|max_new_tokens=4"),
        "'baseline_id' is 'jailbreak|n=6|max_new_tokens=4', not 'jailbreak|n=6|max_new_tokens=16'"),
    "negative max_new_tokens": ("target", _set("max_new_tokens", -5), "'max_new_tokens' is below 1"),
    "unknown task kind": ("target", _set("task_kind", "banana"), "'task_kind' and 'metric' are 'banana'"),
    "jailbreak as a utility task": (
        "target", lambda record: record.update(task_kind="utility", metric="accuracy"),
        "not the task's 'safety' and 'afr'"),
    "unknown task": ("target", _set("task", "t"), "a run of the task 't', none of securesd's"),
    "config of no configuration": (
        RELAXED.key, lambda record: record["config"].update(schedule="x"), "'config' {"),
    "another knob": (RELAXED.key, _set("knob_value", 0.9), "'knob_value' is 0.9, not 0.5, which its 'config'"),
    "a knob on the target": ("target", _set("knob_value", 0.5), "'knob_value' is 0.5, not None"),
    "another schedule label": (
        SECURE.key, _set("schedule_label", "step(L=9)"), "'schedule_label' is 'step(L=9)', not 'step(L=1)'"),
    "no schedule label with a schedule": (SECURE.key, _set("schedule_label", None), "'schedule_label' is None"),
}


@pytest.mark.parametrize("name", IDENTITY)
def test_identity_fields_that_disagree_are_refused(copy, capsys, name) -> None:
    config, change, problem = IDENTITY[name]
    line = _edit(copy, config, change)
    error = _refused(copy, capsys)
    assert f"{copy / RUNS}, line {line}: " in error and problem in error and "new --out directory" in error


def test_a_second_target_record_cannot_replace_the_baseline(copy, capsys) -> None:
    """Records are kept one per `cell` and baselines one per (kind, baseline_id): a second target
    record under another cell name silently became the baseline every PRR was computed against."""
    runs = _runs(copy)
    second = {**runs[_index(runs, "target")], "cell": "target|jailbreak|n=6|max_new_tokens=16|copy",
              "scores": [0.0] * 6, "score": 0.0}
    _write_runs(copy, [*runs, second])
    error = _refused(copy, capsys)
    assert f"{copy / RUNS}, line {len(runs) + 1}: a run whose 'cell' is '{second['cell']}'" in error


# F3: the items of speculative statistics are counts, and TV sums lie within them


NOT_A_TV_SUM, NOT_COUNTS = "hold an item that is not a finite number >= 0", "hold other than counts"
STATS: dict[str, tuple[Change, str]] = {
    "TV sum text": (_set_stats("position_tv_sum", ["a"] * 4), f"'position_tv_sum' {NOT_A_TV_SUM}"),
    "TV sum NaN text": (_set_stats("position_tv_sum", ["NaN"] * 4), f"'position_tv_sum' {NOT_A_TV_SUM}"),
    "verified null": (_set_stats("position_verified", [None, 1, 1, 1]), f"'position_verified' {NOT_COUNTS}"),
    "nested counts": (_set_stats("drafted_per_round", [[5]] * 6), f"'drafted_per_round' {NOT_COUNTS}"),
    "boolean counts": (_set_stats("position_drafted", [True] * 5), f"'position_drafted' {NOT_COUNTS}"),
    "negative counts": (_set_stats("position_verified", [-5] * 4), f"'position_verified' {NOT_COUNTS}"),
    "negative new_tokens": (_set_stats("new_tokens", -1), f"'new_tokens' {NOT_COUNTS}"),
    "TV sum above verified": (_set_stats("position_tv_sum", [50.0] * 4),
                              "'position_tv_sum' item 0 (50.0) exceeds its 'position_verified' (6)"),
    "accepted above drafted": (_set_stats("accepted_per_round", [9] * 6),
                               "'accepted_per_round' item 0 (9) exceeds its 'drafted_per_round' (5)"),
    "uneven rounds": (_set_stats("accepted_per_round", [3] * 7),
                      "'drafted_per_round' and 'accepted_per_round' are not of one length"),
    "example accepted above drafted": (
        lambda record: record.update(accepted=[99] * 6), "example 0 has 'accepted' 99 of 'drafted' 5"),
}


@pytest.mark.parametrize("name", STATS)
def test_statistics_securesd_never_writes_are_refused(copy, capsys, name) -> None:
    """Text or null items were a TypeError traceback in `report`; TV sums above their counts, negative
    counts and more accepted than drafted gave a TV outside [0, 1] in summary.json and position_tv.png."""
    change, problem = STATS[name]
    line = _edit(copy, RELAXED.key, change)
    error = _refused(copy, capsys)
    assert f"{copy / RUNS}, line {line}: a run whose " in error and problem in error


def test_journaled_statistics_securesd_never_writes_stop_a_resumed_bench(tmp_path, data_dir, capsys) -> None:
    """`bench` resumes from generations.jsonl: a text TV sum there was a TypeError traceback when the
    unfinished cell was scored (`SpeculativeStats.merge`)."""
    out = tiny_results(tmp_path / "results", data_dir, ("none",))
    cell = f"{RELAXED.key}|jailbreak|n=3|max_new_tokens=4"
    _write_runs(out, [run for run in _runs(out) if run["cell"] != cell])  # as if killed before it finished
    journal = [json.loads(line) for line in (out / GENERATIONS).read_text(encoding="utf-8").splitlines()]
    line = next(number for number, record in enumerate(journal, 1) if record["cell"] == cell)
    stats = journal[line - 1]["stats"]
    stats["position_tv_sum"] = ["0.5"] * len(stats["position_tv_sum"])
    (out / GENERATIONS).write_text("".join(json.dumps(record) + "\n" for record in journal), encoding="utf-8")
    argv = ["bench", "--profile", "smoke", "--tasks", "jailbreak", "gsm8k", "--limit", "3",
            "--max-new-tokens", "4", "--verifiers", "mars:0.5", "--schedules", "none", "--data-dir",
            str(data_dir), "--out", str(out), "--no-progress", "--no-report"]  # `tiny_results`' own
    capsys.readouterr()  # the first run's progress
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{out / GENERATIONS}, line {line}: a run whose 'stats' 'position_tv_sum' hold an item" in err


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("seconds", -1.0, "a generation whose 'seconds' is -1.0, not a time from 0 to 1e+09 seconds"),
    ("seconds", 1e308, "a generation whose 'seconds' is 1e+308, not a time from 0"),
    ("new_tokens", -3, "a generation whose 'new_tokens' is -3, a negative count"),
    ("cpu_seconds", "x", "a generation whose 'cpu_seconds' is 'x', not a time from 0"),
    ("cpu_seconds", -5.0, "a generation whose 'cpu_seconds' is -5.0, not a time from 0"),
])
def test_journaled_times_and_counts_a_finished_cell_would_refuse_stop_a_resumed_bench(
    tmp_path, data_dir, capsys, field, value, problem
) -> None:
    """A journal line whose time or count the finished cell's record may not hold (report refuses such a
    runs.jsonl line) is named when `bench` resumes from it, not written into runs.jsonl."""
    out = tiny_results(tmp_path / "results", data_dir, ("none",))
    cell = f"{RELAXED.key}|jailbreak|n=3|max_new_tokens=4"
    _write_runs(out, [run for run in _runs(out) if run["cell"] != cell])  # as if killed before it finished
    journal = [json.loads(line) for line in (out / GENERATIONS).read_text(encoding="utf-8").splitlines()]
    line = next(number for number, record in enumerate(journal, 1) if record["cell"] == cell)
    journal[line - 1][field] = value
    (out / GENERATIONS).write_text("".join(json.dumps(record) + "\n" for record in journal), encoding="utf-8")
    argv = ["bench", "--profile", "smoke", "--tasks", "jailbreak", "gsm8k", "--limit", "3",
            "--max-new-tokens", "4", "--verifiers", "mars:0.5", "--schedules", "none", "--data-dir",
            str(data_dir), "--out", str(out), "--no-progress", "--no-report"]  # `tiny_results`' own
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{out / GENERATIONS}, line {line}: {problem}" in err, err


def test_journaled_times_whose_sum_no_run_takes_stop_a_resumed_bench(tmp_path, data_dir, capsys) -> None:
    """Each journaled time fits, their sum does not: the finished cell is not written (report would
    refuse its 'wall_time')."""
    out = tiny_results(tmp_path / "results", data_dir, ("none",))
    cell = f"{RELAXED.key}|jailbreak|n=3|max_new_tokens=4"
    _write_runs(out, [run for run in _runs(out) if run["cell"] != cell])  # as if killed before it finished
    journal = [json.loads(line) for line in (out / GENERATIONS).read_text(encoding="utf-8").splitlines()]
    for record in journal:
        if record["cell"] == cell:
            record["seconds"] = 6e8
    (out / GENERATIONS).write_text("".join(json.dumps(record) + "\n" for record in journal), encoding="utf-8")
    argv = ["bench", "--profile", "smoke", "--tasks", "jailbreak", "gsm8k", "--limit", "3",
            "--max-new-tokens", "4", "--verifiers", "mars:0.5", "--schedules", "none", "--data-dir",
            str(data_dir), "--out", str(out), "--no-progress", "--no-report"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"the journaled generations of cell {cell!r} add up to a run whose " in err
    assert all(run["cell"] != cell for run in _runs(out))


# F8: text holds no lone surrogate


def test_a_lone_surrogate_is_refused_naming_the_field(copy, capsys) -> None:
    """It was accepted, then `report` failed writing report.md ("'utf-8' codec can't encode character
    '\\ud800'"), naming no file, line or field."""
    line = _edit(copy, RELAXED.key, lambda record: record["responses"].__setitem__(1, "\ud800 reply"))
    assert "\\ud800" in (copy / RUNS).read_text(encoding="utf-8")  # json.dumps escapes it, as a file would
    error = _refused(copy, capsys)
    assert f"{copy / RUNS}, line {line}: a record with a lone surrogate in 'responses'[1] (" in error


def test_a_lone_surrogate_in_a_name_or_the_journal_is_refused(copy) -> None:
    _edit(copy, "target", lambda record: record["details"][0].update({"\udc80": 1}))
    where = r"line 1: a record with a lone surrogate in the name 'details'\[0\]\['\\udc80'\]"
    with pytest.raises(CorruptResultsError, match=where):
        ResultsDir(copy).runs()
    record = {"cell": "c", "example_id": "e", "response": "ok \udfff", "seconds": 1.0, "new_tokens": 1,
              "session": "s", "stats": None}
    (copy / GENERATIONS).write_text(json.dumps(record) + "\n", encoding="utf-8")
    where = r"generations.jsonl, line 1: a record with a lone surrogate in 'response' "
    with pytest.raises(CorruptResultsError, match=where):
        ResultsDir(copy).generations()


def test_a_character_escaped_as_a_surrogate_pair_is_text(copy) -> None:
    """`json.dumps` writes a character beyond the BMP (an emoji) as an escaped pair: that is text."""
    _edit(copy, RELAXED.key, lambda record: record["responses"].__setitem__(1, "ok \U0001F600"))
    assert "\\ud83d\\ude00" in (copy / RUNS).read_text(encoding="utf-8")
    assert any(run["responses"][1] == "ok \U0001F600" for run in ResultsDir(copy).runs())
    assert main(["report", str(copy)]) == 0


# The acceptance rate the report bins and ranks settings by, and counts whose sums stay finite


@pytest.mark.parametrize("value, made", [(0.999, "0.6"), (None, "0.6")])
def test_an_acceptance_rate_its_counts_do_not_make_is_refused(copy, capsys, value, made) -> None:
    """A rate written apart from its counts moved the cell into another AR bin and chose which setting
    Figure 2 plots (it was shown as written; only its range was checked)."""
    line = _edit(copy, RELAXED.key, _set("acceptance_rate", value))
    error = _refused(copy, capsys)
    assert f"{copy / RUNS}, line {line}: a run whose 'acceptance_rate' {value!r} is not the one its 'stats' make ({made}" in error


def test_a_rate_without_statistics_is_refused(copy, capsys) -> None:
    line = _edit(copy, RELAXED.key, _set("stats", None))
    assert (f"line {line}: a run whose 'acceptance_rate' 0.6 is not the one its 'stats' make (null: the run has "
            "no statistics)") in _refused(copy, capsys)


def test_counts_whose_sums_leave_float_range_are_refused(copy, capsys) -> None:
    """Counts near float's maximum passed and the merged sum crashed `report` with a traceback."""
    line = _edit(copy, RELAXED.key, _set_stats("position_verified", [10**308] * 6))
    assert (f"line {line}: a run whose 'stats' 'position_verified' hold other than counts (integers from 0 to "
            "2**53)") in _refused(copy, capsys)
