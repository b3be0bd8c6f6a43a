"""Prompt lookup drafting: ours (lossless and MARS + Step(1)) against HF's own prompt lookup and plain
greedy decoding, in one run, on code-editing prompts where n-gram drafting shines (the answer repeats
the prompt's code).

For each method: wall time (best of --repeats), new tokens per second, target forwards (rounds) and
the acceptance rate (ours: from `speculative_stats`; HF's: accepted drafts counted through its
candidate generator). Outputs are checked: HF's prompt lookup and ours lossless must equal plain
greedy token for token.

    nice -n 10 python benchmarks/prompt_lookup.py                         # tiny pair, CPU
    HF_HUB_OFFLINE=1 python benchmarks/prompt_lookup.py --pair qwen --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers.generation import candidate_generator

import hf_securesd
from hf_securesd import MARS, Step
from hf_securesd.models.hardware import checked_device
from hf_securesd.tiny import byte_tokenizer, tiny_pair

CODE = '''def moving_average(values, window):
    total = 0.0
    out = []
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out
'''
PROMPTS = (
    f"Rename the variable `total` to `running_sum` in this function and return the whole function:\n{CODE}",
    f"Add type hints to this function and return it unchanged otherwise:\n{CODE}",
    f"Add a docstring to this function and return the whole function:\n{CODE}",
)


class CountingLookup:
    """Counts HF's prompt-lookup candidates and target rounds (forwards through `get_candidates`)."""

    def __init__(self) -> None:
        self.proposed = 0
        self.rounds = 0
        self._original = candidate_generator.PromptLookupCandidateGenerator.get_candidates

    def __enter__(self) -> "CountingLookup":
        counter = self

        def get_candidates(generator, input_ids, **kwargs):
            candidates, logits = counter._original(generator, input_ids, **kwargs)
            counter.rounds += 1
            counter.proposed += candidates.shape[1] - input_ids.shape[1]
            return candidates, logits

        candidate_generator.PromptLookupCandidateGenerator.get_candidates = get_candidates
        return self

    def __exit__(self, *exc) -> None:
        candidate_generator.PromptLookupCandidateGenerator.get_candidates = self._original


def load(pair: str, dtype: str):
    if pair == "tiny":
        _, target = tiny_pair()
        return byte_tokenizer(), hf_securesd.wrap(target)
    from hf_securesd.models import load_pair

    tokenizer, _, target = load_pair(dtype=dtype, offline=True, download=False)
    return tokenizer, hf_securesd.wrap(target)


def encode(tokenizer, prompt: str, pair: str) -> torch.Tensor:
    if pair == "qwen":
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer(text, return_tensors="pt").input_ids
    return tokenizer(prompt, return_tensors="pt").input_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=("tiny", "qwen"), default="tiny")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=10, help="prompt_lookup_num_tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    args.device = checked_device(parser, args.device)
    torch.set_num_threads(args.threads)
    tokenizer, target = load(args.pair, args.dtype)
    target.to(args.device)
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    methods = {
        "plain": dict(),
        "hf_prompt_lookup": dict(prompt_lookup_num_tokens=args.k),
        "ours_lossless": dict(prompt_lookup_num_tokens=args.k, verifier="lossless", return_dict_in_generate=True),
        "ours_mars_step1": dict(prompt_lookup_num_tokens=args.k, verifier=MARS(theta=0.9), secure_schedule=Step(L=1),
                                return_dict_in_generate=True),
    }
    print(f"pair={args.pair} device={args.device} k={args.k} max_new_tokens={args.max_new_tokens} prompts={len(PROMPTS)}")
    print(f"{'method':18} {'wall s':>8} {'tok/s':>7} {'rounds':>7} {'AR':>6}  equals plain")
    reference: list[torch.Tensor] = []
    for name, extra in methods.items():
        best, tokens, rounds, drafted, accepted, equal = float("inf"), 0, 0, 0, 0, True
        for repeat in range(args.repeats):
            wall, tokens, rounds, drafted, accepted = 0.0, 0, 0, 0, 0
            for index, prompt in enumerate(PROMPTS):
                ids = encode(tokenizer, prompt, args.pair).to(args.device)
                with CountingLookup() as counter:
                    start = time.perf_counter()
                    out = target.generate(ids, **common, **extra)
                    wall += time.perf_counter() - start
                sequences = out.sequences if hasattr(out, "sequences") else out
                new = sequences[0, ids.shape[1]:]
                tokens += new.numel()
                if hasattr(out, "speculative_stats"):
                    stats = out.speculative_stats
                    rounds += stats.rounds
                    drafted += sum(stats.drafted_per_round)
                    accepted += sum(stats.accepted_per_round)
                elif name == "hf_prompt_lookup":
                    rounds += counter.rounds
                    drafted += counter.proposed
                    accepted += new.numel() - counter.rounds
                else:
                    rounds += new.numel()
                if name == "plain" and repeat == 0:
                    reference.append(new)
                elif name != "ours_mars_step1":
                    equal &= torch.equal(new, reference[index])
            best = min(best, wall)
        rate = f"{accepted / drafted:.3f}" if drafted else "–"
        check = "yes" if name != "ours_mars_step1" and equal else ("(lossy)" if name == "ours_mars_step1" else "NO")
        print(f"{name:18} {best:8.2f} {tokens / best:7.1f} {rounds:7d} {rate:>6}  {check}")


if __name__ == "__main__":
    main()
