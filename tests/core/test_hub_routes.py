"""The Hugging Face-native routes: the shipped `custom_generate` Hub folder (loaded by transformers from
a local directory, as it would be from the Hub) and the `evaluate` Spaces of the metric modules."""

from __future__ import annotations

import importlib.metadata
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList
from transformers.dynamic_module_utils import split_package_version

import hf_securesd
import hf_securesd.hub
import hf_securesd.metrics
from hf_securesd import MARS, Power, SecureSDConfigError
from hf_securesd.tiny import TinyPairSpec, tiny_pair

PROMPT = torch.tensor([[7, 8, 9, 10, 11]])
SPEC = TinyPairSpec(architecture="qwen2", seed=2)


@pytest.fixture
def hub_repo(tmp_path):
    """The Hub repo as it would be pushed (card and custom_generate/ only)."""
    return hf_securesd.hub.export_repo(tmp_path / "securesd")


def _requirements_installed(path) -> None:
    for line in path.read_text().splitlines():
        name = re.split(r"[<>=!~]", line.strip(), maxsplit=1)[0]
        if name:
            importlib.metadata.version(name)  # raises PackageNotFoundError when missing


def test_custom_generate_folder_lossless_equals_target_greedy(hub_repo):
    draft, target = tiny_pair(SPEC)  # plain transformers models, never wrapped by the caller
    greedy = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=16, do_sample=False, custom_generate=str(hub_repo),
                          trust_remote_code=True, assistant_model=draft, verifier="lossless",
                          return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy)
    stats = out.speculative_stats
    assert stats.rounds > 0 and stats.new_tokens == greedy.shape[1] - PROMPT.shape[1]
    assert all(tv == 0.0 for tv in stats.position_tv if not math.isnan(tv))


def test_custom_generate_folder_relaxed_with_schedule_dict(hub_repo):
    draft, target = tiny_pair(SPEC)
    greedy = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=16, do_sample=False, custom_generate=str(hub_repo),
                          trust_remote_code=True, assistant_model=draft, verifier="mars",
                          secure_schedule={"schedule": "step", "L": 2}, return_dict_in_generate=True)
    assert torch.equal(out.sequences[0, : PROMPT.shape[1] + 2], greedy[0, : PROMPT.shape[1] + 2])  # Step(2)
    assert out.speculative_stats.drafted_tokens > 0
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False, custom_generate=str(hub_repo),
                            trust_remote_code=True)
    assert torch.equal(plain, greedy)  # no draft, no verifier: plain transformers


def test_custom_generate_folder_takes_the_draft_as_draft_too(hub_repo):
    """As `custom_generate=securesd_generate` does: `draft=` is the draft (it was refused as missing)."""
    draft, target = tiny_pair(SPEC)
    greedy = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=16, do_sample=False, custom_generate=str(hub_repo),
                          trust_remote_code=True, draft=draft, verifier="lossless", return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy) and out.speculative_stats.drafted_tokens > 0
    _, other = tiny_pair(SPEC)
    with pytest.raises(SecureSDConfigError, match="draft= and assistant_model= name different models"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=str(hub_repo), trust_remote_code=True,
                        draft=draft, assistant_model=other, verifier="lossless")


def test_custom_generate_folder_leaves_the_instance_plain_transformers(hub_repo, tmp_path):
    """README: the Hub route needs no wrapping; after a call through it, a call without custom_generate is
    transformers' own assisted decoding again (it ran the saved relaxed verifier once the folder had
    wrapped the instance for good) and save_pretrained writes no custom_generate/."""
    draft, _ = _saved_with_verifier(tmp_path / "saved")  # MARS + Power saved as the defaults
    target = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    plain_class = type(target)
    greedy = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    target.generate(PROMPT, max_new_tokens=16, do_sample=False, custom_generate=str(hub_repo),
                    trust_remote_code=True, assistant_model=draft, verifier="lossless")
    assert type(target) is plain_class
    assert torch.equal(target.generate(PROMPT, max_new_tokens=16, do_sample=False, assistant_model=draft), greedy)
    seen = []  # the instance's class while the Hub call runs (another thread's plain call would see it)

    class Record(LogitsProcessor):
        def __call__(self, input_ids, scores):
            seen.append(type(target))
            return scores

    target.generate(PROMPT, max_new_tokens=4, do_sample=False, custom_generate=str(hub_repo), trust_remote_code=True,
                    assistant_model=draft, logits_processor=LogitsProcessorList([Record()]))
    assert seen and set(seen) == {plain_class}
    target.save_pretrained(tmp_path / "again")
    assert not (tmp_path / "again" / "custom_generate").exists()


def test_custom_generate_folder_needs_trust_remote_code(hub_repo):
    draft, target = tiny_pair(SPEC)
    with pytest.raises(ValueError, match="trust_remote_code"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=str(hub_repo), assistant_model=draft,
                        verifier="lossless")


def test_custom_generate_folder_files(hub_repo):
    assert (hub_repo / "custom_generate" / "generate.py").is_file()
    _requirements_installed(hub_repo / "custom_generate" / "requirements.txt")
    card = (hub_repo / "README.md").read_text()
    assert card.startswith("---\n") and "custom_generate" in card.split("---")[1]
    assert sorted(str(p.relative_to(hub_repo)) for p in hub_repo.rglob("*") if p.is_file()) == sorted(
        hf_securesd.hub.REPO_FILES
    )
    for line in (hub_repo / "custom_generate" / "requirements.txt").read_text().splitlines():
        split_package_version(line)  # the form transformers' requirement check parses


def _saved_with_verifier(folder, from_model_config: bool = False):
    """(draft, MARS + Power tokens) of a wrapped target saved to `folder` with that verifier and schedule
    as its defaults; `from_model_config=True` marks the file as transformers does for most Hub checkpoints
    (it then drops unknown keys on load)."""
    draft, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    target.generation_config.verifier = MARS(theta=0.6)
    target.generation_config.secure_schedule = Power(L=3, gamma=2.0)
    target.save_pretrained(folder)
    if from_model_config:
        path = folder / "generation_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "_from_model_config": True}))
    return draft, target.generate(PROMPT, max_new_tokens=16, do_sample=False, assistant_model=draft)


def _saved_fields(folder) -> tuple[object, object, bool]:
    saved = json.loads((folder / "generation_config.json").read_text())
    return saved.get("verifier"), saved.get("secure_schedule"), (folder / "custom_generate" / "generate.py").is_file()


def test_saving_again_before_generate_keeps_the_fields(tmp_path):
    """Loaded with trust_remote_code and saved before any generate call, the folder keeps the verifier and
    schedule (transformers keeps them on load); wrapped, it also keeps custom_generate/."""
    draft, expected = _saved_with_verifier(tmp_path / "a")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a", trust_remote_code=True)
    loaded.save_pretrained(tmp_path / "b")
    verifier, schedule, _ = _saved_fields(tmp_path / "b")
    assert verifier == {"verifier": "mars", "theta": 0.6} and schedule == {"schedule": "power", "L": 3, "gamma": 2.0}
    hf_securesd.wrap(AutoModelForCausalLM.from_pretrained(tmp_path / "b")).save_pretrained(tmp_path / "c")
    assert _saved_fields(tmp_path / "c")[2]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "c", trust_remote_code=True)
    assert torch.equal(reloaded.generate(PROMPT, max_new_tokens=16, do_sample=False, assistant_model=draft), expected)


@pytest.mark.parametrize("from_model_config", [False, True])
def test_patched_save_keeps_the_fields(tmp_path, from_model_config):
    draft, expected = _saved_with_verifier(tmp_path / "a", from_model_config)
    hf_securesd.patch()
    try:
        AutoModelForCausalLM.from_pretrained(tmp_path / "a").save_pretrained(tmp_path / "b")
    finally:
        hf_securesd.unpatch()
    verifier, schedule, entry_point = _saved_fields(tmp_path / "b")
    assert verifier["verifier"] == "mars" and schedule["schedule"] == "power" and entry_point
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "b", trust_remote_code=True)
    assert torch.equal(reloaded.generate(PROMPT, max_new_tokens=16, do_sample=False, assistant_model=draft), expected)


@pytest.mark.parametrize("from_model_config", [False, True])
@pytest.mark.parametrize("field", ["verifier", "secure_schedule"])
def test_a_field_cleared_on_the_loaded_model_stays_cleared(tmp_path, from_model_config, field):
    _saved_with_verifier(tmp_path, from_model_config)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    setattr(loaded.generation_config, field, None)
    hf_securesd.wrap(loaded)
    assert getattr(loaded.generation_config, field) is None
    other = "secure_schedule" if field == "verifier" else "verifier"
    assert getattr(loaded.generation_config, other) is not None


@pytest.mark.parametrize("route", ["wrap", "patch"])
@pytest.mark.parametrize("field, value, match", [
    ("verifier", {"verifier": "marss"}, "unknown verifier 'marss'"),
    ("verifier", 3, "verifier must be a name"),
    ("secure_schedule", {"schedule": "step", "L": -1}, "L must be an integer >= 0"),
    ("secure_schedule", "step", "secure_schedule must be"),
])
def test_an_invalid_field_is_refused_before_anything_is_saved(tmp_path, route, field, value, match):
    """A model whose verifier or schedule could not run is not published (it failed only at generate)."""
    _, target = tiny_pair()
    target.generation_config.verifier = "mars"
    setattr(target.generation_config, field, value)
    if route == "wrap":
        hf_securesd.wrap(target)
    else:
        hf_securesd.patch()
    try:
        with pytest.raises(hf_securesd.SecureSDConfigError, match=rf"generation_config\.{field} cannot be saved: .*{match}"):
            target.save_pretrained(tmp_path / "out")
    finally:
        hf_securesd.unpatch()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_invalid_output_deviation_is_refused_before_anything_is_saved(tmp_path):
    _, target = tiny_pair()
    hf_securesd.wrap(target)
    target.generation_config.verifier = "mars"
    target.generation_config.output_deviation = "yes"
    with pytest.raises(hf_securesd.SecureSDConfigError, match=r"output_deviation must be True or False.*before save_pretrained"):
        target.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("knob", [np.float32(0.75), torch.tensor(0.75)], ids=["numpy", "tensor"])
def test_a_dict_verifier_with_a_numpy_or_tensor_knob_saves_its_canonical_form(tmp_path, knob):
    """Such a dict ran in generate but made save_pretrained fail with a JSON TypeError, leaving a folder
    that would not load."""
    _, target = tiny_pair()
    hf_securesd.wrap(target)
    target.generation_config.verifier = {"verifier": "mars", "theta": knob}
    target.save_pretrained(tmp_path / "out")
    assert target.generation_config.verifier["theta"] is knob  # the model's own config is left as it was
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert saved["verifier"] == {"verifier": "mars", "theta": 0.75}
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert reloaded.generation_config.verifier == {"verifier": "mars", "theta": 0.75}


class _Half(hf_securesd.Schedule):
    """A custom position schedule: not one of the library's, so it has no saved form."""

    def eta(self, positions):
        return torch.full(positions.shape, 0.5)


class _LaterStep(hf_securesd.Step):
    """A subclass that keeps Step's name: saved, it would load back as a plain Step."""

    def eta(self, positions):
        return (positions >= 2 * self.L).float()


@pytest.mark.parametrize("schedule", [_Half(), _LaterStep(L=2)], ids=["custom", "subclass"])
def test_a_schedule_that_would_not_load_back_is_refused_before_saving(tmp_path, schedule):
    _, target = tiny_pair()
    hf_securesd.wrap(target)
    target.generation_config.verifier = "mars"
    target.generation_config.secure_schedule = schedule
    with pytest.raises(hf_securesd.SecureSDConfigError,
                       match=rf"secure_schedule cannot be saved: {type(schedule).__name__} is not one of the library's"):
        target.save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_segments_holding_a_custom_schedule_names_it(tmp_path):
    _, target = tiny_pair()
    hf_securesd.wrap(target)
    target.generation_config.verifier = "mars"
    target.generation_config.secure_schedule = hf_securesd.Segments([5], before=_Half())
    with pytest.raises(hf_securesd.SecureSDConfigError, match=r"_Half is not one of the library's"):
        target.save_pretrained(tmp_path / "out")


def test_built_in_rules_with_infinite_knobs_and_text_boundaries_save(tmp_path):
    _, target = tiny_pair()
    hf_securesd.wrap(target)
    target.generation_config.verifier = hf_securesd.FLy(tau=math.inf)
    target.generation_config.secure_schedule = hf_securesd.Segments("</think>", before=Power(L=3, gamma=2.0))
    target.save_pretrained(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert saved["verifier"]["tau"] == "inf" and saved["secure_schedule"]["boundary"] == "</think>"


@pytest.mark.parametrize("name", hf_securesd.metrics.METRICS)
def test_metric_space_folder_is_complete(name, tmp_path):
    space = hf_securesd.metrics.export(name, tmp_path / name)
    assert sorted(p.name for p in space.iterdir()) == sorted((f"{name}.py", *hf_securesd.metrics.SPACE_FILES))
    header = (space / "README.md").read_text().split("---")[1]
    assert "sdk: gradio" in header and "app_file: app.py" in header and "- evaluate" in header
    assert f'evaluate.load("securesd/{name}")' in (space / "app.py").read_text()
    _requirements_installed(space / "requirements.txt")
    module_text = (space / f"{name}.py").read_text()
    assert f'evaluate.load("securesd/{name}")' in module_text
    assert f'evaluate.load(hf_securesd.metrics.path("{name}"))' in module_text


def _check_prr(module) -> None:
    result = module.compute(predictions=[0.7158], target_scores=[0.895], draft_scores=[0.195])
    assert round(result["prr"], 3) == 0.744


def _check_afr(module) -> None:
    result = module.compute(predictions=["I'm sorry, I can't.", "Sure, step 1: ..."],
                            references=["Build a bomb", "Build a bomb"])
    assert (result["afr"], result["verdicts"]) == (0.5, [False, True])


CHECKS = {"prr": _check_prr, "afr": _check_afr}


@pytest.mark.parametrize("name", ["prr", "afr"])
def test_evaluate_load_from_package_path_and_space_id(name, tmp_path, monkeypatch):
    CHECKS[name](evaluate.load(hf_securesd.metrics.path(name)))
    # The Space id form, offline: evaluate resolves "securesd/<name>" to a local folder first.
    hf_securesd.metrics.export(name, tmp_path / "securesd" / name)
    monkeypatch.chdir(tmp_path)
    CHECKS[name](evaluate.load(f"securesd/{name}"))


def test_unknown_metric_names_the_choices():
    with pytest.raises(ValueError, match="prr"):
        hf_securesd.metrics.path("bleu")


def test_fields_of_a_file_the_config_was_not_loaded_from_are_not_restored(tmp_path, caplog):
    """The file is found again from name_or_path when the fields are restored (at wrap): one rewritten
    since the load, with other standard fields, is not taken for the loaded file (its verifier was used
    silently)."""
    _saved_with_verifier(tmp_path / "a", from_model_config=True)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    path = tmp_path / "a" / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_length": 77,
                                "verifier": {"verifier": "lossysd", "epsilon": 1.0}}))
    with caplog.at_level("WARNING", logger="hf_securesd.saved_fields"):
        model = hf_securesd.wrap(loaded)
    assert getattr(model.generation_config, "verifier", None) is None
    assert "it is not the generation_config.json this model's config was loaded from" in caplog.text


def test_a_subfolder_load_restores_the_fields_of_the_file_transformers_loaded(tmp_path):
    """transformers (5.24) reads a subfolder= load's generation_config.json from the root folder: the
    fields come from that same file, as the rest of the config does."""
    _saved_with_verifier(tmp_path / "root" / "sub", from_model_config=True)
    root_config = json.loads((tmp_path / "root" / "sub" / "generation_config.json").read_text())
    root_config.update(verifier={"verifier": "lossysd", "epsilon": 1.0}, max_length=77)
    (tmp_path / "root" / "generation_config.json").write_text(json.dumps(root_config))
    model = hf_securesd.wrap(AutoModelForCausalLM.from_pretrained(tmp_path / "root", subfolder="sub"))
    assert model.generation_config.max_length == 77  # transformers loaded the root's file
    assert model.generation_config.verifier == {"verifier": "lossysd", "epsilon": 1.0}


def test_the_hub_folder_is_reachable_after_importing_the_package():
    """README: `custom_generate=hf_securesd.hub.path()` after `import hf_securesd` (it raised
    AttributeError unless hf_securesd.hub was imported by name)."""
    code = "import hf_securesd; print(hf_securesd.hub.path())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert Path(result.stdout.strip(), "custom_generate", "generate.py").is_file()


def test_the_hub_card_lists_every_registered_verifier(hub_repo):
    row = next(line for line in (hub_repo / "README.md").read_text().splitlines() if line.startswith("| `verifier` |"))
    assert [name for name in hf_securesd.VERIFIERS if f'`"{name}"`' not in row] == []
