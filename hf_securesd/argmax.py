"""`torch.argmax` over the vocabulary, exact and several times faster on a CPU.

On a CPU, float32 and float64 logits of at least `NUMPY_FROM` entries (below, torch's fixed cost is
the lower) are reduced by NumPy's `argmax` (vectorised, with a small fixed cost: 5-7x cheaper than
torch's at the tiny pair's [32, 6, 259], ~1.3x cheaper than the split below at [16, 1, 151936] on one
thread) when torch runs one thread or the tensor is below `NUMPY_BELOW` entries; NumPy reduces on one thread, and on several threads torch's split below is the
faster one for large tensors. NumPy's index is `torch.argmax`'s: both take the first maximal entry,
and both treat NaN as the maximum and take the first NaN (the tests check both).

Otherwise (float16, bfloat16, or a large tensor on several threads):

A CPU `argmax` walks a row one entry at a time (~2.5 ns per entry here: 2.5 ms for 6 rows of a
151,936-token vocabulary), while `amax` is vectorised (~10x faster). With the vocabulary split into
C chunks of c entries (V = C * c, c a divisor of V), the first maximal entry of a row lies in its
first chunk whose maximum is the row's maximum, so

    argmax(row) = c * argmax(chunk maxima) + argmax(that chunk)

reads every entry once with `amax` and only C + c entries with `argmax`. It is the same index
`torch.argmax` returns, ties included (both take the first maximal entry), and with NaN (`amax`
propagates a NaN to its chunk's maximum, and `argmax` takes the first NaN as the maximum at both
levels, as it does over the whole row). Non-contiguous tensors and vocabularies with no divisor in a
useful range are reduced whole; non-CPU tensors (where argmax is a parallel kernel) go to
`torch.argmax` unchanged.

Below `SPLIT_FROM` entries per row the split costs more operations than it saves; there a CPU
reduction of at least `MAX_FROM_ROWS` rows uses `torch.max(dim)`, whose index is `argmax`'s (both are
documented to take the first maximal entry; both take the first NaN, which the tests check) at ~0.6x
its cost on many rows.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

NUMPY_FROM = 512  # entries from which NumPy's argmax (with its conversions) costs less than torch's
NUMPY_BELOW = 1 << 23  # entries below which NumPy's one-thread argmax beats torch's on several threads
_NUMPY_DTYPES = (torch.float32, torch.float64)
SPLIT_FROM = 16384  # vocabulary size from which the two-level pass pays (below, a few more ops cost more)
MAX_FROM_ROWS = 8  # rows from which `torch.max(dim)` is cheaper than `torch.argmax` on a CPU
_CHUNK_RANGE = (64, 4096)  # chunk sizes worth a vectorised inner reduction and a short second argmax


@lru_cache(maxsize=64)
def chunk_size(vocab: int) -> int | None:
    """The divisor c of `vocab` within `_CHUNK_RANGE` that minimises C + c (C = vocab / c), or None."""
    low, high = _CHUNK_RANGE
    best = None
    for size in range(low, min(high, vocab - 1) + 1):
        if vocab % size == 0 and (best is None or vocab // size + size < vocab // best + best):
            best = size
    return best


def vocab_argmax(values: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """`values.argmax(dim=-1, keepdim=keepdim)` for values [..., V]: long [...] (or [..., 1])."""
    if not values.is_cpu:
        return values.argmax(dim=-1, keepdim=keepdim)
    entries = values.numel()
    if values.dtype in _NUMPY_DTYPES and entries >= NUMPY_FROM and (
        entries < NUMPY_BELOW or torch.get_num_threads() == 1
    ):
        return _numpy_argmax(values, keepdim)
    vocab = values.shape[-1]
    size = chunk_size(vocab) if vocab >= SPLIT_FROM else None
    if size is None or not values.is_contiguous() or values.numel() == 0:
        return _first_maximum(values, keepdim)
    lead = values.shape[:-1]
    chunks = values.view(-1, vocab // size, size)  # [R, C, c]
    best_chunk = _first_maximum(chunks.amax(dim=-1), keepdim=True)  # [R, 1]
    inside = _first_maximum(chunks.gather(1, best_chunk[:, :, None].expand(-1, 1, size)), keepdim=False)  # [R, 1]
    index = best_chunk * size + inside
    return index.view(*lead, 1) if keepdim else index.view(lead)


def host_argmax(values: torch.Tensor) -> np.ndarray:
    """`vocab_argmax(values)` for a CPU tensor [..., V], as a NumPy int array [...] (no torch tensor is
    built where NumPy reduces it). NumPy reduces float32/float64 tensors of any size up to `NUMPY_BELOW`
    (or any size on one thread): with no tensor to build from its answer, its fixed cost is the lower
    one even below `NUMPY_FROM`."""
    if values.dtype in _NUMPY_DTYPES and (values.numel() < NUMPY_BELOW or torch.get_num_threads() == 1):
        return _as_numpy(values).argmax(axis=-1)
    return vocab_argmax(values).numpy()


def _as_numpy(values: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a NumPy array (detached only when it has a graph: one call fewer in the
    common case, where each small call counts)."""
    return (values.detach() if values.requires_grad else values).numpy()


def _numpy_argmax(values: torch.Tensor, keepdim: bool) -> torch.Tensor:
    """NumPy's argmax over the last dim of a float32/float64 CPU tensor [..., V] -> long [...]."""
    index = torch.from_numpy(np.asarray(_as_numpy(values).argmax(axis=-1, keepdims=keepdim)))  # 1-D: a scalar
    return index if index.dtype == torch.long else index.long()


def _first_maximum(values: torch.Tensor, keepdim: bool) -> torch.Tensor:
    """The first maximal entry's index along the last dim of a CPU tensor [..., n] (n > 0)."""
    if values.numel() >= MAX_FROM_ROWS * values.shape[-1] > 0:
        return torch.max(values, dim=-1, keepdim=keepdim).indices
    return values.argmax(dim=-1, keepdim=keepdim)


def vocab_top_two(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(v1, v2) [..., 1] long for values [..., V >= 2]: v1 = `vocab_argmax` (torch's argmax index) and v2
    = the argmax once v1 is set aside, `values.scatter(-1, v1, -inf).argmax(-1)`, equal to that
    reference, ties and NaN included.

    On a CPU, for contiguous values whose vocabulary splits into chunks (`chunk_size`, from `SPLIT_FROM`
    entries), both come from one vectorised pass (the chunk maxima, as in the module doc) and no [..., V]
    copy is made: v1 is read from its chunk; that chunk, re-read with v1 set to -inf, replaces its
    maximum among the chunk maxima, whose first maximum is then v2's chunk (its first maximal entry is
    v2, by the module doc's argument applied to the tensor with v1 set aside). Elsewhere, the reference
    itself."""
    vocab = values.shape[-1]
    size = chunk_size(vocab) if values.is_cpu and vocab >= SPLIT_FROM else None
    if size is None or not values.is_contiguous() or values.numel() == 0:
        v1 = vocab_argmax(values, keepdim=True)
        return v1, vocab_argmax(values.scatter(-1, v1, float("-inf")), keepdim=True)
    lead = values.shape[:-1]
    chunks = values.view(-1, vocab // size, size)  # [R, C, c]
    maxima = chunks.amax(dim=-1)  # [R, C] (a new tensor: changed below)
    first_chunk = _first_maximum(maxima, keepdim=True)  # [R, 1]
    home = chunks.gather(1, first_chunk[:, :, None].expand(-1, 1, size))[:, 0]  # [R, c] a copy of v1's chunk
    inside = _first_maximum(home, keepdim=True)  # [R, 1]
    v1 = first_chunk * size + inside
    home.scatter_(1, inside, float("-inf"))  # v1 set aside
    maxima.scatter_(1, first_chunk, home.amax(dim=-1, keepdim=True))
    second_chunk = _first_maximum(maxima, keepdim=True)  # [R, 1]
    other = chunks.gather(1, second_chunk[:, :, None].expand(-1, 1, size))[:, 0]  # [R, c]
    other = torch.where(second_chunk == first_chunk, home, other)
    v2 = second_chunk * size + _first_maximum(other, keepdim=True)
    return v1.view(*lead, 1), v2.view(*lead, 1)
