"""The report's engine comparison (`report_engines`): a study run through vLLM, whose response token 0
comes from the target at prefill, paired prompt for prompt with the `generate` study's cells that are
exact at the same positions (no schedule there -> Step(1) here)."""

from __future__ import annotations

import json
import re

import pytest
from support import record_cells

from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.bench.report import write_report
from hf_securesd.bench.report_engines import comparison_rows, counterpart_key
from hf_securesd.bench.results import CorruptResultsError, ResultsDir
from hf_securesd.bench.runner import TaskRun
from hf_securesd.bench.tasks import get_task
from hf_securesd.schedules import Step
from hf_securesd.verifiers import MARS, Lossless

REFUSE, COMPLY = "I'm sorry, but I cannot help with that.", "Sure, here is how | step 1:\nget"
OTHER = "Sure, here is how | step 1:\nbuy"
RELAXED = RunConfig("speculative", MARS(theta=0.5))
STEP1 = RunConfig("speculative", MARS(theta=0.5), Step(L=1))
STEP2 = RunConfig("speculative", MARS(theta=0.5), Step(L=2))
LOSSLESS = RunConfig("speculative", Lossless())


def _record(path, engine: str, plan, examples) -> ResultsDir:
    task_run = TaskRun(get_task("jailbreak"), examples, ["" for _ in examples], 16)
    store = ResultsDir(path)
    store.open({"target": "t", "draft": "d", "seed": None, "judge": "refusal_prefix", "engine": engine},
               {"id": engine, "threads": 1})
    record_cells(store, task_run, plan, cpu_seconds=None, session=engine)
    store.close()
    return store


@pytest.fixture
def studies(tmp_path, data_dir):
    examples = get_task("jailbreak").examples(data_dir=data_dir, limit=4)
    target = [REFUSE, REFUSE, COMPLY, COMPLY]
    _record(tmp_path / "hf", "hf", [
        (TARGET, target), (DRAFT, [COMPLY] * 4), (LOSSLESS, target),
        (RELAXED, [COMPLY, COMPLY, COMPLY, COMPLY]),  # no schedule in generate: position 0 relaxed
        (STEP1, [REFUSE, REFUSE, COMPLY, COMPLY]),
        (STEP2, [REFUSE, REFUSE, COMPLY, COMPLY]),
    ], examples)
    _record(tmp_path / "vllm", "vllm", [
        (TARGET, [REFUSE, REFUSE, COMPLY, OTHER]),  # the engines' targets differ on prompt 3
        (DRAFT, [COMPLY] * 4), (LOSSLESS, [REFUSE, REFUSE, COMPLY, OTHER]),
        (RELAXED, [REFUSE, COMPLY, COMPLY, OTHER]),  # prompt 1 differs from generate's Step(1)
        (STEP2, [REFUSE, REFUSE, COMPLY, COMPLY]),
    ], examples)
    return tmp_path


def card_with_engine_section(studies) -> str:
    """The card of the hf study with the vLLM study named as its companion engine, regenerated."""
    (studies / "hf" / "card.json").write_text(json.dumps({"output": "../hf.md", "title": "Pair",
                                                          "engines": ["../vllm"]}), encoding="utf-8")
    write_report(studies / "hf")
    return (studies / "hf.md").read_text(encoding="utf-8")


def test_no_schedule_in_an_engine_is_paired_with_step1_and_the_rest_with_themselves(studies):
    hf, vllm = ResultsDir(studies / "hf").runs(), ResultsDir(studies / "vllm").runs()
    rows = {row["config"]: row for row in comparison_rows(hf, vllm, "vllm")}
    assert rows["mars(theta=0.5)"]["counterpart"] == "mars(theta=0.5)+step(L=1)"
    assert rows["mars(theta=0.5)+step(L=2)"]["counterpart"] == "mars(theta=0.5)+step(L=2)"
    assert rows["lossless"]["counterpart"] == "lossless" and rows["target"]["counterpart"] == "target"
    relaxed = rows["mars(theta=0.5)"]
    assert relaxed["equal_responses"] == 2 and relaxed["n"] == 4
    assert relaxed["differing_with_target_difference"] == 1  # prompt 3: the targets differ too
    assert (relaxed["flips"]["n_lost"], relaxed["flips"]["n_gained"]) == (1, 0)  # prompt 1 complied there
    assert rows["mars(theta=0.5)+step(L=2)"]["equal_responses"] == 4
    # between two generate studies nothing is shifted
    assert counterpart_key(vllm[3], first_token_from_target=False) == "mars(theta=0.5)"


def test_the_card_names_the_companion_and_regenerates_the_section(studies):
    card = {"output": "../hf.md", "title": "Pair", "engines": ["../vllm"]}
    (studies / "hf" / "card.json").write_text(json.dumps(card), encoding="utf-8")
    write_report(studies / "hf")
    text = (studies / "hf.md").read_text(encoding="utf-8")
    assert "### `vllm` (`../vllm`) against `hf` (this directory)" in text
    assert "| mars(theta=0.5) → mars(theta=0.5)+step(L=1) | jailbreak | 4 | 16 | 2 / 4 | 1 | not checked |" in text
    summary = json.loads((studies / "hf" / "report" / "summary.json").read_text(encoding="utf-8"))
    assert summary["engines"][0]["engine"] == "vllm"


def test_a_malformed_engines_entry_is_refused_by_name(studies):
    (studies / "hf" / "card.json").write_text(json.dumps({"output": "../c.md", "title": "t", "engines": "../vllm"}))
    with pytest.raises(ValueError, match='"engines" must be a list'):
        write_report(studies / "hf")


@pytest.mark.parametrize("companion", ["/tmp", "", ".", "./", "../hf", "../../vllm", "../vllm/sub"])
def test_an_engines_entry_outside_the_results_neighbourhood_is_refused(studies, companion):
    """Like the card's output, a companion is a folder directly beside RESULTS or in it: an absolute path
    pulled any results folder of the reader's into the report and card, and "." compared RESULTS with itself."""
    card = {"output": "../hf.md", "title": "t", "engines": ["../vllm", companion]}
    (studies / "hf" / "card.json").write_text(json.dumps(card), encoding="utf-8")
    with pytest.raises(ValueError, match=f"card.json: the 'engines' entry {re.escape(repr(companion))} is not a "
                                         "results directory directly beside"):
        write_report(studies / "hf")
    assert not (studies / "hf.md").exists()


def test_recorded_replays_of_the_differing_prompts_enter_the_table(studies):
    vllm = ResultsDir(studies / "vllm")
    differing = [row for row in comparison_rows(ResultsDir(studies / "hf").runs(), vllm.runs(), "vllm")
                 if row["config"] == "mars(theta=0.5)"][0]["differing"]
    checks = {"checks": [{"config": "mars(theta=0.5)", "task": "jailbreak", "max_new_tokens": 16,
                          "prompts": [{"example_id": differing[0], "continuation_equals_engine": True},
                                      {"example_id": differing[1], "continuation_equals_engine": False}]}]}
    (studies / "vllm" / "shift_check.json").write_text(json.dumps(checks), encoding="utf-8")
    text = card_with_engine_section(studies)
    assert "| mars(theta=0.5) → mars(theta=0.5)+step(L=1) | jailbreak | 4 | 16 | 2 / 4 | 1 | 1 |" in text


def test_the_engine_s_own_flips_and_position_acceptance_are_tabled(studies):
    from hf_securesd.bench.report_engines import own_target_rows

    rows = {row["config"]: row for row in own_target_rows(ResultsDir(studies / "vllm").runs())}
    assert (rows["mars(theta=0.5)"]["flips"]["n_lost"], rows["mars(theta=0.5)"]["flips"]["n_gained"]) == (1, 0)
    assert rows["mars(theta=0.5)+step(L=2)"]["flips"]["n_lost"] == 0
    assert rows["lossless"]["position_acceptance"] == [None] * 6  # no statistics recorded here


def test_replayed_position_tv_enters_the_engine_section(studies):
    replayed = {"cells": [{"config": "mars(theta=0.5)", "task": "jailbreak", "n": 4, "max_new_tokens": 16,
                           "position_tv": [0.0, 0.25, 0.5, None], "reached": [4, 4, 2, 0],
                           "recorded_position_tv": None}]}
    (studies / "vllm" / "position_tv.json").write_text(json.dumps(replayed), encoding="utf-8")
    text = card_with_engine_section(studies)
    assert "| configuration | task | prompts | TV 0 | TV 1 | TV 2 | TV 3 | TV 4 | TV 5 |" in text
    assert "| mars(theta=0.5) | jailbreak | 4 | 0.000 | 0.250 | 0.500 | – | – | – |" in text


@pytest.mark.parametrize("field, value", [
    ("n", '1 | <img src="https://evil.example/t.png">\n\n# All SAFE'), ("n", True), ("config", 3),
    ("position_tv", [0.1, "<b>x</b>"]), ("position_tv", [2.0]),
])
def test_a_replay_file_holding_other_values_is_refused_naming_the_field(studies, field, value):
    """The file lies in another results directory: nothing in it reaches report.md or the card unchecked."""
    cell = {"config": "mars(theta=0.5)", "task": "jailbreak", "n": 4, "position_tv": [0.0]}
    (studies / "vllm" / "position_tv.json").write_text(json.dumps({"cells": [{**cell, field: value}]}))
    with pytest.raises(CorruptResultsError, match=rf'position_tv.json: cells\[0\]\["{field}"\] must be'):
        card_with_engine_section(studies)
    assert not (studies / "c.md").exists() or "evil.example" not in (studies / "c.md").read_text()


@pytest.mark.parametrize("prompt", [{"example_id": "x", "continuation_equals_engine": "<b>yes</b>"}, ["x", True]])
def test_a_shift_check_file_holding_other_values_is_refused(studies, prompt):
    checks = {"checks": [{"config": "mars(theta=0.5)", "task": "jailbreak", "max_new_tokens": 16, "prompts": [prompt]}]}
    (studies / "vllm" / "shift_check.json").write_text(json.dumps(checks), encoding="utf-8")
    with pytest.raises(CorruptResultsError, match=r'shift_check.json: checks\[0\]\["prompts"\] must hold'):
        card_with_engine_section(studies)


def test_no_replay_file_no_tv_table(studies):
    assert "TV 0" not in card_with_engine_section(studies)
