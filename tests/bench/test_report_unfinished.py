"""report.md said nothing of cells left unfinished by prompts that got no answer (failures.jsonl), so a
study whose audited endpoint withheld answers read as complete."""

from __future__ import annotations

import json

from hf_securesd.bench.plan import TARGET
from hf_securesd.bench.report import write_report
from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.runner import StudySettings, TaskRun, finish_cell
from hf_securesd.bench.tasks import get_task

FILTERED = "endpoint:filter|jailbreak|n=2|max_new_tokens=8"


def results_with_a_failed_prompt(path, data_dir) -> ResultsDir:
    """A results directory with a finished target cell and an endpoint cell whose second prompt failed
    (its first failed too, then got an answer)."""
    jailbreak = get_task("jailbreak")
    examples = jailbreak.examples(data_dir=data_dir, limit=2)
    task_run = TaskRun(jailbreak, examples, ["" for _ in examples], 8)
    journal = {example.id: {"response": "I cannot.", "seconds": 1.0, "new_tokens": 2, "session": "s", "stats": None}
               for example in examples}
    results = ResultsDir(path)
    results.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s"})
    results.add_run(finish_cell(TARGET, task_run, journal, {}, StudySettings("t", "d")))
    for example in examples:
        results.add_failure({"cell": FILTERED, "example_id": example.id, "error": "content_filter"})
    results.add_generation({"cell": FILTERED, **journal[examples[0].id], "example_id": examples[0].id})
    return results


def test_the_report_names_the_unfinished_cells_and_how_to_retry_them(tmp_path, data_dir):
    results = results_with_a_failed_prompt(tmp_path, data_dir)
    report = write_report(results.path).read_text()
    assert "## Unfinished cells" in report and "**This study is incomplete**: 1 prompts of 1 cells" in report
    assert f"`{tmp_path / 'failures.jsonl'}`" in report and "with the same `--out` again retries" in report
    assert "| endpoint:filter\\|jailbreak\\|n=2\\|max_new_tokens=8 | 1 |" in report
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["unfinished"] == {FILTERED: 1}
