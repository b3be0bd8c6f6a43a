"""`long_tensor` equals `torch.tensor(values, dtype=torch.long)`: values, dtype, shape, device."""

from __future__ import annotations

import pytest
import torch

from hf_securesd.host_values import long_tensor


@pytest.mark.parametrize("values", [[], [0], [3, -1, 2**40], list(range(33))])
@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
def test_long_tensor_equals_torch_tensor(values, device):
    made = long_tensor(values, device)
    expected = torch.tensor(values, dtype=torch.long)
    assert made.dtype == torch.long and made.shape == expected.shape and made.device.type == "cpu"
    assert torch.equal(made, expected)
