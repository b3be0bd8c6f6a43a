"""Segment schedules for reasoning models, on tiny random models (no download).

A reasoning model thinks, writes a boundary (Qwen3: the added token `</think>`) and then answers; the
answer's first tokens decide refusal or compliance. `Segments` relaxes the thinking and verifies the
opening of the answer exactly, counting the answer's positions from the boundary.

The tiny models here never learned a `</think>`, so the example designates a boundary they do write:
the text "?" (one byte token), which the relaxed run of this prompt first emits mid-reply. It is given
as text and resolved with `tokenizer=`, exactly as `Segments("</think>", ...)` is for a Qwen3 model.
It prints, per schedule, the acceptance rate, where the answer started, how many of the answer's first
tokens are the target's greedy choice, and the acceptance and deviation by position within each
segment (`out.segment_stats`).

    python examples/reasoning_segments.py
"""

from __future__ import annotations

import torch

import hf_securesd
from hf_securesd import LossySD, Segments, Step
from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair

NEW_TOKENS = 32
ANSWER_CHECKED = 6  # how many answer tokens to compare with the target's greedy choice
PROMPT = "SELECT * FROM"
BOUNDARY = "?"  # the designated "</think>"


def fmt(values: list[float], count: int = 6) -> str:
    return " ".join("  - " if value != value else f"{value:4.2f}" for value in values[:count])


@torch.no_grad()
def main() -> None:
    tokenizer = byte_tokenizer()
    draft, target = tiny_pair(TinyPairSpec(architecture="llama", seed=0))
    for model in (draft, target):
        model.generation_config.eos_token_id = None  # full-length replies
    target = hf_securesd.wrap(target)
    inputs = tokenizer(PROMPT, return_tensors="pt")
    width = inputs["input_ids"].shape[1]
    options = dict(assistant_model=draft, verifier=LossySD(epsilon=1.0), num_assistant_tokens=4,
                   max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                   tokenizer=tokenizer)  # resolves the text boundary
    (boundary,) = tokenizer.encode(BOUNDARY)

    schedules = {
        "relaxed everywhere (None)": None,
        "Step(1) from the response start": Step(L=1),
        "TensorRT-LLM: after='lossless'": Segments(BOUNDARY, before=None, after="lossless"),
        "relaxed thinking, after=Step(4)": Segments(BOUNDARY, before=None, after=Step(L=4)),
        "before=Step(1), after=Step(4)": Segments(BOUNDARY, before=Step(L=1), after=Step(L=4)),
    }
    for label, schedule in schedules.items():
        out = target.generate(**inputs, secure_schedule=schedule, **options)
        response = out.sequences[0, width:].tolist()
        greedy = target(out.sequences).logits[0, width - 1 : -1].argmax(-1).tolist()
        start = response.index(boundary) + 1 if boundary in response else None
        line = f"{label:<34} AR {out.speculative_stats.acceptance_rate:4.2f}"
        if start is not None:
            answer = range(start, min(start + ANSWER_CHECKED, NEW_TOKENS))
            exact = sum(response[j] == greedy[j] for j in answer)
            line += f"   answer starts at {start}; of its first {len(answer)} tokens {exact} are the target's"
        print(line)
        segments = out.segment_stats
        if segments is not None:
            print(f"    segment starts per row: {segments.segment_starts}")
            for side in ("before", "after"):
                part = getattr(segments, side)
                print(f"    {side:<6}: acceptance {fmt(part.acceptance_rate)} | TV {fmt(part.tv)}")


if __name__ == "__main__":
    main()
