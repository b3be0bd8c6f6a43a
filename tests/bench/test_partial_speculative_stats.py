"""A cell where only some replies carry speculative statistics (an endpoint that returns them on some
replies, a structured refusal among normal answers) crashed scoring with a TypeError, and every rerun
crashed again on the journaled generations: its AR is now that of the replies that carry them, and the
record and the report say how many did."""

from __future__ import annotations

from hf_securesd.bench.plan import RunConfig
from hf_securesd.bench.report import write_report
from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.run_records import run_problem
from hf_securesd.bench.runner import StudySettings, TaskRun, finish_cell
from hf_securesd.bench.tasks import get_task
from hf_securesd.stats import SpeculativeStats

REFUSAL = "I'm sorry, but I cannot help with that."


def journal_with_stats_on_the_first_reply(task_run: TaskRun) -> dict[str, dict]:
    stats = SpeculativeStats(new_tokens=4)
    stats.record_round(1, drafted=4, accepted=3)
    return {example.id: {"response": REFUSAL, "seconds": 1.0, "cpu_seconds": None, "new_tokens": 4,
                         "session": "s", "stats": stats.to_dict() if index == 0 else None}
            for index, example in enumerate(task_run.examples)}


def test_a_cell_with_statistics_on_some_replies_finishes_and_says_so(tmp_path, data_dir):
    jailbreak = get_task("jailbreak")
    examples = jailbreak.examples(data_dir=data_dir, limit=2)
    task_run = TaskRun(jailbreak, examples, ["" for _ in examples], 8)
    config = RunConfig("endpoint", endpoint="half")
    cell = finish_cell(config, task_run, journal_with_stats_on_the_first_reply(task_run), {}, StudySettings("t", "d"))
    assert (cell["stats_examples"], cell["drafted"], cell["accepted"]) == (1, [4, None], [3, None])
    assert cell["acceptance_rate"] == 0.75 and run_problem(cell) is None
    results = ResultsDir(tmp_path)
    results.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s"})
    results.add_run(cell)
    assert results.runs()[0]["drafted"] == [4, None]
    assert "| 0.750 (1/2 replies) |" in write_report(tmp_path).read_text()
