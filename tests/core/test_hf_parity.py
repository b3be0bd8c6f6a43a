"""generate() features a Hugging Face user passes with a verifier: stop strings with a tokenizer
(also the pipeline's stop_sequence), saved-and-reloaded verifiers, switching SecureSD off, the
custom_generate=securesd_generate route on wrapped and patched models, and the errors for what
cannot work (prompt lookup, universal assisted decoding)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, pipeline

import hf_securesd
from hf_securesd import MARS, SecureSDConfigError, Step, securesd_generate
from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair

PROMPT = torch.tensor([[72, 101, 108, 108, 111]])  # "Hello"
SPEC = TinyPairSpec(architecture="llama", seed=4)
NEW = 24


@pytest.fixture
def pair():
    """(draft, wrapped target), identical weights every time."""
    draft, target = tiny_pair(SPEC)
    return draft, hf_securesd.wrap(target)


def _stop_string(target) -> tuple[str, int]:
    """A one-character stop string that greedy decoding emits mid-way, and its response position."""
    greedy = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)[0, PROMPT.shape[1] :].tolist()
    position = next(i for i, token in enumerate(greedy) if i >= 3 and 65 <= token <= 122 and chr(token).isalpha())
    return chr(greedy[position]), position


def test_stop_strings_with_tokenizer_stop_like_transformers(pair):
    draft, target = pair
    tokenizer = byte_tokenizer()
    stop, position = _stop_string(target)
    reference = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, stop_strings=stop, tokenizer=tokenizer)
    ours = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, stop_strings=stop, tokenizer=tokenizer,
                           assistant_model=draft, verifier="lossless", num_assistant_tokens=6)
    assert reference.shape[1] <= PROMPT.shape[1] + position + 1  # the stop string did stop greedy decoding
    assert torch.equal(ours, reference)


def test_pipeline_stop_sequence_with_verifier(pair):
    draft, target = pair
    tokenizer = byte_tokenizer()
    stop, _ = _stop_string(target)
    call = dict(max_new_tokens=NEW, do_sample=False, stop_sequence=stop, return_full_text=False)
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)("Hello", **call)
    speculative = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=draft)
    ours = speculative("Hello", verifier="lossless", **call)
    assert ours[0]["generated_text"] == plain[0]["generated_text"]
    assert len(plain[0]["generated_text"]) < NEW


def test_assistant_tokenizer_stays_rejected(pair):
    draft, target = pair
    tokenizer = byte_tokenizer()
    with pytest.raises(SecureSDConfigError, match="universal assisted decoding"):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="mars", tokenizer=tokenizer,
                        assistant_tokenizer=tokenizer)


def test_prompt_lookup_explains_missing_draft_distribution(pair):
    _, target = pair
    with pytest.raises(SecureSDConfigError, match="FSD compares the draft's distribution") as error:
        target.generate(PROMPT, max_new_tokens=4, verifier="fsd", prompt_lookup_num_tokens=3)
    assert "assistant_model=" in str(error.value) and "mars" in str(error.value)


def _save_with_verifier(target, directory) -> None:
    target.generation_config.verifier = MARS(theta=0.8)
    target.generation_config.secure_schedule = Step(L=2)
    target.save_pretrained(directory)


def test_saved_verifier_survives_from_model_config_reload(pair, tmp_path):
    _, target = pair
    assert target.generation_config._from_model_config  # built from a config, like many Hub checkpoints
    _save_with_verifier(target, tmp_path)
    # saved as a config of its own (not marked as derived from the model's), so loading keeps the verifier
    assert json.loads((tmp_path / "generation_config.json").read_text())["_from_model_config"] is False
    reloaded = hf_securesd.wrap(AutoModelForCausalLM.from_pretrained(tmp_path))
    assert reloaded.generation_config.verifier == {"verifier": "mars", "theta": 0.8}
    assert reloaded.generation_config.secure_schedule == {"schedule": "step", "L": 2}


def test_reloaded_model_runs_securesd_with_a_draft_and_plain_decoding_without(pair, tmp_path):
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    explicit = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft,
                               verifier=MARS(theta=0.8), secure_schedule=Step(L=2), return_dict_in_generate=True)
    _save_with_verifier(target, tmp_path)
    reloaded = hf_securesd.wrap(AutoModelForCausalLM.from_pretrained(tmp_path))
    assert torch.equal(reloaded.generate(PROMPT, max_new_tokens=NEW, do_sample=False), greedy)
    tokenizer = byte_tokenizer()
    plain = pipeline("text-generation", model=reloaded, tokenizer=tokenizer)("Hello", max_new_tokens=8, do_sample=False)
    assert plain[0]["generated_text"].startswith("Hello")
    saved = reloaded.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft,
                              return_dict_in_generate=True)
    assert saved.speculative_stats is not None
    assert torch.equal(saved.sequences, explicit.sequences)
    with pytest.raises(SecureSDConfigError, match="needs a proposer"):
        reloaded.generate(PROMPT, max_new_tokens=4, verifier="mars")  # an explicit request cannot be honoured


def test_saved_model_runs_securesd_in_plain_transformers_with_trust_remote_code(pair, tmp_path):
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    _save_with_verifier(target, tmp_path)
    assert (tmp_path / "custom_generate" / "generate.py").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)  # never wrapped by the user
    out = reloaded.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft,
                            return_dict_in_generate=True)
    assert out.speculative_stats.rounds > 0
    assert torch.equal(reloaded.generate(PROMPT, max_new_tokens=NEW, do_sample=False), greedy)


def test_verifier_none_alone_switches_securesd_off(pair):
    draft, target = pair
    plain_draft, plain_target = tiny_pair(SPEC)
    reference = plain_target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=plain_draft)
    target.generation_config.verifier = "mars"
    target.generation_config.secure_schedule = Step(L=1)
    try:
        out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft, verifier=None,
                              return_dict_in_generate=True)
    finally:
        target.generation_config.verifier = target.generation_config.secure_schedule = None
    assert not hasattr(out, "speculative_stats")
    assert torch.equal(out.sequences, reference)
    with pytest.raises(SecureSDConfigError, match="without a verifier"):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier=None, secure_schedule=Step(L=1))


@pytest.mark.parametrize("draft_argument", ["draft", "assistant_model"])
def test_custom_generate_callable_on_wrapped_model(pair, draft_argument):
    draft, target = pair
    greedy = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, custom_generate=securesd_generate,
                          verifier="lossless", num_assistant_tokens=3, return_dict_in_generate=True,
                          **{draft_argument: draft})
    assert torch.equal(out.sequences, greedy)
    assert max(out.speculative_stats.drafted_per_round) == 3


def test_custom_generate_callable_on_patched_model_with_assistant_model():
    draft, target = tiny_pair(SPEC)
    greedy = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    hf_securesd.patch()
    try:
        out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, custom_generate=securesd_generate,
                              assistant_model=draft, verifier="lossless", return_dict_in_generate=True)
    finally:
        hf_securesd.unpatch()
    assert torch.equal(out.sequences, greedy)
    assert out.speculative_stats.rounds > 0


def test_custom_generate_callable_on_plain_model_names_draft_argument():
    draft, target = tiny_pair(SPEC)
    with pytest.raises(SecureSDConfigError, match="draft=<draft model>"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=securesd_generate, assistant_model=draft,
                        verifier="mars")


@pytest.mark.parametrize("wrapped", [False, True])
def test_inputs_embeds_is_refused_by_name_on_every_route(wrapped):
    """On a model that is not wrapped the callable used to blame position_ids=, which the caller never
    passed (transformers' own positions for the embeddings could not be matched against empty ids)."""
    draft, target = tiny_pair(SPEC)
    if wrapped:
        target = hf_securesd.wrap(target)
    embeds = target.get_input_embeddings()(PROMPT)
    with pytest.raises(SecureSDConfigError, match=r"model inputs \['inputs_embeds'\] are not supported"):
        target.generate(inputs_embeds=embeds, max_new_tokens=4, do_sample=False,
                        custom_generate=securesd_generate, draft=draft)


@pytest.mark.parametrize(
    ("option", "message"),
    [({"guidance_scale": 1.5}, "classifier-free guidance"), ({"synced_gpus": True}, "synced_gpus=True")],
)
def test_options_that_would_be_silently_wrong_are_rejected(pair, option, message):
    draft, target = pair
    with pytest.raises(SecureSDConfigError, match=message):
        target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="lossless", **option)
