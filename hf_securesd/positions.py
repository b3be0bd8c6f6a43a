"""Models with a table of absolute positions embed only as many positions as the table holds: a learned
one (GPT-2's `wpe`, OPT's and BioGPT's `embed_positions`) or a precomputed rotary sin/cos table (GPT-J's
and CodeGen's `embed_positions` buffer). A longer call fails inside torch's lookup (IndexError). A draft's
table is often shorter than its target's, so a call the target decodes alone can exceed the draft's; both
are checked before decoding and the limit is named instead."""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel

from .validation import SecureSDConfigError

# The last part of a module's qualified name that transformers gives a learned absolute-position table.
_TABLE_NAMES = ("wpe", "embed_positions", "position_embeddings")
# The last part of a buffer's qualified name that holds a precomputed [positions, dim] sin/cos table (GPT-J, CodeGen).
_BUFFER_TABLE_NAMES = ("embed_positions",)


def position_limit(model: PreTrainedModel) -> int | None:
    """How many positions `model`'s table of absolute positions embeds: a learned table's rows less the offset
    OPT-style tables skip, a precomputed sin/cos buffer's rows; None when it has no such table (rotary
    computed per call, ALiBi, sinusoidal positions made on demand: no fixed limit)."""
    limits = [
        module.num_embeddings - int(getattr(module, "offset", 0))
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in _TABLE_NAMES
    ]
    limits += [
        buffer.shape[0]
        for name, buffer in model.named_buffers()
        if name.rsplit(".", 1)[-1] in _BUFFER_TABLE_NAMES and buffer.dim() == 2
    ]
    return min(limits) if limits else None


def check_positions(role: str, model: PreTrainedModel, prompt_length: int, max_new_tokens: int) -> None:
    """Raise SecureSDConfigError when this call would feed `model` a position beyond its table: the longest
    row's prompt_length tokens plus max_new_tokens - 1 generated ones (the last token is never fed)."""
    limit = position_limit(model)
    needed = prompt_length + max(max_new_tokens - 1, 0)
    if limit is None or needed <= limit:
        return
    generated = max(max_new_tokens - 1, 0)
    if prompt_length > limit:
        raise SecureSDConfigError(
            f"the {role} model ({type(model).__name__}) embeds at most {limit} positions (its position "
            f"table), but the longest prompt alone has {prompt_length} tokens; shorten the prompt to {limit} "
            f"tokens or less, or use a {role} model with a longer context"
        )
    raise SecureSDConfigError(
        f"the {role} model ({type(model).__name__}) embeds at most {limit} positions (its position "
        f"table), but this call can feed it up to {needed} (the longest prompt, {prompt_length} tokens, plus "
        f"max_new_tokens - 1 = {generated}); lower max_new_tokens to {max(limit - prompt_length + 1, 0)} or "
        f"less, shorten the prompt, or use a {role} model with a longer context"
    )
