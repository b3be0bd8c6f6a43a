"""Pick the device and the compute dtype for the machine at hand.

- ``resolve_device("auto")``: ``cuda`` when a GPU is visible, else ``mps``, else ``cpu``. An
  explicit device is checked (``cuda`` without a GPU, ``cuda:3`` on a 1-GPU machine, a malformed
  string) and refused with a message that names the fix, instead of torch's traceback on `.to()`.
- ``resolve_dtype("auto", device)``: on CUDA bf16 where the GPU supports it, else fp16. On a CPU,
  bf16 only where it is native and measurably faster: a CPU whose flags lack ``avx512_bf16`` and
  ``amx_bf16`` emulates bf16 (on a 2-core AVX2 machine a 1.5B model decoded 3.2x slower in bf16
  than in fp32), so fp32; otherwise a one-off timed matrix product (a decoding-sized linear layer,
  best of several runs in each dtype) decides, and fp32 wins unless bf16 is at least
  `BF16_MIN_SPEEDUP` times faster. Other devices get fp32.

Both return the choice and the reason, for the caller to print. Exact token equality between
lossless speculative decoding and target greedy decoding needs an fp32 target (docs/models.md),
whatever is fastest.

>>> resolve_dtype("fp32", "cpu")
('fp32', 'requested')
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import torch

DTYPE_NAMES = ("bf16", "fp16", "fp32")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_MIN_SPEEDUP = 1.2
PROBE_SHAPE = (1536, 4096)  # in/out features of the probe's linear layer (a 1.5B model's width)


class DeviceError(ValueError):
    """The requested device does not exist on this machine (the message names the fix)."""


def resolve_device(spec: str = "auto") -> str:
    """``auto`` -> ``cuda``/``mps``/``cpu``; any other spec is checked and returned normalised."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as error:
        raise DeviceError(f"unknown device {spec!r} ({error}); use auto, cpu, cuda or cuda:N") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"--device {spec}: CUDA is not available here (torch {torch.__version__}, "
                f"{'built without CUDA' if torch.version.cuda is None else 'no visible GPU'}); "
                "use --device cpu or --device auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise DeviceError(f"--device {spec}: this machine has {count} GPU(s) (cuda:0..cuda:{count - 1})")
    elif device.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise DeviceError(f"--device {spec}: MPS is not available here; use --device cpu or --device auto")
    elif device.type != "cpu":
        raise DeviceError(f"--device {spec}: unsupported device type {device.type!r}; use auto, cpu, cuda or mps")
    return str(device)


def checked_device(parser: argparse.ArgumentParser, spec: str) -> str:
    """`resolve_device(spec)` for a script's --device option; a device this machine lacks ends the script
    through `parser.error` (one line naming the fix, exit 2) instead of a traceback from inside torch."""
    try:
        return resolve_device(spec)
    except DeviceError as error:
        parser.error(str(error))


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str] | None:
    """The CPU feature flags of the first processor in `cpuinfo`, or None where it cannot be read."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def _best_time(weight: torch.Tensor, rows: int, repeats: int) -> float:
    """Best of `repeats` timings (seconds) of one linear layer on `rows` inputs: [rows, in] @ [out, in]^T."""
    inputs = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):  # warm-up: kernel selection and caches
            torch.nn.functional.linear(inputs, weight)
        for _ in range(repeats):
            start = time.perf_counter()
            torch.nn.functional.linear(inputs, weight)
            best = min(best, time.perf_counter() - start)
    return best


def bf16_speedup(rows: int = 16, repeats: int = 10) -> float:
    """fp32 time / bf16 time of a decoding-sized linear layer on `rows` inputs ([rows, 1536] @
    [4096, 1536]^T), best of `repeats` runs each, run twice in alternation so a burst of load from
    another process hits both dtypes. > 1: bf16 is faster. Takes well under a second."""
    weight = torch.randn(PROBE_SHAPE[1], PROBE_SHAPE[0])
    weights = {torch.float32: weight, torch.bfloat16: weight.to(torch.bfloat16)}
    best = {dtype: float("inf") for dtype in weights}
    for _ in range(2):
        for dtype, tensor in weights.items():
            best[dtype] = min(best[dtype], _best_time(tensor, rows, repeats))
    return best[torch.float32] / max(best[torch.bfloat16], 1e-12)


@functools.lru_cache(maxsize=8)
def _auto_cpu_dtype(rows: int) -> tuple[str, str]:
    flags = cpu_flags()
    if flags is not None and not flags & set(BF16_FLAGS):
        return "fp32", "the CPU has no native bf16 (no avx512_bf16/amx_bf16), so bf16 would be emulated"
    speedup = bf16_speedup(rows)
    if speedup >= BF16_MIN_SPEEDUP:
        return "bf16", f"bf16 is native and {speedup:.1f}x faster than fp32 in a timed matmul ({rows} rows)"
    return "fp32", f"bf16 is only {speedup:.2f}x the speed of fp32 in a timed matmul ({rows} rows)"


def resolve_dtype(spec: str, device: str, *, rows: int = 1) -> tuple[str, str]:
    """(dtype name, reason) for `spec` on `device`: ``auto`` decides as the module docstring says
    (`rows`: the batch size the models will run at, used by the CPU probe); ``bf16``/``fp16``/
    ``fp32`` are returned as requested."""
    spec = (spec or "auto").strip().lower()
    if spec != "auto":
        if spec not in DTYPE_NAMES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPE_NAMES)}, got {spec!r}")
        return spec, "requested"
    kind = torch.device(device).type
    if kind == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "the GPU supports bf16"
        return "fp16", "the GPU has no bf16 support"
    if kind == "cpu":
        return _auto_cpu_dtype(max(1, int(rows)))
    return "fp32", f"no fast-dtype rule for {kind}; fp32 is exact everywhere"
