"""`custom_generate=hf_securesd.securesd_generate` resolves and checks its arguments as a wrapped model
does: verifier and schedule from the call, a passed GenerationConfig or the model's generation config,
the draft-length fields, position_ids, output_deviation, and clear refusals for what it cannot see."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from transformers import GenerationConfig

import hf_securesd
from hf_securesd import MARS, SecureSDConfigError, Step, securesd_generate
from hf_securesd.segments import BoundaryResolutionError
from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair

PROMPT = torch.tensor([[65, 66, 67, 68]])
SPEC = TinyPairSpec(architecture="qwen2", seed=2)
NEW = 16


def _mars_and_greedy() -> tuple[torch.Tensor, torch.Tensor]:
    """(MARS(0.5) + Step(1) tokens, target greedy tokens) on this pair and prompt; they differ."""
    draft, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    mars = target.generate(
        PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft, verifier=MARS(theta=0.5),
        secure_schedule=Step(L=1),
    )
    greedy = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False)
    assert not torch.equal(mars, greedy)
    return mars, greedy


@pytest.fixture(scope="module")
def references() -> tuple[torch.Tensor, torch.Tensor]:
    return _mars_and_greedy()


@pytest.mark.parametrize("wrapped", [False, True])
def test_verifier_from_a_passed_generation_config(references, wrapped):
    mars, _ = references
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    config = GenerationConfig(
        max_new_tokens=NEW, do_sample=False, verifier=MARS(theta=0.5).to_dict(), secure_schedule=Step(L=1).to_dict()
    )
    out = target.generate(PROMPT, generation_config=config, custom_generate=securesd_generate, draft=draft)
    assert torch.equal(out, mars)


@pytest.mark.parametrize("wrapped", [False, True])
def test_verifier_from_the_models_generation_config(references, wrapped):
    mars, greedy = references
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    target.generation_config.verifier = MARS(theta=0.5)
    target.generation_config.secure_schedule = Step(L=1)
    options = dict(max_new_tokens=NEW, do_sample=False, custom_generate=securesd_generate, draft=draft)
    assert torch.equal(target.generate(PROMPT, **options), mars)
    assert torch.equal(target.generate(PROMPT, verifier="lossless", **options), greedy)  # the call wins


@pytest.mark.parametrize("wrapped", [False, True])
def test_lossless_when_no_verifier_is_set_anywhere(references, wrapped):
    _, greedy = references
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, custom_generate=securesd_generate, draft=draft)
    assert torch.equal(out, greedy)


@pytest.mark.parametrize("wrapped", [False, True])
def test_position_ids_are_refused(wrapped):
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    with pytest.raises(SecureSDConfigError, match="position_ids= is not supported"):
        target.generate(PROMPT, max_new_tokens=4, position_ids=torch.tensor([[0, 40, 80, 120]]),
                        custom_generate=securesd_generate, draft=draft, verifier="lossless")


def test_default_position_ids_decode_the_same_tokens(references):
    """transformers fills in the default positions before it calls the callable: those are the positions
    the loop uses, so passing them changes nothing."""
    _, greedy = references
    draft, target = tiny_pair(SPEC)
    out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, position_ids=torch.arange(4)[None],
                          custom_generate=securesd_generate, draft=draft, verifier="lossless")
    assert torch.equal(out, greedy)


def _drafted(wrapped: bool, **options) -> list[int]:
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    out = target.generate(PROMPT, custom_generate=securesd_generate, draft=draft, verifier="lossless",
                          return_dict_in_generate=True, **options)
    return out.speculative_stats.drafted_per_round


@pytest.mark.parametrize(
    "options",
    [
        {"num_assistant_tokens_schedule": "heuristic_transient"},
        {"assistant_confidence_threshold": 0.9},
        {"num_assistant_tokens": 2},
        {"num_assistant_tokens": 20},  # transformers' default, passed as a keyword: honoured
    ],
)
def test_draft_length_fields_as_on_a_wrapped_model(options):
    draft, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    expected = target.generate(PROMPT, max_new_tokens=20, do_sample=False, assistant_model=draft, verifier="lossless",
                               return_dict_in_generate=True, **options).speculative_stats.drafted_per_round
    assert _drafted(False, max_new_tokens=20, do_sample=False, **options) == expected
    assert _drafted(True, max_new_tokens=20, do_sample=False, **options) == expected


def test_draft_length_from_a_passed_generation_config():
    config = GenerationConfig(num_assistant_tokens=2, max_new_tokens=20, do_sample=False, return_dict_in_generate=True)
    assert set(_drafted(False, generation_config=config)[:-1]) == {2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_assistant_tokens_schedule": "bogus"}, "num_assistant_tokens_schedule='bogus' is not supported"),
        ({"assistant_confidence_threshold": 1.5}, "must be a probability in"),
        ({"num_assistant_tokens": 0}, "must be an integer >= 1"),
        ({"max_new_tokens": True}, r"max_new_tokens( \(in the call or its generation_config\))? must be an integer >= 1"),
        ({"max_new_tokens": 2.0}, r"max_new_tokens( \(in the call or its generation_config\))? must be an integer >= 1"),
        ({"num_beams": 2}, "num_beams > 1"),
        ({"secure_schedule": {"schedule": "step", "L": 1}}, "secure_schedule was given without a verifier"),
        ({"output_hidden_states": True}, "^output_hidden_states=True is not supported with verifier="),
        ({"output_attentions": True}, "^output_attentions=True is not supported with verifier="),
    ],
)
@pytest.mark.parametrize("wrapped", [False, True])
def test_invalid_arguments_are_refused(wrapped, options, message):
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    with pytest.raises(SecureSDConfigError, match=message):
        target.generate(PROMPT, do_sample=False, custom_generate=securesd_generate, draft=draft,
                        **{"max_new_tokens": 4, **options})


def test_verifier_none_names_the_fix_on_a_plain_model():
    draft, target = tiny_pair(SPEC)
    with pytest.raises(SecureSDConfigError, match="verifier=None switches SecureSD off"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=securesd_generate, draft=draft, verifier=None)


def test_verifier_none_on_a_wrapped_model_is_transformers_assisted_decoding(references):
    _, greedy = references
    draft, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    target.generation_config.verifier = MARS(theta=0.5)
    out = target.generate(PROMPT, max_new_tokens=NEW, do_sample=False, custom_generate=securesd_generate, draft=draft,
                          verifier=None, return_dict_in_generate=True)
    assert torch.equal(out.sequences, greedy)
    assert not hasattr(out, "speculative_stats")


@pytest.mark.parametrize("wrapped", [False, True])
def test_output_deviation_is_honoured(wrapped):
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    torch.manual_seed(0)
    out = target.generate(PROMPT, max_new_tokens=8, do_sample=True, custom_generate=securesd_generate, draft=draft,
                          verifier="mars", output_deviation=True, return_dict_in_generate=True)
    assert len(out.speculative_stats.position_tv) > 0


def test_stop_strings_name_the_fix_on_a_plain_model():
    draft, target = tiny_pair(SPEC)
    with pytest.raises(SecureSDConfigError, match=r"stop_strings= needs tokenizer=.*hf_securesd.wrap"):
        target.generate(PROMPT, max_new_tokens=8, custom_generate=securesd_generate, draft=draft, verifier="lossless",
                        stop_strings=["D"], tokenizer=byte_tokenizer())


def test_stop_strings_on_a_wrapped_model():
    draft, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    options = dict(max_new_tokens=12, do_sample=False, stop_strings=["D"], tokenizer=byte_tokenizer())
    expected = target.generate(PROMPT, **options)
    out = target.generate(PROMPT, custom_generate=securesd_generate, draft=draft, verifier="lossless", **options)
    assert torch.equal(out, expected)


def test_wrapped_model_pickles_and_stays_wrapped(references):
    _, greedy = references
    draft, target = tiny_pair(SPEC)
    hf_securesd.wrap(target)
    buffer = io.BytesIO()
    torch.save(target, buffer)
    buffer.seek(0)
    for copied in (pickle.loads(pickle.dumps(target)), torch.load(buffer, weights_only=False), copy.deepcopy(target)):
        assert isinstance(copied, hf_securesd.integration.SecureSDMixin)
        assert type(copied).__name__ == type(target).__name__
        out = copied.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft, verifier="lossless")
        assert torch.equal(out, greedy)


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_schedule_without_a_verifier_in_the_models_config_is_refused_alike(wrapped):
    """transformers merges the target's config into the one a callable receives; every route with a draft
    refuses a schedule that has no verifier anywhere, wherever it sits."""
    draft, target = tiny_pair(SPEC)
    if wrapped:
        hf_securesd.wrap(target)
    target.generation_config.secure_schedule = Step(L=8)
    with pytest.raises(SecureSDConfigError, match="secure_schedule was given without a verifier"):
        target.generate(PROMPT, max_new_tokens=4, do_sample=False, custom_generate=securesd_generate, draft=draft)
    if wrapped:
        with pytest.raises(SecureSDConfigError, match="secure_schedule was given without a verifier"):
            target.generate(PROMPT, max_new_tokens=4, do_sample=False, assistant_model=draft)
        plain = target.generate(PROMPT, max_new_tokens=4, do_sample=False)  # no draft: plain decoding
        assert torch.equal(plain, target.generate(PROMPT, max_new_tokens=4, do_sample=False, verifier=None))


def test_a_text_boundary_on_a_plain_model_names_what_transformers_drops():
    """transformers drops tokenizer= for a callable on a model that is not wrapped: the error must not
    tell the caller to pass the tokenizer they passed."""
    draft, target = tiny_pair(SPEC)
    with pytest.raises(BoundaryResolutionError,
                       match=r"'</think>' is text .* which transformers does not pass to a callable custom_generate"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=securesd_generate, draft=draft, verifier="mars",
                        secure_schedule=hf_securesd.Segments("</think>"), tokenizer=byte_tokenizer())
    resolved = hf_securesd.Segments("</think>").with_tokenizer(byte_tokenizer())
    out = target.generate(PROMPT, max_new_tokens=4, custom_generate=securesd_generate, draft=draft, verifier="mars",
                          secure_schedule=resolved, do_sample=False)
    assert out.shape[1] == PROMPT.shape[1] + 4
