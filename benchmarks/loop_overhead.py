"""Speed of our speculative loop vs HF assisted generation vs plain target decoding, in one run.

For each prompt (greedy, k = 5 draft tokens, constant for both loops: HF's confidence-based early
stop of the draft is switched off so both run the same algorithm), the three methods generate the same number
of tokens; outputs must be identical or the script exits with an error. Reported:

* tokens/s of each method, and ratios;
* per-round loop overhead: (wall time - time inside model forwards) / rounds, measured with
  forward hooks on both models, so it isolates the bookkeeping around the forwards;
* SecureSD mixing overhead: time inside verification with Step(L=1) minus the same verifier with
  no schedule, as a share of decode time.

    python benchmarks/loop_overhead.py                     # tiny random models
    python benchmarks/loop_overhead.py --pair qwen         # the cached Qwen2.5-Coder 0.5B -> 1.5B pair
    python benchmarks/loop_overhead.py --pair qwen --device cuda --target-dtype bf16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

import hf_securesd
from hf_securesd.models.hardware import checked_device
from hf_securesd.tiny import byte_tokenizer, tiny_pair

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in two sentences.",
    "What is 17 * 23? Show the steps.",
    "Write a bash one-liner that counts lines in all .py files.",
    "List three uses of binary search.",
)
DTYPES = ("fp32", "bf16", "fp16")


@dataclass
class ForwardClock:
    """Accumulates wall time spent inside model forwards (synchronising CUDA at each boundary)."""

    seconds: float = 0.0
    calls: int = 0
    _started: list[float] = field(default_factory=list)

    def attach(self, *models: torch.nn.Module) -> list:
        handles = []
        for model in models:
            handles.append(model.register_forward_pre_hook(lambda *_: self._start()))
            handles.append(model.register_forward_hook(lambda *_: self._stop()))
        return handles

    def _start(self) -> None:
        _sync()
        self._started.append(time.perf_counter())

    def _stop(self) -> None:
        _sync()
        self.seconds += time.perf_counter() - self._started.pop()
        self.calls += 1


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@contextmanager
def timed_verification(totals: list[float]):
    """Time every verification step (`verify_step`) of the decoding loop."""
    from hf_securesd import step

    original = step.verify_step

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = original(*args, **kwargs)
        _sync()
        totals.append(time.perf_counter() - start)
        return result

    step.verify_step = wrapper
    try:
        yield
    finally:
        step.verify_step = original


def load(args):
    if args.pair == "tiny":
        tokenizer = byte_tokenizer()
        draft, target = tiny_pair()
        return tokenizer, draft, target
    from hf_securesd.models import load_pair

    return load_pair(dtype=args.draft_dtype, target_dtype=args.target_dtype, device=args.device, offline=True)


def run(method: str, target, draft, inputs, max_new_tokens: int, clock: ForwardClock, target_clock: ForwardClock, **extra):
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, **inputs)
    if method == "hf_assisted":
        kwargs["assistant_model"] = draft
    elif method != "plain":
        kwargs.update(assistant_model=draft, verifier=method, num_assistant_tokens=5, return_dict_in_generate=True)
    kwargs.update(extra)
    forward_before, rounds_before = clock.seconds, target_clock.calls
    _sync()
    start = time.perf_counter()
    out = target.generate(**kwargs)
    _sync()
    wall = time.perf_counter() - start
    sequences = out.sequences if hasattr(out, "sequences") else out
    stats = getattr(out, "speculative_stats", None)
    return sequences, wall, clock.seconds - forward_before, target_clock.calls - rounds_before, stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("tiny", "qwen"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--target-dtype", choices=DTYPES, default="fp32")
    parser.add_argument("--draft-dtype", choices=DTYPES, default="bf16")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--repeats", type=int, default=3, help="runs per prompt and method (median taken)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    args.device = checked_device(parser, args.device)
    if args.threads:
        torch.set_num_threads(args.threads)

    tokenizer, draft, target = load(args)
    target = hf_securesd.wrap(target)
    draft.generation_config.num_assistant_tokens = 5
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0  # HF would otherwise stop drafting early
    clock, target_clock = ForwardClock(), ForwardClock()
    clock.attach(draft, target)
    target_clock.attach(target)  # one target forward per round (per token for plain decoding)
    methods = ("plain", "hf_assisted", "lossless")
    totals = {m: {"wall": 0.0, "forward": 0.0, "rounds": 0, "tokens": 0} for m in methods}
    verification = {"none": [], "step1": []}
    relaxed_wall = {"none": 0.0, "step1": 0.0}

    for prompt in PROMPTS[: args.prompts]:
        messages = [{"role": "user", "content": prompt}]
        inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        inputs = {key: value.to(args.device) for key, value in inputs.items()}
        outputs = {}
        for method in methods:
            runs = [run(method, target, draft, inputs, args.max_new_tokens, clock, target_clock) for _ in range(args.repeats)]
            sequences, wall, forward, rounds, stats = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
            outputs[method] = sequences
            totals[method]["wall"] += wall
            totals[method]["forward"] += forward
            totals[method]["tokens"] += sequences.shape[1] - inputs["input_ids"].shape[1]
            totals[method]["rounds"] += rounds
        if not (torch.equal(outputs["plain"], outputs["hf_assisted"]) and torch.equal(outputs["plain"], outputs["lossless"])):
            print(f"OUTPUT MISMATCH on prompt {prompt!r}", file=sys.stderr)
            return 1
        for name, schedule in (("none", None), ("step1", hf_securesd.Step(L=1))):
            with timed_verification(verification[name]):
                _, wall, *_ = run("mars", target, draft, inputs, args.max_new_tokens, clock, target_clock, secure_schedule=schedule)
            relaxed_wall[name] += wall

    print(f"pair={args.pair} device={args.device} target={args.target_dtype} draft={args.draft_dtype} "
          f"threads={torch.get_num_threads()} prompts={args.prompts} max_new_tokens={args.max_new_tokens} k=5 greedy")
    print("outputs identical across plain / HF assisted / ours (lossless): yes")
    print(f"{'method':<12} {'tokens/s':>9} {'rounds':>7} {'overhead/round (ms)':>20}")
    for method in methods:
        t = totals[method]
        overhead = (t["wall"] - t["forward"]) / max(t["rounds"], 1) * 1000
        print(f"{method:<12} {t['tokens'] / t['wall']:9.2f} {t['rounds']:7d} {overhead:20.3f}")
    plain, hf, ours = (totals[m]["tokens"] / totals[m]["wall"] for m in methods)
    print(f"ours / HF assisted: {ours / hf:.3f}x   ours / plain: {ours / plain:.3f}x   HF assisted / plain: {hf / plain:.3f}x")
    extra = sum(verification["step1"]) - sum(verification["none"])
    share = extra / relaxed_wall["step1"] * 100
    print(f"SecureSD mixing (MARS, Step(L=1) vs no schedule): verification {sum(verification['step1']) * 1000:.2f} ms vs "
          f"{sum(verification['none']) * 1000:.2f} ms; difference {share:+.4f}% of decode time "
          f"(median verify call {statistics.median(verification['step1']) * 1e3:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
