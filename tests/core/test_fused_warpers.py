"""The fused top-k + top-p pass gives bitwise the scores HF's TopKLogitsWarper then TopPLogitsWarper give."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hf_securesd import fused_warpers
from hf_securesd.fused_warpers import TopKTopP, fuse_top_k_top_p


def _bits(scores: torch.Tensor) -> torch.Tensor:
    """The raw bits, so -0.0 / +0.0 and NaN payloads count as different."""
    return scores.view(torch.int16 if scores.element_size() == 2 else torch.int32)


def _scores(kind: str, rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(rows, vocab, generator=generator) * 3
    if kind == "integer_ties":
        return torch.randint(-3, 3, (rows, vocab), generator=generator).float()
    if kind == "signed_zero_ties":
        scores = torch.randint(-2, 2, (rows, vocab), generator=generator).float() * 0.5
        zeros = scores == 0
        scores[zeros & (torch.rand(rows, vocab, generator=generator) < 0.5)] = -0.0
        return scores
    if kind == "minus_inf":
        scores = torch.randn(rows, vocab, generator=generator)
        scores[torch.rand(rows, vocab, generator=generator) < 0.6] = float("-inf")
        scores[0] = float("-inf")  # a row with nothing allowed
        return scores
    if kind == "plus_inf":
        scores = torch.randn(rows, vocab, generator=generator)
        scores[torch.rand(rows, vocab, generator=generator) < 0.05] = float("inf")
        return scores
    raise ValueError(kind)


KINDS = ("normal", "integer_ties", "signed_zero_ties", "minus_inf", "plus_inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_bitwise_equal_to_hf_top_k_then_top_p(monkeypatch, dtype, kind):
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)  # the fused pass even for small inputs
    generator = torch.Generator().manual_seed(hash((kind, str(dtype))) % 2**31)
    cases = 0
    for vocab in (1, 2, 7, 64, 259):
        for top_k in (1, 3, 50, vocab, vocab + 4):
            for top_p in (0.0, 0.3, 0.9, 0.99, 1.0):
                for keep in (1, 2, 5, 300):
                    scores = _scores(kind, 6, vocab, generator).to(dtype)
                    top_k_warper = TopKLogitsWarper(top_k, min_tokens_to_keep=keep)
                    top_p_warper = TopPLogitsWarper(top_p, min_tokens_to_keep=keep)
                    expected = top_p_warper(None, top_k_warper(None, scores.clone()))
                    fused = TopKTopP(top_k_warper, top_p_warper)(None, scores.clone())
                    assert fused.dtype == expected.dtype
                    assert torch.equal(_bits(fused), _bits(expected)), (vocab, top_k, top_p, keep)
                    cases += 1
    assert cases == 5 * 5 * 5 * 4


def test_nan_scores_go_to_hf_unchanged(monkeypatch):
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)
    scores = torch.randn(4, 30)
    scores[1, 3] = float("nan")
    top_k, top_p = TopKLogitsWarper(5), TopPLogitsWarper(0.8)
    expected = top_p(None, top_k(None, scores.clone()))
    assert torch.equal(_bits(TopKTopP(top_k, top_p)(None, scores.clone())), _bits(expected))


def test_distinct_scores_need_no_sort(monkeypatch):
    """On scores without ties at the cut, HF's sorting warper is never called."""
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)
    top_k, top_p = TopKLogitsWarper(50), TopPLogitsWarper(0.9)
    scores = torch.randn(192, 259, generator=torch.Generator().manual_seed(0))
    expected = top_p(None, top_k(None, scores))

    def refuse(*_):
        raise AssertionError("the fused pass sorted")

    monkeypatch.setattr(TopPLogitsWarper, "__call__", refuse)
    assert torch.equal(_bits(TopKTopP(top_k, top_p)(None, scores)), _bits(expected))


def test_small_calls_use_hf_warpers():
    """Below FUSE_FROM entries HF's two warpers run (cheaper there), with the same result."""
    top_k, top_p = TopKLogitsWarper(5), TopPLogitsWarper(0.9)
    scores = torch.randn(1, fused_warpers.FUSE_FROM // 2)
    assert torch.equal(TopKTopP(top_k, top_p)(None, scores), top_p(None, top_k(None, scores)))


def test_only_adjacent_default_pairs_are_fused():
    temperature, top_k, top_p = TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.9)
    fused = fuse_top_k_top_p([temperature, top_k, top_p])
    assert fused[0] is temperature and isinstance(fused[1], TopKTopP) and len(fused) == 2
    assert fuse_top_k_top_p([top_k, temperature, top_p]) == [top_k, temperature, top_p]
    assert fuse_top_k_top_p([top_p, top_k]) == [top_p, top_k]
    custom_filter = TopKLogitsWarper(50, filter_value=-1e4)
    assert fuse_top_k_top_p([custom_filter, top_p]) == [custom_filter, top_p]
    with pytest.raises(ValueError, match="filter_value is -inf"):
        TopKTopP(custom_filter, top_p)
