"""Inverse-CDF draws: the row's distribution exactly, never a zero-probability token, per-row generators."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_securesd.draws import draw_rows
from hf_securesd.prefixes import all_finite
from support import noise_floor


def test_draws_follow_each_rows_distribution():
    generator = torch.Generator().manual_seed(0)
    probs = torch.rand(3, 7, generator=generator) ** 3
    probs[1, [0, 3, 6]] = 0.0  # zero-probability tokens, first and last included
    probs[2] *= 40.0  # weights need not sum to 1
    samples = 20_000
    torch.manual_seed(1)
    tokens = draw_rows(probs.repeat(samples, 1)).view(samples, 3)
    for row in range(3):
        counts = torch.bincount(tokens[:, row], minlength=7).double()
        expected = probs[row].double() / probs[row].double().sum()
        assert counts[expected == 0].sum() == 0
        tv = 0.5 * (counts / samples - expected).abs().sum().item()
        assert tv < noise_floor(dict(enumerate(expected.tolist())), samples)


def test_a_row_does_not_depend_on_its_batch():
    probs = torch.rand(4, 50, generator=torch.Generator().manual_seed(3))
    seeds = [10, 11, 12, 13]
    together = draw_rows(probs, [torch.Generator().manual_seed(s) for s in seeds])
    alone = [
        draw_rows(probs[row : row + 1], [torch.Generator().manual_seed(seed)]).item()
        for row, seed in enumerate(seeds)
    ]
    assert together.tolist() == alone


def test_one_generator_per_row_is_required():
    with pytest.raises(ValueError, match="2 generators for 3 rows"):
        draw_rows(torch.ones(3, 4), [None, None])


def test_a_one_hot_row_always_gives_its_token():
    probs = torch.zeros(5, 9)
    probs[torch.arange(5), torch.tensor([0, 8, 4, 4, 1])] = 1.0
    torch.manual_seed(0)
    for _ in range(50):
        assert draw_rows(probs).tolist() == [0, 8, 4, 4, 1]


@pytest.mark.parametrize(
    "values",
    [[1.0, -2.0], [3e38, 3e38, -3e38], [float("inf"), 0.0], [float("-inf")], [float("nan"), 1.0], []],
)
def test_all_finite_is_isfinite_all(values):
    tensor = torch.tensor(values, dtype=torch.float32)
    assert bool(all_finite(tensor)) == bool(torch.isfinite(tensor).all())
    assert np.isfinite(np.array(values, dtype=np.float32)).all() == bool(all_finite(tensor))
