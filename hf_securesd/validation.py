"""Checks that run before any decoding, so bad input fails with a message naming the fix."""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from .schedules import Schedule, is_integer, resolve_schedule
from .verifiers import Verifier, resolve_verifier

DEFAULT_NUM_DRAFT_TOKENS = 5


class SecureSDConfigError(ValueError):
    """A speculative decoding request that cannot run as asked."""


PROMPT_LOOKUP = "prompt lookup"


def resolve_request(
    verifier: Any, secure_schedule: Any, num_assistant_tokens: Any
) -> tuple[Verifier, Schedule | None, int]:
    """Turn user-facing arguments into (verifier, schedule, k), validating each."""
    if verifier is None:
        raise SecureSDConfigError(
            "secure_schedule was given without a verifier; pass verifier='mars' (or another name) "
            "together with the schedule, or drop secure_schedule"
        )
    resolved = resolve_verifier(verifier)
    schedule = resolve_schedule(secure_schedule)
    k = DEFAULT_NUM_DRAFT_TOKENS if num_assistant_tokens is None else num_assistant_tokens
    if not is_integer(k) or int(k) < 1:
        raise SecureSDConfigError(f"num_assistant_tokens (the draft length k) must be an integer >= 1, got {k!r}")
    k = int(k)
    resolved.check_draft_length(k)
    return resolved, schedule, k


def check_proposer(verifier: Verifier, proposer: str) -> None:
    """Refuse a verifier whose rule reads the draft model's logits when `proposer` has none."""
    try:
        verifier.check_proposer(proposer, has_raw_draft_logits=False)
    except ValueError as error:
        raise SecureSDConfigError(str(error)) from None


def _vocab_size(model: PreTrainedModel) -> int:
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def check_models(target: PreTrainedModel, draft: PreTrainedModel | None) -> None:
    """The draft must exist, be a decoder-only causal LM and share the target's vocabulary."""
    if draft is None:
        raise SecureSDConfigError(
            "verifier= needs a draft model: pass assistant_model=<draft model> to generate "
            "(or draft=<draft model> when calling through custom_generate)"
        )
    for role, model in (("target", target), ("draft", draft)):
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
    target_vocab, draft_vocab = _vocab_size(target), _vocab_size(draft)
    if target_vocab != draft_vocab:
        raise SecureSDConfigError(
            f"vocabulary mismatch: the target scores {target_vocab} tokens but the draft scores {draft_vocab}; "
            "verification compares both models' probabilities token by token, so the draft must use the same "
            "tokenizer and vocabulary as the target (e.g. a smaller model of the same family)"
        )


def check_lengths(max_new_tokens: Any, max_length: Any) -> None:
    """`max_new_tokens` / `max_length`, when given, must be integers (NumPy and 0-d tensor integers too)."""
    for name, value in (("max_new_tokens", max_new_tokens), ("max_length", max_length)):
        if value is not None and (not is_integer(value) or int(value) < 0):
            raise SecureSDConfigError(f"{name} must be an integer >= 0, got {value!r}")


def check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """The prompt must hold at least one token and the attention mask, if any, its shape."""
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise SecureSDConfigError(
            f"the prompt is empty (input_ids of shape {tuple(input_ids.shape)}); speculative decoding needs at least "
            "one prompt token per row (e.g. the tokenizer's BOS token)"
        )
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise SecureSDConfigError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has shape {tuple(input_ids.shape)}; "
            "pass the mask the tokenizer returned with the same input_ids"
        )


def check_options(options: dict[str, Any], input_ids: torch.Tensor | None) -> None:
    """Reject generation options that a verifier cannot honour. `options` holds the effective values."""
    if options.get("assistant_tokenizer") is not None:
        raise SecureSDConfigError(
            "assistant_tokenizer= selects universal assisted decoding (a draft with a different tokenizer): its "
            "drafts are re-tokenized text with no draft distribution in the target's vocabulary, so a verifier "
            "cannot run on them; use a draft that shares the target's tokenizer and drop assistant_tokenizer "
            "(tokenizer= alone, e.g. for stop_strings, is fine)"
        )
    if (options.get("guidance_scale") or 1) > 1:
        raise SecureSDConfigError(
            "guidance_scale > 1 (classifier-free guidance) runs its own unconditional forward of the target one "
            "token at a time, with its own cache, which does not follow speculative rounds; it cannot be combined "
            "with verifier=. Use guidance_scale=None (or 1), or drop verifier"
        )
    if options.get("synced_gpus"):
        raise SecureSDConfigError(
            "synced_gpus=True (DeepSpeed ZeRO-3 / FSDP across processes) is not supported with verifier=: the "
            "speculative loop runs in one process; load the models on one process (device_map='auto' spreads "
            "one model over several GPUs)"
        )
    if (options.get("num_beams") or 1) > 1:
        raise SecureSDConfigError("num_beams > 1 (beam search) cannot be combined with verifier=; use num_beams=1")
    if (options.get("num_return_sequences") or 1) > 1:
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
        for option in ("streamer", "output_scores", "output_logits"):
            if options.get(option):
                raise SecureSDConfigError(
                    f"{option} supports a single sequence with verifier= (rows of a batch advance by different "
                    f"numbers of tokens per round); generate one prompt at a time to use {option}"
                )
