"""`select_cache_rows` keeps the same rows, in the same order, as transformers' own
`batch_select_indices`, for plain and sliding-window layers and layers it does not know."""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from hf_securesd.model_runner import select_cache_rows


class CountingLayer(DynamicLayer):
    """A layer type `select_cache_rows` does not know: it must select its own rows."""

    calls = 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        CountingLayer.calls += 1
        super().batch_select_indices(indices)


def filled_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4), CountingLayer(), DynamicLayer()]
    generator = torch.Generator().manual_seed(0)
    for layer in cache.layers[:3]:  # the last layer stays empty
        for _ in range(2):
            keys, values = torch.randn(2, 5, 3, 2, 4, generator=generator)
            layer.update(keys, values)
    return cache


def test_rows_match_transformers_own_selection() -> None:
    ours, theirs = filled_cache(), filled_cache()
    rows = torch.tensor([4, 0, 2])
    CountingLayer.calls = 0
    select_cache_rows(ours, rows)
    assert CountingLayer.calls == 1
    theirs.batch_select_indices(rows)
    for mine, reference in zip(ours.layers, theirs.layers):
        assert mine.get_seq_length() == reference.get_seq_length()
        if reference.get_seq_length():
            assert torch.equal(mine.keys, reference.keys) and torch.equal(mine.values, reference.values)
            assert mine.keys.shape[0] == 3


def test_selection_does_not_alias_the_old_rows() -> None:
    cache = filled_cache()
    before = copy.deepcopy(cache.layers[0].keys)
    select_cache_rows(cache, torch.tensor([1]))
    cache.layers[0].keys.add_(1.0)
    assert torch.equal(cache.layers[0].keys, before[1:2] + 1.0)
