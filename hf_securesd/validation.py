"""Checks that run before any decoding, so bad input fails with a message naming the fix."""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Mapping

import torch
from transformers import MaxLengthCriteria, MaxTimeCriteria, PreTrainedModel
from transformers.generation import logits_process

from .schedules import Schedule, is_integer, python_scalar, resolve_schedule, short_repr
from .verifiers import Verifier, resolve_verifier

DEFAULT_NUM_DRAFT_TOKENS = 5


class SecureSDConfigError(ValueError):
    """A speculative decoding request that cannot run as asked."""


class SecureSDConfigTypeError(SecureSDConfigError, TypeError):
    """A generate argument of the wrong type (e.g. `verifier=3`): a `SecureSDConfigError` that is also the
    `TypeError` the rule's own check raises."""


PROMPT_LOOKUP = "prompt lookup"
# Stopping criteria that stop every row of a batch at the same length.
_SAME_LENGTH_CRITERIA = (MaxLengthCriteria, MaxTimeCriteria)


def resolve_request(
    verifier: Any, secure_schedule: Any, num_assistant_tokens: Any, draft_length_field: str = "num_assistant_tokens"
) -> tuple[Verifier, Schedule | None, int]:
    """Turn user-facing arguments into (verifier, schedule, k), validating each. `draft_length_field` is the
    argument k came from (`prompt_lookup_num_tokens` with prompt lookup), named when the verifier cannot
    work with k."""
    if verifier is None:
        raise SecureSDConfigError(
            "secure_schedule was given without a verifier; pass verifier='mars' (or another name) "
            "together with the schedule, or drop secure_schedule"
        )
    try:
        resolved = resolve_verifier(verifier)
        schedule = resolve_schedule(secure_schedule)
    except TypeError as error:  # the rules' own messages, as the one error type of generate
        raise SecureSDConfigTypeError(str(error)) from error
    except ValueError as error:
        raise SecureSDConfigError(str(error)) from error
    k = DEFAULT_NUM_DRAFT_TOKENS if num_assistant_tokens is None else num_assistant_tokens
    if not is_integer(k) or int(k) < 1:
        raise SecureSDConfigError(f"num_assistant_tokens (the draft length k) must be an integer >= 1, got {k!r}")
    k = int(k)
    try:
        resolved.check_draft_length(k)
    except ValueError as error:
        smallest = resolved.needs().min_draft_tokens
        raise SecureSDConfigError(
            f"{error} (k is {draft_length_field}={k} here: set {draft_length_field}={max(smallest, 2)} or more, "
            "or change the verifier)"
        ) from None
    return resolved, schedule, k


def check_model_inputs(arguments: Mapping[str, Any], cache_implementation: Any) -> None:
    """Refuse generate arguments that the speculative loop would otherwise drop without a word.

    - `position_ids`: the loop places every token from each row's attention mask (left padding
      skipped), as plain decoding does when none are given; positions of the caller's own would change
      the tokens and cannot be extended draft by draft.
    - `cache_implementation="paged"`: transformers then switches to continuous batching, its own
      decoding loop, before assisted decoding (and so the verifier) is ever reached."""
    if arguments.get("position_ids") is not None:
        raise SecureSDConfigError(
            "position_ids= is not supported with verifier=: the speculative loop places each token from the "
            "row's attention mask (left padding skipped), as plain decoding does without position_ids; drop "
            "position_ids (and pass attention_mask= for padding)"
        )
    if cache_implementation == "paged":
        raise SecureSDConfigError(
            "cache_implementation='paged' is not supported with verifier=: transformers then switches to "
            "continuous batching, a decoding loop of its own without assisted decoding, so no draft would be "
            "verified; leave cache_implementation unset (or 'dynamic'), or serve with the vLLM plugin "
            "(docs/vllm.md) for paged attention"
        )


def check_proposer(verifier: Verifier, proposer: str) -> None:
    """Refuse a verifier whose rule reads the draft model's logits when `proposer` has none."""
    try:
        verifier.check_proposer(proposer, has_raw_draft_logits=False)
    except ValueError as error:
        raise SecureSDConfigError(str(error)) from None


def vocab_size(model: PreTrainedModel) -> int:
    """The number of tokens `model` scores (its output layer's rows, else its config's vocabulary size)."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def check_models(target: PreTrainedModel, draft: PreTrainedModel | None) -> None:
    """The draft must exist, be a decoder-only causal LM and share the target's vocabulary."""
    if draft is None:
        raise SecureSDConfigError(
            "verifier= needs a proposer: pass assistant_model=<draft model> to generate "
            "(or draft=<draft model> through custom_generate), or prompt_lookup_num_tokens=N to draft from "
            "the prompt (n-gram lookup)"
        )
    for role, model in (("target", target), ("draft", draft)):
        if not callable(getattr(model, "can_generate", None)) or not callable(getattr(model, "get_output_embeddings", None)):
            raise SecureSDConfigError(
                f"the {role} model must be a transformers causal language model (a PreTrainedModel loaded with "
                f"AutoModelForCausalLM), got {type(model).__name__}; pass the draft model object as assistant_model= "
                "(draft= through custom_generate=securesd_generate)"
            )
        if not model.can_generate():
            raise SecureSDConfigError(
                f"the {role} model is a {type(model).__name__}, which has no language-model head and cannot "
                "generate; load it with AutoModelForCausalLM (a decoder-only causal language model)"
            )
        if model.config.is_encoder_decoder:
            raise SecureSDConfigError(
                f"the {role} model is an encoder-decoder; speculative decoding with a verifier supports "
                "decoder-only causal language models"
            )
    target_vocab, draft_vocab = vocab_size(target), vocab_size(draft)
    if target_vocab != draft_vocab:
        raise SecureSDConfigError(
            f"vocabulary mismatch: the target scores {target_vocab} tokens but the draft scores {draft_vocab}; "
            "verification compares both models' probabilities token by token over one output size, so the draft "
            "must use the target's tokenizer and an output layer of the same size. Models of one family may pad "
            "their output layers to different sizes (Qwen2.5-7B and up score 152,064 tokens, 0.5B to 3B "
            "151,936): pick a draft whose output size is the target's, or run it with prompt lookup "
            "(prompt_lookup_num_tokens=N) instead of a draft model"
        )
    for role, model in (("target", target), ("draft", draft)):
        rows = _embedded_ids(model)
        if rows is not None and rows < target_vocab:
            raise SecureSDConfigError(
                f"the {role} model embeds {rows} token ids but both models score {target_vocab} tokens: a token "
                f"from {rows} on, drafted or accepted, would be fed to the {role}, whose embedding has no row for "
                "it; use models whose input embeddings cover their output vocabulary (resize_token_embeddings)"
            )



def check_lengths(max_new_tokens: Any, max_length: Any, where: str = "") -> None:
    """`max_new_tokens` (>= 1) / `max_length` (>= 0), when given, must be integers (NumPy and 0-d tensor
    integers too). where: said after the field's name (e.g. which config held it)."""
    for name, value, least in (("max_new_tokens", max_new_tokens, 1), ("max_length", max_length, 0)):
        if value is not None and (not is_integer(value) or int(value) < least):
            raise SecureSDConfigError(f"{name}{where} must be an integer >= {least}, got {value!r}")


def checked_flag(name: str, value: Any) -> bool | None:
    """A True/False option as a Python bool: True, False, 1 or 0 (NumPy and 0-d tensor ones too, as
    transformers takes its own flags); None stays None (unset)."""
    value = python_scalar(value)
    if value is None or isinstance(value, bool):
        return value
    if is_integer(value) and int(value) in (0, 1):
        return bool(value)
    raise SecureSDConfigError(f"{name} must be True or False, got {short_repr(value)}")


def check_input_ids_form(input_ids: Any) -> None:
    """The prompt must be a [B, P] tensor of token ids, as a tokenizer returns it with return_tensors='pt'."""
    if not isinstance(input_ids, torch.Tensor):
        raise SecureSDConfigError(
            f"input_ids must be a torch.Tensor of token ids [batch, length], got {type(input_ids).__name__}; pass "
            "the tokenizer's output made with return_tensors='pt' (e.g. tokenizer(text, return_tensors='pt').input_ids)"
        )
    if input_ids.ndim != 2:
        raise SecureSDConfigError(
            f"input_ids must be 2-D [batch, length], got shape {tuple(input_ids.shape)}; a single prompt's ids "
            "[length] go in as ids[None] (one row), as tokenizer(text, return_tensors='pt') gives them"
        )


def check_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, pad_token_id: Any = None
) -> None:
    """The prompt [B, P] must hold integer token ids, at least one row and one token per row, and the attention
    mask, if any, its shape, only 0s and 1s, and no row padded on the right (a row's next token would follow
    its padding). pad_token_id: the call's, when the mask may be the one transformers builds from it (a
    call without attention_mask): a right-padded row that ends in it is then named as such."""
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise SecureSDConfigError(
            f"input_ids must hold integer token ids, got dtype {input_ids.dtype}; pass the tokenizer's input_ids "
            "(torch.long)"
        )
    check_input_ids_form(input_ids)
    if input_ids.shape[1] == 0:
        raise SecureSDConfigError(
            f"the prompt is empty (input_ids of shape {tuple(input_ids.shape)}); speculative decoding needs at least "
            "one prompt token per row (e.g. the tokenizer's BOS token)"
        )
    if input_ids.shape[0] == 0:
        raise SecureSDConfigError(
            f"input_ids holds no rows (shape {tuple(input_ids.shape)}); pass at least one prompt"
        )
    if attention_mask is None:
        return
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise SecureSDConfigError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has shape {tuple(input_ids.shape)}; "
            "pass the mask the tokenizer returned with the same input_ids"
        )
    binary = (attention_mask == 0) | (attention_mask == 1)
    if not bool(binary.all()):
        value = attention_mask[~binary][0].item()
        raise SecureSDConfigError(
            f"attention_mask holds {value!r}, but a mask marks each token 1 (attended) or 0 (padding); other values "
            "are not a padding mask (transformers would count them into position ids): pass the mask the "
            "tokenizer returned"
        )
    attended = attention_mask != 0  # [B, P]
    right_padded = (~attended[:, -1] & attended.any(dim=-1)).nonzero()[:, 0].tolist()
    if right_padded:
        inferred = ""
        pad = python_scalar(pad_token_id)
        if is_integer(pad) and all(int(input_ids[row, -1]) == int(pad) for row in right_padded):
            inferred = (
                f" (without an attention_mask in the call, transformers builds one from pad_token_id={int(pad)}, "
                "and these rows end in that id: if it is a real token there, pass "
                "attention_mask=torch.ones_like(input_ids), or set a pad_token_id the prompt does not use)"
            )
        raise SecureSDConfigError(
            f"batch row(s) {right_padded} are padded on the right (their attention_mask ends in 0){inferred}, so "
            "each new token would follow the padding; decoder-only generation needs left padding: load the "
            "tokenizer with padding_side='left'"
        )


def check_prompt_ids(input_ids: torch.Tensor, models: Mapping[str, PreTrainedModel | None]) -> None:
    """Every prompt id [B, P] must be a row of each model's input embedding (`models`: role -> model, None
    skipped); an id outside would fail deep inside the embedding lookup."""
    if input_ids.numel() == 0:
        return
    low, high = (int(value) for value in torch.aminmax(input_ids))
    for role, model in models.items():
        rows = _embedded_ids(model) if model is not None else None
        if rows is not None and (low < 0 or high >= rows):
            bad = low if low < 0 else high
            raise SecureSDConfigError(
                f"input_ids holds token id {bad}, but the {role} model embeds ids 0..{rows - 1}; pass ids from "
                "the tokenizer of this model pair"
            )


def _embedded_ids(model: PreTrainedModel) -> int | None:
    """How many token ids `model`'s input embedding holds, or None when it does not say."""
    try:
        embeddings = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        return None
    rows = getattr(embeddings, "num_embeddings", None)
    return rows if isinstance(rows, int) else None


# Generation fields that select another decoding method or another acceptance rule, with the reason a
# verifier cannot run with them (transformers would otherwise pick that method or ignore the field).
OTHER_METHODS = {
    "dola_layers": "DoLa decoding contrasts the target's layers token by token, a decoding method of its own",
    "penalty_alpha": "penalty_alpha > 0 selects contrastive search, a decoding method of its own",
    "constraints": "constraints select constrained beam search",
    "force_words_ids": "force_words_ids selects constrained beam search",
    "assistant_ensemble_weight": "it is transformers' own relaxed acceptance (a target/draft mixture), and with "
    "verifier= the verifier and its schedule decide acceptance",
    "use_mtp": "multi-token prediction drafts with the target's own MTP layers, not with a draft model",
    "speculation_type": "it selects another kind of drafting than a draft model or prompt lookup",
}


def _is_set(value: Any) -> bool:
    """A field value that changes what transformers does (None, False, 0 and empty lists do not)."""
    if value is None or value is False:
        return False
    if isinstance(value, (list, tuple, dict)):
        return len(value) > 0
    if isinstance(value, (int, float)):
        return value != 0
    return True


def _is_positive(value: Any) -> bool:
    """penalty_alpha's test in transformers (contrastive search needs it > 0); a value that is not a number
    counts as set, so it is refused rather than passed to transformers' comparison."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value is not None
    return value > 0


# How transformers decides that a field of OTHER_METHODS is set where `_is_set` would not say the same:
# it tests these against None, so an empty list already selects the method.
_SET_WHEN = {
    "dola_layers": lambda value: value is not None,
    "constraints": lambda value: value is not None,
    "force_words_ids": lambda value: value is not None,
    "penalty_alpha": _is_positive,
    "speculation_type": lambda value: value is not None and value != "",
}


def check_padding(batch: int, pad_token_id: int | None, stopping_criteria: Iterable[object]) -> None:
    """A batch whose rows can stop at different lengths (stop strings, custom stopping criteria) needs a pad
    token to fill the rows that stopped first."""
    if batch == 1 or pad_token_id is not None:
        return
    per_row = sorted({
        type(criterion).__name__ for criterion in stopping_criteria if type(criterion) not in _SAME_LENGTH_CRITERIA
    })
    if per_row:
        raise SecureSDConfigError(
            f"rows of this batch can stop at different lengths ({', '.join(per_row)}) but there is no pad_token_id "
            "to fill the rows that stopped first (and no eos_token_id to take it from); pass pad_token_id= to "
            "generate (e.g. tokenizer.pad_token_id)"
        )


# Processors whose output depends on how often they were called before, not only on (input_ids, scores),
# with why and what to use instead.
_STATEFUL_PROCESSORS = {
    "SynthIDTextWatermarkLogitsProcessor": (
        "(watermarking_config=SynthIDTextWatermarkingConfig(...)) keeps a state that advances at every call (the "
        "context it hashes)",
        "use WatermarkingConfig (its watermark reads only the token ids), or generate without verifier=",
    ),
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": (
        "(classifier-free guidance) runs its own unconditional forward of the model at every call, with its own "
        "cache, which advances one token a call",
        "drop it (classifier-free guidance cannot follow speculative rounds), or generate without verifier=",
    ),
    "ClassifierFreeGuidanceLogitsProcessor": (
        "(classifier-free guidance) reads scores of a batch doubled by an unconditional copy of each row, which "
        "speculative rounds do not build",
        "drop it (classifier-free guidance cannot follow speculative rounds), or generate without verifier=",
    ),
}


def check_processors(processors: Iterable[object]) -> None:
    """Refuse transformers' processors that keep a state advanced at every call (or read a batch this loop
    does not build). A speculative round calls each processor at draft positions it may then reject, and
    at the target's positions in other numbers and orders than plain decoding, so such a state would not
    follow the committed tokens (processors that read only their inputs, every other one transformers
    builds, give plain decoding's scores). Subclasses are refused too: they keep their parent's state."""
    for processor in processors:
        for name, (reason, fix) in _STATEFUL_PROCESSORS.items():
            refused = getattr(logits_process, name, None)
            if refused is not None and isinstance(processor, refused):
                raise SecureSDConfigError(
                    f"{type(processor).__name__} {reason}; speculative rounds call processors at drafted positions "
                    f"that may be rejected, so its output, and the tokens, would differ from plain generate's: it is "
                    f"not supported with verifier=; {fix}"
                )


def check_options(options: dict[str, Any], input_ids: torch.Tensor | None) -> None:
    """Reject generation options that a verifier cannot honour. `options` holds the effective values."""
    for name, reason in OTHER_METHODS.items():
        value = options.get(name)
        if _SET_WHEN.get(name, _is_set)(value):
            raise SecureSDConfigError(
                f"{name}={value!r} cannot be combined with verifier=: {reason}; drop {name} (or verifier=)"
            )
    if options.get("assistant_tokenizer") is not None:
        raise SecureSDConfigError(
            "assistant_tokenizer= selects universal assisted decoding (a draft with a different tokenizer): its "
            "drafts are re-tokenized text with no draft distribution in the target's vocabulary, so a verifier "
            "cannot run on them; use a draft that shares the target's tokenizer and drop assistant_tokenizer "
            "(tokenizer= alone, e.g. for stop_strings, is fine)"
        )
    guidance_scale = options.get("guidance_scale")
    if guidance_scale is not None and guidance_scale != 1:
        raise SecureSDConfigError(
            f"guidance_scale={guidance_scale!r} turns on classifier-free guidance (transformers applies it for any "
            "value other than 1, below 1 too), which runs its own unconditional forward of the target one token at a "
            "time, with its own cache, which does not follow speculative rounds; it cannot be combined with "
            "verifier=. Use guidance_scale=None (or 1), or drop verifier"
        )
    if options.get("synced_gpus"):
        raise SecureSDConfigError(
            "synced_gpus=True (DeepSpeed ZeRO-3 / FSDP across processes) is not supported with verifier=: the "
            "speculative loop runs in one process; load the models on one process (device_map='auto' spreads "
            "one model over several GPUs)"
        )
    if _count_option(options, "num_beams") > 1:
        raise SecureSDConfigError("num_beams > 1 (beam search) cannot be combined with verifier=; use num_beams=1")
    if _count_option(options, "num_return_sequences") > 1:
        raise SecureSDConfigError(
            "num_return_sequences > 1 cannot be combined with verifier=; repeat the prompt in the batch instead"
        )
    for option in ("output_attentions", "output_hidden_states"):
        if options.get(option):
            raise SecureSDConfigError(
                f"{option}=True is not supported with verifier=; the output carries scores/logits and "
                "speculative_stats instead"
            )
    batch = input_ids.shape[0] if input_ids is not None and input_ids.ndim == 2 else 1
    if batch > 1:
        # Scores and logits are returned only with return_dict_in_generate (without it they have no effect).
        returned = ("output_scores", "output_logits") if options.get("return_dict_in_generate") else ()
        for option in ("streamer", *returned):
            if options.get(option):
                raise SecureSDConfigError(
                    f"{option} supports a single sequence with verifier= (rows of a batch advance by different "
                    f"numbers of tokens per round); generate one prompt at a time to use {option}"
                )


def _count_option(options: Mapping[str, Any], name: str) -> int:
    """options[name] (`num_beams`, `num_return_sequences`) as a whole number >= 1, 1 when not given. Another
    type or a count below 1 is refused: transformers would take num_beams=0 as beam search (and divide by it)
    and leave SecureSD out, and a text "2" would fail inside a comparison."""
    value = options.get(name)
    if value is None:
        return 1
    if not is_integer(value):
        raise SecureSDConfigTypeError(f"{name}={short_repr(value)} must be a whole number (1 with verifier=), "
                                      f"not {type(value).__name__}; pass {name}=1 or leave it out")
    count = int(python_scalar(value))
    if count < 1:
        raise SecureSDConfigError(f"{name}={count} is not a count (at least 1); with verifier= pass {name}=1 or leave it out")
    return count
