"""Python lists of integers as tensors, the cheap way.

`torch.tensor(list)` walks the list element by element through Python (~6 us for 32 ints on a CPU);
a NumPy array of the list wrapped by `torch.from_numpy` holds the same int64 values for ~1 us. The
decoding loop and the vLLM plugin turn a few host lists into tensors every round."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def long_tensor(values: Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    """[len(values)] int64 on `device` (the CPU when None), equal to `torch.tensor(values, dtype=torch.long)`."""
    tensor = torch.from_numpy(np.array(values, dtype=np.int64).reshape(-1))
    return tensor if device is None else tensor.to(device)  # (no copy when already there)
