"""The benchmark harness: a registry of tasks (loader, prompt builder, scorer), local or Hub data
loading, a sandbox for executing generated code, and the study runner (`runner`), report
(`report`, `plots`) and Step(L) calibration (`calibrate`) behind `securesd bench`, `securesd
report` and `securesd calibrate`. See docs/benchmarks.md."""

from hf_securesd.bench.tasks import Example, ScoreOptions, Task, TaskScore, get_task, task_names

__all__ = ["Example", "ScoreOptions", "Task", "TaskScore", "get_task", "task_names"]
