"""Acceptance 7 and 8, and the generate() features a user relies on: the three routes (wrap, patch,
custom_generate), plain-transformers behaviour without a verifier, save_pretrained, streamer, EOS,
stopping criteria, scores and statistics."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

import hf_securesd
from hf_securesd import MARS, Step, securesd_generate
from hf_securesd.schedules import resolve_schedule
from hf_securesd.tiny import TinyPairSpec, tiny_pair
from hf_securesd.verifiers import resolve_verifier

PROMPT = torch.tensor([[7, 8, 9, 10, 11]])
SPEC = TinyPairSpec(architecture="llama", seed=4)


@pytest.fixture
def fresh_pair():
    """(draft, target) unwrapped, identical weights every time."""
    return tiny_pair(SPEC)


def seeded(model, seed=0, **kwargs):
    torch.manual_seed(seed)
    return model.generate(PROMPT, max_new_tokens=20, **kwargs)


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("with_assistant", [False, True])
def test_wrap_without_verifier_is_plain_transformers(do_sample, with_assistant):
    draft, plain = tiny_pair(SPEC)
    _, wrapped = tiny_pair(SPEC)
    hf_securesd.wrap(wrapped)
    extra = {"assistant_model": draft} if with_assistant else {}
    assert torch.equal(seeded(plain, do_sample=do_sample, **extra), seeded(wrapped, do_sample=do_sample, **extra))


@pytest.mark.parametrize("do_sample", [False, True])
def test_patch_without_verifier_is_plain_transformers_and_with_verifier_works(do_sample):
    draft, plain = tiny_pair(SPEC)
    reference = seeded(plain, do_sample=do_sample)
    reference_assisted = seeded(plain, do_sample=do_sample, assistant_model=draft)
    hf_securesd.patch()
    try:
        _, patched = tiny_pair(SPEC)  # a model the user never wrapped
        assert torch.equal(seeded(patched, do_sample=do_sample), reference)
        assert torch.equal(seeded(patched, do_sample=do_sample, assistant_model=draft), reference_assisted)
        greedy = seeded(patched, do_sample=False)
        speculative = seeded(patched, do_sample=False, assistant_model=draft, verifier="lossless", return_dict_in_generate=True)
        assert torch.equal(speculative.sequences, greedy)
        assert speculative.speculative_stats.rounds > 0
    finally:
        hf_securesd.unpatch()
    with pytest.raises(ValueError, match="are not used by the model"):
        plain.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="mars")  # unpatched: HF rejects it


@pytest.mark.parametrize("route", ["wrap", "wrap_and_callable"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_a_wrapped_model_gives_the_same_tokens_under_patch(route, do_sample):
    """Under patch(), a wrapped model's call was prepared twice: the first pass's num_assistant_tokens then
    refused every prompt-lookup call ('does not apply to prompt lookup')."""
    repeating = torch.tensor([[7, 8, 9, 10, 7, 8, 9, 10, 7, 8]])
    kwargs = dict(max_new_tokens=12, do_sample=do_sample, verifier="mars", prompt_lookup_num_tokens=3)
    if route == "wrap_and_callable":
        kwargs["custom_generate"] = securesd_generate
    _, wrapped = tiny_pair(SPEC)
    hf_securesd.wrap(wrapped)
    torch.manual_seed(0)
    expected = wrapped.generate(repeating, **kwargs)
    hf_securesd.patch()
    try:
        torch.manual_seed(0)
        assert torch.equal(wrapped.generate(repeating, **kwargs), expected)
    finally:
        hf_securesd.unpatch()


def test_custom_generate_route(fresh_pair):
    draft, target = fresh_pair
    greedy = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    out = target.generate(
        PROMPT, max_new_tokens=20, do_sample=False, custom_generate=securesd_generate, draft=draft, verifier="lossless",
        num_assistant_tokens=3, return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, greedy)
    assert max(out.speculative_stats.drafted_per_round) == 3
    with pytest.raises(hf_securesd.SecureSDConfigError, match="needs a draft model"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=securesd_generate, verifier="mars")


def test_save_pretrained_keeps_architecture_and_config(fresh_pair, tmp_path):
    draft, target = fresh_pair
    hf_securesd.wrap(target)
    target.generation_config.verifier = MARS(theta=0.8)
    target.generation_config.secure_schedule = Step(L=2)
    target.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["verifier"] == {"verifier": "mars", "theta": 0.8}
    assert saved["secure_schedule"] == {"schedule": "step", "L": 2}
    reloaded = hf_securesd.wrap(AutoModelForCausalLM.from_pretrained(tmp_path))
    assert type(reloaded).__name__ == "LlamaForCausalLM"
    # the saved dict forms turn back into the same objects
    assert resolve_verifier(saved["verifier"]) == MARS(theta=0.8)
    assert resolve_schedule(saved["secure_schedule"]) == Step(L=2)


def test_generation_config_object_carries_verifier(fresh_pair):
    draft, target = fresh_pair
    hf_securesd.wrap(target)
    config = GenerationConfig(max_new_tokens=12, do_sample=False, verifier="lossless", num_assistant_tokens=2)
    out = target.generate(PROMPT, generation_config=config, assistant_model=draft, return_dict_in_generate=True)
    assert out.speculative_stats.drafted_per_round[0] == 2
    assert torch.equal(out.sequences, target.generate(PROMPT, max_new_tokens=12, do_sample=False))


class Collect(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def test_streamer_receives_prompt_then_every_token(llama_pair):
    draft, target = llama_pair
    streamer = Collect()
    out = target.generate(PROMPT, max_new_tokens=15, assistant_model=draft, verifier="mars", streamer=streamer, do_sample=False)
    assert streamer.ended
    assert streamer.chunks[0] == PROMPT[0].tolist()
    assert sum(streamer.chunks[1:], []) == out[0, PROMPT.shape[1] :].tolist()


def test_eos_stops_exactly_like_greedy(llama_pair):
    draft, target = llama_pair
    greedy = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    eos = int(greedy[0, PROMPT.shape[1] + 6])  # a token greedy decoding emits mid-way
    reference = target.generate(PROMPT, max_new_tokens=20, do_sample=False, eos_token_id=eos)
    ours = target.generate(PROMPT, max_new_tokens=20, do_sample=False, eos_token_id=eos, assistant_model=draft, verifier="lossless")
    assert torch.equal(ours, reference)
    assert int(ours[0, -1]) == eos and ours.shape[1] <= PROMPT.shape[1] + 7


class StopAfterToken(StoppingCriteria):
    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_custom_stopping_criteria_stop_mid_round(llama_pair):
    draft, target = llama_pair
    greedy = target.generate(PROMPT, max_new_tokens=20, do_sample=False)
    stop_token = int(greedy[0, PROMPT.shape[1] + 4])
    criteria = StoppingCriteriaList([StopAfterToken(stop_token)])
    reference = target.generate(PROMPT, max_new_tokens=20, do_sample=False, stopping_criteria=criteria)
    ours = target.generate(PROMPT, max_new_tokens=20, do_sample=False, stopping_criteria=criteria, assistant_model=draft,
                           verifier="lossless", num_assistant_tokens=8)
    assert torch.equal(ours, reference)


def test_exact_length_scores_and_statistics(llama_pair):
    draft, target = llama_pair
    reference = target.generate(PROMPT, max_new_tokens=13, do_sample=False, output_scores=True, output_logits=True,
                                return_dict_in_generate=True)
    out = target.generate(PROMPT, max_new_tokens=13, do_sample=False, assistant_model=draft, verifier="lossless",
                          output_scores=True, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference.sequences)
    assert len(out.scores) == len(out.logits) == 13
    for ours, theirs in zip(out.logits, reference.logits):
        assert torch.allclose(ours, theirs, atol=1e-4)
    stats = out.speculative_stats
    assert stats.new_tokens == 13
    assert stats.accepted_tokens + stats.rounds == 13  # each round commits accepted drafts + one token
    assert 0.0 <= stats.acceptance_rate <= 1.0
    assert sum(stats.position_drafted) == stats.drafted_tokens
    assert all(tv == 0.0 for tv in stats.position_tv if tv == tv)  # lossless: zero deviation everywhere
    relaxed = target.generate(PROMPT, max_new_tokens=13, do_sample=False, assistant_model=draft,
                              verifier=MARS(theta=0.5), return_dict_in_generate=True)
    assert relaxed.speculative_stats.to_dict()["rounds"] == relaxed.speculative_stats.rounds
