"""Response positions survive vLLM's preemption: with a KV cache too small for the batch, vLLM preempts
requests and later recomputes them (a prefill of prompt and committed response, in chunks of at most
64 tokens here, whose last step emits a token and carries no drafts). Every row the plugin verifies, with or
without drafts, must record the response position where its emitted tokens land in the final output
(a schedule reads that position), and lossless must still equal target greedy. One engine in a fresh
interpreter, n-gram drafting, the tiny random Qwen2 target."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from vllm_support import NUM_SPECULATIVE_TOKENS, engine_environment, requires_vllm

pytestmark = requires_vllm()

NEW_TOKENS = 150
PROMPTS = [list(f"request {index}: abc abc abc abc".encode()) for index in range(6)]
ENGINE_SCRIPT = """
import collections, json, sys
from vllm import LLM, SamplingParams
from vllm.v1.core.sched import scheduler
from hf_securesd.vllm import sampler, verification
target, prompts, new_tokens, k = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
preempted = collections.defaultdict(int)
original_preempt = scheduler.Scheduler._preempt_request
def preempt(self, request, *args, **kwargs):
    preempted[request.request_id] += 1
    return original_preempt(self, request, *args, **kwargs)
scheduler.Scheduler._preempt_request = preempt
batch_ids, chunk_ends = [], []
original_plans = verification._row_plans
def row_plans(runner, requests, stash, num_draft_tokens):
    batch = runner.input_batch
    batch_ids[:] = list(batch.req_ids)
    # whether the step reaches the row's last known token: else a prefill chunk, whose token vLLM drops
    starts = runner.query_start_loc.np
    chunk_ends[:] = [
        bool(batch.num_computed_tokens_cpu[row] + starts[row + 1] - starts[row] - num_draft_tokens[row]
             >= batch.num_tokens_no_spec[row])
        for row in range(len(requests))
    ]
    return original_plans(runner, requests, stash, num_draft_tokens)
verification._row_plans = row_plans
rows = collections.defaultdict(list)
original_verify = sampler.verify_rows
def recording(plans, output, draft_token_ids, num_draft_tokens, *args, **kwargs):
    results = original_verify(plans, output, draft_token_ids, num_draft_tokens, *args, **kwargs)
    for result in results:
        emitted = [t for t in output[result.row].tolist() if t >= 0]
        rows[batch_ids[result.row]].append({"position": result.position, "verified": result.verified,
                                            "emitted": emitted, "chunk_end": chunk_ends[result.row]})
    return results
sampler.verify_rows = recording
llm = LLM(model=target, max_model_len=256, max_num_seqs=len(prompts), enforce_eager=True, dtype="float32", seed=0,
          block_size=32, num_gpu_blocks_override=10, max_num_batched_tokens=64,
          speculative_config={"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3,
                              "prompt_lookup_min": 1})
params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True,
                        extra_args={"securesd": {"verifier": "lossless"}})
done = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
def own(request_id, table):  # the engine's ids are the request's id, "-" and a suffix
    return [value for key, value in table.items() if key.split("-")[0] == request_id]
print("RESULT " + json.dumps([
    {"tokens": list(d.outputs[0].token_ids), "preemptions": sum(own(d.request_id, preempted)),
     "rows": [row for listed in own(d.request_id, rows) for row in listed]}
    for d in done
]))
"""


@pytest.fixture(scope="module")
def preempted_run(pair_dir) -> list[dict]:
    env = {**os.environ, **engine_environment(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "SECURESD_VLLM": "1"}
    command = [sys.executable, "-c", ENGINE_SCRIPT, str(pair_dir / "target"), json.dumps(PROMPTS),
               str(NEW_TOKENS), str(NUM_SPECULATIVE_TOKENS)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"engine failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_the_cache_is_small_enough_to_preempt_and_resume(preempted_run):
    """Otherwise the other tests prove little: requests were preempted and resumed, some resumed
    request's recomputation emitted a token (a row without drafts, past response position 0) and some
    recomputation ran in several chunks (a step that stops short of the row's last token)."""
    assert sum(result["preemptions"] for result in preempted_run) > 0
    listed = [row for result in preempted_run for row in result["rows"]]
    assert [row for row in listed if not row["verified"] and row["position"] > 0 and row["chunk_end"]]
    assert [row for row in listed if not row["chunk_end"] and row["position"] > 0]


def test_every_row_records_where_its_tokens_land(preempted_run):
    """Every row whose step reaches its last known token (a prefill chunk before that emits a token
    vLLM drops) records the position where its accepted drafts and emitted token sit in the output."""
    for result in preempted_run:
        sequence = result["tokens"]
        assert result["rows"]
        for row in (row for row in result["rows"] if row["chunk_end"]):
            position, emitted = row["position"], row["emitted"]
            assert position < len(sequence) or not emitted, row
            assert sequence[position : position + len(emitted)] == emitted[: len(sequence) - position], row


def test_lossless_equals_target_greedy_through_preemption(preempted_run, hf_models):
    _, target = hf_models
    for prompt, result in zip(PROMPTS, preempted_run):
        expected = target.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                   eos_token_id=None)[0, len(prompt):].tolist()
        assert result["tokens"] == expected
