"""SecureSD behind vLLM's other proposers, inside a real engine on CPU, on the tiny random Qwen2
target: n-gram lookup (one-hot drafts, no draft distribution), EAGLE and EAGLE-3 (tiny random heads
built for the target, `hf_securesd.vllm.tiny_heads`, drafting from their own distribution over the
target's vocabulary), against engine-free references:

* lossless = target greedy;
* every relaxed verifier that needs no draft distribution, with `Step(2)`: the first two tokens are
  target greedy; with and without a schedule, every verified round equals `mixing.verify_round` on
  the same drafts with the target's logits recomputed by HF at the response position the plugin gave
  the round (so a position off by one fails: the schedule and the context would differ). At T = 0
  these rules read only the target, so the reference needs no draft logits for EAGLE either;
* n-gram: FSD, BiLD with a fallback and SpecCascade `rule="chow"` (they read the draft's
  distribution) are refused at admission with the reason, and the engine keeps serving; EAGLE, which
  has a draft distribution, runs them;
* EAGLE-3 (the same proposer class as EAGLE, with its own head) runs lossless and the accept-everything
  LossySD under `Step(2)` only, to keep CI short.

Each engine runs in a fresh interpreter (one engine per process) that records every verified round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from vllm_support import NUM_SPECULATIVE_TOKENS, engine_environment, requires_vllm

from hf_securesd import MARS, BiLD, FLy, LossySD, SpecCascade, Step
from hf_securesd.mixing import verify_round
from hf_securesd.verifiers.base import RoundInputs
from hf_securesd.vllm.tiny_heads import build_eagle3_head, build_eagle_head

pytestmark = requires_vllm()

NEW_TOKENS = 24
# Repetitive prompts, so that n-gram lookup finds matches and drafts.
PROMPTS = [list(b"abc abc abc abc abc"), list(b"def add(a, b): return a + b\ndef add(a, b):")]
RELAXED = {
    "lossysd": LossySD(epsilon=1.0),
    "bild": BiLD(tau_rb=8.0),
    "speccascade": SpecCascade(a=0.9),
    "fly": FLy(tau=0.1, window=2),
    "mars": MARS(theta=0.5),
}
REFUSED = {
    "fsd": ({"verifier": "fsd", "tau": 0.5}, "FSD compares the draft's distribution"),
    "bild-fallback": ({"verifier": "bild", "tau_fb": 0.5}, "BiLD's fallback"),
    "speccascade-chow": ({"verifier": "speccascade", "rule": "chow"}, "rule='chow'"),
}
ENGINE_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
from hf_securesd.vllm import sampler
target, speculative, jobs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
rounds = []
original = sampler.verify_rows
def recording(plans, output, draft_token_ids, num_draft_tokens, *args, **kwargs):
    results = original(plans, output, draft_token_ids, num_draft_tokens, *args, **kwargs)
    starts = [sum(num_draft_tokens[:row]) for row in range(len(num_draft_tokens))]
    for result in results:
        start = starts[result.row]
        drafts = draft_token_ids[start: start + num_draft_tokens[result.row]].tolist()
        emitted = [t for t in output[result.row].tolist() if t >= 0]
        rounds.append({"position": result.position, "verified": result.verified, "accepted": result.accepted,
                       "drafts": drafts, "emitted": emitted})
    return results
sampler.verify_rows = recording
llm = LLM(model=target, speculative_config=speculative, max_model_len=256, max_num_seqs=4, enforce_eager=True,
          dtype="float32", seed=0)
out = []
for job in jobs:
    rounds.clear()
    params = SamplingParams(max_tokens=job["max_tokens"], temperature=0, extra_args=job["extra_args"])
    try:
        done = llm.generate([{"prompt_token_ids": job["prompt"]}], params, use_tqdm=False)
        out.append({"tokens": list(done[0].outputs[0].token_ids), "rounds": list(rounds)})
    except Exception as error:
        out.append({"error": type(error).__name__ + ": " + str(error)})
print("RESULT " + json.dumps(out))
"""


def securesd(verifier, schedule=None) -> dict:
    return {"securesd": {"verifier": verifier if isinstance(verifier, (str, dict)) else verifier.to_dict(),
                         "secure_schedule": None if schedule is None else schedule.to_dict()}}


def run_engine(pair_dir, speculative: dict, jobs: list[dict]) -> list[dict]:
    env = {**os.environ, **engine_environment(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "SECURESD_VLLM": "1"}
    target = str(pair_dir / "target")
    command = [sys.executable, "-c", ENGINE_SCRIPT, target, json.dumps(speculative), json.dumps(jobs)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"engine failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def jobs(method: str) -> list[tuple[tuple, dict]]:
    """(name, job) pairs: plain and lossless per prompt, each relaxed verifier the method runs
    (`RELAXED_RUN`) with its schedules (`SCHEDULES_RUN`), the refused ones (not for eagle3), then a plain
    request (the engine keeps serving)."""
    listed = []
    for index, prompt in enumerate(PROMPTS):
        listed.append((("plain", index), {"prompt": prompt, "extra_args": None}))
        listed.append((("lossless", index), {"prompt": prompt, "extra_args": securesd("lossless")}))
        for name in RELAXED_RUN[method]:
            for L in SCHEDULES_RUN[method]:
                schedule = None if L is None else Step(L=L)
                key = (name, index, L)
                listed.append((key, {"prompt": prompt, "extra_args": securesd(RELAXED[name], schedule)}))
    if method != "eagle3":
        for name, (verifier, _) in REFUSED.items():
            listed.append(((name, 0), {"prompt": PROMPTS[0], "extra_args": securesd(verifier)}))
    listed.append((("plain-after", 0), {"prompt": PROMPTS[0], "extra_args": None}))
    return [(key, {**job, "max_tokens": NEW_TOKENS}) for key, job in listed]


PROPOSERS = ["ngram", "eagle", "eagle3"]
# EAGLE-3 drafts through the same proposer class as EAGLE: its engine runs lossless and one relaxed rule
# under Step(2) (fewer jobs, for CI time); the other two run every rule.
RELAXED_RUN = {"ngram": tuple(RELAXED), "eagle": tuple(RELAXED), "eagle3": ("lossysd",)}
SCHEDULES_RUN = {"ngram": (None, 2), "eagle": (None, 2), "eagle3": (2,)}


def speculative_config(method: str, pair_dir: Path, tmp_path_factory) -> dict:
    """The engine's speculative_config; EAGLE heads are random, built for the tiny target."""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    build = build_eagle_head if method == "eagle" else build_eagle3_head
    head = build(pair_dir / "target", tmp_path_factory.mktemp(f"{method}_head"))
    return {"method": method, "model": str(head), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}


@pytest.fixture(scope="module", params=PROPOSERS)
def proposer_results(request, pair_dir, tmp_path_factory) -> tuple[str, dict]:
    """(method, {job key: result}) for one engine per proposer."""
    method = request.param
    listed = jobs(method)
    speculative = speculative_config(method, pair_dir, tmp_path_factory)
    results = run_engine(pair_dir, speculative, [job for _, job in listed])
    return method, {key: result for (key, _), result in zip(listed, results)}


def target_greedy(hf_models, prompt, n) -> list[int]:
    _, target = hf_models
    out = target.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)[0, len(prompt):].tolist()
    return out[: out.index(258) + 1] if 258 in out else out


def reference_round(hf_models, verifier, schedule, prompt, tokens, round_) -> tuple[int, int]:
    """(accepted, next token) of `mixing.verify_round` on the round's one-hot drafts, with the target's
    logits recomputed by HF for the committed prefix at the round's response position."""
    _, target = hf_models
    position, drafts = round_["position"], round_["drafts"][: round_["verified"]]
    context = torch.tensor([prompt + tokens[:position] + drafts])
    with torch.no_grad():
        logits = target(context).logits[0, len(prompt) + position - 1 :].float()  # [n + 1, V]
    round_inputs = RoundInputs(
        draft_tokens=torch.tensor([drafts]), target_logits=logits[None], draft_logits=None,
        target_raw_logits=logits[None], draft_raw_logits=None, greedy=True,
    )
    positions = position + torch.arange(len(drafts))[None]
    eta = torch.ones(positions.shape) if schedule is None else schedule.eta(positions)
    accepted, token, _ = verify_round(verifier, round_inputs, eta)
    return int(accepted), int(token)


def test_the_proposer_drafts_and_lossless_equals_target_greedy(proposer_results, hf_models):
    _, ngram_results = proposer_results
    for index, prompt in enumerate(PROMPTS):
        expected = target_greedy(hf_models, prompt, NEW_TOKENS)
        assert ngram_results[("plain", index)]["tokens"] == expected
        lossless = ngram_results[("lossless", index)]
        assert lossless["tokens"] == expected
    drafted = [r for key, result in ngram_results.items() if key[0] == "lossless" for r in result["rounds"]]
    assert any(r["verified"] for r in drafted), "the proposer drafted nothing: the test proves little"


@pytest.mark.parametrize("name", list(RELAXED))
def test_relaxed_verifiers_equal_the_engine_free_rule_on_the_same_drafts(proposer_results, hf_models, name):
    method, ngram_results = proposer_results
    if name not in RELAXED_RUN[method]:
        pytest.skip(f"the {method} engine runs {RELAXED_RUN[method]} only (CI time)")
    verifier = RELAXED[name]
    for index, prompt in enumerate(PROMPTS):
        for L in SCHEDULES_RUN[method]:
            result = ngram_results[(name, index, L)]
            tokens, schedule = result["tokens"], None if L is None else Step(L=L)
            if L is not None:
                assert tokens[:L] == target_greedy(hf_models, prompt, L)
            for round_ in result["rounds"]:
                if not round_["verified"]:
                    continue
                accepted, token = reference_round(hf_models, verifier, schedule, prompt, tokens, round_)
                emitted = round_["emitted"]
                assert (round_["accepted"], emitted[-1]) == (accepted, token), (name, index, L, round_)
                assert emitted[:accepted] == round_["drafts"][:accepted]
                position = round_["position"]
                assert tokens[position : position + len(emitted)] == emitted[: len(tokens) - position]


def test_relaxed_verification_fires_on_these_drafts(proposer_results, hf_models):
    """The accept-everything rule (under Step(2) for eagle3) changes some reply: otherwise the
    comparisons prove little."""
    method, ngram_results = proposer_results
    key = ("lossysd", SCHEDULES_RUN[method][0])
    changed = [
        index for index, prompt in enumerate(PROMPTS)
        if ngram_results[(key[0], index, key[1])]["tokens"] != target_greedy(hf_models, prompt, NEW_TOKENS)
    ]
    assert changed


@pytest.mark.parametrize("name", list(REFUSED))
def test_rules_that_read_the_draft_distribution_need_one(proposer_results, name):
    """Refused at admission behind n-gram lookup (VLLMValidationError: HTTP 400 from the server), with
    the rule's reason; served behind EAGLE, whose drafts come with a distribution."""
    method, results = proposer_results
    _, message = REFUSED[name]
    if method == "eagle3":
        pytest.skip("the eagle3 engine runs lossless and one relaxed rule only (eagle's proposer class)")
    if method == "ngram":
        error = results[(name, 0)]["error"]
        assert "VLLMValidationError" in error and message in error
        assert "ngram proposer has no draft distribution" in error
    else:
        assert "error" not in results[(name, 0)] and len(results[(name, 0)]["tokens"]) > 1
        assert any(round_["verified"] for round_ in results[(name, 0)]["rounds"])
    assert results[("plain-after", 0)]["tokens"] == results[("plain", 0)]["tokens"]
