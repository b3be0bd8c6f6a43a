"""The fused top-k + top-p pass gives bitwise the scores HF's TopKLogitsWarper then TopPLogitsWarper give,
also where a cumulative probability sits at the top-p threshold, and the error bound it relies on holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

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


@pytest.mark.parametrize("split", ["sort", "partition"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KINDS)
def test_bitwise_equal_to_hf_top_k_then_top_p(monkeypatch, dtype, kind, split):
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)  # the fused pass even for small inputs
    # Each row sorted whole, or partitioned at the K-th largest (what large vocabularies get).
    monkeypatch.setattr(fused_warpers, "PARTITION_FROM", 0 if split == "partition" else 10**9)
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


@pytest.mark.parametrize("split", ["sort", "partition"])
def test_top_p_keeping_more_than_top_k_with_ties_in_some_rows(monkeypatch, split):
    """Top-p's min_tokens_to_keep above top-k's K while some rows tie at the K-th largest and others do
    not (their sorted tails start with -inf that top-p may not remove): top-k still decides those rows."""
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)
    monkeypatch.setattr(fused_warpers, "PARTITION_FROM", 0 if split == "partition" else 10**9)
    generator = torch.Generator().manual_seed(11)
    for vocab in (64, 259):
        for top_k in (1, 3, 5):
            for keep in (4, 8, 20):
                scores = torch.randn(6, vocab, generator=generator)
                scores[::2] = torch.randint(-3, 3, (3, vocab), generator=generator).float()  # ties at kth
                top_k_warper, top_p_warper = TopKLogitsWarper(top_k), TopPLogitsWarper(0.5, min_tokens_to_keep=keep)
                expected = top_p_warper(None, top_k_warper(None, scores.clone()))
                fused = TopKTopP(top_k_warper, top_p_warper)(None, scores.clone())
                assert torch.equal(_bits(fused), _bits(expected)), (vocab, top_k, keep)


@pytest.mark.parametrize("split", ["sort", "partition"])
def test_rows_with_nan_are_handed_to_hf_and_the_others_fused(monkeypatch, split):
    """NaN anywhere in a row (one, several, more than K, the whole row, beside infinities): that row gets
    HF's result, bitwise, and the other rows of the call are still decided by the fused pass."""
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)
    monkeypatch.setattr(fused_warpers, "PARTITION_FROM", 0 if split == "partition" else 10**9)
    generator = torch.Generator().manual_seed(7)
    nan, inf = float("nan"), float("inf")
    for vocab, top_k in ((30, 5), (259, 50), (259, 259)):
        scores = torch.randn(8, vocab, generator=generator) * 3
        scores[1, 3] = nan
        scores[2, torch.randperm(vocab, generator=generator)[:3]] = nan
        scores[3, : top_k + 2] = nan  # more NaN than top-k keeps
        scores[4] = nan
        scores[5, 0], scores[5, 1], scores[5, 2] = nan, inf, -inf
        top_k_warper, top_p_warper = TopKLogitsWarper(top_k), TopPLogitsWarper(0.8)
        expected = top_p_warper(None, top_k_warper(None, scores.clone()))
        handed_rows = []
        hf_call = TopPLogitsWarper.__call__

        def recording(self, input_ids, rows_scores):
            handed_rows.append(rows_scores.shape[0])
            return hf_call(self, input_ids, rows_scores)

        monkeypatch.setattr(TopPLogitsWarper, "__call__", recording)
        fused = TopKTopP(top_k_warper, top_p_warper)(None, scores.clone())
        monkeypatch.setattr(TopPLogitsWarper, "__call__", hf_call)
        assert torch.equal(_bits(fused), _bits(expected)), (vocab, top_k)
        assert handed_rows == [5], (vocab, top_k, handed_rows)  # rows 1-5 only: rows 0, 6, 7 were fused


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
    """Below FUSE_FROM entries of several rows HF's two warpers run (cheaper there), with the same result."""
    top_k, top_p = TopKLogitsWarper(5), TopPLogitsWarper(0.9)
    scores = torch.randn(2, fused_warpers.FUSE_FROM // 4)
    assert torch.equal(TopKTopP(top_k, top_p)(None, scores), top_p(None, top_k(None, scores)))


def _one_row_outcomes(monkeypatch) -> list[bool]:
    """Records, per call of `_one_row_cutoff`, whether it decided the row (True) or deferred it (False)."""
    outcomes: list[bool] = []
    decide = TopKTopP._one_row_cutoff

    def recording(self, row):
        cutoff = decide(self, row)
        outcomes.append(cutoff is not None)
        return cutoff

    monkeypatch.setattr(TopKTopP, "_one_row_cutoff", recording)
    return outcomes


@pytest.mark.parametrize("split", ["sort", "partition"])
@pytest.mark.parametrize("kind", KINDS)
def test_one_row_bitwise_equal_to_hf(monkeypatch, kind, split):
    """A single float32 row (a draft step at batch 1) is decided by scalar steps, whatever its size, with
    HF's bits; the rows it defers (ties, non-finite peaks) go to the multi-row pass, also with HF's bits."""
    monkeypatch.setattr(fused_warpers, "PARTITION_FROM", 0 if split == "partition" else 10**9)
    outcomes = _one_row_outcomes(monkeypatch)
    generator = torch.Generator().manual_seed(hash((kind, split, "one row")) % 2**31)
    for vocab in (1, 2, 7, 64, 259, 3000):
        for top_k in (1, 3, 50, vocab, vocab + 4):
            for top_p in (0.0, 0.3, 0.9, 0.99, 1.0):
                for keep in (1, 2, 5, 300):
                    for row in _scores(kind, 6, vocab, generator):
                        scores = row[None].clone()
                        top_k_warper = TopKLogitsWarper(top_k, min_tokens_to_keep=keep)
                        top_p_warper = TopPLogitsWarper(top_p, min_tokens_to_keep=keep)
                        expected = top_p_warper(None, top_k_warper(None, scores.clone()))
                        for in_place in (False, True):
                            given = scores.clone()
                            fused = TopKTopP(top_k_warper, top_p_warper).apply(None, given, in_place=in_place)
                            assert torch.equal(_bits(fused), _bits(expected)), (vocab, top_k, top_p, keep)
                            assert (fused is given) == in_place
    assert len(outcomes) == 2 * 6 * 5 * 5 * 4 * 6
    assert outcomes.count(True) > len(outcomes) // 4  # the scalar steps decide (not only defer)


def test_one_row_decisions_at_the_threshold_equal_hf(monkeypatch):
    """Single rows whose top-p cut torch's rounding decides are deferred (and then decided by torch's own
    float32 arithmetic): without the margin the scalar steps would decide some of them otherwise."""
    generator = torch.Generator().manual_seed(11)
    calls = [(scores[:1].clone(), top_k, top_p) for scores, top_k, top_p in _near_threshold_calls(generator, 300)]
    expected = [top_p(None, top_k(None, scores)) for scores, top_k, top_p in calls]
    disagreements, margin = {}, fused_warpers.ERROR_PER_TERM
    for per_term in (margin, 0):
        monkeypatch.setattr(fused_warpers, "ERROR_PER_TERM", per_term)
        outcomes = _one_row_outcomes(monkeypatch)
        disagreements[per_term] = sum(
            not torch.equal(_bits(TopKTopP(top_k, top_p)(None, scores.clone())), _bits(want))
            for (scores, top_k, top_p), want in zip(calls, expected)
        )
        if per_term:
            assert outcomes.count(False) > 10  # rows at the threshold were deferred
    assert disagreements[margin] == 0
    assert disagreements[0] > 10


def _near_threshold_calls(generator: torch.Generator, calls: int):
    """(scores [8, 300], top-k warper, top-p warper) whose top_p puts 1 - top_p at (float64) one of row 0's
    cumulative probabilities after top-k: where torch's float32 rounding decides the cut."""
    vocab = 300
    for call in range(calls):
        top_k = 50 if call % 2 else vocab
        scores = torch.randn(8, vocab, generator=generator) * 2
        kept = torch.sort(torch.topk(scores[0], top_k).values)[0].double()
        cumulative = torch.softmax(kept, 0).cumsum(0)
        position = int(torch.randint(0, top_k - 1, (1,), generator=generator))
        top_p = 1 - float(cumulative[position])
        if 0 < top_p < 1:
            yield scores, TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)


def test_decisions_at_the_threshold_equal_hf(monkeypatch):
    """Rows whose cut torch's rounding decides are decided by torch's own float32 softmax and cumulative
    sum on the rebuilt sorted row, bitwise as HF's warpers decide them and without HF's sort; without the
    error margin the float64 decision disagrees with torch's on many of these calls (the check has teeth)."""
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)
    disagreements, margin = {}, fused_warpers.ERROR_PER_TERM
    hf_sorts = []
    hf_call = TopPLogitsWarper.__call__

    def recording(self, input_ids, rows_scores):
        hf_sorts.append(rows_scores.shape[0])
        return hf_call(self, input_ids, rows_scores)

    for per_term in (margin, 0):
        monkeypatch.setattr(fused_warpers, "ERROR_PER_TERM", per_term)
        generator = torch.Generator().manual_seed(7)
        outcomes = []
        for scores, top_k, top_p in _near_threshold_calls(generator, 300):
            expected = top_p(None, top_k(None, scores))
            monkeypatch.setattr(TopPLogitsWarper, "__call__", recording)
            fused = TopKTopP(top_k, top_p)(None, scores.clone())
            monkeypatch.setattr(TopPLogitsWarper, "__call__", hf_call)
            outcomes.append(torch.equal(_bits(fused), _bits(expected)))
        disagreements[per_term] = outcomes.count(False)
    assert disagreements[margin] == 0
    assert disagreements[0] > 10
    assert hf_sorts == []  # (random scores: no tie at any cut)


def test_rows_inside_the_margin_are_decided_by_torch_not_by_float64(monkeypatch):
    """The rows inside the margin take torch's float32 decision: deciding them in float64 instead (the
    margin's certainty skipped) gives other scores on many near-threshold calls."""
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)

    def float64_decision(self, tail, lead, span):
        cumulative = np.cumsum(np.exp(tail.astype(np.float64) - tail[:, -1:]), axis=1)
        return (cumulative[:, :span] <= (1 - self.top_p.top_p) * cumulative[:, -1:]).sum(axis=1)

    generator = torch.Generator().manual_seed(7)
    calls = list(_near_threshold_calls(generator, 300))
    expected = [top_p(None, top_k(None, scores)) for scores, top_k, top_p in calls]
    monkeypatch.setattr(TopKTopP, "_removed_by_torch", float64_decision)
    disagreements = sum(
        not torch.equal(_bits(TopKTopP(top_k, top_p)(None, scores.clone())), _bits(want))
        for (scores, top_k, top_p), want in zip(calls, expected)
    )
    assert disagreements > 10


@pytest.mark.parametrize("kind", ["normal", "flat", "wide", "two_level", "offset"])
@pytest.mark.parametrize("vocab", [2, 7, 50, 300, 4096])
def test_torch_cumulative_softmax_stays_within_the_bound(kind, vocab):
    """The margin is a bound on torch's float32 cumulative softmax error on this build: measured against
    float64 on sorted rows of every shape of score the pass sees."""
    generator = torch.Generator().manual_seed(vocab)
    noise = torch.randn(64, vocab, generator=generator)
    scores = {
        "normal": noise * 3,
        "flat": torch.rand(64, vocab, generator=generator) * 1e-3,
        "wide": noise * 30,
        "two_level": (noise > 0).float() * 0.7 + noise * 1e-4,
        "offset": noise * 3 + 1e4,
    }[kind]
    ascending = torch.sort(scores)[0]
    torch_cumulative = ascending.softmax(-1).cumsum(-1).double().numpy()
    exact = ascending.double().numpy()
    terms = np.exp(exact - exact[:, -1:])
    exact_cumulative = np.cumsum(terms, axis=1) / terms.sum(axis=1, keepdims=True)
    assert np.abs(torch_cumulative - exact_cumulative).max() <= fused_warpers._cumulative_error(vocab)


@pytest.mark.parametrize("kind", KINDS)
def test_a_large_vocabulary_equals_hf(kind):
    """A real model's vocabulary (partitioned, not sorted whole), ties at the K-th largest included."""
    assert 151936 >= fused_warpers.PARTITION_FROM
    generator = torch.Generator().manual_seed(3)
    for top_k, top_p in ((50, 0.9), (20, 0.8), (1, 0.5), (151936, 0.95)):
        top_k_warper, top_p_warper = TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)
        scores = _scores(kind, 3, 151936, generator) * 4
        scores[1, :1000] = scores[1, 5]  # ties of one score, wherever it falls
        expected = top_p_warper(None, top_k_warper(None, scores.clone()))
        assert torch.equal(_bits(TopKTopP(top_k_warper, top_p_warper)(None, scores.clone())), _bits(expected)), top_k


def test_large_vocabularies_are_partitioned_not_sorted(monkeypatch):
    """From PARTITION_FROM entries per row no row is sorted whole (the cost the partition saves)."""
    top_k, top_p = TopKLogitsWarper(50), TopPLogitsWarper(0.9)
    scores = torch.randn(4, fused_warpers.PARTITION_FROM, generator=torch.Generator().manual_seed(5)) * 3
    expected = top_p(None, top_k(None, scores))
    sort = np.sort

    def sort_short_rows_only(values, *args, **kwargs):
        assert values.shape[-1] <= 50, "a whole row was sorted"
        return sort(values, *args, **kwargs)

    monkeypatch.setattr(fused_warpers.np, "sort", sort_short_rows_only)
    assert torch.equal(_bits(TopKTopP(top_k, top_p)(None, scores)), _bits(expected))


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


@pytest.mark.parametrize("split", ["sort", "partition"])
def test_in_place_writes_into_the_scores_with_the_same_bits(monkeypatch, split):
    """`apply(in_place=True)` returns the scores tensor itself holding what the call returns, handed rows
    (a tie at the cut, a NaN row) included."""
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)
    monkeypatch.setattr(fused_warpers, "PARTITION_FROM", 0 if split == "partition" else 10**9)
    generator = torch.Generator().manual_seed(11)
    scores = torch.randn(6, 259, generator=generator) * 3
    scores[2] = torch.randint(-3, 3, (259,), generator=generator).float()  # ties at the cut
    scores[4, 7] = float("nan")
    pair = TopKTopP(TopKLogitsWarper(50), TopPLogitsWarper(0.9))
    expected = pair(None, scores.clone())
    mine = scores.clone()
    out = pair.apply(None, mine, in_place=True)
    assert out is mine
    assert torch.equal(_bits(out), _bits(expected))

