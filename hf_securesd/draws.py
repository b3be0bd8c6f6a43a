"""One token per row from a categorical distribution, by the inverse of its cumulative distribution.

`torch.multinomial` on a CPU costs about 10 us per row (it validates and normalises every row on its
own); a speculative round draws B tokens per draft step and B more at verification. Here every row is
drawn at once: one uniform u in [0, 1) per row (float64, from the row's own generator when given),
and the token is the first index whose normalised cumulative probability exceeds u. The cumulative
sums are taken in float64, so each token's probability is its share of the row's total to within
float64 rounding; a token of probability 0 is never drawn (its cumulative value equals its
predecessor's, so a smaller index is found first).

Every row must have a positive, finite total: the callers guarantee it without a check here, which would
cost a read on the host at every draft step. Drafting draws from scores `prefixes.usable_scores` made
safe, and verification from q (checked where it is computed, `RoundInputs.target_probs`) or from a
recovery distribution that falls back to q wherever it has no mass.
"""

from __future__ import annotations

from typing import Sequence

import torch


def draw_rows(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None] | None = None
) -> torch.Tensor:
    """probs [N, V] non-negative weights (rows need not sum to 1; each needs a positive, finite total, which
    the caller guarantees: see the module doc) -> [N] long, one token per row drawn with probability
    probs[n, v] / probs[n].sum().

    generators: None draws every row's uniform from torch's global generator (one call for all rows);
    otherwise one generator (or None: the global one) per row, row n's uniform from generators[n], so a
    row's token does not depend on the other rows."""
    rows = probs.shape[0]
    cumulative = probs.double().cumsum(dim=-1)
    cumulative = cumulative / cumulative[:, -1:]
    if generators is None:
        uniforms = torch.rand(rows, 1, dtype=torch.float64, device=probs.device)
    else:
        if len(generators) != rows:
            raise ValueError(f"draw_rows got {len(generators)} generators for {rows} rows; pass one per row")
        uniforms = torch.cat([
            torch.rand(1, dtype=torch.float64, device=probs.device, generator=generator)
            for generator in generators
        ])[:, None]
    # The last normalised value is 1 > u, so an index below V is always found.
    return torch.searchsorted(cumulative, uniforms, right=True)[:, 0]
