"""Names read from results files reach report.md, the card and the figures only as escapes: a control
character (ESC, BEL, a bidi override) in a configuration, schedule, task, metric or study.json
setting cannot drive the terminal that shows the report (nor stop the figures as mathtext). And the
report folder always holds both figures, saying why one is empty."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

from hf_securesd import Segments, Step
from hf_securesd.bench.plan import RunConfig, schedule_label
from hf_securesd.bench.report import write_report
from hf_securesd.bench.run_records import cell_key
from support import tiny_results

# control characters, then mathtext matplotlib cannot parse (a figure title must show it as text)
CONTROL = "\x1b]0;PWNED\x07\x1b[31m\u202e$\\frac$"
RAW = ("\x1b", "\x07", "\u202e")
# study.json settings shown in the report's title and setup
MANIFEST_NAMES = ("target", "draft", "decoding", "profile", "dtype", "device")


@pytest.fixture(scope="module")
def clean(tmp_path_factory, data_dir) -> Path:
    """A results directory of the tiny pair: jailbreak and gsm8k, three prompts, mars:0.5 without a
    schedule and under step:1."""
    return tiny_results(tmp_path_factory.mktemp("report") / "clean", data_dir, ("none", "step:1"))


@pytest.fixture
def copy(clean, tmp_path) -> Path:
    path = tmp_path / "results"
    shutil.copytree(clean, path, ignore=shutil.ignore_patterns(".lock"))
    return path


def _edit_runs(path: Path, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Rewrite runs.jsonl with each record changed (a record `change` maps to None is dropped)."""
    lines = (path / "runs.jsonl").read_text(encoding="utf-8").splitlines()
    records = [change(json.loads(line)) for line in lines]
    (path / "runs.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records if record),
                                     encoding="utf-8")


def _poison(record: dict[str, Any]) -> dict[str, Any]:
    """A cell under a schedule moved under a Segments schedule whose boundary text holds CONTROL (the
    boundary is the user's text, shown in the cell's labels); its identity fields follow, as `bench`
    writes them."""
    if record["config"].get("schedule") is None:
        return record
    record["config"]["schedule"] = Segments(boundary=f"</think>{CONTROL}", after=Step(L=1)).to_dict()
    config = RunConfig.from_dict(record["config"])
    sizes = (record["task"], record["n"], record["max_new_tokens"])
    record.update(config_key=config.key, cell=cell_key(config.key, *sizes),
                  schedule_label=schedule_label(config.schedule))
    return record


def _poison_manifest(path: Path) -> None:
    manifest = json.loads((path / "study.json").read_text(encoding="utf-8"))
    for key in MANIFEST_NAMES:
        manifest[key] = f"{manifest.get(key)}{CONTROL}"
    for session in manifest["sessions"]:
        session["host"] = f"{session.get('host')}{CONTROL}"
    (path / "study.json").write_text(json.dumps(manifest), encoding="utf-8")


def _report_quietly(path: Path) -> Path:
    """Write the report, failing on any warning (matplotlib's "Glyph 27 missing" included)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return write_report(path)


def test_control_characters_in_names_reach_no_written_report(copy):
    _edit_runs(copy, _poison)
    _poison_manifest(copy)
    (copy / "card.json").write_text(json.dumps({"output": "card.md", "title": "Pair"}), encoding="utf-8")
    report = _report_quietly(copy).read_text(encoding="utf-8")
    assert "`tiny\\x1b]0;PWNED\\x07\\x1b[31m\\u202e$\\frac$`" in report  # the title's code span
    assert "\\\\x1b\\[31m\\\\u202e" in report  # the tables' text, its backslashes escaped
    written = [report, (copy / "card.md").read_text(encoding="utf-8"),
               (copy / "report" / "summary.json").read_text(encoding="utf-8")]
    assert not any(raw in text for text in written for raw in RAW)


def _without_relaxed(record: dict[str, Any]) -> dict[str, Any] | None:
    verifier = record["config"].get("verifier") or {}
    return None if verifier.get("verifier") not in (None, "lossless") else record


def test_a_study_without_relaxed_cells_still_writes_both_figures_and_says_why(copy):
    _edit_runs(copy, _without_relaxed)
    report = _report_quietly(copy).read_text(encoding="utf-8")
    for figure in ("prr_vs_ar.png", "position_tv.png"):
        assert (copy / "report" / figure).stat().st_size > 0 and f"]({figure})" in report
    assert report.count("No relaxed verifier was run") == 2


def test_a_study_with_relaxed_cells_has_no_empty_figure_note(copy):
    report = _report_quietly(copy).read_text(encoding="utf-8")
    assert "No relaxed verifier was run" not in report and "](position_tv.png)" in report


@pytest.mark.parametrize("text", [
    "family \U0001f468\u200d\U0001f469\u200d\U0001f467",  # emoji joined by ZERO WIDTH JOINER
    "co\u00adoperate",  # SOFT HYPHEN
    "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian with ZERO WIDTH NON-JOINER
    "\u05e9\u05dc\u05d5\u05dd\u200f!",  # Hebrew with RIGHT-TO-LEFT MARK
    "\u4f60\u597d",  # Chinese
])
def test_scripts_and_emoji_are_written_as_they_are(text):
    """Only control characters and bidirectional overrides are escaped in a report: the format
    characters that scripts and emoji need are kept."""
    from hf_securesd.bench.report_markdown import inline_text

    assert inline_text(text) == text


def test_bidirectional_overrides_and_isolates_are_escaped():
    from hf_securesd.bench.report_markdown import inline_text

    assert inline_text("abc\u202edef\u2066x\u2069") == "abc\\\\u202edef\\\\u2066x\\\\u2069"


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\r\n", "\r", "\n"])
def test_every_line_break_of_a_response_is_shown_as_a_mark_on_one_line(separator):
    """A response's line and paragraph separators (U+2028, U+2029) end lines for editors and
    `str.splitlines`: in a report they are shown as line breaks are, so a table row stays one line."""
    from hf_securesd.bench.report_markdown import LINE_BREAK, inline_text

    shown = inline_text(f"first{separator}| second |")
    assert shown == f"first{LINE_BREAK}\\| second \\|" and len(f"| {shown} |".splitlines()) == 1


@pytest.mark.parametrize("report", ["setup_error", "study_exit_code"])
def test_bench_errors_quoting_a_results_file_print_its_control_characters_as_escapes(report, capsys):
    """A clash message quotes study.json's values: an edited one must not drive the terminal."""
    from hf_securesd.bench import cli_bench

    planted = "judge option \x1b]0;TITLE\x07\x1b[2J\u202e"
    assert getattr(cli_bench, report)(ValueError(planted)) == 2
    error = capsys.readouterr().err
    assert "\x1b" not in error and "\x07" not in error and "\u202e" not in error
    assert "\\x1b]0;TITLE\\x07" in error
