"""Per-position TV of each speculative cell at T = 0, from its committed responses and the target alone.

At temperature 0 the target's distribution at a response position is a point mass on its argmax and
every verifier here commits one token deterministically, so the one-step output is a point mass too:
TV(out_j, q_j) is 1 where the committed token differs from the target's argmax given the response so
far, and 0 where it does not. Averaged over the prompts that reach position j, that is the per-position
TV `generate` records in its own statistics (`SpeculativeStats.position_tv`) — and the one figure an
engine that reports only drafted/accepted counts (vLLM's per-request metrics) cannot give. This script
recomputes it for every speculative cell of a results directory by scoring each response with the
target (teacher forcing, one prompt at a time, fp32), and prints it beside the recorded figure where
the directory has one (the `generate` study: a check of the replay itself).

Responses are stored as text, so they are re-tokenised; a response whose re-tokenisation is not the
engine's own token sequence counts where the two part (the replayed prefix is then not the engine's),
which is why the recorded and replayed figures of the `generate` study are printed side by side.

Writes RESULTS/position_tv.json (or --out) after every cell, which `securesd report` reads for the engine
section; `--configs` splits the work between processes (merge their files' "cells" lists).

    HF_HUB_OFFLINE=1 python benchmarks/engine_position_tv.py \\
        model_cards/qwen2.5-coder-0.5b-1.5b-vllm-results --target qwen-1.5b --draft qwen-0.5b --threads 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch

from hf_securesd.bench.analysis import merged_stats
from hf_securesd.bench.loading import load_study_models
from hf_securesd.bench.report_engines import POSITION_TV_FILE, POSITIONS
from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.runner import prepare_tasks


def position_deviations(target, prompt_ids: torch.Tensor, response_ids: torch.Tensor) -> list[int]:
    """Per response position j: 1 where response_ids[j] differs from the target's argmax after the
    prompt and response_ids[:j], else 0. prompt_ids [1, L], response_ids [1, n]."""
    if response_ids.shape[1] == 0:
        return []
    with torch.no_grad():
        logits = target(torch.cat([prompt_ids, response_ids], dim=1)).logits[0, prompt_ids.shape[1] - 1 : -1]
    return (logits.argmax(-1) != response_ids[0]).long().tolist()


def encode(tokenizer, text: str) -> torch.Tensor:
    """[1, n] token ids of `text`, without special tokens."""
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]


def shown(values: list[float | None]) -> str:
    return " ".join("  –  " if value is None or math.isnan(value) else f"{value:.3f}"
                    for value in values[:POSITIONS])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="results directory (any engine)")
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True, help="loaded with the target (the study's pair)")
    parser.add_argument("--configs", nargs="*", help="only these configuration keys (default: every one)")
    parser.add_argument("--tasks", nargs="*", help="only cells of these tasks (default: every one)")
    parser.add_argument("--max-new-tokens", type=int, help="only cells of this response length")
    parser.add_argument("--out", help=f"where to write the figures (default: RESULTS/{POSITION_TV_FILE})")
    parser.add_argument("--data-dir", default=os.environ.get("SECURESD_DATA_DIR"))
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = ResultsDir(args.results)
    cells = [cell for cell in results.runs() if cell["config"]["kind"] == "speculative"
             and (not args.configs or cell["config_key"] in args.configs)
             and (not args.tasks or cell["task"] in args.tasks)
             and args.max_new_tokens in (None, cell["max_new_tokens"])]
    if not cells:
        raise SystemExit(f"no speculative cell in {args.results} matches --configs {args.configs} "
                         f"--tasks {args.tasks} --max-new-tokens {args.max_new_tokens}")
    path = Path(args.out) if args.out else Path(args.results) / POSITION_TV_FILE
    models = load_study_models(args.target, args.draft, dtype="fp32", offline=True)
    tokenizer = models.tokenizer
    prompts: dict[tuple[str, str], str] = {}
    rows = []
    for cell in cells:
        if not any(task == cell["task"] for task, _ in prompts):
            task_run = prepare_tasks([cell["task"]], tokenizer, data_dir=args.data_dir, limit=cell["n"])[0]
            prompts.update({(cell["task"], example.id): text
                            for example, text in zip(task_run.examples, task_run.prompts)})
        deviating, reached = [0] * cell["max_new_tokens"], [0] * cell["max_new_tokens"]
        for example_id, response in zip(cell["example_ids"], cell["responses"]):
            prompt_ids = encode(tokenizer, prompts[cell["task"], example_id])
            deviations = position_deviations(models.target, prompt_ids, encode(tokenizer, response))
            for position, deviation in enumerate(deviations[: cell["max_new_tokens"]]):
                deviating[position] += deviation
                reached[position] += 1
        replayed = [d / n if n else None for d, n in zip(deviating, reached)]
        stats = merged_stats([cell])
        recorded = list(stats.position_tv) if stats and stats.position_tv_sum else None
        rows.append({"config": cell["config_key"], "task": cell["task"], "n": cell["n"],
                     "max_new_tokens": cell["max_new_tokens"], "position_tv": replayed, "reached": reached,
                     "recorded_position_tv": recorded})
        print(f"{cell['config_key']:<44} replayed {shown(replayed)}", flush=True)
        if recorded:
            print(f"{'':<44} recorded {shown(recorded)}", flush=True)
        path.write_text(json.dumps({"cells": rows}, indent=1) + "\n", encoding="utf-8")  # after every cell
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
