"""Tokens/s of batched speculative decoding vs plain batched target decoding, same run, same prompts.

Greedy, lossless verifier, k = 5. For each batch size the same prompt list is split into batches
(left-padded); tokens/s counts generated tokens (up to each row's EOS) over wall time.

    python benchmarks/batch_throughput.py                           # tiny random models
    python benchmarks/batch_throughput.py --pair qwen --batch-sizes 1 4 8 16 --prompts 16 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import hf_securesd
from hf_securesd.tiny import byte_tokenizer, tiny_pair

PROMPTS = (
    "Write a Python function that reverses a linked list.",
    "Explain recursion to a beginner.",
    "What is the capital of Australia?",
    "Give three tips for writing clean code.",
    "Translate 'good morning' into French and Spanish.",
    "Write a SQL query that counts users per country.",
    "What does the `yield` keyword do in Python?",
    "Summarise the rules of chess in two sentences.",
)
DTYPES = ("fp32", "bf16")


def load(args):
    if args.pair == "tiny":
        draft, target = tiny_pair()
        return byte_tokenizer(), draft, target
    from hf_securesd.models import load_pair

    tokenizer, draft, target = load_pair(dtype=args.dtype, offline=True)
    tokenizer.padding_side = "left"
    return tokenizer, draft, target


def generated_tokens(sequences: torch.Tensor, width: int, eos: int | None, pad: int | None) -> int:
    total = 0
    for row in sequences[:, width:].tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        elif pad is not None:
            while row and row[-1] == pad:
                row.pop()
        total += len(row)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("tiny", "qwen"), default="tiny")
    parser.add_argument("--dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer, draft, target = load(args)
    target = hf_securesd.wrap(target)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                             add_generation_prompt=True, tokenize=False) for i in range(args.prompts)]
    eos, pad = target.generation_config.eos_token_id, tokenizer.pad_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    print(f"pair={args.pair} dtype={args.dtype} threads={torch.get_num_threads()} prompts={args.prompts} "
          f"max_new_tokens={args.max_new_tokens} greedy, lossless, k=5")
    print(f"{'batch':>5} {'plain tok/s':>12} {'speculative tok/s':>18} {'spec/plain':>11} {'AR':>6}")
    baseline = None
    for batch_size in args.batch_sizes:
        rates = {}
        acceptance = []
        for method in ("plain", "speculative"):
            tokens, start = 0, time.perf_counter()
            for first in range(0, len(prompts), batch_size):
                encoded = tokenizer(prompts[first : first + batch_size], return_tensors="pt", padding=True)
                extra = dict(assistant_model=draft, verifier="lossless", return_dict_in_generate=True) if method == "speculative" else {}
                out = target.generate(**encoded, max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad, **extra)
                sequences = out.sequences if method == "speculative" else out
                if method == "speculative":
                    acceptance.append(out.speculative_stats.acceptance_rate)
                tokens += generated_tokens(sequences, encoded["input_ids"].shape[1], eos, pad)
            rates[method] = tokens / (time.perf_counter() - start)
        baseline = baseline or rates["speculative"]
        print(f"{batch_size:5d} {rates['plain']:12.2f} {rates['speculative']:18.2f} {rates['speculative'] / rates['plain']:11.2f} "
              f"{sum(acceptance) / len(acceptance):6.2f}   speculative vs batch {args.batch_sizes[0]}: "
              f"{rates['speculative'] / baseline:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
