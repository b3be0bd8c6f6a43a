"""Forward costs of a draft/target pair and the speed-up speculative decoding can reach from an AR.

Measures (median of `--repeats`, after a warm-up, KV cache of `--context` tokens): one draft token,
one target token, and one target forward over k + 1 tokens (a verification). With c = draft token
cost / target token cost and v = verification cost / target token cost, the expected speed-up over
target-only decoding at acceptance rate a (i.i.d. acceptances, k drafts per round) is

    SPD(a) = E[tokens per round] / (k c + v),   E[tokens per round] = (1 - a^(k+1)) / (1 - a).

    python benchmarks/cost_ratio.py --pair qwen --ar 0.6 0.7 0.8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from transformers import DynamicCache

DTYPES = ("fp32", "bf16")


def forward_seconds(model, context: int, new_tokens: int, repeats: int) -> float:
    prompt = torch.randint(0, 1000, (1, context))
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=prompt, cache=cache, use_cache=True)
        tokens = torch.randint(0, 1000, (1, new_tokens))
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(input_ids=tokens, cache=cache, use_cache=True, logits_to_keep=new_tokens)
            times.append(time.perf_counter() - start)
            cache.crop(-new_tokens)
    return statistics.median(times[1:])


def expected_speedup(acceptance: float, k: int, draft_cost: float, verify_cost: float) -> float:
    tokens = k + 1 if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)
    return tokens / (k * draft_cost + verify_cost)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("qwen",), default="qwen")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--context", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ar", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8, 0.9])
    args = parser.parse_args()
    from hf_securesd.models import load_pair

    _, draft, target = load_pair(dtype=args.dtype, offline=True)
    draft_token = forward_seconds(draft, args.context, 1, args.repeats)
    target_token = forward_seconds(target, args.context, 1, args.repeats)
    verify = forward_seconds(target, args.context, args.k + 1, args.repeats)
    c, v = draft_token / target_token, verify / target_token
    print(f"dtype={args.dtype} threads={torch.get_num_threads()} context={args.context} k={args.k}")
    print(f"draft token {draft_token * 1e3:.0f} ms, target token {target_token * 1e3:.0f} ms, "
          f"target verification ({args.k + 1} tokens) {verify * 1e3:.0f} ms")
    print(f"c = draft/target = {c:.3f}   v = verification/target token = {v:.2f}")
    for acceptance in args.ar:
        print(f"AR {acceptance:.2f}: expected SPD {expected_speedup(acceptance, args.k, c, v):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
