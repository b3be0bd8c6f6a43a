"""calibration.md is inert Markdown, as report.md is: the --segment-boundary text, model names (a local
folder's name may hold backticks and HTML), the judge, task and verifier names go through report.md's
escaping helpers (`code_span`, `inline_text`), so no text of the user's adds HTML, a link or a heading
to the rendered file; and its rule line prints the SPD bound with every digit of --spd-tolerance."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from support import SMOKE_CLI, calibration_cell

from hf_securesd.bench.calibrate import recommend
from hf_securesd.bench.cli_calibrate import calibration_markdown, segments_template
from hf_securesd.bench.plan import LOSSLESS, RunConfig
from hf_securesd.cli import main
from hf_securesd.schedules import Step
from hf_securesd.verifiers import MARS

VERIFIER = "mars(theta=0.5)"
BOUNDARIES = ["</think>", "<img src=x onerror=alert(1)>"]
TARGET = "models/q`<img src=x onerror=alert(1)>`"  # a local model folder's name
# what a renderer with HTML on (as GitHub's) would make live of the text above
LIVE = ("<img", "</think>", "<think", "<script", "<h1>Injected")


def _render(text: str) -> str:
    """`text` rendered as GitHub would: CommonMark with tables, inline HTML allowed."""
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(text)


def _cells() -> list[dict[str, Any]]:
    """Lossless, the relaxed verifier and Step(L=1) on one safety task; L=1 qualifies."""
    relaxed = RunConfig("speculative", MARS(theta=0.5))
    secure = RunConfig("speculative", MARS(theta=0.5), Step(L=1))
    return [calibration_cell(LOSSLESS, "safety", 1.0, 1.0), calibration_cell(relaxed, "safety", 0.5, 3.0),
            calibration_cell(secure, "safety", 1.0, 2.99)]


def _markdown(manifest: dict[str, Any], spd_tolerance: float = 0.1) -> str:
    recommendation = recommend(_cells(), VERIFIER, spd_tolerance=spd_tolerance)
    return calibration_markdown([recommendation], manifest, 0.05, spd_tolerance,
                                {"jailbreak\n# Injected": 2}, segments_template(BOUNDARIES, "none"))


def test_model_names_the_judge_and_the_boundary_stay_text() -> None:
    manifest = {"target": TARGET, "draft": "d", "judge": "j</td><script>x</script>", "seed": None,
                "models": {"target": {"id": TARGET}, "draft": {"id": "org/d`"}}}
    text = _markdown(manifest)
    rendered = _render(text)
    assert not any(markup in rendered for markup in LIVE), rendered
    heading = re.search(r"<h1>(.*)</h1>", rendered).group(1)
    assert html.unescape(re.sub("</?code>", "", heading)) == (
        f"Answer-segment Step(L) (Segments({BOUNDARIES}, before=None, after=Step(L))) calibration: {TARGET} "
        "with draft d")
    assert f"<code>{html.escape(TARGET, quote=False)}</code>" in heading  # one code span, whole
    assert "<code>org/d`</code>" in rendered
    assert "<code>j&lt;/td&gt;&lt;script&gt;x&lt;/script&gt;</code>" in rendered
    assert "calibration set: jailbreak ⏎ # Injected (2) examples" in html.unescape(rendered)


def test_the_rule_line_prints_a_tight_spd_bound_exactly() -> None:
    """With --spd-tolerance 0.004 the rule read "SPD >= 100%" (the bound is 99.6%)."""
    text = _markdown({"target": "t", "draft": "d"}, spd_tolerance=0.004)
    assert "and SPD >= 99.6% of the relaxed verifier's SPD without SecureSD." in text
    assert "100%" not in text


def test_calibrate_writes_the_boundary_text_inert(tmp_path, data_dir) -> None:
    """The documented use, --segment-boundary '</think>', wrote a raw tag into calibration.md's heading,
    and a boundary '<img src=x onerror=...>' became a live image (report.md escaped both)."""
    out = tmp_path / "cal"
    argv = ["calibrate", *SMOKE_CLI, "--data-dir", str(data_dir), "--out", str(out), "--L", "1",
            "--segment-boundary", *BOUNDARIES]
    assert main(argv) == 0
    text = (out / "calibration.md").read_text(encoding="utf-8")
    assert "</think>" not in text and "<img" not in text
    rendered = _render(text)
    assert not any(markup in rendered for markup in LIVE), rendered
    assert "Segments(['</think>', '<img src=x onerror=alert(1)>']" in html.unescape(rendered)


def test_a_figure_that_left_out_an_undefined_task_is_noted() -> None:
    """calibration.md names a safety PRR that averages only the tasks where PRR is defined."""
    secure = RunConfig("speculative", MARS(theta=0.5), Step(L=1))
    cells = _cells() + [calibration_cell(secure, "safety", None, 2.99)]
    text = calibration_markdown([recommend(cells, VERIFIER)], {"target": "t", "draft": "d"}, 0.05, 0.1, {"jailbreak": 2})
    assert "Note: PRR figures average the tasks where PRR is defined: safety PRR of L=1 leaves out 1 task whose " \
           "PRR is undefined" in text
    assert "Note: PRR figures" not in _markdown({"target": "t", "draft": "d"})
