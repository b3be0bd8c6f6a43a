"""The benchmark harness: a registry of tasks (loader, prompt builder, scorer), local or Hub data
loading, and a sandbox for executing generated code. See docs/benchmarks.md."""

from hf_securesd.bench.tasks import Example, ScoreOptions, Task, TaskScore, get_task, task_names

__all__ = ["Example", "ScoreOptions", "Task", "TaskScore", "get_task", "task_names"]
