"""A model with its own KV cache, fed slots that may become holes (rejected drafts of some rows).

Rows of a speculative batch keep different numbers of drafts per round. Instead of re-running
anything, the slots of rejected drafts become holes: masked out of attention and skipped by the
position ids; slots that are holes in every row are cropped away.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedModel


class ModelRunner:
    """One model, its KV cache and, once a slot is a hole, the validity mask of the slots ([B, S] bool).

    While every slot is valid (always for a single row) no mask is kept: positions are a plain range
    and attention gets no mask, exactly as in plain decoding."""

    def __init__(self, model: PreTrainedModel, cache: DynamicCache | None, cached_mask: torch.Tensor | None = None) -> None:
        self.model = model
        self.device = model.device
        self.cache = cache if cache is not None else DynamicCache(config=model.config)
        self.num_slots = self.cache.get_seq_length() if cache is not None else 0
        self.slot_mask = cached_mask
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self._keeps_logits = "logits_to_keep" in parameters

    def forward(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, keep: int) -> torch.Tensor:
        """Feed new slots. tokens: [B, m]; token_mask: [B, m] (False = a hole) or None (all valid)
        -> float32 logits of the last `keep` slots [B, keep, V]."""
        device = self.device
        batch, width = tokens.shape
        if self.slot_mask is None and token_mask is None:
            positions = torch.arange(self.num_slots, self.num_slots + width, device=device).expand(batch, -1)
            attention_mask = None
        else:
            previous = self.slot_mask if self.slot_mask is not None else torch.ones(batch, self.num_slots, dtype=torch.bool, device=device)
            new = token_mask.to(device) if token_mask is not None else torch.ones(batch, width, dtype=torch.bool, device=device)
            positions = (previous.sum(-1, keepdim=True) + new.long().cumsum(-1) - 1).clamp_min(0)
            self.slot_mask = torch.cat([previous, new], dim=-1)
            attention_mask = self.slot_mask.long()
        kwargs = {self._cache_argument: self.cache, "use_cache": True, "position_ids": positions, "attention_mask": attention_mask}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        logits = self.model(input_ids=tokens.to(device), **kwargs).logits[:, -keep:].to(torch.float32)
        self.num_slots += width
        return logits

    def keep_slots(self, start: int, kept: list[int]) -> None:
        """Of the slots from `start` on, row b keeps its first kept[b]; the rest become holes. The slot
        before `start` is valid in some row, so the cache is cropped to start + max(kept)."""
        if self.slot_mask is None and min(kept) == max(kept):
            self._crop_to(start + kept[0])
            return
        device = self.device
        if self.slot_mask is None:
            self.slot_mask = torch.ones(len(kept), self.num_slots, dtype=torch.bool, device=device)
        offsets = torch.arange(self.num_slots - start, device=device)
        self.slot_mask[:, start:] &= offsets[None] < torch.tensor(kept, device=device)[:, None]
        self._crop_to(start + max(kept))

    def _crop_to(self, length: int) -> None:
        if length < self.num_slots:
            self.cache.crop(length - self.num_slots)
            if self.slot_mask is not None:
                self.slot_mask = self.slot_mask[:, :length]
            self.num_slots = length

    def select_rows(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows.to(self.device))
        if self.slot_mask is not None:
            self.slot_mask = self.slot_mask[rows.to(self.slot_mask.device)]

    @property
    def has_holes(self) -> bool:
        return self.slot_mask is not None
