"""What a speculative round costs besides its forwards: plain decoding, HF assisted generation and our
loop (lossless, MARS + Step(1)) at batch 1 / 8 / 32, greedy and with four sampling processors.

Per configuration, in one run (best of --repeats wall times), the table gives the wall time, the
loop rounds (target forwards), the time inside model forwards (forward hooks, CUDA synchronised at
each boundary), and the host time per round = (wall - forward time) / rounds: everything the loop
does around its forwards (processors, verification, cache bookkeeping, Python). The same figure in
this thread's CPU time (`time.thread_time`, minimum over repeats) is steadier on a shared machine,
where waiting for a core inflates wall times. With --count-syncs
(CUDA) it also counts host-device synchronisations per round with `torch.cuda.set_sync_debug_mode`.

Outputs are checked: greedy, HF assisted and ours (lossless) must produce the target's own greedy
tokens row for row (batched rows as the target decodes them in the same padded batch); every row
must hold the requested number of new tokens (tiny pair, where EOS is switched off).

    nice -n 10 python benchmarks/round_cost.py                          # tiny pair, CPU, 1 thread
    python benchmarks/round_cost.py --pair qwen --batches 1 8           # the cached real pair
    python benchmarks/round_cost.py --device cuda --count-syncs         # on a GPU
    python benchmarks/round_cost.py --batches 1 32 --interleave 15      # the batch ratio, interleaved

With --interleave N only ours (lossless) runs, at the smallest and the largest of --batches, greedy and
with the processors, in N passes after one warm-up pass: each pass runs every (batch, processors) once,
in an order rotated by the pass, so a busy spell on a shared machine hits all of them. Per pass it takes
the ratio of the large batch's host CPU per round to the small batch's, and prints each figure and each
ratio as the median with its min and max over the passes (greedy outputs checked against the target's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
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
    "Summarise the plot of Hamlet in three sentences.",
    "Write a SQL query that returns the five customers with the highest total spend.",
    "Why is the sky blue?",
)
SAMPLING = dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.1)
METHODS = ("plain", "hf_assisted", "lossless", "mars_step1")


@dataclass
class ForwardClock:
    """Wall time inside model forwards and the number of target forwards."""

    device: str
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this thread's CPU time inside forwards (robust to other processes)
    target_calls: int = 0
    timing: bool = True  # off while synchronisations are counted (the clock's own syncs would count)
    _started: list[tuple[float, float]] = field(default_factory=list)

    def attach(self, draft, target) -> list:
        handles = []
        for model in (draft, target):
            handles.append(model.register_forward_pre_hook(lambda *_: self._start()))
            handles.append(model.register_forward_hook(lambda *_: self._stop()))
        handles.append(target.register_forward_hook(lambda *_: self._count()))
        return handles

    def _count(self) -> None:
        self.target_calls += 1

    def _start(self) -> None:
        if self.timing:
            _sync(self.device)
            self._started.append((time.perf_counter(), time.thread_time()))

    def _stop(self) -> None:
        if self.timing:
            _sync(self.device)
            wall, cpu = self._started.pop()
            self.seconds += time.perf_counter() - wall
            self.cpu_seconds += time.thread_time() - cpu


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextmanager
def counted_syncs(enabled: bool):
    """Count CUDA host-device synchronisations (sync debug mode warnings) inside the block."""
    counter = {"n": 0}
    if not enabled:
        yield counter
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counter
        finally:
            torch.cuda.set_sync_debug_mode("default")
            counter["n"] = sum("synchroniz" in str(w.message) for w in caught)


@dataclass
class Row:
    pair: str
    batch: int
    processors: bool
    method: str
    wall_ms: float
    rounds: int
    forward_ms: float
    host_ms_per_round: float
    host_cpu_ms_per_round: float
    syncs_per_round: float | None


def load(args):
    if args.pair == "tiny":
        draft, target = tiny_pair()
        tokenizer = byte_tokenizer()
    else:
        from hf_securesd.models import load_pair

        tokenizer, draft, target = load_pair(dtype=args.dtype, device=args.device, offline=True, download=False)
    for model in (draft, target):
        model.to(args.device).eval()
        model.generation_config.eos_token_id = None if args.pair == "tiny" else model.generation_config.eos_token_id
    # HF assisted generation runs the same algorithm as ours: k = 5, no adaptive draft length.
    draft.generation_config.num_assistant_tokens = 5
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer, draft, hf_securesd.wrap(target)


def encode(tokenizer, batch: int, device: str) -> dict[str, torch.Tensor]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], add_generation_prompt=True, tokenize=False)
        for i in range(batch)
    ]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def call(method: str, target, draft, inputs, args, processors: bool):
    kwargs = dict(max_new_tokens=args.max_new_tokens, pad_token_id=target.generation_config.pad_token_id, **inputs)
    kwargs.update(SAMPLING if processors else dict(do_sample=False))
    if method == "hf_assisted":
        kwargs["assistant_model"] = draft
    elif method == "lossless":
        kwargs.update(assistant_model=draft, verifier="lossless", num_assistant_tokens=5)
    elif method == "mars_step1":
        kwargs.update(assistant_model=draft, verifier="mars", secure_schedule=hf_securesd.Step(L=1), num_assistant_tokens=5)
    return target.generate(**kwargs)


def measure(method, target, draft, inputs, args, processors, clock, pair) -> tuple[Row, torch.Tensor]:
    best = None
    for repeat in range(args.repeats):
        torch.manual_seed(repeat)
        forward_before, cpu_before, calls_before = clock.seconds, clock.cpu_seconds, clock.target_calls
        _sync(args.device)
        start, start_cpu = time.perf_counter(), time.thread_time()
        out = call(method, target, draft, inputs, args, processors)
        _sync(args.device)
        wall, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
        forward, forward_cpu = clock.seconds - forward_before, clock.cpu_seconds - cpu_before
        rounds = clock.target_calls - calls_before
        host_cpu = (cpu - forward_cpu) / max(rounds, 1)
        if best is None or wall < best[0]:
            best = (wall, forward, rounds, out, host_cpu if best is None else min(host_cpu, best[4]))
        else:
            best = (*best[:4], min(host_cpu, best[4]))
    wall, forward, rounds, out, host_cpu = best
    syncs_per_round = None
    if args.count_syncs:
        clock.timing, calls_before = False, clock.target_calls
        torch.manual_seed(0)
        with counted_syncs(True) as syncs:
            call(method, target, draft, inputs, args, processors)
        clock.timing = True
        syncs_per_round = syncs["n"] / max(clock.target_calls - calls_before, 1)
    row = Row(pair, inputs["input_ids"].shape[0], processors, method, wall * 1e3, rounds, forward * 1e3,
              (wall - forward) / max(rounds, 1) * 1e3, host_cpu * 1e3, syncs_per_round)
    return row, out


def check(outputs: dict[str, torch.Tensor], inputs, args, processors: bool) -> None:
    width = inputs["input_ids"].shape[1]
    for method, sequences in outputs.items():
        if sequences.shape[1] - width != args.max_new_tokens and args.pair == "tiny":
            raise SystemExit(f"{method}: {sequences.shape[1] - width} new tokens instead of {args.max_new_tokens}")
        if not processors and method in ("hf_assisted", "lossless") and not torch.equal(sequences, outputs["plain"]):
            raise SystemExit(f"OUTPUT MISMATCH: {method} differs from the target's greedy decoding")


def interleaved_ratios(args, tokenizer, draft, target, clock) -> None:
    """--interleave: ours (lossless) at the smallest and largest batch, greedy and with processors, in
    interleaved passes; prints host CPU per round and the large-to-small ratio, median [min-max]."""
    small, large = min(args.batches), max(args.batches)
    inputs = {batch: encode(tokenizer, batch, args.device) for batch in (small, large)}
    plain = {batch: call("plain", target, draft, inputs[batch], args, False) for batch in (small, large)}
    single = argparse.Namespace(**{**vars(args), "repeats": 1})
    configs = [(batch, processors) for processors in (False, True) for batch in (small, large)]
    host: dict[tuple[int, bool], list[float]] = {config: [] for config in configs}
    for batch, processors in configs:  # warm-up pass, not recorded
        measure("lossless", target, draft, inputs[batch], single, processors, clock, args.pair)
    for index in range(args.interleave):
        for batch, processors in configs[index % len(configs):] + configs[: index % len(configs)]:
            row, out = measure("lossless", target, draft, inputs[batch], single, processors, clock, args.pair)
            check({"plain": plain[batch], "lossless": out} if not processors else {"lossless": out},
                  inputs[batch], args, processors)
            host[batch, processors].append(row.host_cpu_ms_per_round)
    print(f"pair={args.pair} device={args.device} threads={torch.get_num_threads()} max_new_tokens={args.max_new_tokens} "
          f"k=5, ours (lossless), {args.interleave} interleaved passes; processors = {SAMPLING}")
    print()
    print(f"| processors | batch {small} host CPU per round (ms) | batch {large} | batch {large} / batch {small}, pass by pass |")
    print("|---|---|---|---|")
    for processors in (False, True):
        low, high = host[small, processors], host[large, processors]
        ratios = [b / a for a, b in zip(low, high)]
        print(f"| {'yes' if processors else 'no'} | {_spread(low, 2)} | {_spread(high, 2)} | {_spread(ratios, 2)} |")


def _spread(values: list[float], digits: int) -> str:
    """median [min-max]"""
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("tiny", "qwen"), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="model dtype for --pair qwen (see hf_securesd.models.load_pair)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--count-syncs", action="store_true", help="CUDA only: host-device syncs per round")
    parser.add_argument("--interleave", type=int, default=0, metavar="N",
                        help="only the batch ratio of ours (lossless), in N interleaved passes (see above)")
    args = parser.parse_args()
    args.device = checked_device(parser, args.device)
    if args.count_syncs and not args.device.startswith("cuda"):
        parser.error("--count-syncs needs a CUDA device")
    if args.interleave < 0 or (args.interleave and len(set(args.batches)) < 2):
        parser.error("--interleave N needs N >= 1 and two different --batches sizes")
    torch.set_num_threads(args.threads)
    tokenizer, draft, target = load(args)
    clock = ForwardClock(args.device)
    clock.attach(draft, target)
    if args.interleave:
        interleaved_ratios(args, tokenizer, draft, target, clock)
        return 0
    rows = []
    for batch in args.batches:
        inputs = encode(tokenizer, batch, args.device)
        for processors in (False, True):
            methods = [m for m in METHODS if m != "hf_assisted" or batch == 1]
            outputs = {}
            for method in methods:
                row, outputs[method] = measure(method, target, draft, inputs, args, processors, clock, args.pair)
                rows.append(row)
                print(_format(row), flush=True)
            check(outputs, inputs, args, processors)
    print()
    print(f"pair={args.pair} device={args.device} threads={torch.get_num_threads()} max_new_tokens={args.max_new_tokens} "
          f"k=5 best of {args.repeats}; processors = {SAMPLING}")
    print("outputs checked: greedy rows of HF assisted and ours (lossless) equal the target's greedy decoding; "
          "every row holds all new tokens")
    print()
    print("| batch | processors | method | wall (ms) | rounds | forwards (ms) | host per round (ms) | host CPU per round (ms) |"
          + (" syncs per round |" if args.count_syncs else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.count_syncs else ""))
    for row in rows:
        print(f"| {row.batch} | {'yes' if row.processors else 'no'} | {row.method} | {row.wall_ms:.0f} | {row.rounds} | "
              f"{row.forward_ms:.0f} | {row.host_ms_per_round:.2f} | {row.host_cpu_ms_per_round:.2f} |"
              + (f" {row.syncs_per_round:.1f} |" if args.count_syncs else ""))
    for processors in (False, True):
        hf = next((r for r in rows if r.batch == 1 and r.processors == processors and r.method == "hf_assisted"), None)
        ours = next((r for r in rows if r.batch == 1 and r.processors == processors and r.method == "lossless"), None)
        if hf and ours:
            print(f"batch 1, processors {'on' if processors else 'off'}: ours (lossless) {hf.wall_ms / ours.wall_ms:.2f}x faster than HF assisted")
    return 0


def _format(row: Row) -> str:
    syncs = f" syncs/round {row.syncs_per_round:.1f}" if row.syncs_per_round is not None else ""
    return (f"batch {row.batch:2d} processors {'on ' if row.processors else 'off'} {row.method:12s} wall {row.wall_ms:8.0f} ms "
            f"rounds {row.rounds:4d} forwards {row.forward_ms:8.0f} ms host/round {row.host_ms_per_round:6.2f} ms "
            f"(CPU {row.host_cpu_ms_per_round:6.2f} ms){syncs}")


if __name__ == "__main__":
    sys.exit(main())
