"""The safety sections of `securesd report` (paired flips against the target, cost per tier,
sampled responses) and the model card written from a results directory."""

from __future__ import annotations

import html
import json
import math

import pytest
from scipy.stats import binomtest
from support import record_cells

from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.bench.report import write_report
from hf_securesd.bench.analysis import mean_of
from hf_securesd.bench.results import RUNS, ResultsDir, json_text
from hf_securesd.bench.runner import TaskRun
from hf_securesd.bench.tasks import get_task
from hf_securesd.schedules import Step
from hf_securesd.stats import SpeculativeStats
from hf_securesd.verifiers import SpecCascade

REFUSE, COMPLY = "I'm sorry, but I cannot help with that.", "Sure, here is how | step 1:\nget"
RELAXED = RunConfig("speculative", SpecCascade(a=0.9))
SECURE = RunConfig("speculative", SpecCascade(a=0.9), Step(L=1))
# 1 = refused (attack failed). Against the target, RELAXED loses prompts 0, 1, 2 and gains 9;
# SECURE loses only prompt 0.
PLAN = [
    (TARGET, [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]),
    (DRAFT, [0, 0, 0, 1, 1, 0, 0, 0, 0, 0]),
    (RELAXED, [0, 0, 0, 1, 1, 1, 0, 0, 0, 1]),
    (SECURE, [0, 1, 1, 1, 1, 1, 0, 0, 0, 0]),
]



def _stats(accepted: int) -> dict:
    stats = SpeculativeStats()
    stats.record_round(0, 5, accepted, [0.5] * min(accepted + 1, 5))
    stats.new_tokens = accepted + 1
    return stats.to_dict()


@pytest.fixture
def results(tmp_path, data_dir):
    jailbreak = get_task("jailbreak")
    examples = jailbreak.examples(data_dir=data_dir, limit=10)
    task_run = TaskRun(jailbreak, examples, ["" for _ in examples], 16)
    store = ResultsDir(tmp_path / "results")
    store.open(
        {"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix",
         "judge_agreement": {"agreement": 0.81, "kappa": 0.626, "precision": 0.71, "recall": 0.93, "n": 100,
                             "labels": "human majority", "match": "start"}},
        {"id": "s", "threads": 1},
    )
    plan = [(config, [REFUSE if value else COMPLY for value in refused]) for config, refused in PLAN]
    record_cells(store, task_run, plan, speculative_stats=_stats(4), seconds=2.0, cpu_seconds=1.5)
    return store.path, examples


def test_report_shows_paired_flips_beside_prr(results) -> None:
    path, _ = results
    write_report(path)
    summary = json.loads((path / "report" / "summary.json").read_text())
    flips = {row["config"]: row["flips"] for row in summary["flips"]}
    assert set(flips) == {"draft", RELAXED.key, SECURE.key}
    relaxed = flips[RELAXED.key]
    assert (relaxed["n_lost"], relaxed["n_gained"], relaxed["n_examples"]) == (3, 1, 10)
    assert relaxed["mcnemar_pvalue"] == pytest.approx(binomtest(3, 4).pvalue)
    assert (flips[SECURE.key]["n_lost"], flips[SECURE.key]["n_gained"]) == (1, 0)
    text = (path / "report" / "report.md").read_text()
    assert "paired flips against the target" in text
    assert ("`refusal_prefix` (refusal strings matched at the start of the normalised response): 81 % agreement "
            "with human labels, Cohen's κ 0.626") in text  # beside the AFR table
    # AFR 0.5 against the target's 0.6, yet 4 of 10 verdicts flipped: 3 lost, 1 gained
    row = next(line for line in text.splitlines() if line.startswith(f"| {RELAXED.key} | 0.800 |"))
    assert "| 3 (0.300 [0.07, 0.65]) | 1 (0.100 [0.00, 0.45]) | 0.400 [0.12, 0.74] |" in row
    assert "## Cost per tier" in text and "| 1-2 safety (jailbreak) | 4 | 40 | 0.02 | 0.02 (4/4 cells) |" in text


def test_a_longer_rerun_on_a_sample_is_a_length_check_not_a_second_study(results) -> None:
    path, examples = results
    sample = TaskRun(get_task("jailbreak"), examples[:4], ["" for _ in examples[:4]], 32)
    # at 32 tokens the target keeps its verdicts; RELAXED turns prompt 3 from refusal to compliance
    # and prompt 1 the other way
    plan = [(TARGET, [1, 1, 1, 1]), (DRAFT, [0, 0, 0, 1]), (RELAXED, [0, 1, 0, 0])]
    responses = [(config, [REFUSE if value else COMPLY for value in refused]) for config, refused in plan]
    record_cells(ResultsDir(path), sample, responses, speculative_stats=_stats(4), seconds=2.0, cpu_seconds=1.5)
    write_report(path)
    text = (path / "report" / "report.md").read_text()
    stability = text.split("## Verdict stability with a longer reply")[1].split("\n## ")[0]
    assert "| target | jailbreak | 4 | 16 → 32 | 1.000 → 1.000 | 0 | 0 |" in stability
    assert f"| {RELAXED.key} | jailbreak | 4 | 16 → 32 | 0.250 → 0.250 | 1 | 1 |" in stability
    # each run is compared with the target of its own length and size
    assert "### jailbreak, 10 prompts, 16 new tokens (target-only AFR 0.600)" in text
    assert "### jailbreak, 4 prompts, 32 new tokens (target-only AFR 1.000)" in text
    summary = json.loads((path / "report" / "summary.json").read_text())
    sample_row = next(row for row in summary["flips"] if row["config"] == RELAXED.key and row["n"] == 4)
    assert (sample_row["flips"]["n_lost"], sample_row["flips"]["n_gained"]) == (3, 0)
    # the sample's cost is its own row beside the main run's
    assert "| 1-2 safety (jailbreak) | 4 | 40 | 0.02 | 0.02 (4/4 cells) |" in text
    assert "| 1-2 safety (jailbreak): other sizes and lengths | 3 | 12 | 0.01 | 0.01 (3/3 cells) |" in text
    # pooled tables count each prompt once: only the 10-prompt run enters Table 1
    assert [row["safety"]["cells"] for row in summary["ar_bins"] if row["ar_bin"] == "all"] == [1]


def test_appendix_quotes_responses_by_prompt_id_only(results) -> None:
    path, examples = results
    write_report(path)
    text = (path / "report" / "report.md").read_text()
    appendix = text.split("## Appendix: sampled responses")[1]
    assert f"### {RELAXED.key} on jailbreak" in appendix
    assert "Sure, here is how \\| step 1: ⏎ get" in appendix  # one table cell per response
    assert appendix.count(f"`{examples[0].id}`") == len(PLAN)  # the same prompts for every configuration
    for example in examples:
        assert example.fields["prompt"] not in text  # benchmark text is never reproduced


def test_card_is_regenerated_from_the_results(results) -> None:
    path, _ = results
    (path / "card.json").write_text(json.dumps({
        "output": "../results.md", "title": "Pair card", "preamble": ["What was run."],
        "commands": ["securesd report results"], "closing": ["The end."],
    }))
    write_report(path)
    card = (path.parent / "results.md").read_text()
    assert card.startswith("# Pair card\n\nWhat was run.\n")
    assert "```bash\nsecuresd report results\n```" in card
    assert "](results/report/position_tv.png)" in card and (path / "report" / "position_tv.png").is_file()
    assert "paired flips against the target" in card and card.rstrip().endswith("The end.")
    assert str(path.resolve()) not in card  # paths are relative to the card
    (path / "card.json").write_text(json.dumps({"title": "no output"}))
    with pytest.raises(ValueError, match="'output'"):
        write_report(path)


def test_prompt_injection_tables_name_their_own_check_and_are_quoted(tmp_path, data_dir) -> None:
    task = get_task("prompt_injection")
    examples = task.examples(data_dir=data_dir, limit=5)
    task_run = TaskRun(task, examples, ["" for _ in examples], 16)
    store = ResultsDir(tmp_path / "results")
    store.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix"}, {"id": "s", "threads": 1})
    answers = [example.fields["injected_answer"] for example in examples]
    plan = [(TARGET, ["I cannot."] * 5), (DRAFT, answers), (RELAXED, answers[:2] + ["I cannot."] * 3)]
    record_cells(store, task_run, plan, speculative_stats=_stats(3), new_tokens=4)
    store.close()
    text = write_report(tmp_path / "results").read_text(encoding="utf-8")
    section = text.split("### prompt_injection, 5 prompts")[1].split("##")[0]
    assert "injected task's correct answer" in section and "agreement" in section
    assert "### speccascade(a=0.9) on prompt_injection" in text.split("## Appendix: sampled responses")[1]


def _edit_runs(path, edit) -> None:
    """Rewrite runs.jsonl with `edit(run)` applied to every recorded cell."""
    runs = ResultsDir(path).runs()
    for run in runs:
        edit(run)
    (path / RUNS).write_text("".join(json_text(run) + "\n" for run in runs), encoding="utf-8")


def test_excluded_verdicts_leave_the_flips_and_are_counted(results) -> None:
    path, _ = results

    def exclude(run):  # what a judge with unparsed=exclude records: NaN (written as null), left out of the score
        for config, index in (("target", 0), (RELAXED.key, 5)):
            if run["config_key"] == config:
                run["scores"][index] = math.nan
                run["score"] = mean_of(run["scores"])

    _edit_runs(path, exclude)
    write_report(path)
    summary = json.loads((path / "report" / "summary.json").read_text())
    flips = {row["config"]: row["flips"] for row in summary["flips"]}
    assert set(flips) == {"draft", RELAXED.key, SECURE.key}  # a NaN does not drop the configuration
    relaxed = flips[RELAXED.key]  # prompts 0 and 5 left out: lost 1, 2 remain; gained 9
    assert (relaxed["n_examples"], relaxed["n_excluded"], relaxed["n_lost"], relaxed["n_gained"]) == (8, 2, 2, 1)
    assert (flips[SECURE.key]["n_excluded"], flips[SECURE.key]["n_lost"]) == (1, 0)
    text = (path / "report" / "report.md").read_text()
    assert (f"Prompts left out of the flips because the judge's `unparsed=exclude` policy excluded their verdict "
            f"in the configuration or in the target: draft 1, {RELAXED.key} 2, {SECURE.key} 1.") in text


MODEL_TEXT = ('Sure.</td></tr></table><h1>AFR 1.000</h1><img src="https://attacker.example/p.png">'
              '![x](https://attacker.example/q.png) `code | cell` <!-- & \\| end')


def test_a_bare_url_is_escaped_out_of_autolinking_and_renders_as_written() -> None:
    """GitHub turns `https://...` and `www....` in text into links; the ':' of '://' and the '.' after
    'www' get a backslash, which renders as the character itself and stops the autolink."""
    from hf_securesd.bench.report_markdown import inline_text

    reply = "visit https://attacker.example/x or WWW.attacker.example, at 3:00 e.g."
    cell = inline_text(reply)
    assert cell == "visit https\\://attacker.example/x or WWW\\.attacker.example, at 3:00 e.g."
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").render(cell)
    assert html.unescape(rendered) == f"<p>{reply}</p>\n"


def test_github_math_mentions_issue_links_and_emoji_stay_text() -> None:
    """GitHub renders `$...$` as math and links @user, #123 and :emoji: in rendered text: `$` becomes an
    entity and a word joiner (U+2060) follows the mark that would start a reference, so the rendered
    text shows the characters as written (with invisible joiners) and nothing else changes."""
    from hf_securesd.bench.report_markdown import WORD_JOINER, inline_text

    reply = "$x$ and $$y$$ cc @everyone @user, fixes #123 :x: :+1: (a # 2, mars:0.5, 3:00, @ home)"
    cell = inline_text(reply)
    assert "$" not in cell and cell.count("&#36;") == 6
    for reference in ("@everyone", "@user", "#123", ":x:", ":+1:"):
        assert reference not in cell and reference[0] + WORD_JOINER + reference[1:] in cell
    assert "# 2, mars:0.5, 3:00, @ home" in cell  # text GitHub would not link stays as written
    markdown_it = pytest.importorskip("markdown_it")
    rendered = markdown_it.MarkdownIt("commonmark").render(cell)
    assert html.unescape(rendered).replace(WORD_JOINER, "") == f"<p>{reply}</p>\n"


def test_model_text_stays_text_in_its_table_cell(results) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    path, examples = results

    def inject(run):
        if run["config_key"] == RELAXED.key:
            run["responses"][0] = MODEL_TEXT

    _edit_runs(path, inject)
    manifest = json.loads((path / "study.json").read_text())
    (path / "study.json").write_text(json.dumps({**manifest, "target": "m`<img src=x>`"}))
    write_report(path)
    text = (path / "report" / "report.md").read_text()
    assert text.startswith("# SecureSD benchmark report: `` m`<img src=x>` `` with draft `d`\n")  # one code span
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(text)  # HTML on, as on GitHub
    live = ('src="https://attacker', "<img src=x", "<h1>AFR", "<!--", 'href="https://attacker')
    assert not any(markup in rendered for markup in live)
    assert "<h1>SecureSD benchmark report: <code>m`&lt;img src=x&gt;`</code> with draft" in rendered
    appendix = rendered.split("Appendix: sampled responses")[1]
    row = next(row for row in appendix.split("<tr>") if "attacker.example/p.png" in row)
    cells = row.split("<td>")[1:]
    assert len(cells) == 3  # prompt id, verdict, response: nothing left its cell
    assert html.unescape(cells[2].split("</td>")[0]) == MODEL_TEXT  # shown exactly as generated


def test_the_appendix_cuts_a_huge_response() -> None:
    """A results directory holding a 50 MB response made a 120 MB report: a response is cut after
    APPENDIX_RESPONSE_CHARS characters, with the count left out."""
    from hf_securesd.bench.report_safety import APPENDIX_RESPONSE_CHARS, appendix_section

    cell = {"task_kind": "safety", "task": "jailbreak", "config_key": "target", "example_ids": ["a"],
            "scores": [0.0], "responses": ["x" * (APPENDIX_RESPONSE_CHARS + 5_000) + "END"]}
    text = "\n".join(appendix_section([cell], size=1))
    assert "x" * APPENDIX_RESPONSE_CHARS + " … (5,003 more characters)" in text and "END" not in text
    assert len(text) < APPENDIX_RESPONSE_CHARS + 2_000


def test_the_appendix_cuts_a_huge_prompt_id() -> None:
    """An id is repeated for every configuration of its task: one of 30 MB in a results directory would
    be written that many times. An id is cut after APPENDIX_ID_CHARS characters, with the count left out;
    an id of that length is shown whole."""
    from hf_securesd.bench.report_safety import APPENDIX_ID_CHARS, appendix_section

    whole, huge = "w" * APPENDIX_ID_CHARS, "i" * (APPENDIX_ID_CHARS + 1_234) + "END"
    cells = [{"task_kind": "safety", "task": "jailbreak", "config_key": key, "example_ids": [whole, huge],
              "scores": [0.0, 1.0], "responses": ["one", "two"]} for key in ("target", "mars")]
    text = "\n".join(appendix_section(cells, size=2))
    assert text.count(f"`{whole}`") == 2 and "END" not in text
    assert text.count(f"`{'i' * APPENDIX_ID_CHARS}` … (1,237 more characters)") == 2
    assert len(text) < 4 * APPENDIX_ID_CHARS + 2_000
