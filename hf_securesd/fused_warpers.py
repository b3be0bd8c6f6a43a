"""HF's top-k followed by top-p in one pass without a vocabulary sort, bitwise equal to the two warpers.

`TopPLogitsWarper` sorts every row of the vocabulary (`torch.sort`, 10-15 us per row of a few hundred
scores on a CPU, milliseconds for a 150k vocabulary) and `TopKLogitsWarper` runs `torch.topk`: a
speculative round filters B*(k+1) target rows and B rows per draft step, so the two warpers dominate a
round's host time. Here the pair runs on the CPU scores through NumPy:

* top-k: `np.sort` (NumPy's vectorised float sort, cheaper on a CPU than `torch.topk` or a partition
  for vocabularies of a few thousand) orders each row, or, from `PARTITION_FROM` entries per row,
  `np.partition` splits it at the K-th largest and only the K largest are sorted; the K-th largest is
  a value, and a score is removed exactly when it is below it, as in `TopKLogitsWarper`.
* top-p: after top-k a row sorted ascending is [-inf (V - m times), kth (m - K times), the K largest
  ascending] (m: the scores >= kth), read from the sorted row's last m entries. `TopPLogitsWarper` removes the
  sorted positions whose float32 cumulative softmax is <= 1 - top_p (its threshold, a Python float,
  meets the float32 tensor as a float32). Here the cumulative softmax is computed in float64 and a row
  is decided only when every decision is certain: torch's float32 value differs from the exact one by
  less than `_cumulative_error` (each rounding of the softmax's shift, exponential, sum and division
  and of the cumulative sum, bounded per finite score; -inf scores add exact zeros), so a float64 value
  farther than that from the threshold decides as torch does. The removed positions are a prefix of
  the sorted row (the cumulative sum of non-negative terms never decreases), so when the last removed
  and the first kept value differ, the removed tokens are exactly the scores <= the last removed value,
  whatever order a sort puts ties in.
* A row with a cumulative value inside that margin is decided by torch's own float32 computation: the
  row is rebuilt as `TopPLogitsWarper` sorts it (-inf entries, then the tail: the same values at the
  same positions), and torch's softmax and cumulative sum on it are the warper's, bit for bit (a row's
  result depends only on the row). No sort is needed for it.
* A tie straddling the cut (where `torch.sort`'s unstable order decides which tied token goes) or a
  non-finite maximum is handed to HF's two warpers, which sort the row. A row holding NaN is one of
  them: NumPy sorts and partitions NaN as the largest value, so the row's maximum is NaN.

A single CPU float32 row [1, V] (a draft step at batch 1) takes the same steps as scalars
(`TopKTopP._one_row_cutoff`: one sort or partition, the float64 cumulative sum, two binary searches for the
margin's counts), and goes to the multi-row pass where that defers it (ties at the K-th largest or at the
cut, a non-finite peak, a value inside the margin). Measured inside the `generate` loop's conditions (a
draft forward between calls), 15-20 % cheaper than the multi-row pass or HF's warpers for one row.

Scores that are not CPU float32 [N, V] tensors, small calls of several rows (where HF's warpers are cheaper
than this pass) and filter values other than -inf go to HF's warpers unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

NEG_INF = np.float32(-np.inf)
FUSE_FROM = 2048  # scores entries (rows x vocabulary) from which the NumPy pass is used (measured in the loop)
PARTITION_FROM = 2048  # vocabulary size from which partitioning each row beats sorting it whole
UNIT = 2.0**-24  # float32's unit roundoff
ERROR_PER_TERM = 4  # the bound on torch's cumulative-softmax error, in units per finite score


class TopKTopP:
    """`top_p(top_k(scores))` for two HF warpers with the default filter value (-inf).

    Called like a logits processor: input_ids [N, L] (unread but for the rows handed to HF's warpers),
    scores [N, V] -> [N, V], bitwise equal to calling the two warpers one after the other (see the module
    docstring)."""

    def __init__(self, top_k: TopKLogitsWarper, top_p: TopPLogitsWarper) -> None:
        if not fusable(top_k, top_p):
            raise ValueError(
                "TopKTopP fuses a TopKLogitsWarper and a TopPLogitsWarper whose filter_value is -inf"
            )
        self.top_k, self.top_p = top_k, top_p

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        return self.apply(input_ids, scores, in_place=False)

    def apply(self, input_ids: torch.Tensor | None, scores: torch.Tensor, in_place: bool) -> torch.Tensor:
        """The call, with in_place=True when `scores` is a temporary nobody else reads (a processor's new
        output): the removed scores are then written into it (returned) instead of into a copy."""
        if _one_cpu_row(scores):
            values = scores.numpy()
            cutoff = self._one_row_cutoff(values[0])
            if cutoff is not None:
                return _removed_below(scores, values, cutoff, in_place)
        elif not _worth_fusing(scores):
            return self.top_p(input_ids, self.top_k(input_ids, scores))
        values = scores.numpy()
        vocab = values.shape[1]
        k = min(self.top_k.top_k, vocab)
        tail, kth, start = _top_tail(values, k)
        cutoff, handed = self._cut(tail, kth, vocab, lead=start)
        originals = None
        if handed.size:
            rows = torch.from_numpy(handed)
            originals = scores[rows]  # before any score is removed
        # One pass for both warpers: top-k removes the scores < kth, top-p those <= its last removed value;
        # no score of a row lies between that value and the first kept one, so both remove exactly the
        # scores < `cutoff`.
        out = _removed_below(scores, values, cutoff, in_place)
        if originals is not None:
            own_ids = input_ids[rows] if input_ids is not None and input_ids.shape[0] == len(values) else input_ids
            out[rows] = self.top_p(own_ids, self.top_k(own_ids, originals))
        return out

    def _one_row_cutoff(self, row: np.ndarray) -> np.float32 | None:
        """The cutoff of one row [V] (the two warpers remove exactly the scores below it) by the multi-row
        pass's rule with scalar steps, a third of its fixed cost (a draft step at batch 1 filters one row).
        None where the row needs that pass: ties at the K-th largest beyond the K, a non-finite peak, a
        cumulative value inside the margin, or a tie straddling the cut."""
        vocab = row.shape[0]
        k = min(self.top_k.top_k, vocab)
        lead = vocab - k  # sorted positions below the K largest
        if vocab < PARTITION_FROM or not lead:
            ordered = np.sort(row)
            top, largest_rest = ordered[lead:], ordered[lead - 1] if lead else None
        else:
            split = np.partition(row, lead)
            top, largest_rest = np.sort(split[lead:]), split[:lead].max()
        kth, peak = top[0], top[-1]
        if (lead and largest_rest == kth) or not np.isfinite(peak):
            return None
        cumulative = np.subtract(top, peak, dtype=np.float64)  # [K] <= 0: no overflow, -inf -> exact zeros
        np.exp(cumulative, out=cumulative)
        np.add.accumulate(cumulative, out=cumulative)
        total = float(cumulative[-1])
        limit = float(np.float32(1 - self.top_p.top_p)) * total
        margin = _cumulative_error(k) * total
        removable = max(vocab - self.top_p.min_tokens_to_keep, 0)
        span = cumulative[: max(removable - lead, 0)]  # non-decreasing: counts by binary search
        surely_removed = int(np.searchsorted(span, limit - margin, side="left"))
        removed = int(np.searchsorted(span, limit + margin, side="right"))
        if removed != surely_removed:
            return None
        in_top = removed + (min(lead, removable) - lead)
        if in_top <= 0:  # top-p removes nothing top-k keeps
            return kth
        if top[in_top - 1] == top[in_top]:
            return None
        return top[in_top]

    def _cut(self, tail: np.ndarray, kth: np.ndarray, vocab: int, lead: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-p of rows of `vocab` scores after top-k, from the last vocab - lead entries of each row
        sorted ascending (tail [N, vocab - lead]; each sorted row's first lead entries are -inf) and the
        K-th largest kth [N, 1] -> (cutoff [N, 1] float32: the two warpers remove exactly the scores below
        it; the [H] rows that are not decided here: see the module docstring)."""
        width = tail.shape[1]
        with np.errstate(invalid="ignore", over="ignore"):
            cumulative = np.subtract(tail, tail[:, -1:], dtype=np.float64)  # shifted by the row's peak
            np.exp(cumulative, out=cumulative)  # exact zeros for -inf
            np.add.accumulate(cumulative, axis=1, out=cumulative)  # float64, unnormalised (cumsum without its wrapper)
        total = cumulative[:, -1:]
        threshold = float(np.float32(1 - self.top_p.top_p))
        # Sorted positions < lead hold -inf: probability 0 in torch too, cumulative 0 <= threshold (removed).
        removable = max(vocab - self.top_p.min_tokens_to_keep, 0)  # the last min_tokens_to_keep stay
        # cumulative / total <= threshold, decided as cumulative <= threshold * total (float64 rounding differs
        # from the division's only far inside the margin). A row's cumulative never decreases, so the entries
        # below any value form a prefix and counting them locates the cut: a row is certain when no entry
        # lies within the margin of threshold * total, and then both counts are its removed entries.
        span = cumulative[:, : max(removable - lead, 0)]  # the tail entries top-p may remove
        limit, margin = threshold * total, _cumulative_error(width) * total
        surely_removed = (span < limit - margin).sum(axis=1)
        maybe_removed = (span <= limit + margin).sum(axis=1)
        # A NaN or infinite peak makes the total NaN (NaN - x, inf - inf): those rows go to HF's warpers.
        finite = ~np.isnan(total[:, 0])
        unsure = np.flatnonzero((maybe_removed != surely_removed) & finite)
        if unsure.size:
            maybe_removed[unsure] = self._removed_by_torch(tail[unsure], lead, span.shape[1])
        # [N] removed entries of the tail (a sorted prefix; < width: min_tokens_to_keep >= 1)
        in_tail = maybe_removed + (min(lead, removable) - lead)
        # The last removed and the first kept entry of each row (both the first entry where none is removed).
        pair = tail[_row_numbers(len(tail)), np.maximum(in_tail[:, None] + _LAST_AND_NEXT, 0)]
        # A tie straddling the cut: torch's sort order decides which tied token goes (HF's warpers do).
        straddles = (in_tail > 0) & (pair[:, 0] == pair[:, 1])
        handed = (straddles | ~finite).nonzero()[0]
        # The first kept entry is >= kth unless the row removes nothing in the tail (then kth decides).
        return np.maximum(pair[:, 1:], kth), handed

    def _removed_by_torch(self, tail: np.ndarray, lead: int, span: int) -> np.ndarray:
        """The entries of tail [H, width] (rows sorted ascending after `lead` -inf entries) among its first
        `span` that `TopPLogitsWarper` removes -> [H] intp, decided by its own float32 computation: the
        rows are rebuilt as it sorts them (the same values at the same positions, so the same softmax and
        cumulative sum bit for bit) and compared with its threshold as it compares them."""
        rebuilt = np.full((len(tail), lead + tail.shape[1]), NEG_INF, dtype=np.float32)
        rebuilt[:, lead:] = tail
        cumulative = torch.from_numpy(rebuilt).softmax(dim=-1).cumsum(dim=-1)  # [H, V] as the warper's
        removed = cumulative[:, lead : lead + span] <= (1 - self.top_p.top_p)
        return removed.sum(dim=1).numpy()


_LAST_AND_NEXT = np.array([[-1, 0]])  # offsets of the last removed and the first kept sorted entry


def _removed_below(scores: torch.Tensor, values: np.ndarray, cutoff: np.ndarray | np.float32, in_place: bool) -> torch.Tensor:
    """scores [N, V] (values: their NumPy view) with every entry below its row's cutoff ([N, 1], or one value
    for one row) set to -inf: written into `scores` when in_place, else into a copy."""
    kept = values if in_place else values.copy()
    np.putmask(kept, values < cutoff, NEG_INF)  # (np.copyto with where= is ~1.5x slower)
    return scores if in_place else torch.from_numpy(kept)


def _row_numbers(rows: int) -> np.ndarray:
    """[rows, 1] intp 0 .. rows - 1: the row index that pairs with per-row column indices."""
    return np.arange(rows)[:, None]


def _top_tail(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The end of each row of values [N, V] sorted ascending that top-k leaves to top-p.

    -> (tail [N, k + width] ascending: the K-th largest's ties beyond the K largest (rows with fewer
    than `width` of them start with -inf, as top-k leaves what is below), then the K largest; kth
    [N, 1] the K-th largest; start = V - k - width, the sorted position where the tail begins).

    Below PARTITION_FROM entries per row one vectorised sort of the whole row is the cheaper; from it
    on, `np.partition` splits each row at the K-th largest and only the K largest are sorted (the ties
    are counted in the unsorted rest: the same tail, 2-3x cheaper at a 150k vocabulary)."""
    rows, vocab = values.shape
    lead = vocab - k  # sorted positions below the K largest
    if not lead:  # top-k keeps every score
        ordered = np.sort(values, axis=1)
        return ordered, ordered[:, :1], 0
    if vocab < PARTITION_FROM:
        ordered = np.sort(values, axis=1)  # [N, V] ascending
        kth = ordered[:, lead, None]  # [N, 1] the K-th largest
        top, rest = ordered[:, lead:], ordered[:, :lead]
        largest_rest = rest[:, -1]
    else:
        split = np.partition(values, lead, axis=1)  # [N, V]: the K largest from position `lead` on
        kth = split[:, lead, None]
        top, rest = np.sort(split[:, lead:], axis=1), split[:, :lead]
        largest_rest = rest.max(axis=1)
    tied = largest_rest == kth[:, 0]  # [N] rows where kth has ties beyond the K (counted only there)
    if not tied.any():
        return top, kth, lead
    ties = np.zeros(rows, dtype=np.intp)
    tied = np.flatnonzero(tied)
    ties[tied] = np.count_nonzero(rest[tied] == kth[tied], axis=1)
    width = int(ties.max())
    below = np.arange(width)[None] < (width - ties)[:, None]  # [N, width]: -inf where a row has fewer ties
    filler = np.where(below, NEG_INF, np.broadcast_to(kth, (rows, width)))
    return np.concatenate([filler, top], axis=1), kth, lead - width


def _cumulative_error(finite: int) -> float:
    """A bound on |torch's float32 cumulative softmax - the exact one| for rows of at most `finite`
    finite scores (the other terms are exact zeros), u = 2**-24: each probability carries the roundings
    of its shift (|x - max| u relative, and |x - max| e^(x - max) <= 1/e per term), its exponential (a
    few u), the sum (finite u) and the division (2 u); the cumulative sum adds finite u: below
    (2.4 finite + 8) u in all. ERROR_PER_TERM * (finite + 16) u leaves room."""
    return ERROR_PER_TERM * (finite + 16) * UNIT


def _worth_fusing(scores: torch.Tensor) -> bool:
    """The NumPy pass pays off for contiguous CPU float32 scores [N, V] from FUSE_FROM entries on (below,
    HF's sort of a few short rows is cheaper than the pass's fixed cost). Measured per call inside the
    `generate` loop, where caches are cold after each forward: at the tiny pair's 259-token vocabulary the
    pass is cheaper from 9 rows (150 against 160 us), level at 8, dearer below (125 against 85 us at 1)."""
    return (
        scores.device.type == "cpu"
        and scores.dtype == torch.float32
        and scores.dim() == 2
        and scores.numel() >= FUSE_FROM
        and not scores.requires_grad
        and scores.is_contiguous()
    )


def _one_cpu_row(scores: torch.Tensor) -> bool:
    """scores is one contiguous CPU float32 row [1, V] (without autograd): `_one_row_cutoff`'s input."""
    return (
        scores.device.type == "cpu"
        and scores.dtype == torch.float32
        and scores.dim() == 2
        and scores.shape[0] == 1
        and scores.shape[1] > 0
        and not scores.requires_grad
        and scores.is_contiguous()
    )


def fusable(top_k: object, top_p: object) -> bool:
    """True for HF's own TopK then TopP warpers (not subclasses), both filtering with -inf."""
    return (
        type(top_k) is TopKLogitsWarper
        and type(top_p) is TopPLogitsWarper
        and top_k.filter_value == NEG_INF
        and top_p.filter_value == NEG_INF
    )


def fuse_adjacent(
    processors: list, can_fuse: Callable[[object, object], bool], fuse: Callable[[Any, Any], object]
) -> list:
    """The processors with every adjacent pair (a, b) that `can_fuse(a, b)` accepts replaced by `fuse(a, b)`."""
    fused: list = []
    for processor in processors:
        if fused and can_fuse(fused[-1], processor):
            fused[-1] = fuse(fused[-1], processor)
        else:
            fused.append(processor)
    return fused


def fuse_top_k_top_p(processors: list) -> list:
    """The processors with every adjacent (TopKLogitsWarper, TopPLogitsWarper) pair replaced by one
    `TopKTopP` (same outputs, no vocabulary sort)."""
    return fuse_adjacent(processors, fusable, TopKTopP)
