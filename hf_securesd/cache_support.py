"""Which KV caches the speculative loop can roll back, and how sliding-window layers are kept exact.

Each round appends drafts to both models' caches and crops the rejected ones away (`ModelRunner`):

* Full-attention key/value layers (`DynamicLayer` and its subclasses but the quantized ones) crop any
  number of slots.
* Sliding-window layers (`DynamicSlidingWindowLayer`: Gemma 2/3, Mistral with `sliding_window`, ...) keep
  only their window's last slots once it is reached, so a crop after that point would need slots they
  dropped. They are put in past-recording mode, as transformers' own assisted decoding does: each layer
  keeps every slot until the next crop, which trims it back to the window. A cache handed back to the
  caller leaves that mode (`stop_recording`), as plain `generate` leaves it.
* Static layers (`cache_implementation="static"`) crop by rewinding their length where transformers gives
  them a `crop`. They hold a fixed number of slots (a static sliding-window layer: at most its window, and
  it cannot bring back what it evicted), so a call that could fill more is refused. Rows of a batch that
  finish early are dropped from them as from dynamic layers; a batch is refused where some layer can drop
  no rows (`selects_rows`).
* Other layers are refused: linear attention and state-space layers (Mamba-style, RecurrentGemma, hybrid
  models) hold a running state that cannot be cropped slot by slot, and quantized layers crop only their
  unquantized residual.

A batch of several rows leaves masked slots (holes) where one row rejected drafts that another kept. A
sliding window counts cache slots, so a row whose window holds holes would attend to fewer of its own
tokens than plain decoding does. Holes are harmless while no row can reach the window: a batch is
admitted when the prompt plus every slot the loop can add fits in the smallest window
(`check_cache_support`), and refused otherwise with the fix named. GPT-Neo's "local" layers count slots
the same way in their mask while their cache keeps every slot (`mask_window`), and GPT-Neo reads that mask
from a table of max_position_embeddings slots (`slot_table`): a batch is admitted only while its slots fit in
the table. A model whose attention reads a key's distance from its slot number (`SLOT_POSITIONED`: MPT's
ALiBi) is admitted one row at a time.
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers import cache_utils
from transformers.cache_utils import (
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionCacheLayerMixin,
    StaticLayer,
)

from .validation import SecureSDConfigError

# Quantized layers subclass DynamicLayer but crop only their unquantized residual (transformers 5.24 names
# the base class BaseQuantizedLayer, 5.17 QuantizedLayer).
_QUANTIZED = tuple(
    getattr(cache_utils, name) for name in ("BaseQuantizedLayer", "QuantizedLayer") if hasattr(cache_utils, name)
)


# Static layers whose whole per-row state is `keys` and `values` [B, heads, max_cache_len, head_dim] (their
# filled length is shared by every row): `model_runner.select_cache_rows` drops finished rows from them.
STATIC_KEY_VALUE_LAYERS = tuple(
    getattr(cache_utils, name) for name in ("StaticLayer", "StaticSlidingWindowLayer") if hasattr(cache_utils, name)
)


# model types whose attention reads a key's distance from its cache slot (not from position_ids or the
# attention mask), so that a batch's masked slots change what a row attends to: why, by model type
SLOT_POSITIONED = {
    "mpt": "computes its ALiBi attention bias from cache slot numbers",
}


def selects_rows(layer: object) -> bool:
    """Whether finished rows can be dropped from `layer`: a dynamic or static key/value layer, or one that
    transformers gives a `batch_select_indices`."""
    return type(layer) in STATIC_KEY_VALUE_LAYERS or callable(getattr(layer, "batch_select_indices", None))


def cache_layers(model: PreTrainedModel, cache: object | None) -> list:
    """The layers of `cache`, or of the cache `generate` builds for `model` when none is passed."""
    if cache is None:
        cache = DynamicCache(config=model.config)
    return list(getattr(cache, "layers", None) or [])


def smallest_window(layers: list) -> int | None:
    """The smallest window among dynamic sliding-window layers, None when none of them slides."""
    windows = [int(layer.sliding_window) for layer in layers if isinstance(layer, DynamicSlidingWindowLayer)]
    return min(windows) if windows else None


def mask_window(config: object) -> int | None:
    """The window of attention layers that apply it in their mask over cache slots while their cache
    keeps every slot (plain `DynamicLayer`s): GPT-Neo's "local" layers (`attention_layers`, `window_size`:
    a token attends to the slots less than window_size before its own). None when the model has none."""
    layers, size = getattr(config, "attention_layers", None), getattr(config, "window_size", None)
    if isinstance(layers, (list, tuple)) and "local" in layers and isinstance(size, int) and not isinstance(size, bool):
        return size
    return None


def slot_table(model: PreTrainedModel) -> int | None:
    """The cache slots a model's attention can address: GPT-Neo reads its causal mask from a fixed
    [1, 1, N, N] boolean buffer (`bias`, N = max_position_embeddings) at the key's slot, so a cache of more
    than N slots fails inside its attention. None when the model keeps no such table."""
    sizes = [
        int(buffer.shape[-1])
        for name, buffer in model.named_buffers()
        if name.rsplit(".", 1)[-1] == "bias" and buffer.dtype == torch.bool and buffer.dim() == 4
        and buffer.shape[-1] == buffer.shape[-2]
    ]
    return min(sizes) if sizes else None


def _croppable(layer: object) -> bool:
    """A key/value layer (dynamic or static) that transformers lets crop."""
    return (
        isinstance(layer, (DynamicLayer, StaticLayer))
        and not isinstance(layer, (LinearAttentionCacheLayerMixin, *_QUANTIZED))
        and callable(getattr(layer, "crop", None))
    )


def check_cache_layers(role: str, model: PreTrainedModel, cache: object | None) -> None:
    """Raise SecureSDConfigError when a layer of `model`'s cache (the `cache` passed to `generate`, or
    None: the one built from the config) cannot be cropped draft by draft. role: "target" or "draft"."""
    _refuse_uncroppable(role, model, cache_layers(model, cache))


def _refuse_uncroppable(role: str, model: PreTrainedModel, layers: list) -> None:
    unsupported = sorted({type(layer).__name__ for layer in layers if not _croppable(layer)})
    if unsupported:
        raise SecureSDConfigError(
            f"the {role} model ({type(model).__name__}) keeps {', '.join(unsupported)} cache layers, which cannot be "
            "rolled back draft by draft (a running state of linear attention or state-space layers, or a layer "
            "this transformers release cannot crop); speculative decoding with a verifier supports models whose "
            "layers all keep keys and values (full or sliding-window attention), in a DynamicCache where "
            "cache_implementation is left unset"
        )


def check_cache_support(
    role: str, model: PreTrainedModel, cache: object | None, batch: int, prompt_length: int, max_new_tokens: int
) -> None:
    """Raise SecureSDConfigError when the loop cannot keep `model`'s cache exact for this call of `batch`
    rows of prompt_length tokens: its layers (`check_cache_layers`), then the slots the call can fill.

    The cache never holds more than prompt_length + batch x (max_new_tokens - 1) slots: a round grows it
    by the most tokens any row put in it (the sum over rows at most, and a row's last token never enters
    it), and a row drafts no more than its remaining budget, so the drafts in flight fit in that row's
    share. A static cache must hold that many slots. A model with sliding-window (or chunked) layers is
    admitted at batch 1, or for a larger batch when that many slots fit in its smallest window."""
    layers = cache_layers(model, cache)
    _refuse_uncroppable(role, model, layers)
    held = _cached_rows(layers) if cache is not None else None
    if held is not None and held != batch:
        raise SecureSDConfigError(
            f"the {role} cache passed to generate holds {held} row{'s' * (held != 1)} but input_ids has {batch}: a "
            "cache holds one row per prompt of the call that filled it; pass the cache returned for these same "
            "rows (in the same order), or no cache"
        )
    fixed = sorted({type(layer).__name__ for layer in layers if not selects_rows(layer)})
    if batch > 1 and fixed:
        raise SecureSDConfigError(
            f"the {role} cache keeps {', '.join(fixed)} layers, which cannot drop the rows of a batch that finish "
            "before the others (transformers gives them no row selection). Pass one row per generate call, or "
            "leave cache_implementation unset and pass no such cache (a DynamicCache)"
        )
    reach = prompt_length + batch * max(max_new_tokens - 1, 0)
    bound = "prompt length + rows x (max_new_tokens - 1)"
    here = f"{prompt_length} + {batch} x ({max_new_tokens} - 1)"
    static = [layer for layer in layers if isinstance(layer, StaticLayer)]
    smallest = min(static, key=lambda layer: int(layer.max_cache_len)) if static else None
    if smallest is not None and reach > int(smallest.max_cache_len):
        if smallest.is_sliding:
            why = "a static sliding window cannot bring back what it evicted when rejected drafts are cropped"
        elif batch > 1:
            why = "rows that keep different numbers of drafts leave masked slots past the rows' own tokens"
        else:
            why = "a static cache has no room beyond the length it was built for"
        raise SecureSDConfigError(
            f"the {role} cache is static and holds {smallest.max_cache_len} slots per layer, but this call could "
            f"fill {reach} ({bound} = {here}): {why}. Leave cache_implementation unset and pass no static cache "
            "(a DynamicCache grows as needed and keeps sliding windows exact)"
            + ("" if batch == 1 else ", or pass one row per generate call")
        )
    model_type = getattr(model.config, "model_type", None)
    if batch > 1 and model_type in SLOT_POSITIONED:
        raise SecureSDConfigError(
            f"the {role} model ({type(model).__name__}) {SLOT_POSITIONED[model_type]}: rows of a batch that keep "
            "different numbers of drafts leave masked slots, which would change the distances it sees. Pass one "
            "row per generate call"
        )
    table = slot_table(model)
    if table is not None and batch > 1 and reach > table:
        raise SecureSDConfigError(
            f"the {role} model ({type(model).__name__}) reads its attention mask from a table of {table} cache slots "
            f"(max_position_embeddings), and a batch of {batch} rows could fill {reach}: rows that keep different "
            f"numbers of drafts leave masked slots beyond their own tokens. Pass one row per generate call, or keep "
            f"{bound} <= {table} (here {here})"
        )
    windows = [window for window in (smallest_window(layers), mask_window(model.config)) if window is not None]
    window = min(windows) if windows else None
    if window is None or batch == 1 or reach <= window:
        return
    raise SecureSDConfigError(
        f"the {role} model ({type(model).__name__}) has sliding-window (or chunked) attention (window {window}), "
        f"and a batch of {batch} rows could fill {reach} cache slots: rows that keep different numbers of drafts "
        "leave masked slots, and a window that counts them would show a row fewer of its own tokens than plain "
        f"decoding. Pass one row per generate call, or keep {bound} <= {window} (here {here})"
    )


def _cached_rows(layers: list) -> int | None:
    """The batch rows a passed cache's layers hold keys for ([rows, heads, slots, dim] keys), from the first
    layer that holds any; None when none does yet (an empty cache fits any batch)."""
    for layer in layers:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.dim() == 4 and keys.numel():
            return int(keys.shape[0])
    return None


def records_past(cache: DynamicCache) -> bool:
    """Put the sliding-window layers of `cache` in past-recording mode (see the module doc); True when it
    has any, so the caller trims them after each round.

    A recording layer keeps more slots than its window between two crops; the attention mask of a forward
    of q slots covers its window's last window - 1 slots plus the q new ones. transformers 5.24 returns
    exactly those from `update`; 5.17 returns every recorded slot, so each layer's `update` is bounded the
    same way here (a no-op where transformers already does it)."""
    sliding = [layer for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
    for layer in sliding:
        layer.activate_past_recording()
        if "update" not in vars(layer):
            layer.update = _window_bounded(layer, type(layer).update)
    return bool(sliding)


def _window_bounded(layer: DynamicSlidingWindowLayer, update: Callable) -> Callable:
    """`update` of a recording layer returning only the slots its attention mask covers."""

    def bounded(key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = update(layer, key_states, value_states, *args, **kwargs)
        visible = layer.sliding_window - 1 + key_states.shape[-2]
        return keys[..., -visible:, :], values[..., -visible:, :]

    return bounded


def stop_recording(cache: DynamicCache) -> None:
    """Trim the sliding-window layers of `cache` back to their window and leave past-recording mode, so
    the cache behaves as plain `generate` leaves it."""
    cache.crop(0)
    for layer in cache.layers:
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.record_past = False
            vars(layer).pop("update", None)
