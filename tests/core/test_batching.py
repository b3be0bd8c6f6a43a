"""Batched speculative decoding: rows accept different numbers of drafts and advance independently.

Greedy batched output must equal the same prompts run one at a time, for every verifier with the
deterministic schedules (None, Step). Linear and Power make verification random even at T = 0
(alpha_mix is fractional there), so for them, as for sampling, the batched output is checked in
distribution (tests/core/test_lossless_sampling.py draws its samples in batches).
"""

from __future__ import annotations

import pytest
import torch

from hf_securesd import VERIFIERS, Step
from hf_securesd.tiny import byte_tokenizer

TEXTS = (
    "hi",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):",
    "What is 2 + 2?",
    "x",
    "Once upon a time, in a land far away, there lived",
    "SELECT * FROM",
    "12345",
    "Tell me a story about a robot who learns to paint.",
    "<html>",
    "import numpy as np",
    "Why is the sky blue?",
    "aaaa",
)
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def one_at_a_time(target, draft, tokenizer, texts, **kwargs) -> list[list[int]]:
    outputs = []
    for text in texts:
        single = tokenizer(text, return_tensors="pt")
        out = target.generate(**single, max_new_tokens=NEW_TOKENS, assistant_model=draft, do_sample=False, **kwargs)
        outputs.append(out[0, single["input_ids"].shape[1] :].tolist())
    return outputs


def batched(target, draft, tokenizer, texts, **kwargs):
    encoded = tokenizer(list(texts), return_tensors="pt", padding=True)
    out = target.generate(**encoded, max_new_tokens=NEW_TOKENS, assistant_model=draft, do_sample=False,
                          return_dict_in_generate=True, **kwargs)
    width = encoded["input_ids"].shape[1]
    return out, [out.sequences[b, width:].tolist() for b in range(len(texts))]


def strip_padding(generated: list[int], reference: list[int], pad: int) -> list[int]:
    """A row that finished early is right-padded; everything after its own length must be padding."""
    assert all(token == pad for token in generated[len(reference) :])
    return generated[: len(reference)]


@pytest.mark.parametrize("schedule", [None, Step(L=2)], ids=["none", "step2"])
@pytest.mark.parametrize("name", list(VERIFIERS))
def test_batched_greedy_equals_one_at_a_time(llama_pair, tokenizer, name, schedule):
    draft, target = llama_pair
    verifier = VERIFIERS[name].sweep()[-1]  # the lossy end: rows accept very different numbers of drafts
    expected = one_at_a_time(target, draft, tokenizer, TEXTS, verifier=verifier, secure_schedule=schedule)
    pad = target.generation_config.pad_token_id
    for batch_size in (2, 4, 8):
        for start in range(0, len(TEXTS), batch_size):
            texts = TEXTS[start : start + batch_size]
            out, generated = batched(target, draft, tokenizer, texts, verifier=verifier, secure_schedule=schedule)
            for row, reference in zip(generated, expected[start : start + batch_size]):
                assert strip_padding(row, reference, pad) == reference
            assert len(out.speculative_stats_per_row) == len(texts)


def test_rows_accept_different_numbers_and_keep_their_own_statistics(llama_pair, tokenizer):
    draft, target = llama_pair
    out, _ = batched(target, draft, tokenizer, TEXTS[:8], verifier="lossless")
    per_row = [stats.accepted_per_round for stats in out.speculative_stats_per_row]
    first_rounds = {tuple(rounds[:3]) for rounds in per_row}
    assert len(first_rounds) > 1, "all rows accepted the same numbers: the batch was not ragged"
    merged = out.speculative_stats
    assert merged.accepted_tokens == sum(stats.accepted_tokens for stats in out.speculative_stats_per_row)
    assert merged.new_tokens == sum(stats.new_tokens for stats in out.speculative_stats_per_row)


def test_a_row_finishing_at_the_first_token_and_one_running_to_the_end(llama_pair, tokenizer):
    draft, target = llama_pair
    texts = ("The quick brown fox", "def add(a, b):")
    singles = one_at_a_time(target, draft, tokenizer, texts, verifier="mars")
    eos = singles[0][0]  # the first row's first token ends it
    assert eos not in singles[1], "pick texts whose second row never emits the first row's first token"
    expected = one_at_a_time(target, draft, tokenizer, texts, verifier="mars", eos_token_id=eos)
    assert len(expected[0]) == 1 and len(expected[1]) == NEW_TOKENS
    out, generated = batched(target, draft, tokenizer, texts, verifier="mars", eos_token_id=eos, pad_token_id=0)
    assert generated[0] == [eos] + [0] * (NEW_TOKENS - 1)
    assert generated[1] == expected[1]
    assert out.speculative_stats_per_row[0].new_tokens == 1


def test_batched_real_vocabulary_qwen_architecture(qwen_pair, tokenizer):
    draft, target = qwen_pair
    expected = one_at_a_time(target, draft, tokenizer, TEXTS[:6], verifier="speccascade", secure_schedule=Step(L=1))
    _, generated = batched(target, draft, tokenizer, TEXTS[:6], verifier="speccascade", secure_schedule=Step(L=1))
    pad = target.generation_config.pad_token_id
    assert [strip_padding(row, ref, pad) for row, ref in zip(generated, expected)] == expected
