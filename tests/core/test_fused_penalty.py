"""The fused repetition penalty + temperature gives bitwise the scores of HF's two processors, and hands
every call it does not cover to them."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from hf_securesd.fused_penalty import PenaltyThenTemperature, fuse_penalty_temperature


def _bits(scores: torch.Tensor) -> torch.Tensor:
    """The raw bits, so -0.0 / +0.0 count as different; every NaN as one pattern (a NaN's sign and payload
    depend on the kernel that produced it: half-precision division gives different ones on a strided
    and on a contiguous tensor)."""
    bits = scores.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[scores.element_size()])
    return torch.where(scores.isnan(), -1, bits)


def _scores(kind: str, rows: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(rows, vocab, generator=generator) * 4
    if kind == "integer_ties":
        return torch.randint(-3, 3, (rows, vocab), generator=generator).float()
    if kind == "signed_zeros":
        scores = torch.randint(-1, 2, (rows, vocab), generator=generator).float() * 0.0
        scores[torch.rand(rows, vocab, generator=generator) < 0.5] = -0.0
        return scores
    if kind == "non_finite":
        scores = torch.randn(rows, vocab, generator=generator)
        draw = torch.rand(rows, vocab, generator=generator)
        scores[draw < 0.1] = float("-inf")
        scores[(draw >= 0.1) & (draw < 0.15)] = float("inf")
        scores[(draw >= 0.15) & (draw < 0.2)] = float("nan")
        return scores
    if kind == "tiny_and_huge":  # subnormal products and quotients, overflow to inf
        magnitude = torch.tensor([1e-45, 1e-39, 3e38, 1.0])
        return magnitude[torch.randint(0, 4, (rows, vocab), generator=generator)] * torch.randn(rows, vocab, generator=generator).sign()
    raise ValueError(kind)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("kind", ["normal", "integer_ties", "signed_zeros", "non_finite", "tiny_and_huge"])
def test_bitwise_equal_to_hf_penalty_then_temperature(dtype, kind):
    generator = torch.Generator().manual_seed(hash((kind, str(dtype))) % 2**31)
    for rows, vocab, width in ((1, 1, 1), (6, 259, 0), (6, 259, 40), (32, 259, 300), (3, 5000, 64)):
        for penalty in (0.5, 1.0, 1.3):
            for temperature in (0.3, 0.7, 1.0, 1.7):
                scores = _scores(kind, rows, vocab, generator).to(dtype)
                ids = torch.randint(0, vocab, (rows, width), generator=generator)  # repeats included
                hf_penalty, hf_temperature = RepetitionPenaltyLogitsProcessor(penalty), TemperatureLogitsWarper(temperature)
                expected = hf_temperature(ids, hf_penalty(ids, scores.clone()))
                fused = PenaltyThenTemperature(hf_penalty, hf_temperature)(ids, scores.clone())
                assert fused.dtype == expected.dtype and fused.shape == expected.shape
                assert fused.is_contiguous()
                assert torch.equal(_bits(fused), _bits(expected)), (rows, vocab, width, penalty, temperature)


def test_the_fused_pass_does_not_call_hf_processors(monkeypatch):
    scores, ids = torch.randn(6, 259), torch.randint(0, 259, (6, 30))
    pair = PenaltyThenTemperature(RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.7))
    expected = pair.temperature(ids, pair.penalty(ids, scores))

    def refuse(*_):
        raise AssertionError("HF's processor ran")

    monkeypatch.setattr(RepetitionPenaltyLogitsProcessor, "__call__", refuse)
    monkeypatch.setattr(TemperatureLogitsWarper, "__call__", refuse)
    assert torch.equal(pair(ids, scores), expected)


@pytest.mark.parametrize("case", ["id_at_vocab", "id_above_vocab", "ignore_int", "ignore_tensor", "ids_1d", "scores_3d"])
def test_calls_outside_the_fused_pass_get_hf_results(case):
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 50, generator=generator)
    ids = torch.randint(0, 50, (4, 12), generator=generator)
    ignore = None
    if case == "id_at_vocab":
        ids[1, 3] = 50  # HF drops ids >= V (its pad column)
    elif case == "id_above_vocab":
        ids[2, 0] = 75
    elif case == "ignore_int":
        ignore = 5
    elif case == "ignore_tensor":
        ignore = torch.tensor([0, 3, 12, 1])
    elif case == "ids_1d":  # HF reads [N] ids as one id per row
        ids = ids[:, 0]
    elif case == "scores_3d":
        scores = scores[:, None]
    try:
        penalty = RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=ignore)
    except ValueError:
        pytest.skip("this transformers release takes no [B] prompt_ignore_length")
    temperature = TemperatureLogitsWarper(0.6)
    pair = PenaltyThenTemperature(penalty, temperature)
    try:
        expected = temperature(ids, penalty(ids, scores.clone()))
    except RuntimeError as error:  # releases before HF's pad column refuse ids >= V: so does the pair
        with pytest.raises(type(error)):
            pair(ids, scores.clone())
        return
    assert torch.equal(_bits(pair(ids, scores.clone())), _bits(expected))


def test_without_ignore_length_reads_every_position():
    pair = PenaltyThenTemperature(RepetitionPenaltyLogitsProcessor(1.4, prompt_ignore_length=2), TemperatureLogitsWarper(0.8))
    plain = pair.without_ignore_length()
    assert plain.prompt_ignore_length is None and plain.penalty.penalty == 1.4 and plain.temperature is pair.temperature
    scores, ids = torch.randn(2, 20), torch.randint(0, 20, (2, 6))
    assert torch.equal(plain(ids, scores), TemperatureLogitsWarper(0.8)(ids, RepetitionPenaltyLogitsProcessor(1.4)(ids, scores)))


def test_only_adjacent_hf_pairs_are_fused():
    penalty, temperature, top_k = RepetitionPenaltyLogitsProcessor(1.1), TemperatureLogitsWarper(0.7), TopKLogitsWarper(5)

    class OwnPenalty(RepetitionPenaltyLogitsProcessor):
        pass

    fused = fuse_penalty_temperature([penalty, temperature, top_k])
    assert type(fused[0]) is PenaltyThenTemperature and fused[1:] == [top_k]
    assert fuse_penalty_temperature([penalty, top_k, temperature]) == [penalty, top_k, temperature]
    assert fuse_penalty_temperature([temperature, penalty]) == [temperature, penalty]
    own = OwnPenalty(1.1)
    assert fuse_penalty_temperature([own, temperature]) == [own, temperature]
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor followed by a TemperatureLogitsWarper"):
        PenaltyThenTemperature(own, temperature)
