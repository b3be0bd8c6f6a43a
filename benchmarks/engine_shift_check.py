"""Why a vLLM cell's responses differ from the `generate` study's: replay each differing prompt in
`generate`, continued from the target's first response token (the token vLLM commits at prefill)
with the schedule shifted by one position, and compare with the engine's response.

vLLM's cell without a schedule is paired with `generate`'s `Step(1)` cell (both exact at response
position 0, relaxed after it), but the engine's rounds start one position later: its first round
drafts positions 1..k, `generate`'s 0..k-1, so a bonus token (always the target's) and every later
round boundary fall elsewhere. Continued from token 0, `generate` drafts the same blocks as the
engine. So for each prompt where the two studies' responses differ:

- *continuation equals the engine*: the difference is the block alignment, as docs/vllm.md says;
- *targets differ*: the two engines' target-only responses differ on this prompt too (arithmetic);
- otherwise: unexplained — a defect to find.

Writes RESULTS_OTHER/shift_check.json, which `securesd report` reads for the engine section, and
prints a summary. Greedy, one prompt at a time, fp32 (the studies' settings).

    HF_HUB_OFFLINE=1 python benchmarks/engine_shift_check.py \\
        --here model_cards/qwen2.5-coder-0.5b-1.5b-results \\
        --other model_cards/qwen2.5-coder-0.5b-1.5b-vllm-results --target qwen-1.5b --draft qwen-0.5b
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from hf_securesd.bench.loading import load_study_models
from hf_securesd.bench.plan import RunConfig
from hf_securesd.bench.report_engines import SHIFT_CHECK_FILE, comparison_rows
from hf_securesd.bench.results import ResultsDir
from hf_securesd.bench.runner import prepare_tasks
from hf_securesd.schedules import Step


def shifted(schedule: Step | None) -> Step | None:
    """The schedule of a continuation that starts one response position later: ``Step(L)`` →
    ``Step(L-1)``, ``Step(1)`` and no schedule → no schedule."""
    if schedule is None:
        return None
    if not isinstance(schedule, Step):
        raise SystemExit(f"only Step schedules are shifted here, not {schedule!r}")
    return Step(L=schedule.L - 1) if schedule.L > 1 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--here", required=True, help="the generate (hf engine) results directory")
    parser.add_argument("--other", required=True, help="the vllm/openai engine results directory")
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--data-dir", default=os.environ.get("SECURESD_DATA_DIR"))
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    here, other = ResultsDir(args.here), ResultsDir(args.other)
    engine = other.read_manifest().get("engine", "hf")
    other_cells = {cell["cell"]: cell for cell in other.runs()}
    rows = [row for row in comparison_rows(here.runs(), list(other_cells.values()), engine)
            if row["config"] not in ("target", "draft") and row["differing"]]
    models = load_study_models(args.target, args.draft, dtype="fp32", offline=True)
    tokenizer = models.tokenizer
    prompts: dict[str, str] = {}
    checks = []
    for row in rows:
        cell = next(c for c in other_cells.values()
                    if c["config_key"] == row["config"] and c["task"] == row["task"]
                    and c["max_new_tokens"] == row["max_new_tokens"] and c["n"] >= row["n"])
        if cell["task"] not in {p.split("|")[0] for p in prompts}:
            task_run = prepare_tasks([cell["task"]], tokenizer, data_dir=args.data_dir, limit=cell["n"])[0]
            prompts.update({f"{cell['task']}|{example.id}": text
                            for example, text in zip(task_run.examples, task_run.prompts)})
        config = RunConfig.from_dict(cell["config"])
        engine_responses = dict(zip(cell["example_ids"], cell["responses"]))
        results = []
        for example_id in row["differing"]:
            ids = tokenizer(prompts[f"{cell['task']}|{example_id}"], return_tensors="pt",
                            add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                first = models.target(ids).logits[:, -1].argmax(-1, keepdim=True)
                out = models.target.generate(
                    torch.cat([ids, first], dim=1), attention_mask=torch.ones(1, ids.shape[1] + 1, dtype=torch.long),
                    assistant_model=models.draft, verifier=config.verifier,
                    secure_schedule=shifted(config.schedule), do_sample=False,
                    max_new_tokens=cell["max_new_tokens"] - 1, pad_token_id=tokenizer.pad_token_id,
                )
            response = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            results.append({"example_id": example_id,
                            "continuation_equals_engine": response == engine_responses[example_id]})
        checks.append({"config": row["config"], "task": row["task"], "max_new_tokens": row["max_new_tokens"],
                       "prompts": results})
        explained = sum(item["continuation_equals_engine"] for item in results)
        print(f"{row['config']:<40} {row['task']}: {len(results)} differing, {explained} equal to the "
              f"engine when continued from token 0, {row['differing_with_target_difference']} with differing targets")
    path = Path(args.other) / SHIFT_CHECK_FILE
    path.write_text(json.dumps({"here": os.path.relpath(args.here, args.other), "checks": checks}, indent=1) + "\n",
                    encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
