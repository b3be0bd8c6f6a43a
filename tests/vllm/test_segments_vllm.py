"""Segment schedules inside a real vLLM engine on CPU: the same tokens as the `generate` path for
boundaries on a step's first draft, mid-step, on the bonus token, split over two tokens and over two
steps, and for a batch whose rows cross the boundary at different steps; the L tokens after the
boundary are the target's greedy choice (full target forwards); no boundary is `before` alone.
Requests here carry one token-id boundary each; the plugin also takes several boundaries and text
boundaries, which it resolves with the model's tokenizer at admission (`tests/vllm/test_request.py`).

vLLM commits response token 0 at prefill, from the target; its first drafted token sits at response
position 1. The `generate` reference therefore continues from that first token with `before` shifted
by one position (Step(L) -> Step(L - 1)); `after` is counted from the boundary and needs no shift (the
boundaries here end well after token 0). With LossySD(epsilon=1) every draft is accepted where eta = 1,
so a step drafts positions 4s+1..4s+3 and its bonus token sits at 4s+4 (k = 3) until the boundary.
"""

from __future__ import annotations

import os

import pytest
import torch
from vllm_support import NUM_SPECULATIVE_TOKENS, engine_environment, requires_vllm

from hf_securesd import LossySD, Segments, Step

pytestmark = requires_vllm()

K = NUM_SPECULATIVE_TOKENS
EOS = 258
NEW_TOKENS = 24
L = 3
RELAXED = LossySD(epsilon=1.0)
PROMPTS = [list(text.encode()) for text in (
    "hello world", "def add(a, b):", "The quick brown fox", "What is 2 + 2?", "Once upon a time",
    "SELECT * FROM", "12345", "<html>", "import numpy", "Why is the sky blue?", "aaaa", "x",
)]
# response positions of the boundary's tokens in the relaxed run (k = 3: step s drafts 4s+1..4s+3)
PLACEMENTS = {
    "first_draft": (5,),
    "mid_round": (6,),
    "bonus": (8,),
    "split_in_round": (5, 6),
    "split_over_rounds": (8, 9),
}


@pytest.fixture(scope="module")
def engine(pair_dir):
    saved = dict(os.environ)
    os.environ.update({**engine_environment(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "SECURESD_VLLM": "1"})
    try:
        from vllm import LLM

        yield LLM(
            model=str(pair_dir / "target"),
            speculative_config={
                "method": "draft_model",
                "model": str(pair_dir / "draft"),
                "num_speculative_tokens": K,
                "draft_sample_method": "probabilistic",
            },
            max_model_len=256,
            max_num_seqs=8,
            enforce_eager=True,
            dtype="float32",
            seed=0,
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)


def cut(sequence: list[int]) -> list[int]:
    """The first NEW_TOKENS tokens, ending at the first EOS (inclusive), as both engines stop there."""
    out = []
    for token in sequence[:NEW_TOKENS]:
        out.append(token)
        if token == EOS:
            break
    return out


def vllm_tokens(engine, prompts, schedule) -> list[list[int]]:
    from vllm import SamplingParams

    secure_schedule = None if schedule is None else schedule.to_dict()
    request = {"verifier": RELAXED.to_dict(), "secure_schedule": secure_schedule}
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, extra_args={"securesd": request})
    outputs = engine.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def shifted(schedule):
    return Step(L=max(0, schedule.L - 1)) if isinstance(schedule, Step) else schedule


@torch.no_grad()
def generate_reference(hf_models, prompt: list[int], segments: Segments) -> list[int]:
    draft, target = hf_models
    first = int(target(torch.tensor([prompt])).logits[0, -1].argmax())
    continued = Segments(segments.boundary, before=shifted(segments.before), after=segments.after)
    out = target.generate(
        torch.tensor([prompt + [first]]), assistant_model=draft, verifier=RELAXED, secure_schedule=continued,
        num_assistant_tokens=K, max_new_tokens=NEW_TOKENS + K + 1, do_sample=False,
    )
    return cut([first] + out[0, len(prompt) + 1 :].tolist())


@torch.no_grad()
def target_choices(hf_models, prompt: list[int], response: list[int]) -> list[int]:
    _, target = hf_models
    return target(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].argmax(-1).tolist()


def first_end(response: list[int], boundary: tuple[int, ...]) -> int | None:
    return next((end for end in range(len(boundary), len(response) + 1)
                 if tuple(response[end - len(boundary) : end]) == boundary), None)


@pytest.fixture(scope="module")
def relaxed_runs(engine):
    return vllm_tokens(engine, PROMPTS, None)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_segments_match_the_generate_path(engine, hf_models, relaxed_runs, placement):
    positions = PLACEMENTS[placement]
    start = positions[-1] + 1
    for prompt, base in zip(PROMPTS, relaxed_runs):
        if len(base) < start + L:
            continue
        boundary = tuple(base[p] for p in positions)
        if first_end(base, boundary) != start:
            continue
        choices = target_choices(hf_models, prompt, base)
        if all(base[j] == choices[j] for j in range(start, start + L)):
            continue  # the schedule would change nothing here
        segments = Segments([list(boundary)], before=None, after=Step(L=L))
        (got,) = vllm_tokens(engine, [prompt], segments)
        assert got == generate_reference(hf_models, prompt, segments)
        assert got[:start] == base[:start] and got != base
        assert got[start : start + L] == target_choices(hf_models, prompt, got)[start : start + L]
        return
    pytest.fail(f"no prompt places a boundary at {positions}: extend PROMPTS")


def test_rows_of_one_batch_cross_at_different_steps(engine, hf_models, relaxed_runs):
    for token in range(256):
        steps = {}
        for index, base in enumerate(relaxed_runs):
            if token in base[1 : NEW_TOKENS - L - 1] and token != base[0]:
                steps.setdefault((base.index(token) - 1) // (K + 1), index)
        if len(steps) >= 3:
            break
    else:
        pytest.fail("no token is first emitted at three different steps by different prompts")
    rows = sorted(steps.values())[:3]
    prompts = [PROMPTS[index] for index in rows]
    segments = Segments([token], before=Step(L=1), after=Step(L=L))
    got = vllm_tokens(engine, prompts, segments)
    assert got == [generate_reference(hf_models, prompt, segments) for prompt in prompts]


def test_no_boundary_is_before_alone(engine, relaxed_runs):
    absent = next(t for t in range(256) if all(t not in base for base in relaxed_runs))
    prompts = PROMPTS[:4]
    assert vllm_tokens(engine, prompts, Segments([absent], before=Step(L=2))) == vllm_tokens(
        engine, prompts, Step(L=2)
    )


def test_a_text_boundary_is_resolved_with_the_models_tokenizer(engine, relaxed_runs, pair_dir):
    """Admission resolves a text boundary with the engine's tokenizer and hands the workers its ids: the
    same tokens as the token-id boundary."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(pair_dir / "target")
    base = relaxed_runs[0]
    token = next(t for t in base[3:] if tokenizer.decode([t]) and tokenizer.convert_ids_to_tokens(t) == tokenizer.decode([t]))
    text = tokenizer.decode([token])
    prompts = PROMPTS[:2]
    by_text = vllm_tokens(engine, prompts, Segments(text, before=None, after=Step(L=3)))
    by_ids = vllm_tokens(engine, prompts, Segments([token], before=None, after=Step(L=3)))
    assert by_text == by_ids
