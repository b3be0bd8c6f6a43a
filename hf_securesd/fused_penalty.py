"""HF's repetition penalty followed by its temperature in one pass, bitwise equal to the two processors.

`RepetitionPenaltyLogitsProcessor` pads the scores [N, V] by one column, gathers the scores of the ids,
scatters their penalised values into a copy of the padded scores and returns that copy without the pad
column (a view whose rows are strided); `TemperatureLogitsWarper` then divides the view into a new
tensor. Three vocabulary-sized tensors per call, one of them read strided: in the `generate` loop, where
each is freshly allocated memory after a forward, that is most of the processors' time at a real
vocabulary. Here the division comes first, into the one new tensor, and the penalised entries are
overwritten with the penalty then the temperature applied to the original scores:

    out = scores / T;   g = scores[ids];   out[ids] = where(g < 0, g * penalty, g / penalty) / T

Every entry gets the floating-point operations the two processors apply to it, in the same order (IEEE
multiplication and division are correctly rounded, so neither the layout nor vectorisation changes a
bit), and a repeated id writes the same value each time. A NaN entry stays NaN; in half precision its
sign and payload bits may differ from HF's (they depend on the division kernel, strided or not).

HF's pair runs instead for ids outside [0, V) (HF's penalty drops ids >= V, from an embedding larger than
the output layer), ids that are not [N, L], scores that are not [N, V], a penalty with
`prompt_ignore_length` or continuous-batching indices, and scores off the CPU (where checking the ids
would synchronise with the device).
"""

from __future__ import annotations

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

from .fused_warpers import fuse_adjacent


class PenaltyThenTemperature:
    """`temperature(penalty(input_ids, scores))` for HF's two processors, as one processor.

    Called like a logits processor: input_ids [N, L] long, scores [N, V] -> [N, V] (contiguous), bitwise
    equal to the two calls (see the module docstring). `prompt_ignore_length` is the penalty's, so a
    caller that shows ignored positions as other tokens of the row (`prefixes.RowProcessing`) calls
    `without_ignore_length()` instead."""

    def __init__(self, penalty: RepetitionPenaltyLogitsProcessor, temperature: TemperatureLogitsWarper) -> None:
        if not fusable(penalty, temperature):
            raise ValueError(
                "PenaltyThenTemperature fuses a RepetitionPenaltyLogitsProcessor followed by a "
                "TemperatureLogitsWarper (HF's own classes)"
            )
        self.penalty, self.temperature = penalty, temperature

    @property
    def prompt_ignore_length(self) -> int | torch.Tensor | None:
        return getattr(self.penalty, "prompt_ignore_length", None)

    def without_ignore_length(self) -> PenaltyThenTemperature:
        """The same pair with a penalty that reads every position of the ids."""
        return PenaltyThenTemperature(RepetitionPenaltyLogitsProcessor(self.penalty.penalty), self.temperature)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, ids_in_range: bool | None = None) -> torch.Tensor:
        """ids_in_range: whether every id lies in [0, V) when the caller already knows it (True skips the
        check, False runs HF's pair); None checks here."""
        if not self._fusable_call(input_ids, scores, ids_in_range):
            return self.temperature(input_ids, self.penalty(input_ids, scores))
        penalty, temperature = self.penalty.penalty, self.temperature.temperature
        out = scores / temperature
        chosen = scores.gather(1, input_ids)
        out.scatter_(1, input_ids, torch.where(chosen < 0, chosen * penalty, chosen / penalty) / temperature)
        return out

    def _fusable_call(self, input_ids: torch.Tensor, scores: torch.Tensor, ids_in_range: bool | None) -> bool:
        penalty = self.penalty
        return (
            scores.device.type == "cpu"
            and scores.dim() == 2
            and input_ids.dim() == 2
            and input_ids.shape[0] == scores.shape[0]
            and input_ids.device == scores.device
            and not input_ids.dtype.is_floating_point
            and getattr(penalty, "prompt_ignore_length", None) is None
            and getattr(penalty, "logits_indices", None) is None
            and getattr(penalty, "cu_seq_lens_q", None) is None
            and (ids_in_range if ids_in_range is not None else ids_within(input_ids, vocab=scores.shape[1]))
        )


def ids_within(input_ids: torch.Tensor, vocab: int) -> bool:
    """Every id of input_ids [N, L] lies in [0, vocab): one reduction for both ends."""
    if input_ids.numel() == 0:
        return True
    low, high = torch.aminmax(input_ids)
    return int(low) >= 0 and int(high) < vocab


def fusable(penalty: object, temperature: object) -> bool:
    """True for HF's own RepetitionPenaltyLogitsProcessor then TemperatureLogitsWarper (not subclasses)."""
    return type(penalty) is RepetitionPenaltyLogitsProcessor and type(temperature) is TemperatureLogitsWarper


def fuse_penalty_temperature(processors: list) -> list:
    """The processors with every adjacent (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper) pair
    replaced by one `PenaltyThenTemperature` (same outputs, two vocabulary-sized copies fewer)."""
    return fuse_adjacent(processors, fusable, PenaltyThenTemperature)
