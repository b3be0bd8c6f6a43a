"""HF's top-k followed by top-p in one pass without a vocabulary sort, bitwise equal to the two warpers.

`TopPLogitsWarper` sorts every row of the vocabulary (`torch.sort`), which on a CPU costs about
15 us per row: a speculative round filters B*(k+1) target rows and B rows per draft step, so the sort
dominates a round's host time. After `TopKLogitsWarper` a row holds at most K finite values besides
the ties of its K-th largest score, so the ascending order top-p needs is known from `torch.topk`:

    sorted row = [-inf (V - m times), kth (m - K times), the K largest values ascending]

where kth is the K-th largest score and m the number of scores >= kth (what top-k keeps). Top-p's
cumulative probabilities are computed from exactly that [N, V] row (the same values in the same
places, so `softmax` and `cumsum` give the same bits), and its removed positions are the first
`count` of the sorted row (a CPU `cumsum` of non-negative terms never decreases). When the last
removed and the first kept value differ, the removed tokens are exactly the scores <= the last
removed value, whatever order the sort puts ties in. When they are equal (a tie straddles the cut,
and `torch.sort`'s unstable order decides which tied token goes), the row is handed to HF's two
warpers, which sort it (a row's order depends only on the row). Non-CPU tensors, small calls (where
HF's sort is cheaper than this pass), scores with NaN and filter values other than -inf go to HF's
warpers unchanged.
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

NEG_INF = float("-inf")
FUSE_FROM = 4096  # scores entries (rows x vocabulary) from which the fused pass is used
_AROUND_CUT = torch.tensor([[-1, 0]])  # sorted positions of the last removed and the first kept score


class TopKTopP:
    """`top_p(top_k(scores))` for two HF warpers with the default filter value (-inf).

    Called like a logits processor: input_ids [N, L] (unread), scores [N, V] -> [N, V], bitwise equal to
    calling the two warpers one after the other (see the module docstring)."""

    def __init__(self, top_k: TopKLogitsWarper, top_p: TopPLogitsWarper) -> None:
        if not fusable(top_k, top_p):
            raise ValueError(
                "TopKTopP fuses a TopKLogitsWarper and a TopPLogitsWarper whose filter_value is -inf"
            )
        self.top_k, self.top_p = top_k, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not _worth_fusing(scores):
            return self.top_p(input_ids, self.top_k(input_ids, scores))
        vocab = scores.shape[-1]
        k = min(self.top_k.top_k, vocab)
        largest = torch.topk(scores, min(k + 1, vocab)).values  # [N, K or K+1] descending
        kth = largest[:, k - 1 : k]
        ascending = _sorted_after_top_k(scores, largest, kth, k)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        removed = cumulative <= (1 - self.top_p.top_p)  # exactly TopPLogitsWarper's test
        removed[..., -self.top_p.min_tokens_to_keep :] = 0
        # cumsum of non-negative terms never decreases (NaN, from +inf scores, only at the end), so the
        # removed sorted positions are the first `count`.
        count = removed.sum(dim=-1, keepdim=True)
        around_cut = ascending.gather(1, (count + _AROUND_CUT.to(count.device)).clamp(0, vocab - 1))
        last_removed, first_kept = around_cut[:, :1], around_cut[:, 1:]
        cut = count > 0
        # Removed: score < kth (top-k) or score <= last_removed (top-p), i.e. score < threshold.
        above_last = torch.nextafter(last_removed, torch.full_like(last_removed, float("inf")))
        threshold = torch.where(cut, torch.maximum(kth, above_last), kth)
        out = scores.masked_fill(scores < threshold, NEG_INF)
        ambiguous = cut & (last_removed == first_kept)  # a tie straddles the cut: the sort's order decides
        if bool(ambiguous.any()):
            rows = ambiguous[:, 0].nonzero()[:, 0]
            out[rows] = self.top_p(input_ids, self.top_k(input_ids, scores[rows]))
        return out


def _worth_fusing(scores: torch.Tensor) -> bool:
    """The sort-free pass pays off for CPU scores [N, V] from FUSE_FROM entries on (below, HF's sort of
    a few short rows is cheaper than the pass's fixed cost). A NaN sum flags NaN scores (and, harmlessly,
    rows holding both infinities): those go to HF's warpers."""
    return (
        scores.device.type == "cpu"
        and scores.dim() == 2
        and scores.numel() >= FUSE_FROM
        and not bool(scores.sum().isnan())
    )


def _sorted_after_top_k(
    scores: torch.Tensor, largest: torch.Tensor, kth: torch.Tensor, k: int
) -> torch.Tensor:
    """The top-k output of scores [N, V] sorted ascending, from its largest values [N, K or K+1]
    (descending) and the K-th largest kth [N, 1]: -inf, then the ties of kth beyond the K, then the K
    largest ascending."""
    vocab = scores.shape[-1]
    ascending = torch.full_like(scores, NEG_INF)
    ascending[:, vocab - k :] = largest[:, :k].flip(-1)
    if k < vocab and bool((largest[:, k] == kth[:, 0]).any()):  # ties of kth beyond the K
        kept = (scores >= kth).sum(dim=-1, keepdim=True)
        ties = torch.arange(vocab - k, device=scores.device)[None] >= vocab - kept
        ascending[:, : vocab - k] = torch.where(ties, kth, ascending[:, : vocab - k])
    return ascending


def fusable(top_k: object, top_p: object) -> bool:
    """True for HF's own TopK then TopP warpers (not subclasses), both filtering with -inf."""
    return (
        type(top_k) is TopKLogitsWarper
        and type(top_p) is TopPLogitsWarper
        and top_k.filter_value == NEG_INF
        and top_p.filter_value == NEG_INF
    )


def fuse_top_k_top_p(processors: list) -> list:
    """The processors with every adjacent (TopKLogitsWarper, TopPLogitsWarper) pair replaced by one
    `TopKTopP` (same outputs, no vocabulary sort)."""
    fused: list = []
    for processor in processors:
        if fused and fusable(fused[-1], processor):
            fused[-1] = TopKTopP(fused[-1], processor)
        else:
            fused.append(processor)
    return fused
