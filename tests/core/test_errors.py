"""Acceptance 6: bad input fails with a clear error, raised before any model forward runs."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch
from transformers import GenerationConfig, LogitsProcessorList

import hf_securesd
from hf_securesd import FLy, FSD, MARS, BiLD, Linear, LossySD, NonFiniteLogitsError, Power, SecureSDConfigError, SpecCascade, Step
from hf_securesd.draft_length import PASSED_CONFIG
from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair
from hf_securesd.verifiers import VERIFIERS, Lossless
from hf_securesd.verifiers.base import RoundInputs

PROMPT = torch.tensor([[3, 1, 4, 1, 5]])


@pytest.fixture
def forward_calls(llama_pair):
    """Counts forwards of both models, to prove errors come before any decoding."""
    draft, target = llama_pair
    calls = {"n": 0}

    def count(*_):
        calls["n"] += 1

    handles = [model.register_forward_hook(count) for model in (draft, target)]
    yield calls
    for handle in handles:
        handle.remove()


def expect_error(target, forward_calls, match: str, error=SecureSDConfigError, **kwargs):
    with pytest.raises(error, match=match):
        target.generate(PROMPT, max_new_tokens=8, **kwargs)
    assert forward_calls["n"] == 0, "the error came after decoding had started"


def test_unknown_verifier_lists_valid_names(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, f"unknown verifier 'marz'; valid names: {', '.join(VERIFIERS)}",
                 error=ValueError, assistant_model=draft, verifier="marz")


def test_verifier_of_wrong_type(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "verifier must be a name", error=TypeError, assistant_model=draft, verifier=3)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: LossySD(epsilon=-0.1), "epsilon must be in \\[0, 1\\]"),
        (lambda: LossySD(epsilon=float("nan")), "epsilon must be in \\[0, 1\\]"),
        (lambda: MARS(theta=0.0), "theta must be in \\(0, 1\\]"),
        (lambda: MARS(theta=1.5), "theta must be in \\(0, 1\\]"),
        (lambda: BiLD(tau_rb=-1.0), "tau_rb must be >= 0"),
        (lambda: BiLD(tau_fb=1.5), "tau_fb must be a probability"),
        (lambda: SpecCascade(a=1.2), "a must be in \\[0, 1\\]"),
        (lambda: SpecCascade(rule="cascade"), "rule must be one of"),
        (lambda: FSD(tau=-0.1), "tau must be >= 0"),
        (lambda: FSD(divergence="hellinger"), "divergence must be one of"),
        (lambda: FLy(window=0), "window W must be an integer >= 1"),
        (lambda: FLy(tau=-1.0), "tau must be >= 0"),
        (lambda: Step(L=-1), "L must be an integer >= 0"),
        (lambda: Linear(L=2.5), "L must be an integer >= 0"),
        (lambda: Power(L=3, gamma=0.0), "gamma > 0"),
        (lambda: Power(L=3, gamma=math.inf), "gamma > 0"),
    ],
)
def test_hyperparameter_out_of_range(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_fly_window_must_be_below_draft_length(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "FLy window W=5 needs W <= k-1", error=ValueError,
                 assistant_model=draft, verifier=FLy(window=5), num_assistant_tokens=5)


def test_bad_draft_length(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "num_assistant_tokens .* must be an integer >= 1",
                 assistant_model=draft, verifier="mars", num_assistant_tokens=0)


def test_bad_schedule_type(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "secure_schedule must be Step", error=TypeError,
                 assistant_model=draft, verifier="mars", secure_schedule="step")


def test_schedule_without_verifier(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "secure_schedule was given without a verifier",
                 assistant_model=draft, secure_schedule=Step(L=1))


def test_verifier_without_draft(llama_pair, forward_calls):
    _, target = llama_pair
    expect_error(target, forward_calls,
                 "verifier= needs a proposer: pass assistant_model=.*or prompt_lookup_num_tokens=N",
                 verifier="mars")


@pytest.mark.parametrize("field", [dict(max_matching_ngram_size=3), dict(num_assistant_tokens=4),
                                   dict(prompt_lookup_num_tokens=None, max_matching_ngram_size=2)])
def test_a_draft_length_field_without_any_proposer_is_told_the_proposer_is_missing(llama_pair, forward_calls, field):
    """max_matching_ngram_size without prompt_lookup_num_tokens was blamed on a draft model never passed."""
    _, target = llama_pair
    expect_error(target, forward_calls, "verifier= needs a proposer: pass assistant_model=", verifier="mars", **field)


def test_vocabulary_mismatch(llama_pair, forward_calls):
    _, target = llama_pair
    other_draft, _ = tiny_pair(TinyPairSpec(vocab_size=300))
    expect_error(target, forward_calls, "vocabulary mismatch: the target scores 259 tokens but the draft scores 300",
                 assistant_model=other_draft, verifier="lossless")
    # one family padded to two output sizes (Qwen2.5-7B and 0.5B): the fix is another draft, not a family
    expect_error(target, forward_calls, r"an output layer of the same size\. Models of one family may pad .*pick a "
                 r"draft whose output size is the target's, or run it with prompt lookup",
                 assistant_model=other_draft, verifier="lossless")


def test_a_draft_that_cannot_embed_every_scored_token_is_refused(llama_pair, forward_calls):
    """Its output layer matches the target's (259 rows) but its embedding has 200 rows: a drafted or
    accepted token from 200 on crashed it mid-decoding (torch's IndexError)."""
    draft, target = llama_pair
    short = copy.deepcopy(draft)
    short.set_input_embeddings(torch.nn.Embedding(200, short.config.hidden_size))
    expect_error(target, forward_calls, "the draft model embeds 200 token ids but both models score 259 tokens",
                 assistant_model=short, verifier="lossless")


def test_prompt_lookup_with_a_draft_model_is_rejected(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, r"prompt_lookup_num_tokens=3 \(in the call\) .* was given too; transformers "
                 "would silently use prompt lookup", assistant_model=draft, verifier="mars", prompt_lookup_num_tokens=3)


def test_prompt_lookup_saved_in_the_models_config_with_a_draft_model_names_where_and_the_fix(
    llama_pair, forward_calls, monkeypatch
):
    """The saved field is named as the source, with the call's way out; that way out then drafts with the model."""
    draft, target = llama_pair
    monkeypatch.setattr(target.generation_config, "prompt_lookup_num_tokens", 3)
    expect_error(target, forward_calls, r"prompt_lookup_num_tokens=3 \(saved in the model's own generation_config\) .* "
                 r"pass prompt_lookup_num_tokens=None in the call", assistant_model=draft, verifier="mars")
    out = target.generate(PROMPT, max_new_tokens=4, assistant_model=draft, verifier="lossless", do_sample=False,
                          prompt_lookup_num_tokens=None)
    assert out.shape[1] == PROMPT.shape[1] + 4


@pytest.mark.parametrize("verifier", [FSD(tau=0.3), BiLD(tau_rb=2.0, tau_fb=0.5), SpecCascade(a=0.3, rule="chow")])
def test_prompt_lookup_refuses_rules_that_read_the_draft_logits(llama_pair, forward_calls, verifier):
    _, target = llama_pair
    expect_error(target, forward_calls, "prompt lookup has no draft distribution", verifier=verifier,
                 prompt_lookup_num_tokens=3)


def test_different_tokenizer_assistant_is_rejected(llama_pair, forward_calls):
    draft, target = llama_pair
    tokenizer = byte_tokenizer()
    expect_error(target, forward_calls, "different tokenizer", assistant_model=draft, verifier="mars",
                 tokenizer=tokenizer, assistant_tokenizer=tokenizer)


@pytest.mark.parametrize("option, value, message", [
    ("num_beams", 2, "num_beams > 1"),
    ("num_return_sequences", 2, "num_return_sequences > 1"),
    ("output_attentions", True, "output_attentions=True is not supported"),
    # transformers takes num_beams=0 as beam search (it divides by it) and would leave SecureSD out
    ("num_beams", 0, r"num_beams=0 is not a count \(at least 1\); with verifier= pass num_beams=1"),
    ("num_beams", -1, r"num_beams=-1 is not a count"),
    ("num_return_sequences", 0, r"num_return_sequences=0 is not a count"),
    ("num_beams", "2", r"num_beams='2' must be a whole number \(1 with verifier=\), not str"),
    ("num_return_sequences", 2.0, r"num_return_sequences=2.0 must be a whole number"),
    ("generation_config", {"max_new_tokens": 5}, r"generation_config= takes a transformers GenerationConfig, not dict"),
])
def test_unsupported_generation_options(llama_pair, forward_calls, option, value, message):
    draft, target = llama_pair
    expect_error(target, forward_calls, message, assistant_model=draft, verifier="mars", **{option: value})


@pytest.mark.parametrize("option", ["output_scores", "output_logits"])
def test_per_token_outputs_need_a_single_row(llama_pair, forward_calls, option):
    draft, target = llama_pair
    with pytest.raises(SecureSDConfigError, match=f"{option} supports a single sequence"):
        target.generate(torch.tensor([[1, 2, 3], [4, 5, 6]]), max_new_tokens=4, assistant_model=draft, verifier="mars",
                        return_dict_in_generate=True, **{option: True})
    assert forward_calls["n"] == 0


@pytest.mark.parametrize("who", ["draft", "target"])
def test_nan_logits_raise_at_run_time(llama_pair, who):
    draft, target = llama_pair
    broken = copy.deepcopy(draft if who == "draft" else target)
    with torch.no_grad():
        broken.get_output_embeddings().weight[7, 0] = float("nan")
    models = {"assistant_model": broken, "target": target} if who == "draft" else {"assistant_model": draft, "target": broken}
    runner = models.pop("target")
    with pytest.raises(NonFiniteLogitsError, match=f"the {who} model produced NaN or infinite logits.*"
                       "pass remove_invalid_values=True to generate"):
        runner.generate(PROMPT, max_new_tokens=8, verifier="lossless", do_sample=False, **models)
    # the fix the message names: NaN scores cleaned as plain transformers decoding cleans them
    cleaned = runner.generate(PROMPT, max_new_tokens=8, verifier="lossless", do_sample=False,
                              remove_invalid_values=True, **models)
    plain_target = target if who == "draft" else broken
    plain = plain_target.generate(PROMPT, max_new_tokens=8, do_sample=False, remove_invalid_values=True)
    assert torch.equal(cleaned, plain)


def test_zero_draft_probability_and_empty_residual_never_give_nan():
    """p(x) = 0 for most tokens (top-k) and q == p at one position (empty residual -> q)."""
    target = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]])
    draft = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [float("-inf"), 5.0, float("-inf"), float("-inf")]]])
    inputs = RoundInputs(torch.tensor([[0, 1]]), target, draft, target, draft.nan_to_num(neginf=-30.0), greedy=False)
    everything = torch.arange(4).expand(1, 2, 4)
    for verifier in (cls() for name, cls in VERIFIERS.items() if name not in ("fly", "vllm_fly")):  # no lookahead
        alpha = verifier.acceptance(inputs, everything)
        recovery = verifier.recovery(inputs)
        assert torch.isfinite(alpha).all() and torch.isfinite(recovery).all(), verifier
        assert torch.allclose(recovery.sum(-1), torch.ones(1, 2)), verifier
    lossless_recovery = Lossless().recovery(inputs)
    assert torch.allclose(lossless_recovery[0, 0], target[0, 0].softmax(-1))  # q == p: fall back to q
    assert lossless_recovery[0, 1, 1] == 0  # residual excludes the token p put all its mass on


def test_right_padded_rows_are_refused(llama_pair, forward_calls):
    """A row whose mask ends in 0 would get its next token after its padding: refused, naming the fix."""
    draft, target = llama_pair
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    for proposer in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
        with pytest.raises(SecureSDConfigError, match=r"batch row\(s\) \[1\] are padded on the right.*padding_side='left'"):
            target.generate(ids, attention_mask=mask, max_new_tokens=4, verifier="lossless", **proposer)
    assert forward_calls["n"] == 0


def test_a_prompt_ending_in_the_pad_id_without_a_mask_names_the_inferred_mask(llama_pair, forward_calls):
    """Without attention_mask transformers builds one from pad_token_id, so a prompt whose last token is
    that id looks right-padded: the refusal says so and how to pass the prompt as it is."""
    draft, target = llama_pair
    ids = torch.tensor([[5, 6, 7, 0]])
    with pytest.raises(SecureSDConfigError, match=r"builds one from pad_token_id=0.*attention_mask=torch.ones_like"):
        target.generate(ids, pad_token_id=0, max_new_tokens=4, assistant_model=draft, verifier="lossless")
    assert forward_calls["n"] == 0
    out = target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, max_new_tokens=4,
                          assistant_model=draft, verifier="lossless")
    assert out.shape == (1, 8)


@pytest.mark.parametrize("mask, value", [([[2] * 5], "2"), ([[0, 1, 1, -1, 1]], "-1"), ([[1.0, 0.5, 1.0, 1.0, 1.0]], "0.5")])
def test_an_attention_mask_of_other_values_than_0_and_1_is_refused(llama_pair, forward_calls, mask, value):
    """Such a mask was neither honoured nor refused (plain decoding counts its values into position ids)."""
    draft, target = llama_pair
    for proposer in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
        with pytest.raises(SecureSDConfigError, match=rf"attention_mask holds {value}, but a mask marks each token 1"):
            target.generate(PROMPT, attention_mask=torch.tensor(mask), max_new_tokens=4, verifier="lossless", **proposer)
    assert forward_calls["n"] == 0
    for binary in (torch.ones(1, 5, dtype=torch.bool), torch.ones(1, 5)):  # bool and float masks of 0/1 are masks
        target.generate(PROMPT, attention_mask=binary, max_new_tokens=2, verifier="lossless", assistant_model=draft)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_non_integer_input_ids_are_refused(llama_pair, forward_calls, dtype):
    draft, target = llama_pair
    for proposer in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
        with pytest.raises(SecureSDConfigError, match=f"input_ids must hold integer token ids, got dtype {dtype}"):
            target.generate(PROMPT.to(dtype), max_new_tokens=4, verifier="lossless", **proposer)
    assert forward_calls["n"] == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16])
def test_narrower_integer_ids_decode_as_int64_ids(llama_pair, dtype):
    """Both proposers feed both models int64 ids, whatever integer dtype the prompt came in."""
    draft, target = llama_pair
    for proposer in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
        expected = target.generate(PROMPT, max_new_tokens=8, verifier="lossless", **proposer)
        got = target.generate(PROMPT.to(dtype), max_new_tokens=8, verifier="lossless", **proposer)
        assert got.dtype == torch.long and torch.equal(got, expected)


def test_schedule_in_a_passed_config_without_a_verifier(llama_pair, forward_calls):
    """The same refusal as the keyword's: a passed config's schedule is not silently dropped."""
    draft, target = llama_pair
    config = GenerationConfig(max_new_tokens=8, secure_schedule={"schedule": "step", "L": 1})
    expect_error(target, forward_calls, "secure_schedule was given without a verifier", assistant_model=draft,
                 generation_config=config)


@pytest.mark.parametrize("not_a_model", ["draft-model-name", byte_tokenizer()])
def test_an_assistant_that_is_not_a_model_is_refused(llama_pair, forward_calls, not_a_model):
    _, target = llama_pair
    expect_error(target, forward_calls, "the draft model must be a transformers causal language model",
                 assistant_model=not_a_model, verifier="lossless")


def test_a_verifier_dict_without_its_name(llama_pair, forward_calls):
    draft, target = llama_pair
    expect_error(target, forward_calls, "names its rule under the key 'verifier'", error=ValueError,
                 assistant_model=draft, verifier={"theta": 0.5})


@pytest.mark.parametrize("option, value", [
    ("dola_layers", "high"),
    ("penalty_alpha", 0.6),
    ("force_words_ids", [[5, 6]]),
    ("assistant_ensemble_weight", 0.5),
    ("use_mtp", True),
    ("speculation_type", "dflash"),
    ("dola_layers", []),
    ("force_words_ids", []),
    ("constraints", []),
    ("penalty_alpha", "0.6"),
])
def test_fields_that_select_another_method_are_refused(llama_pair, forward_calls, option, value):
    """transformers would run another decoding method (or its own relaxed acceptance) and drop the verifier."""
    draft, target = llama_pair
    expect_error(target, forward_calls, re.escape(f"{option}={value!r} cannot be combined with verifier="),
                 assistant_model=draft, verifier="mars", **{option: value})


@pytest.mark.parametrize("option, value", [
    ("penalty_alpha", -0.5), ("penalty_alpha", 0.0), ("penalty_alpha", np.float32(0)), ("speculation_type", ""),
])
def test_field_values_transformers_ignores_are_not_refused(llama_pair, option, value):
    """penalty_alpha <= 0 never selects contrastive search and an empty speculation_type selects nothing:
    transformers decodes as without them, and so does the verifier."""
    draft, target = llama_pair
    expected = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    got = target.generate(PROMPT, max_new_tokens=8, do_sample=False, assistant_model=draft, verifier="lossless",
                          **{option: value})
    assert torch.equal(got, expected)


def test_a_batch_that_can_stop_unevenly_needs_a_pad_token(forward_calls, llama_pair):
    """Stop strings end rows at different lengths; with neither pad nor EOS token nothing could fill them."""
    draft, target = llama_pair
    ids = torch.tensor([[104, 101, 108, 108, 111], [5, 5, 97, 98, 99]])
    for proposer in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
        with pytest.raises(SecureSDConfigError, match=r"StopStringCriteria.*no pad_token_id.*pass pad_token_id="):
            target.generate(ids, max_new_tokens=8, verifier="lossless", pad_token_id=None, eos_token_id=None,
                            stop_strings=["h"], tokenizer=byte_tokenizer(), **proposer)
    assert forward_calls["n"] == 0


@pytest.mark.parametrize("option", ["output_scores", "output_logits"])
def test_per_token_outputs_without_a_dict_have_no_effect_on_a_batch(llama_pair, option):
    """Without return_dict_in_generate nothing carries scores, as in transformers: the batch just decodes."""
    draft, target = llama_pair
    batch = torch.tensor([[1, 2, 3], [4, 5, 6]])
    expected = target.generate(batch, max_new_tokens=4, assistant_model=draft, verifier="mars")
    assert torch.equal(
        target.generate(batch, max_new_tokens=4, assistant_model=draft, verifier="mars", **{option: True}), expected
    )


@pytest.mark.parametrize("proposer", ["draft", "prompt_lookup"])
@pytest.mark.parametrize("option, match", [
    (dict(position_ids=torch.arange(5)[None] * 3), r"position_ids= is not supported with verifier="),
    (dict(cache_implementation="paged"), r"cache_implementation='paged' is not supported with verifier=: transformers then switches to continuous batching"),
], ids=["position_ids", "paged"])
def test_inputs_the_loop_would_drop_are_refused(llama_pair, forward_calls, proposer, option, match):
    """Plain generate honours custom position_ids, and a paged cache switches transformers to continuous
    batching before assisted decoding: both used to run without the option (or the verifier) in effect."""
    draft, target = llama_pair
    drafting = dict(assistant_model=draft) if proposer == "draft" else dict(prompt_lookup_num_tokens=3)
    expect_error(target, forward_calls, match, verifier="mars", secure_schedule=Step(L=2), **drafting, **option)


@pytest.mark.parametrize("arguments", [
    dict(verifier="foo"), dict(verifier={"theta": 0.5}), dict(verifier={"verifier": "mars", "theta": 5}),
    dict(verifier="mars", secure_schedule="step"), dict(verifier="mars", secure_schedule={"schedule": "step", "L": -1}),
], ids=["unknown name", "dict without its rule", "theta out of range", "schedule of a wrong type", "negative L"])
def test_bad_verifiers_and_schedules_raise_the_one_error_type_of_generate(llama_pair, forward_calls, arguments):
    draft, target = llama_pair
    expect_error(target, forward_calls, ".", assistant_model=draft, **arguments)


@pytest.mark.parametrize(
    "input_ids, message",
    [
        ([[3, 1, 4]], "input_ids must be a torch.Tensor of token ids \\[batch, length\\], got list"),
        (torch.tensor([3, 1, 4]).numpy(), "input_ids must be a torch.Tensor of token ids \\[batch, length\\], got ndarray"),
        (torch.tensor([3, 1, 4]), "input_ids must be 2-D \\[batch, length\\], got shape \\(3,\\); .* ids\\[None\\]"),
        (torch.tensor([[[3, 1, 4]]]), "input_ids must be 2-D \\[batch, length\\], got shape \\(1, 1, 3\\)"),
    ],
)
@pytest.mark.parametrize("with_mask", [False, True])
def test_input_ids_that_are_not_a_2d_tensor_are_named_as_such(llama_pair, forward_calls, input_ids, message, with_mask):
    """Not "the prompt is empty", not a mask blamed for matching the ids, not transformers' IndexError."""
    draft, target = llama_pair
    mask = {"attention_mask": torch.ones(torch.as_tensor(input_ids).shape, dtype=torch.long)} if with_mask else {}
    with pytest.raises(SecureSDConfigError, match=message):
        target.generate(input_ids=input_ids, max_new_tokens=4, assistant_model=draft, verifier="lossless", **mask)
    assert forward_calls["n"] == 0


@pytest.mark.parametrize("proposer", ["draft_model", "prompt_lookup"])
def test_synthid_watermarking_is_refused_before_decoding(llama_pair, forward_calls, proposer):
    """Its processor's state advances at every call, so drafted positions would move the watermark: with a
    verifier the output would be neither plain generate's tokens nor its watermark."""
    from transformers import SynthIDTextWatermarkingConfig

    draft, target = llama_pair
    watermark = SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123, 340], ngram_len=3)
    drafting = {"assistant_model": draft} if proposer == "draft_model" else {"prompt_lookup_num_tokens": 3}
    expect_error(target, forward_calls, "SynthIDTextWatermarkLogitsProcessor .* keeps a state that advances at every "
                 "call .* not supported with verifier=; use WatermarkingConfig", verifier="lossless",
                 watermarking_config=watermark, **drafting)


@pytest.mark.parametrize("scale", [0.5, 0, -1.0, 1.5])
def test_classifier_free_guidance_is_refused_at_any_scale_but_one(llama_pair, forward_calls, scale):
    """transformers applies classifier-free guidance for every guidance_scale other than 1 (below 1 as well):
    with its own one-token-a-call cache it would give other tokens than plain generate's."""
    draft, target = llama_pair
    expect_error(target, forward_calls, re.escape(f"guidance_scale={scale!r} turns on classifier-free guidance"),
                 assistant_model=draft, verifier="lossless", guidance_scale=scale)


def test_guidance_scale_one_is_plain_decoding(llama_pair):
    draft, target = llama_pair
    expected = target.generate(PROMPT, max_new_tokens=8, do_sample=False)
    got = target.generate(PROMPT, max_new_tokens=8, do_sample=False, guidance_scale=1.0, assistant_model=draft,
                          verifier="lossless")
    assert torch.equal(got, expected)


@pytest.mark.parametrize("proposer", ["draft_model", "prompt_lookup"])
def test_a_classifier_free_guidance_processor_is_refused(llama_pair, forward_calls, proposer):
    """transformers' unbatched guidance processor runs its own forward, one token a call, with its own cache."""
    from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor

    draft, target = llama_pair
    guidance = UnbatchedClassifierFreeGuidanceLogitsProcessor(1.5, target, unconditional_ids=PROMPT[:, :2])
    drafting = {"assistant_model": draft} if proposer == "draft_model" else {"prompt_lookup_num_tokens": 3}
    expect_error(target, forward_calls, "UnbatchedClassifierFreeGuidanceLogitsProcessor .classifier-free guidance. "
                 "runs its own unconditional forward .* not supported with verifier=", verifier="lossless",
                 logits_processor=LogitsProcessorList([guidance]), **drafting)


def test_the_batched_classifier_free_guidance_processor_is_refused(llama_pair, forward_calls):
    """It reads a batch doubled by unconditional rows, which speculative rounds do not build."""
    from transformers.generation.logits_process import ClassifierFreeGuidanceLogitsProcessor

    draft, target = llama_pair
    expect_error(target, forward_calls, "ClassifierFreeGuidanceLogitsProcessor .classifier-free guidance. reads scores "
                 "of a batch doubled .* not supported with verifier=", verifier="lossless", assistant_model=draft,
                 logits_processor=LogitsProcessorList([ClassifierFreeGuidanceLogitsProcessor(1.5)]))


def test_the_hash_watermark_stays_exact(llama_pair):
    """WatermarkingConfig's processor reads only the ids: greedy lossless equals plain generate with it."""
    from transformers import WatermarkingConfig

    draft, target = llama_pair
    watermark = WatermarkingConfig(bias=4.0, seeding_scheme="selfhash")
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False, watermarking_config=watermark)
    ours = target.generate(PROMPT, max_new_tokens=16, do_sample=False, watermarking_config=watermark,
                           assistant_model=draft, verifier="lossless")
    assert torch.equal(ours, plain)


def test_verifier_names_ignore_case_and_surrounding_spaces(llama_pair):
    draft, target = llama_pair
    plain = target.generate(PROMPT, max_new_tokens=6, do_sample=False)
    assert torch.equal(target.generate(PROMPT, max_new_tokens=6, assistant_model=draft, verifier=" Lossless\n"), plain)


def test_a_bad_draft_length_in_a_generation_config_names_where_it_was_set(llama_pair, forward_calls):
    draft, target = llama_pair
    config = GenerationConfig(num_assistant_tokens=float("nan"), max_new_tokens=4)
    expect_error(target, forward_calls, re.escape(f"num_assistant_tokens{PASSED_CONFIG} "
                 "(the draft length k) must be an integer >= 1, got nan"), assistant_model=draft, verifier="lossless",
                 generation_config=config)


def test_a_draft_that_is_not_a_model_names_both_routes_arguments(llama_pair, forward_calls):
    _, target = llama_pair
    expect_error(target, forward_calls, re.escape("pass the draft model object as assistant_model= (draft= through "
                 "custom_generate=securesd_generate)"), assistant_model="Qwen/Qwen2.5-0.5B", verifier="lossless")
