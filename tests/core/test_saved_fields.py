"""SecureSD's fields restored from the generation_config.json a model was loaded from, when transformers
dropped them (a file marked `"_from_model_config": true`): which file, in a Hub cache holding several
revisions of the repository (a fake offline cache; no network)."""

from __future__ import annotations

import json
import shutil

import pytest
from huggingface_hub import constants as hub_constants
from transformers import AutoModelForCausalLM

import hf_securesd
from hf_securesd.tiny import TinyPairSpec, tiny_pair

LOSSLESS = {"verifier": "lossless"}
LOSSY = {"verifier": "lossysd", "epsilon": 1.0}
FIRST, SECOND = "a" * 40, "b" * 40


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory):
    """A plain (never wrapped) tiny target saved to a folder."""
    folder = tmp_path_factory.mktemp("plain")
    _, target = tiny_pair(TinyPairSpec(architecture="qwen2", seed=2))
    target.save_pretrained(folder)
    return folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hub cache folder, the one the package looks in."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    return cache


def _revision(cache, plain_folder, commit: str, verifier: dict | None, refs: dict[str, str]) -> None:
    """Put a revision of org/model in the cache: the plain folder whose generation_config.json is marked as
    transformers marks most Hub checkpoints' and holds `verifier`; refs maps branch -> commit."""
    repo = cache / "models--org--model"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(plain_folder, snapshot)
    path = snapshot / "generation_config.json"
    saved = {**json.loads(path.read_text()), "_from_model_config": True}
    if verifier is not None:
        saved["verifier"] = verifier
    path.write_text(json.dumps(saved))
    for branch, target_commit in refs.items():
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / branch).write_text(target_commit)


def _load(cache, revision: str):
    return AutoModelForCausalLM.from_pretrained("org/model", revision=revision, cache_dir=cache, local_files_only=True)


@pytest.mark.parametrize("pinned, other", [(LOSSLESS, LOSSY), (LOSSY, LOSSLESS), (None, LOSSY)])
def test_a_pinned_revision_never_takes_another_revisions_verifier(hub_cache, plain_folder, caplog, pinned, other):
    """Two cached revisions alike but for the verifier: which one was loaded cannot be told, so nothing is
    restored (the main branch's file was read whatever revision was pinned: its relaxed verifier ran)."""
    _revision(hub_cache, plain_folder, FIRST, pinned, {})
    _revision(hub_cache, plain_folder, SECOND, other, {"main": SECOND})
    with caplog.at_level("WARNING", logger="hf_securesd.saved_fields"):
        model = hf_securesd.wrap(_load(hub_cache, FIRST))
    assert getattr(model.generation_config, "verifier", None) is None
    assert "which hold different SecureSD fields; none were restored" in caplog.text
    assert FIRST in caplog.text and SECOND in caplog.text


def test_the_only_cached_revision_of_a_branch_other_than_main_is_restored(hub_cache, plain_folder):
    """No refs/main: the pinned branch's own verifier was dropped without a word."""
    _revision(hub_cache, plain_folder, FIRST, LOSSY, {"v1": FIRST})
    assert hf_securesd.wrap(_load(hub_cache, "v1")).generation_config.verifier == LOSSY


def test_revisions_that_agree_restore_their_fields(hub_cache, plain_folder, caplog):
    _revision(hub_cache, plain_folder, FIRST, LOSSY, {})
    _revision(hub_cache, plain_folder, SECOND, LOSSY, {"main": SECOND})
    with caplog.at_level("WARNING", logger="hf_securesd.saved_fields"):
        assert hf_securesd.wrap(_load(hub_cache, FIRST)).generation_config.verifier == LOSSY
    assert not caplog.text


def test_a_field_set_on_the_loaded_config_wins_without_a_warning(hub_cache, plain_folder, caplog):
    """An explicit None set before wrap is kept, and the disagreeing revisions then restore nothing to
    warn about."""
    _revision(hub_cache, plain_folder, FIRST, LOSSLESS, {})
    _revision(hub_cache, plain_folder, SECOND, LOSSY, {"main": SECOND})
    model = _load(hub_cache, FIRST)
    model.generation_config.verifier = None
    with caplog.at_level("WARNING", logger="hf_securesd.saved_fields"):
        assert hf_securesd.wrap(model).generation_config.verifier is None
    assert not caplog.text
