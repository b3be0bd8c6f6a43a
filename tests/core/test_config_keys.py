"""A misspelt SecureSD key in a generation config (saved or passed) is refused by speculative calls: a
misspelt `secure_schedule` would otherwise decode with the relaxed verifier and no lossless prefix."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

import hf_securesd
from hf_securesd import SecureSDConfigError, Step
from hf_securesd.config_keys import misspelt_fields
from hf_securesd.tiny import TinyPairSpec, tiny_pair

PROMPT = torch.tensor([[7, 8, 9, 10, 11]])
SPEC = TinyPairSpec(architecture="qwen2", seed=2)
MISSPELT = ["secure-schedule", "secureSchedule", "Secure_Schedule", "secure_schedules", "secure_shedule",
            "\uff53\uff45\uff43\uff55\uff52\uff45_schedule"]


@pytest.mark.parametrize("key", MISSPELT)
def test_spellings_of_a_field_are_found(key):
    assert misspelt_fields([key]) == [(key, "secure_schedule")]


@pytest.mark.parametrize("key", ["secure_schedule", "verifier", "output_attentions", "assistant_model",
                                 "schedule", "foo", "_from_model_config", "num_assistant_tokens", "verified",
                                 "output_variation", "output_deviation_stats"])
def test_fields_and_other_keys_are_not(key):
    assert misspelt_fields([key]) == []


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A wrapped target saved with MARS and Step(L=3) as its defaults, and the draft."""
    draft, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    target.generation_config.verifier = "mars"
    target.generation_config.secure_schedule = Step(L=3)
    folder = tmp_path_factory.mktemp("saved")
    target.save_pretrained(folder)
    return folder, draft


@pytest.mark.parametrize("from_model_config", [False, True])
@pytest.mark.parametrize("key", ["secure-schedule", "secureSchedule"])
def test_a_misspelt_saved_schedule_is_refused(saved, tmp_path, key, from_model_config):
    folder, draft = saved
    copy = tmp_path / "model"
    copy.mkdir()
    for path in folder.iterdir():
        if path.is_file():
            (copy / path.name).write_bytes(path.read_bytes())
    config = json.loads((copy / "generation_config.json").read_text())
    config[key] = config.pop("secure_schedule")
    config["_from_model_config"] = from_model_config
    (copy / "generation_config.json").write_text(json.dumps(config))
    model = hf_securesd.wrap(AutoModelForCausalLM.from_pretrained(copy))
    with pytest.raises(SecureSDConfigError, match=f"model's generation config holds '{key}'.*'secure_schedule'"):
        model.generate(PROMPT, assistant_model=draft, max_new_tokens=4, do_sample=False)
    assert model.generate(PROMPT, max_new_tokens=4, do_sample=False).shape == (1, 9)  # plain calls run
    # SecureSD switched off: transformers' own assisted decoding, which reads no SecureSD field, runs
    plain = model.generate(PROMPT, assistant_model=draft, verifier=None, max_new_tokens=4, do_sample=False)
    assert plain.shape == (1, 9)


@pytest.mark.parametrize("route", ["wrap", "callable"])
def test_a_misspelt_key_in_a_passed_config_is_refused(route):
    draft, target = tiny_pair(SPEC)
    config = GenerationConfig.from_dict({"max_new_tokens": 4, "do_sample": False, "verifier": "mars",
                                         "secureSchedule": {"schedule": "step", "L": 1}})
    if route == "wrap":
        call = dict(assistant_model=draft)
        hf_securesd.wrap(target)
    else:
        call = dict(custom_generate=hf_securesd.securesd_generate, draft=draft)
    with pytest.raises(SecureSDConfigError, match="holds 'secureSchedule'.*did you mean 'secure_schedule'"):
        target.generate(PROMPT, generation_config=config, **call)
