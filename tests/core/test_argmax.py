"""`vocab_argmax` returns `torch.argmax`'s index on every input and through each of its routes (NumPy's
argmax, and the torch reductions: the split and `torch.max`): random rows, ties across and within
chunks, infinities and NaNs, every vocabulary layout it splits, small vocabularies, every float dtype
and the inputs it hands to torch. `vocab_top_two` returns its reference (argmax, then argmax with the
first set to -inf) on the same inputs and on runner-ups placed around the maximum's chunk."""

from __future__ import annotations

import pytest
import torch

from hf_securesd import argmax
from hf_securesd.argmax import SPLIT_FROM, chunk_size, vocab_argmax, vocab_top_two


@pytest.fixture(autouse=True, params=["numpy", "torch"])
def route(request, monkeypatch) -> str:
    """Every test runs through NumPy's argmax (float32 on a CPU, from any size) and through the torch
    reductions (NumPy's route switched off)."""
    if request.param == "torch":
        monkeypatch.setattr(argmax, "_NUMPY_DTYPES", ())
    else:
        monkeypatch.setattr(argmax, "NUMPY_FROM", 1)
    return request.param


@pytest.mark.parametrize("vocab", [SPLIT_FROM, 32000, 50257, 151936])
def test_split_vocabularies_give_torchs_index_on_random_rows(vocab: int) -> None:
    assert chunk_size(vocab) is not None
    generator = torch.Generator().manual_seed(vocab)
    values = torch.randn(3, 4, vocab, generator=generator)
    assert torch.equal(vocab_argmax(values), values.argmax(dim=-1))
    assert torch.equal(vocab_argmax(values, keepdim=True), values.argmax(dim=-1, keepdim=True))


def special_rows(vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Rows whose maximum is tied (in one chunk, across chunks, in the first and last entries), infinite
    or NaN, over a background of small integers (many ties below the maximum too)."""
    size = chunk_size(vocab)
    rows = torch.randint(-5, 5, (12, vocab), generator=generator).float()
    picks = torch.randint(0, vocab, (12, 3), generator=generator)
    rows[0, picks[0]] = 9.0  # tied maximum anywhere
    rows[1, [size + 1, size + 2]] = 9.0  # tied inside one chunk
    rows[2, [vocab - 1, 0]] = 9.0  # first and last entries
    rows[3, [3 * size - 1, 3 * size]] = 9.0  # the two sides of a chunk boundary
    rows[4, picks[4, 0]] = float("inf")
    rows[5, picks[5]] = float("inf")
    rows[6, picks[6, 0]] = float("nan")
    rows[7, picks[7]] = float("nan")
    rows[8, picks[8, :2]] = float("nan")
    rows[8, picks[8, 2]] = float("inf")
    rows[9] = float("-inf")
    rows[10, picks[10]] = float("-inf")
    rows[11] = 0.0  # every entry tied
    return rows


@pytest.mark.parametrize("vocab", [SPLIT_FROM, 50257, 151936])
@pytest.mark.parametrize("seed", range(4))
def test_ties_infinities_and_nans_give_torchs_index(vocab: int, seed: int) -> None:
    rows = special_rows(vocab, torch.Generator().manual_seed(seed))
    assert torch.equal(vocab_argmax(rows), rows.argmax(dim=-1))


def test_inputs_it_does_not_split_go_to_torch() -> None:
    generator = torch.Generator().manual_seed(0)
    small = torch.randn(5, 259, generator=generator)
    prime = torch.randn(2, 16411, generator=generator)  # a prime vocabulary has no chunk size
    strided = torch.randn(4, 151936, generator=generator)[::2]
    empty = torch.empty(0, 151936)
    assert chunk_size(16411) is None
    for values in (small, prime, strided, empty):
        assert torch.equal(vocab_argmax(values), values.argmax(dim=-1))


@pytest.mark.parametrize("seed", range(6))
def test_small_vocabularies_with_ties_infinities_and_nans_give_torchs_index(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for rows, vocab in [(1, 259), (7, 259), (8, 259), (192, 259), (40, 3), (64, 16383)]:
        values = torch.randint(-3, 3, (rows, vocab), generator=generator).float()
        marks = torch.rand(rows, vocab, generator=generator)
        values[marks < 0.01] = float("nan")
        values[(marks > 0.5) & (marks < 0.51)] = float("inf")
        values[marks > 0.98] = float("-inf")
        assert torch.equal(vocab_argmax(values), values.argmax(dim=-1))
        assert torch.equal(vocab_argmax(values.view(rows, 1, vocab), keepdim=True), values.argmax(dim=-1, keepdim=True)[:, None])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_every_float_dtype_gives_torchs_index(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    for vocab in (259, 32000):
        values = torch.randint(-3, 3, (6, vocab), generator=generator).to(dtype)
        values[0, 7], values[1, :] = float("nan"), float("-inf")
        values[2, [5, 9]] = float("inf")
        assert torch.equal(vocab_argmax(values), values.argmax(dim=-1))


def test_large_tensors_on_several_threads_take_the_split(monkeypatch) -> None:
    """Above NUMPY_BELOW entries with more than one torch thread the torch split reduces (faster there),
    and gives the same index."""
    monkeypatch.setattr(argmax, "NUMPY_BELOW", 1)
    monkeypatch.setattr(argmax, "_numpy_argmax", None)  # the route must not be taken
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    values = special_rows(32000, torch.Generator().manual_seed(1))
    assert torch.equal(vocab_argmax(values), values.argmax(dim=-1))


def test_a_tensor_that_requires_grad_is_reduced_without_its_graph() -> None:
    values = torch.randn(3, 259, requires_grad=True)
    assert torch.equal(vocab_argmax(values), values.argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 7), (3, 7), (21, 259), (2, 4, 259)])
def test_host_argmax_is_torchs_index_as_a_numpy_array(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    values = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)
    values.view(-1, shape[-1])[0, :3] = float("nan")  # NaN is the maximum, the first one taken
    values.view(-1, shape[-1])[-1, 1:4] = float("inf")  # ties: the first maximal entry
    index = argmax.host_argmax(values)
    assert index.shape == shape[:-1] and index.tolist() == values.argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_host_argmax_of_no_rows_is_an_empty_index(dtype: torch.dtype) -> None:
    index = argmax.host_argmax(torch.empty(0, 259, dtype=dtype))
    assert index.shape == (0,) and index.dtype.kind == "i"


@pytest.mark.parametrize("entries", [511, 512, 151_936])
@pytest.mark.parametrize("keepdim", [False, True])
def test_a_single_row_gives_torchs_index_and_shape(entries: int, keepdim: bool) -> None:
    """A 1-D tensor (one row, [V]): from NUMPY_FROM entries NumPy's answer is a scalar, not an array."""
    values = torch.randn(entries, generator=torch.Generator().manual_seed(entries))
    index, expected = vocab_argmax(values, keepdim=keepdim), values.argmax(dim=-1, keepdim=keepdim)
    assert torch.equal(index, expected) and index.shape == expected.shape and index.dtype == torch.long


def reference_top_two(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(v1, v2) [..., 1] as torch computes them: argmax, then argmax once v1 is set to -inf."""
    v1 = values.argmax(dim=-1, keepdim=True)
    return v1, values.scatter(-1, v1, float("-inf")).argmax(dim=-1, keepdim=True)


def assert_top_two_is_the_reference(values: torch.Tensor) -> None:
    got, expected = vocab_top_two(values), reference_top_two(values)
    for index, reference in zip(got, expected):
        assert index.shape == reference.shape and index.dtype == torch.long
        assert torch.equal(index, reference)


def runner_up_rows(vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Rows whose runner-up sits in the maximum's own chunk (before or after it), in an earlier or later
    chunk, tied with the maximum or below it in several chunks, or is NaN or -inf."""
    size = chunk_size(vocab)
    rows = torch.randn(12, vocab, generator=generator)
    rows[0, [size + 5, size + 2]] = torch.tensor([9.0, 8.0])  # runner-up before the maximum, same chunk
    rows[1, [size + 2, size + 5]] = torch.tensor([9.0, 8.0])  # after it, same chunk
    rows[2, [5 * size, 2]] = torch.tensor([9.0, 8.0])  # in an earlier chunk
    rows[3, [2, 5 * size]] = torch.tensor([9.0, 8.0])  # in a later chunk
    rows[4, [7 * size + 1, 7 * size + 3, size]] = 9.0  # the maximum tied three times
    rows[5, 7] = 9.0
    rows[5, [3 * size, 4 * size, 10]] = 8.0  # the runner-up tied across chunks
    rows[6, [size + 1, size + 4]] = float("nan")  # two NaNs in one chunk
    rows[7, 3 * size] = float("nan")  # one NaN: the runner-up is the largest number
    rows[8] = float("-inf")
    rows[8, 0] = 1.0  # a single finite logit at index 0: v2 = v1
    rows[9] = float("-inf")  # no finite logit
    rows[10] = 0.0  # every entry tied
    rows[11, [vocab - 1, vocab - 2]] = float("inf")  # the last two entries
    return rows


@pytest.mark.parametrize("vocab", [SPLIT_FROM, 32000, 50257, 151936])
@pytest.mark.parametrize("seed", range(3))
def test_top_two_is_the_reference_on_ties_infinities_and_nans(vocab: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    for rows in (special_rows(vocab, generator), runner_up_rows(vocab, generator)):
        assert_top_two_is_the_reference(rows)
        assert_top_two_is_the_reference(rows.view(3, 4, vocab))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_top_two_is_the_reference_in_every_float_dtype(dtype: torch.dtype) -> None:
    rows = runner_up_rows(32000, torch.Generator().manual_seed(5))
    assert_top_two_is_the_reference(torch.cat([rows, torch.randint(-3, 3, (4, 32000)).float()]).to(dtype))


def test_top_two_of_inputs_it_does_not_split_is_the_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    small = torch.randint(-2, 2, (5, 259), generator=generator).float()
    prime = torch.randn(2, 16411, generator=generator)
    strided = runner_up_rows(151936, generator)[::2]
    one_row = torch.randn(151936, generator=generator)
    empty = torch.empty(0, 151936)
    for values in (small, prime, strided, one_row, empty):
        assert_top_two_is_the_reference(values)
