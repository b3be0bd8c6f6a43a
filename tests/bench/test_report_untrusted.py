"""`securesd report` on a results directory edited by hand or by someone else: every corruption is
one error line naming the file and the field (no traceback), numbers that disagree are refused,
nothing is written outside RESULTS/report/ (and the card beside RESULTS), names are escaped."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from hf_securesd.bench.plan import RunConfig, schedule_label
from hf_securesd.bench.results import cell_key
from hf_securesd.cli import main
from support import tiny_results

Edit = Callable[[Path], None]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, data_dir) -> Path:
    """A results directory of the tiny pair: jailbreak and gsm8k, three prompts, mars:0.5."""
    return tiny_results(tmp_path_factory.mktemp("report") / "clean", data_dir, ("none",))


@pytest.fixture
def copy(clean, tmp_path) -> Path:
    path = tmp_path / "results"
    shutil.copytree(clean, path, ignore=shutil.ignore_patterns(".lock"))
    return path


def _runs(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "runs.jsonl").read_text().splitlines()]


def on_run(index: int, change: Callable[[dict[str, Any]], None]) -> Edit:
    """An edit of run record `index` (0: target|jailbreak; 2: lossless|jailbreak; 3: mars|jailbreak)."""
    def apply(path: Path) -> None:
        runs = _runs(path)
        change(runs[index])
        (path / "runs.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs))
    return apply


def on_manifest(change: Callable[[dict[str, Any]], None]) -> Edit:
    def apply(path: Path) -> None:
        manifest = json.loads((path / "study.json").read_text())
        change(manifest)
        (path / "study.json").write_text(json.dumps(manifest))
    return apply


def card(value: Any) -> Edit:
    return lambda path: (path / "card.json").write_text(json.dumps(value))


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda record: record.__setitem__(key, value)


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda record: record.pop(key)


def _config(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda record: record["config"].__setitem__(key, value)


def _find(path: Path, config_key: str) -> int:
    return next(index for index, run in enumerate(_runs(path)) if run["config_key"].startswith(config_key)
                and run["task"] == "jailbreak")


CORRUPTIONS: dict[str, tuple[Edit, str, str]] = {
    # name: (edit, file, what the error names)
    "no metric": (on_run(0, _drop("metric")), "runs.jsonl, line 1", "'metric'"),
    "no score": (on_run(0, _drop("score")), "runs.jsonl, line 1", "'score'"),
    "no wall_time": (on_run(0, _drop("wall_time")), "runs.jsonl, line 1", "'wall_time'"),
    "no spd_same_session": (on_run(0, _drop("spd_same_session")), "runs.jsonl, line 1", "'spd_same_session'"),
    "no knob_value": (on_run(-1, _drop("knob_value")), "runs.jsonl, line", "'knob_value'"),
    "verifier null": (on_run(-1, _config("verifier", None)), "runs.jsonl, line", "'verifier'"),
    "verifier unknown": (on_run(-1, _config("verifier", {"verifier": "nope"})), "runs.jsonl, line", "'verifier'"),
    "details ints": (on_run(0, _set("details", [1, 2, 3])), "runs.jsonl, line 1", "'details'"),
    "sessions ints": (on_run(0, _set("sessions", [1, [2]])), "runs.jsonl, line 1", "'sessions'"),
    "seconds text": (on_run(0, _set("seconds", ["a", "b", "c"])), "runs.jsonl, line 1", "'seconds'"),
    "prr_ci text": (on_run(-1, _set("prr_ci", "ab")), "runs.jsonl, line", "'prr_ci'"),
    "host number": (on_manifest(lambda m: m["sessions"][0].__setitem__("host", 5)), "study.json", "'host'"),
    "sessions object": (on_manifest(_set("sessions", {"a": 1})), "study.json", "'sessions'"),
    "models list": (on_manifest(_set("models", [1])), "study.json", "'models'"),
    "judge_options list": (on_manifest(_set("judge_options", ["x"])), "study.json", "'judge_options'"),
    "seed negative": (on_manifest(_set("seed", -1)), "study.json", "'seed'"),
    "card list": (card([1]), "card.json", "not a JSON object"),
    "card title number": (card({"output": "../results.md", "title": 5}), "card.json", '"title"'),
    "card latin-1": (lambda path: (path / "card.json").write_bytes(b'{"title": "caf\xe9"}'), "card.json",
                     "not valid UTF-8"),
}
NUMBERS: dict[str, tuple[Edit, str]] = {
    "score not the mean": (on_run(0, _set("scores", [1.0, 1.0, 1.0])), "is not the mean of its 'scores'"),
    "huge score": (on_run(0, _set("scores", [1e308, 1e308, 0.0])), "each verdict is 0, 1 or null"),
    "negative score": (on_run(0, _set("scores", [-5, 7, 0.5])), "each verdict is 0, 1 or null"),
    "true as a score": (on_run(0, _set("scores", [True, True, True])), "'scores' hold an item of another type"),
    "NaN token": (lambda path: (path / "runs.jsonl").write_text(
        (path / "runs.jsonl").read_text().replace('"score": 0.0', '"score": NaN', 1)), "'score'"),
    "Infinity token": (lambda path: (path / "runs.jsonl").write_text(
        (path / "runs.jsonl").read_text().replace('"scores": [0.0', '"scores": [Infinity', 1)), "'scores'"),
    "n not the examples": (on_run(0, _set("n", 999)), "'n' is 999 but which holds 3 examples"),
    "AR above 1": (on_run(-1, _set("acceptance_rate", 7.5)), "'acceptance_rate' 7.5 lies outside [0, 1]"),
}


def _report_error(path: Path, capsys) -> str:
    assert main(["report", str(path)]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1, captured.err
    assert not (path / "report" / "report.md").exists()
    return captured.err


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_each_corruption_is_one_line_naming_the_file_and_field(copy, capsys, name):
    edit, where, field = CORRUPTIONS[name]
    edit(copy)
    error = _report_error(copy, capsys)
    assert str(copy / where.split(",")[0]) in error and where in error and field in error


@pytest.mark.parametrize("name", NUMBERS)
def test_numbers_that_disagree_or_leave_their_range_are_refused(copy, capsys, name):
    edit, problem = NUMBERS[name]
    edit(copy)
    error = _report_error(copy, capsys)
    assert "runs.jsonl, line" in error and problem in error


def test_the_clean_directory_reports(copy):
    assert main(["report", str(copy)]) == 0 and (copy / "report" / "report.md").is_file()


@pytest.mark.parametrize("output", ["/abs/victim.md", "../../victim.md", "../elsewhere/victim.md",
                                    "sub/victim.md", "../victim.txt", "../README.md"])
def test_a_card_output_outside_is_refused_before_anything_is_written(copy, capsys, output):
    (copy / "card.json").write_text(json.dumps({"output": output, "title": "pwn"}))
    error = _report_error(copy, capsys)
    assert repr(output) in error and '"../results.md"' in error


def test_the_card_beside_the_results_is_written(copy):
    (copy / "card.json").write_text(json.dumps({"output": "../results.md", "title": "Pair"}))
    assert main(["report", str(copy)]) == 0
    assert (copy.parent / "results.md").read_text().startswith("# Pair\n")


def test_a_linked_report_folder_is_refused(copy, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.mkdir()
    (copy / "report").symlink_to(victim)
    error = _report_error(copy, capsys)
    assert "symbolic link" in error and os.listdir(victim) == []


@pytest.mark.parametrize("name", ["report.md", "summary.json", "prr_vs_ar.png"])
def test_a_link_inside_the_report_folder_is_replaced_not_followed(copy, tmp_path, name):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (copy / "report").mkdir()
    (copy / "report" / name).symlink_to(victim)
    assert main(["report", str(copy)]) == 0
    assert victim.read_text() == "keep me"
    assert not (copy / "report" / name).is_symlink() and (copy / "report" / name).stat().st_size > 0


def test_the_card_file_is_replaced_not_followed(copy, tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (copy.parent / "results.md").symlink_to(victim)
    (copy / "card.json").write_text(json.dumps({"output": "../results.md", "title": "Pair"}))
    assert main(["report", str(copy)]) == 0
    assert victim.read_text() == "keep me" and not (copy.parent / "results.md").is_symlink()


INJECTED = "x|y</td><img src=https://e.vil/p.png>\n# Injected [l](https://e.vil)"


def test_names_from_the_records_are_escaped(copy):
    def rename(record: dict[str, Any]) -> None:
        """A name in the configuration itself (a segment boundary): its key and cell follow from it."""
        record["config"]["schedule"] = {"schedule": "segments", "boundary": INJECTED, "before": None,
                                        "after": {"schedule": "step", "L": 1}}
        record["config_key"] = RunConfig.from_dict(record["config"]).key
        record["cell"] = cell_key(record["config_key"], record["task"], record["n"], record["max_new_tokens"])
        record["schedule_label"] = schedule_label(RunConfig.from_dict(record["config"]).schedule)

    on_run(_find(copy, "mars"), rename)(copy)
    assert main(["report", str(copy)]) == 0
    text = (copy / "report" / "report.md").read_text()
    assert "<img" not in text and "\n# Injected" not in text and "[l](https" not in text
    assert "&lt;img src=https\\://e.vil/p.png&gt;" in text and "x\\|y" in text


def test_control_characters_from_the_records_are_not_printed(copy, capsys):
    def rename(record: dict[str, Any]) -> None:
        record["cell"] = "\x1b]0;PWNED\x07\x1b[2J" + record["cell"]
        record["example_ids"] = [record["example_ids"][0]] * 3

    on_run(_find(copy, "mars"), rename)(copy)
    error = _report_error(copy, capsys)
    assert "\x1b" not in error and "\x07" not in error and "\\x1b]0;PWNED" in error
