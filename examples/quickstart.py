"""Quickstart on tiny random models (no download): the one-line change, every verifier with and
without SecureSD, and the statistics that come back with `return_dict_in_generate=True`.

    python examples/quickstart.py

For real models see `securesd demo` (README).
"""

from __future__ import annotations

from dataclasses import replace

import torch

import hf_securesd
from hf_securesd import VERIFIERS, Step
from hf_securesd.tiny import byte_tokenizer, tiny_pair


def main() -> None:
    torch.manual_seed(0)
    tokenizer = byte_tokenizer()
    draft, target = tiny_pair()
    target = hf_securesd.wrap(target)  # the one-line change

    messages = [{"role": "user", "content": "Say something."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt_length = inputs["input_ids"].shape[1]
    reference = target.generate(**inputs, max_new_tokens=32, do_sample=False)
    print(f"target greedy: {reference[0, prompt_length:].tolist()[:12]}...")

    print(f"\n{'verifier':<62} {'schedule':<10} {'AR':>5} {'same as target':>15} {'mean TV, first 4 positions':>28}")
    for name, verifier_class in VERIFIERS.items():
        lossy = verifier_class.sweep()[-1]  # the most lenient setting of the knob
        if name == "vllm_fly":
            # vLLM's default window, min(6, k - 1) = 4 at k = 5, defers a draft only when the 4 drafts after it
            # are accepted: on random models that almost never happens, so this demo pins W = 1.
            lossy = replace(lossy, window=1)
        for schedule in (None, Step(L=4)):
            out = target.generate(
                **inputs, assistant_model=draft, verifier=lossy, secure_schedule=schedule,
                max_new_tokens=32, do_sample=False, return_dict_in_generate=True,
            )
            stats = out.speculative_stats
            same = torch.equal(out.sequences, reference)
            tv = " ".join(f"{value:.2f}" for value in stats.position_tv[:4])
            print(f"{str(lossy):<62} {str(schedule):<10} {stats.acceptance_rate:5.2f} {str(same):>15} {tv:>28}")
            if name == "lossless":
                break


if __name__ == "__main__":
    main()
