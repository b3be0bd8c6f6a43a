"""`save_pretrained(push_to_hub=True)` of a model with a verifier uploads the `custom_generate/` entry
point with the weights (transformers uploads inside `save_pretrained`, before the wrapper's own writing
would come), and a rank told not to save (`is_main_process=False`) writes nothing. The Hub is replaced
by a recorder of commits; transformers' own upload logic (which files changed since the save began)
runs unchanged."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers.modeling_utils
import transformers.utils.hub

import hf_securesd
from hf_securesd import MARS, Step
from hf_securesd.tiny import TinyPairSpec, tiny_pair

SPEC = TinyPairSpec(architecture="qwen2", seed=2)
ENTRY_POINT = {"custom_generate/generate.py", "custom_generate/requirements.txt"}


class RecordingHub:
    """Stands for `HfApi`: records each commit's uploaded paths."""

    def __init__(self) -> None:
        self.commits: list[set[str]] = []

    def create_repo(self, repo_id: str, **_: object) -> SimpleNamespace:
        return SimpleNamespace(repo_id=repo_id)

    def create_commit(self, operations: list, **_: object) -> None:
        self.commits.append({operation.path_in_repo for operation in operations})


@pytest.fixture
def hub(monkeypatch) -> RecordingHub:
    recorder = RecordingHub()
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", recorder)
    card = SimpleNamespace(save=lambda path: Path(path).write_text("card\n"))
    monkeypatch.setattr(transformers.modeling_utils, "create_and_tag_model_card", lambda *_, **__: card)
    return recorder


def _target_with_verifier():
    _, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    target.generation_config.verifier = MARS(theta=0.6)
    target.generation_config.secure_schedule = Step(L=1)
    return target


@pytest.mark.parametrize("route", ["wrap", "patch"])
def test_push_to_hub_from_save_pretrained_uploads_the_entry_point(tmp_path, hub, route):
    if route == "wrap":
        target = _target_with_verifier()
    else:
        _, target = tiny_pair(SPEC)
        target.generation_config.verifier = "mars"
        hf_securesd.patch()
    try:
        target.save_pretrained(tmp_path / "model", push_to_hub=True, repo_id="me/model")
    finally:
        hf_securesd.unpatch()
    [uploaded] = hub.commits
    assert ENTRY_POINT <= uploaded and {"generation_config.json", "model.safetensors"} <= uploaded
    assert "_upload_modified_files" not in vars(target)  # the hook lasts the call only


def test_pushing_a_folder_saved_before_uploads_the_entry_point_again(tmp_path, hub):
    target = _target_with_verifier()
    target.save_pretrained(tmp_path / "model")
    target.save_pretrained(tmp_path / "model", push_to_hub=True, repo_id="me/model")
    assert ENTRY_POINT <= hub.commits[-1]


def test_a_rank_told_not_to_save_writes_no_entry_point(tmp_path):
    target = _target_with_verifier()
    target.save_pretrained(tmp_path / "model", is_main_process=False)
    assert not (tmp_path / "model" / "custom_generate").exists()
