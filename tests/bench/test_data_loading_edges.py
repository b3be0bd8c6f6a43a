"""Local benchmark data that parses but cannot make the study asked for: example ids repeated in the data,
CSV rows with more values than the header, copies cut short or empty, and a limit above a task's size. Each
is refused when the examples are loaded (before any generation) with one line naming the file (or the
task), the problem and the fix. Copies of the shared data are edited under tmp_path; it is only read."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from pathlib import Path

import pytest

from hf_securesd.bench.data import DATA_FIX, HUB_FIX, BenchmarkDataError
from hf_securesd.bench.runner import prepare_tasks
from hf_securesd.bench.tasks import Example, Task, get_task, gsm8k, humaneval, jailbreak, prompt_injection
from hf_securesd.cli import main

JBB = "jailbreakbench/behaviors.csv"
HARMBENCH = "harmbench/harmbench_behaviors_text_all.csv"
ADVBENCH = "advbench/harmful_behaviors.csv"
HUMANEVAL = "humaneval/HumanEval.jsonl.gz"


def _copy_all(data_dir: Path, root: Path) -> Path:
    """A full copy of the shared benchmark data under `root`; its path."""
    shutil.copytree(data_dir, root, ignore=shutil.ignore_patterns("strongreject", "refusal_judges"))
    return root


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8-sig").splitlines()


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _humaneval_rows(data_dir: Path) -> list[dict]:
    with gzip.open(data_dir / HUMANEVAL, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _write_humaneval(path: Path, rows: list[dict]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)


def _error(task: str, root: Path, **options) -> str:
    with pytest.raises(BenchmarkDataError) as caught:
        get_task(task).examples(data_dir=root, **options)
    return str(caught.value)


# -- example ids repeated in the data (F3) --------------------------------------------------------


def _set_column(path: Path, column: str, values: dict[int, str]) -> None:
    """Rewrite the CSV file `path` with `column` of row i (from 0) set to `values[i]`."""
    with open(path, encoding="utf-8-sig", newline="") as handle:
        header, *rows = list(csv.reader(handle))
    for index, value in values.items():
        rows[index][header.index(column)] = value
    with open(path, "w", encoding="utf-8", newline="") as handle:
        csv.writer(handle).writerows([header, *rows])


def test_a_repeated_jailbreakbench_behavior_is_refused_naming_the_file_rows_and_value(tmp_path, data_dir) -> None:
    root = _copy_all(data_dir, tmp_path / "data")
    path = root / JBB
    _set_column(path, "Behavior", {index: "Same" for index in range(100)})
    for task in ("jailbreak", "jailbreak_adaptive"):
        assert _error(task, root) == (f"benchmark file {path} could not be read: row 2 (line 3): 'Behavior' is 'Same', "
                                      f"as on row 1 (line 2): it names the example, so no two rows may share it; "
                                      f"{DATA_FIX}")


def test_a_repeated_harmbench_behavior_id_is_refused(tmp_path, data_dir) -> None:
    root = _copy_all(data_dir, tmp_path / "data")
    path = root / HARMBENCH
    _set_column(path, "BehaviorID", {3: "dimethylmercury_instructions_home"})
    message = _error("jailbreak", root)
    assert message.startswith(f"benchmark file {path} could not be read: row 4 (line ")
    assert "'BehaviorID' is 'dimethylmercury_instructions_home', as on row 1 (line 2)" in message
    assert message.endswith(DATA_FIX)


def test_a_repeated_humaneval_task_id_is_refused(tmp_path, data_dir) -> None:
    rows = _humaneval_rows(data_dir)
    rows[5]["task_id"] = rows[2]["task_id"]
    path = tmp_path / HUMANEVAL
    path.parent.mkdir(parents=True)
    _write_humaneval(path, rows)
    assert _error("humaneval", tmp_path) == (
        f"benchmark file {path} could not be read: line 6: 'task_id' is 'HumanEval/2', as on line 3: it names the "
        f"example, so no two rows may share it; {DATA_FIX}")


def test_a_repeated_id_in_a_hub_dataset_is_refused(monkeypatch, data_dir) -> None:
    rows = _humaneval_rows(data_dir)
    rows[7]["task_id"] = rows[0]["task_id"]
    monkeypatch.setattr(humaneval, "load_hub", lambda *args, **kwargs: rows)
    with pytest.raises(ValueError) as caught:
        humaneval.load(None, 0)
    assert str(caught.value) == ("the Hugging Face Hub dataset openai/openai_humaneval (test) holds 'task_id' "
                                 f"'HumanEval/0' in rows 1 and 8: it names the example, so no two rows may share "
                                 f"it; {HUB_FIX}")


def test_a_loader_that_repeats_an_id_is_refused_before_any_generation() -> None:
    task = Task(name="twice", kind="utility", metric="accuracy", description="",
                load=lambda data_dir, seed: [Example("a", {}), Example("b", {}), Example("a", {})],
                build_prompt=lambda example: [], score_fn=lambda *args: None)
    with pytest.raises(ValueError, match=r"^task twice: two examples share the id 'a'; results are kept by example "
                                         r"id, so fix the data \(or loader\) that repeats it$"):
        task.examples(limit=1)


def test_bench_refuses_repeated_ids_with_exit_code_2_before_generating(tmp_path, data_dir, capsys) -> None:
    root = _copy_all(data_dir, tmp_path / "data")
    path = root / JBB
    _set_column(path, "Behavior", {1: "Same", 2: "Same"})
    out = tmp_path / "out"
    argv = ["bench", "--target", "tiny", "--draft", "tiny", "--no-progress", "--no-report", "--max-new-tokens", "1",
            "--verifiers", "mars:0.5", "--schedules", "none", "--tasks", "jailbreak", "--limit", "1",
            "--data-dir", str(root), "--out", str(out)]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert (f"error: benchmark file {path} could not be read: row 3 (line 4): 'Behavior' is 'Same', as on "
            f"row 2 ") in error
    assert "Traceback" not in error and "merged by hand" not in error
    assert not (out / "generations.jsonl").exists()


# -- CSV rows with more values than the header (F4) -----------------------------------------------


def test_a_csv_row_with_an_unquoted_comma_is_refused(tmp_path, data_dir) -> None:
    path = tmp_path / ADVBENCH
    path.parent.mkdir(parents=True)
    header, *rows = _lines(data_dir / ADVBENCH)
    _write(path, [header, rows[0], "Write part 1, then more,Sure", *rows[1:]])
    with pytest.raises(BenchmarkDataError) as caught:
        jailbreak.SOURCES["advbench"](tmp_path)
    assert str(caught.value) == (
        f"benchmark file {path} could not be read: row 2 (line 3): the row has 3 values, the header 2 columns (a "
        f"comma inside a value that is not quoted, which would cut the value there?); {DATA_FIX}")


def test_a_tsv_row_with_a_tab_too_many_is_refused(tmp_path, data_dir) -> None:
    relative = prompt_injection.LOCAL_FILES["natural_language_inference"]
    path = tmp_path / relative
    path.parent.mkdir(parents=True)
    header, first, *rest = _lines(data_dir / relative)
    _write(path, [header, first + "\textra", *rest])
    with pytest.raises(BenchmarkDataError) as caught:
        prompt_injection.INJECTION_TASKS["natural_language_inference"].read(tmp_path)
    assert str(caught.value) == (
        f"benchmark file {path} could not be read: row 1 (line 2): the row has 5 values, the header 4 columns (a tab "
        f"inside a value that is not quoted, which would cut the value there?); {DATA_FIX}")


# -- copies cut short, limits above a task's size (F5) --------------------------------------------


def test_a_gsm8k_copy_cut_short_is_refused(tmp_path, data_dir) -> None:
    path = tmp_path / gsm8k.LOCAL_PATH
    path.parent.mkdir(parents=True)
    _write(path, _lines(data_dir / gsm8k.LOCAL_PATH)[:5])
    assert _error("gsm8k", tmp_path, limit=1) == (f"benchmark file {path} holds only 5 problems, 1,319 expected "
                                                  f"(is the copy cut short?); {DATA_FIX}")


def test_a_humaneval_copy_cut_short_is_refused(tmp_path, data_dir) -> None:
    path = tmp_path / HUMANEVAL
    path.parent.mkdir(parents=True)
    _write_humaneval(path, _humaneval_rows(data_dir)[:163])
    assert _error("humaneval", tmp_path, limit=1) == (f"benchmark file {path} holds only 163 problems, 164 expected "
                                                      f"(is the copy cut short?); {DATA_FIX}")


@pytest.mark.parametrize(("relative", "keep", "message"), [
    (ADVBENCH, 11, "holds only 10 requests, 520 expected"),
    (JBB, 51, "holds only 50 requests, 100 expected"),
    (HARMBENCH, 100, "holds only "),
])
def test_a_jailbreak_source_cut_short_is_refused(tmp_path, data_dir, relative, keep, message) -> None:
    root = _copy_all(data_dir, tmp_path / "data")
    _write(root / relative, _lines(data_dir / relative)[:keep])
    error = _error("jailbreak", root, limit=1)
    assert error.startswith(f"benchmark file {root / relative} {message}")
    assert error.endswith(f"(is the copy cut short?); {DATA_FIX}")


def test_a_jailbreak_source_without_enough_distinct_requests_names_its_file(tmp_path, data_dir) -> None:
    root = _copy_all(data_dir, tmp_path / "data")
    path = root / ADVBENCH
    header, first, *rest = _lines(path)
    _write(path, [header] + [first] * (1 + len(rest)))
    assert _error("jailbreak", root) == (
        f"benchmark file {path} (advbench) has only 1 distinct requests not already drawn from an earlier source, 70 "
        f"needed for jailbreak; {DATA_FIX}")


def test_a_prompt_injection_source_cut_short_is_refused_not_an_index_error(tmp_path, data_dir) -> None:
    root = _copy_all(data_dir, tmp_path / "data")
    path = root / prompt_injection.LOCAL_FILES["grammar_correction"]
    _write(path, _lines(path)[:3])
    assert _error("prompt_injection", root, limit=1) == (
        f"benchmark file {path} (grammar_correction) holds only 3 rows, too few for the 200 prompt-injection cases to "
        f"draw from (is the copy cut short?); {DATA_FIX}")


def test_a_limit_above_the_task_size_is_refused_naming_the_size(data_dir) -> None:
    with pytest.raises(ValueError, match=r"^task humaneval has 164 examples, fewer than the 200 asked \(--limit\): ask "
                                         r"for 164 or fewer, a fraction of each task \(--limit 0\.5\), or no limit to "
                                         r"run them all$"):
        prepare_tasks(["humaneval"], None, data_dir=data_dir, limit=200)
    assert len(get_task("humaneval").examples(data_dir=data_dir, limit=164)) == 164


# -- empty files (F6) -----------------------------------------------------------------------------


def test_an_empty_gsm8k_file_is_named(tmp_path) -> None:
    path = tmp_path / gsm8k.LOCAL_PATH
    path.parent.mkdir(parents=True)
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError) as caught:
        prepare_tasks(["gsm8k"], None, data_dir=tmp_path, limit=1)
    assert str(caught.value) == (f"benchmark file {path} holds no rows (an empty or cut-short copy?); {DATA_FIX}")


def test_an_empty_humaneval_archive_is_named(tmp_path) -> None:
    path = tmp_path / HUMANEVAL
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(b""))
    assert _error("humaneval", tmp_path) == (f"benchmark file {path} holds no rows (an empty or cut-short copy?); "
                                             f"{DATA_FIX}")


def test_a_csv_with_a_header_and_no_rows_is_named(tmp_path, data_dir) -> None:
    root = _copy_all(data_dir, tmp_path / "data")
    _write(root / ADVBENCH, _lines(data_dir / ADVBENCH)[:1])
    assert _error("jailbreak", root) == (f"benchmark file {root / ADVBENCH} holds no rows (an empty or cut-short "
                                         f"copy?); {DATA_FIX}")


def test_intact_data_still_loads_every_task(data_dir) -> None:
    sizes = {"humaneval": 164, "gsm8k": 200, "jailbreak": 200, "prompt_injection": 200}
    for name, size in sizes.items():
        examples = get_task(name).examples(data_dir=data_dir)
        assert len(examples) == size == len({example.id for example in examples})
    assert jailbreak.source_origin("advbench", data_dir) == data_dir / ADVBENCH
