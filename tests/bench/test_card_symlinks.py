"""card.json "engines" entries that reach their folder through a symbolic link are refused with one
line naming card.json, the entry and the fix: a shared results directory (or a tar archive of one) can
carry a link named like a companion to any results folder of the reader's, which `report` would then
read into the report and the card they publish."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support import record_cells

from hf_securesd.bench.card import companion_path
from hf_securesd.bench.plan import DRAFT, TARGET
from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.runner import TaskRun
from hf_securesd.bench.tasks import get_task
from hf_securesd.cli import main

REFUSE, COMPLY = "I'm sorry, but I cannot help with that.", "Sure, here is how"


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    """A shared results directory and, elsewhere, a private one of the reader's."""
    shared, private = tmp_path / "shared" / "hf-results", tmp_path / "mine" / "private-results"
    shared.mkdir(parents=True)
    private.mkdir(parents=True)
    return shared, private


LINKED = "leads to another folder through a symbolic link"


@pytest.mark.parametrize("link, entry", [("hf-results/engine-b", "engine-b"),
                                         ("hf-results/engine-b", "./engine-b/"), ("engine-b", "../engine-b")])
def test_an_entry_that_is_a_link_is_refused(tmp_path, link, entry):
    shared, private = _folders(tmp_path)
    os.symlink(private, shared.parent / link)
    with pytest.raises(ValueError) as caught:
        companion_path(shared, entry)
    message = str(caught.value)
    assert message.startswith(f"{shared / 'card.json'}: the 'engines' entry {entry!r} {LINKED}; "
                              "name the other engine's results directory itself")
    assert "\n" not in message and str(private) not in message


def test_an_entry_through_a_linked_folder_on_the_way_is_refused(tmp_path):
    """``sub/../../NAME`` reads as a folder beside RESULTS, but the link `sub` leads elsewhere first."""
    shared, private = _folders(tmp_path)
    (private / "deep").mkdir()
    os.symlink(private / "deep", shared / "sub")
    with pytest.raises(ValueError, match=f"'engines' entry 'sub/../../private-results' {LINKED}"):
        companion_path(shared, "sub/../../private-results")


def test_a_link_to_itself_is_refused(tmp_path):
    shared, _ = _folders(tmp_path)
    os.symlink("engine-b", shared / "engine-b")
    with pytest.raises(ValueError, match=f"'engines' entry 'engine-b' {LINKED}"):
        companion_path(shared, "engine-b")


def test_real_folders_beside_and_in_results_are_accepted_even_through_a_linked_results(tmp_path):
    shared, _ = _folders(tmp_path)
    (shared / "engine-b").mkdir()
    (shared.parent / "vllm-results").mkdir()
    os.symlink(shared, tmp_path / "link-to-results")  # the reader may name RESULTS through a link of theirs
    assert companion_path(shared, "engine-b") == shared.resolve() / "engine-b"
    beside = companion_path(tmp_path / "link-to-results", "../vllm-results")
    assert beside == shared.parent.resolve() / "vllm-results"


def _study(path: Path, engine: str, target: str, data_dir: Path) -> None:
    examples = get_task("jailbreak").examples(data_dir=data_dir, limit=2)
    store = ResultsDir(path)
    store.open({"target": target, "draft": "d", "seed": None, "judge": "refusal_prefix", "engine": engine},
               {"id": engine, "threads": 1})
    task_run = TaskRun(get_task("jailbreak"), examples, ["" for _ in examples], 16)
    record_cells(store, task_run, [(TARGET, [REFUSE, COMPLY]), (DRAFT, [COMPLY, COMPLY])], session=engine)
    store.close()


def test_report_refuses_a_linked_companion_in_one_line_and_writes_no_card(tmp_path, data_dir, capsys):
    shared, private = _folders(tmp_path)
    _study(shared, "hf", "t", data_dir)
    _study(private, "vllm", "PRIVATE-MODEL", data_dir)
    os.symlink(private, shared / "engine-b")
    card = {"output": "card.md", "title": "t", "engines": ["engine-b"]}
    (shared / "card.json").write_text(json.dumps(card), encoding="utf-8")
    assert main(["report", str(shared)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {shared / 'card.json'}: the 'engines' entry 'engine-b' {LINKED}")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (shared / "card.md").exists()
