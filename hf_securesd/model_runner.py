"""A model with its own KV cache, fed slots that may become holes (rejected drafts of some rows).

Rows of a speculative batch keep different numbers of drafts per round. Instead of re-running
anything, the slots of rejected drafts become holes: masked out of attention and skipped by the
position ids; slots that are holes in every row are cropped away.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .cache_support import STATIC_KEY_VALUE_LAYERS, records_past, stop_recording
from .host_values import long_tensor
from .positions import position_limit
from .validation import SecureSDConfigError

# Layers whose whole per-row state is `keys` and `values` [B, heads, slots, head_dim].
_KEY_VALUE_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer)


class ModelRunner:
    """One model, its KV cache and, once a slot is a hole, the validity of each slot.

    While every slot is valid (always for a single row) no mask is kept: positions are a plain range
    and attention gets no mask, exactly as in plain decoding. Once there are holes, the slots' validity
    lives in a [B, capacity] int64 buffer (its first `num_slots` columns are the attention mask, grown
    by doubling; every column from `num_slots` on holds 1, so a forward of valid slots writes nothing)
    and each row's number of valid slots in `_valid` [B, 1], so a forward appends its columns and reads
    the positions without re-reducing the whole mask."""

    def __init__(self, model: PreTrainedModel, cache: DynamicCache | None, cached_mask: torch.Tensor | None = None) -> None:
        self.model = model
        self.device = model.device
        self.cache = cache if cache is not None else DynamicCache(config=model.config)
        # int(): a static cache's length is its own counter tensor, which `+=` below would advance twice
        self.num_slots = int(self.cache.get_seq_length()) if cache is not None else 0
        # Sliding-window layers keep every slot until the round's crop trims them (`cache_support`).
        self._trims = isinstance(self.cache, DynamicCache) and records_past(self.cache)
        self._mask: torch.Tensor | None = None  # [B, capacity] long: 1 = valid slot, 0 = hole
        self._valid: torch.Tensor | None = None  # [B, 1] long: valid slots per row
        self._position_table: torch.Tensor | None = None  # [B, capacity] long: 0, 1, 2, ... in every row
        self._steps: dict[int, torch.Tensor] = {}  # width -> [width] long 0 .. width - 1
        if cached_mask is not None:
            self._begin_mask(cached_mask.to(self.device).long())
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        limit = position_limit(model)
        self._last_position = None if limit is None else limit - 1  # of a position table (learned, or a sin/cos buffer)
        self._keeps_logits = "logits_to_keep" in parameters
        self._cache_checked = False  # whether a forward has shown that the cache grows by the tokens fed

    def _begin_mask(self, slots: torch.Tensor) -> None:
        """Start tracking holes with slots [B, num_slots] long (the current slots' validity)."""
        batch = slots.shape[0]
        self._mask = torch.ones(batch, 2 * self.num_slots + 16, dtype=torch.long, device=self.device)
        self._mask[:, : self.num_slots] = slots
        self._valid = slots.sum(dim=-1, keepdim=True)

    def _reserve(self, width: int) -> None:
        """Grow the mask buffer (doubling) so that `width` slots fit."""
        capacity = self._mask.shape[1]
        if width > capacity:
            rows, size = self._mask.shape[0], max(width, 2 * capacity)
            grown = torch.ones(rows, size, dtype=torch.long, device=self.device)
            grown[:, : self.num_slots] = self._mask[:, : self.num_slots]
            self._mask = grown

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, keep: int) -> torch.Tensor:
        """Feed new slots. tokens: [B, m]; token_mask: [B, m] (False = a hole) or None (all valid)
        -> float32 logits of the last `keep` slots [B, keep, V]."""
        device = self.device
        batch, width = tokens.shape
        if self._mask is None and token_mask is None:
            positions = self._plain_positions(batch, width)
            attention_mask = None
        else:
            if self._mask is None:
                self._begin_mask(torch.ones(batch, self.num_slots, dtype=torch.long, device=device))
            end = self.num_slots + width
            self._reserve(end)
            if token_mask is None:  # the new columns already hold 1
                # One slot per row (each draft step after the first) sits at each row's count of valid slots.
                positions = self._valid if width == 1 else self._valid + self._step_range(width)
                self._valid = self._valid + width
            else:
                new = token_mask.to(device).long()
                self._mask[:, self.num_slots : end] = new
                positions = (self._valid + new.cumsum(-1) - 1).clamp_min(0)
                self._valid = self._valid + new.sum(dim=-1, keepdim=True)
            attention_mask = self._mask[:, :end]
        if self._last_position is not None:
            # A row near its budget is fed the batch's k drafts, past the positions it keeps (`positions.
            # check_positions` bounds those): such slots are never kept, so a position table is
            # read at its last row there instead of past its end.
            positions = positions.clamp_max(self._last_position)
        kwargs = {self._cache_argument: self.cache, "use_cache": True, "position_ids": positions, "attention_mask": attention_mask}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        logits = self.model(input_ids=tokens.to(device), **kwargs).logits
        if not self._cache_checked:
            self._check_cache_grew(width)
        if logits.shape[1] != keep:  # the model kept more positions than asked (or has no logits_to_keep)
            logits = logits[:, -keep:]
        if logits.dtype != torch.float32:
            logits = logits.float()
        self.num_slots += width
        return logits

    def _check_cache_grew(self, width: int) -> None:
        """After the first forward: the cache must hold one more slot per token fed. A model that keeps no
        cache (openai-gpt ignores the one it is given) or caches other slots than its tokens (CPM-Ant adds
        prompt slots) cannot be rolled back draft by draft: SecureSDConfigError, before any token is out."""
        held = int(self.cache.get_seq_length())
        if held != self.num_slots + width:
            raise SecureSDConfigError(
                f"{type(self.model).__name__} was fed {width} tokens after {self.num_slots} cached ones and its "
                f"KV cache holds {held} slots: speculative decoding rolls the cache back draft by draft and needs "
                "a model that keeps one cache slot per token in the cache it is given. Use plain generate (no "
                "assistant_model, verifier or prompt lookup) with this model"
            )
        self._cache_checked = True

    def _step_range(self, width: int) -> torch.Tensor:
        """[width] long 0 .. width - 1 (cached per width)."""
        steps = self._steps.get(width)
        if steps is None:
            steps = self._steps[width] = torch.arange(width, device=self.device)
        return steps

    def _plain_positions(self, batch: int, width: int) -> torch.Tensor:
        """[batch, width] positions num_slots .. num_slots + width - 1 of every row, sliced from a cached
        [batch, capacity] range (one operation instead of building and expanding a range per forward)."""
        end = self.num_slots + width
        table = self._position_table
        if table is None or table.shape[0] != batch or table.shape[1] < end:
            self._position_table = table = torch.arange(2 * end + 16, device=self.device).expand(batch, -1)
        return table[:, self.num_slots : end]

    def keep_slots(self, start: int, kept: list[int]) -> None:
        """Of the slots from `start` on, row b keeps its first kept[b]; the rest become holes. The slot
        before `start` is valid in some row, so the cache is cropped to start + max(kept)."""
        if self._mask is None and min(kept) == max(kept):
            self._crop_to(start + kept[0])
            return
        device = self.device
        if self._mask is None:
            self._begin_mask(torch.ones(len(kept), self.num_slots, dtype=torch.long, device=device))
        end = start + max(kept)
        offsets = self._step_range(end - start)
        self._mask[:, start:end] *= offsets[None] < long_tensor(kept, device)[:, None]
        if end < self.num_slots:
            self._mask[:, end : self.num_slots] = 1  # cropped away: fresh columns again
        self._crop_to(end)
        self._valid = self._mask[:, : self.num_slots].sum(dim=-1, keepdim=True)

    def _crop_to(self, length: int) -> None:
        """Drop the slots from `length` on; sliding-window layers are also trimmed back to their window."""
        if length < self.num_slots or self._trims:
            self.cache.crop(length - self.num_slots)
            self.num_slots = length

    def handed_back_cache(self) -> DynamicCache:
        """The cache as plain decoding leaves it, for the caller (sliding windows trimmed, no longer
        recording); the runner is not fed again after this."""
        if self._trims:
            stop_recording(self.cache)
        return self.cache

    def select_rows(self, rows: torch.Tensor) -> None:
        select_cache_rows(self.cache, rows.to(self.device))
        if self._mask is not None:
            rows = rows.to(self.device)
            self._mask, self._valid = self._mask[rows], self._valid[rows]

    @property
    def has_holes(self) -> bool:
        return self._mask is not None


def select_cache_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep only batch rows `rows` [B'] of every layer of `cache`. Plain key/value layers are gathered
    with `index_select` (what `DynamicLayer.batch_select_indices` does with advanced indexing, which
    costs ~8x more on a CPU); static ones too (transformers gives them no row selection; their other
    state, the filled length, is the same for every row); any other layer type selects its own rows
    (`cache_support.check_cache_support` admits a batch only where every layer can)."""
    for layer in cache.layers:
        if type(layer) in _KEY_VALUE_LAYERS:
            if layer.get_seq_length() > 0:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)
        elif type(layer) in STATIC_KEY_VALUE_LAYERS:
            if layer.is_initialized:
                layer.keys = layer.keys.index_select(0, rows)
                layer.values = layer.values.index_select(0, rows)
                layer.batch_size = rows.shape[0]
        else:
            layer.batch_select_indices(rows)
