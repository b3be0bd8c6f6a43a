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
- otherwise: unexplained — a defect to find. For each of those the check diagnoses the first
  response token where the engine and the continuation part (`diagnose`): at that prefix, the gaps
  between the draft's and the target's two largest logits (an engine whose kernels round differently
  can flip a near tie), and the smallest logit noise (10^-5 .. 10^-2, Gaussian, 8 draws each) that
  changes whether the verifier keeps the draft's token there (a rule deciding within that distance of
  its threshold). A prompt with neither near tie nor fragile decision points at a defect.

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
from hf_securesd.step import RowSpec, VerificationRound, verify_step

NOISE_LEVELS = (1e-5, 1e-4, 1e-3, 1e-2)
NOISE_DRAWS = 8
DRAFTS = 5  # drafts of the diagnosed round (a windowed rule such as FLy reads the ones after the first)


def shifted(schedule: Step | None) -> Step | None:
    """The schedule of a continuation that starts one response position later: ``Step(L)`` →
    ``Step(L-1)``, ``Step(1)`` and no schedule → no schedule."""
    if schedule is None:
        return None
    if not isinstance(schedule, Step):
        raise SystemExit(f"only Step schedules are shifted here, not {schedule!r}")
    return Step(L=schedule.L - 1) if schedule.L > 1 else None


def first_divergence(tokenizer, response: list[int], engine_text: str) -> int | None:
    """Index of the first token of `response` whose text the engine's response does not continue, or
    None when the engine's text starts with the whole of it."""
    for index in range(len(response)):
        if not engine_text.startswith(tokenizer.decode(response[: index + 1], skip_special_tokens=True)):
            return index
    return None


def top_gap(logits: torch.Tensor) -> float:
    """Difference of the two largest entries of logits [V]."""
    top = logits.topk(2).values
    return float(top[0] - top[1])


def keeps_first_draft(verifier, drafts: torch.Tensor, target: torch.Tensor, draft: torch.Tensor) -> bool:
    """Whether `verifier` (no schedule, greedy) keeps the first of drafts [1, k], given target logits
    [1, k+1, V] and draft logits [1, k, V]."""
    round_ = VerificationRound(
        rows=[RowSpec(verifier)], draft_tokens=drafts, draft_counts=None, starts=torch.tensor([1]),
        target_logits=target, target_raw_logits=target, greedy=True,
        draft_logits=draft, draft_raw_logits=draft,
    )
    return bool(verify_step(round_).accepted[0] >= 1)


def fragile_at(verifier, drafts, target, draft, generator: torch.Generator) -> float | None:
    """The smallest noise level of NOISE_LEVELS at which Gaussian noise on both logits changes
    `keeps_first_draft`, or None."""
    exact = keeps_first_draft(verifier, drafts, target, draft)
    for level in NOISE_LEVELS:
        for _ in range(NOISE_DRAWS):
            noisy_target = target + level * torch.randn(target.shape, generator=generator)
            noisy_draft = draft + level * torch.randn(draft.shape, generator=generator)
            if keeps_first_draft(verifier, drafts, noisy_target, noisy_draft) != exact:
                return level
    return None


def diagnose(models, config: RunConfig, ids: torch.Tensor, response: list[int], engine_text: str) -> dict:
    """Where and why the engine's response leaves the continuation (see the module docstring). ids
    [1, L]: the prompt; response: the continued response's tokens (the target's first one included)."""
    tokenizer = models.tokenizer
    index = first_divergence(tokenizer, response, engine_text)
    if index is None:
        return {"position": None}
    prefix = torch.cat([ids, torch.tensor([response[:index]], dtype=torch.long)], dim=1)
    with torch.no_grad():
        drafted = models.draft.generate(prefix, attention_mask=torch.ones_like(prefix), do_sample=False,
                                        max_new_tokens=DRAFTS, min_new_tokens=DRAFTS,
                                        pad_token_id=tokenizer.pad_token_id)[:, prefix.shape[1]:]
        whole = torch.cat([prefix, drafted], dim=1)
        draft = models.draft(whole).logits[:, prefix.shape[1] - 1 : -1].float()
        target = models.target(whole).logits[:, prefix.shape[1] - 1 :].float()
    verifier = config.verifier
    agreed_text = tokenizer.decode(response[:index], skip_special_tokens=True)
    return {
        "position": index,  # 0-based response position
        "continuation_token": tokenizer.decode(response[index : index + 1]),
        "engine_text_after": engine_text[len(agreed_text):][:12],
        "draft_token": tokenizer.decode(drafted[0, :1]),
        "target_token": tokenizer.decode(target[0, 0].argmax().view(1)),
        "draft_top_gap": top_gap(draft[0, 0]),
        "target_top_gap": top_gap(target[0, 0]),
        "keeps_draft": keeps_first_draft(verifier, drafted, target, draft),
        "fragile_at_noise": fragile_at(verifier, drafted, target, draft, torch.Generator().manual_seed(0)),
    }


def earlier_equal(path: Path) -> set[tuple[str, str, int, str]]:
    """(config, task, max_new_tokens, example id) of every prompt an earlier check found equal to the
    engine when continued from token 0 (nothing when there is no earlier check)."""
    if not path.is_file():
        return set()
    checks = json.loads(path.read_text(encoding="utf-8"))["checks"]
    return {(check["config"], check["task"], check["max_new_tokens"], item["example_id"])
            for check in checks for item in check["prompts"] if item["continuation_equals_engine"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--here", required=True, help="the generate (hf engine) results directory")
    parser.add_argument("--other", required=True, help="the vllm/openai engine results directory")
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--data-dir", default=os.environ.get("SECURESD_DATA_DIR"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="keep the prompts an earlier run of this check (RESULTS_OTHER/shift_check.json) "
                             "found equal to the engine, and replay only the others")
    parser.add_argument("--configs", nargs="*",
                        help="replay only these configurations (the earlier check's entries of the others "
                             "are kept)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    here, other = ResultsDir(args.here), ResultsDir(args.other)
    engine = other.read_manifest().get("engine", "hf")
    other_cells = {cell["cell"]: cell for cell in other.runs()}
    rows = [row for row in comparison_rows(here.runs(), list(other_cells.values()), engine)
            if row["config"] not in ("target", "draft") and row["differing"]
            and (not args.configs or row["config"] in args.configs)]
    models = load_study_models(args.target, args.draft, dtype="fp32", offline=True)
    tokenizer = models.tokenizer
    prompts: dict[str, str] = {}
    checks = []
    earlier = earlier_equal(Path(args.other) / SHIFT_CHECK_FILE) if args.reuse else set()
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
            if (row["config"], row["task"], row["max_new_tokens"], example_id) in earlier:
                results.append({"example_id": example_id, "continuation_equals_engine": True})
                continue
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
            result = {"example_id": example_id,
                      "continuation_equals_engine": response == engine_responses[example_id]}
            if not result["continuation_equals_engine"]:
                result["divergence"] = diagnose(models, config, ids, out[0, ids.shape[1]:].tolist(),
                                                engine_responses[example_id])
            results.append(result)
        checks.append({"config": row["config"], "task": row["task"], "max_new_tokens": row["max_new_tokens"],
                       "prompts": results})
        explained = sum(item["continuation_equals_engine"] for item in results)
        print(f"{row['config']:<40} {row['task']}: {len(results)} differing, {explained} equal to the "
              f"engine when continued from token 0, {row['differing_with_target_difference']} with differing targets")
    path = Path(args.other) / SHIFT_CHECK_FILE
    if args.configs and path.is_file():
        replayed = {check["config"] for check in checks}
        checks = [check for check in json.loads(path.read_text(encoding="utf-8"))["checks"]
                  if check["config"] not in replayed] + checks
    path.write_text(json.dumps({"here": os.path.relpath(args.here, args.other), "checks": checks}, indent=1) + "\n",
                    encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
