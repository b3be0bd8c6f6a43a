"""The vocabulary-sized reductions a CPU round makes, ours against the torch calls they replace, on
random logits of the tiny pair's and the real pair's vocabularies (outputs checked equal):

* the argmax of drafts and of the target's verified positions: `torch.argmax` / `vocab_argmax`;
* the finiteness check of raw logits: `(x * 0).sum()` (the previous check) / `x.sum()` (`Health`);
* dropping finished rows from a KV cache layer: advanced indexing (transformers'
  `batch_select_indices`) / `index_select` (`select_cache_rows`);
* top-k then top-p (`top_k=50, top_p=0.9`): HF's two warpers / `TopKTopP` (outputs checked bitwise).

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/vocab_reductions.py
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from hf_securesd.argmax import vocab_argmax
from hf_securesd.fused_warpers import TopKTopP


def best_us(function: Callable[[], object], repeats: int) -> float:
    """Minimum wall time of one call over `repeats` calls, in microseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"threads {torch.get_num_threads()}, best of {args.repeats} calls, microseconds per call")
    print("| what | shape | torch | ours | ratio |")
    print("|---|---|---|---|---|")
    for shape in [(1, 1, 259), (32, 1, 259), (32, 6, 259), (1, 1, 151936), (1, 6, 151936), (16, 1, 151936),
                  (16, 6, 151936)]:
        logits = torch.randn(*shape, generator=generator)
        if not torch.equal(vocab_argmax(logits), logits.argmax(dim=-1)):
            raise SystemExit(f"MISMATCH: vocab_argmax differs from torch.argmax on {shape}")
        before = best_us(lambda: logits.argmax(dim=-1), args.repeats)
        after = best_us(lambda: vocab_argmax(logits), args.repeats)
        print(f"| argmax | {list(shape)} | {before:.1f} | {after:.1f} | {before / after:.2f}x |")
    for shape in [(32, 6, 259), (1, 6, 151936), (16, 5, 151936), (16, 6, 151936)]:
        logits = torch.randn(*shape, generator=generator)
        before = best_us(lambda: (logits * 0).sum(), args.repeats)
        after = best_us(lambda: logits.sum(), args.repeats)
        print(f"| finiteness check | {list(shape)} | {before:.1f} | {after:.1f} | {before / after:.2f}x |")
    for shape in [(32, 2, 190, 16), (16, 2, 600, 128)]:
        keys = torch.randn(*shape, generator=generator)
        rows = torch.arange(0, shape[0] - 1)
        if not torch.equal(keys[rows, ...], keys.index_select(0, rows)):
            raise SystemExit("MISMATCH: index_select differs from advanced indexing")
        before = best_us(lambda: keys[rows, ...], args.repeats)
        after = best_us(lambda: keys.index_select(0, rows), args.repeats)
        print(f"| cache rows ({shape[0] - 1} of {shape[0]}) | {list(shape)} | {before:.1f} | {after:.1f} | "
              f"{before / after:.2f}x |")
    top_k, top_p = TopKLogitsWarper(50), TopPLogitsWarper(0.9)
    fused = TopKTopP(top_k, top_p)
    for shape in [(32, 259), (192, 259), (1, 151936), (6, 151936), (16, 151936)]:
        scores = torch.randn(*shape, generator=generator) * 3 / 0.7
        if not torch.equal(fused(None, scores).view(torch.int32), top_p(None, top_k(None, scores)).view(torch.int32)):
            raise SystemExit(f"MISMATCH: TopKTopP differs from HF's top-k then top-p on {shape}")
        repeats = args.repeats if shape[-1] < 1000 else max(args.repeats // 6, 3)
        before = best_us(lambda: top_p(None, top_k(None, scores)), repeats)
        after = best_us(lambda: fused(None, scores), repeats)
        print(f"| top-k + top-p | {list(shape)} | {before:.1f} | {after:.1f} | {before / after:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
