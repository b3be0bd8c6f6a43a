"""A step holding plain and SecureSD rows (`hf_securesd.vllm.verification.patch_rejection_module`): vLLM's
own constraints run for the plain rows over the whole step, and are handed the step's sampling settings
without the top-k / top-p that only SecureSD rows ask for (`for_plain_rows`); what vLLM reads back
(processed logprobs) still holds each SecureSD row's own filters, as in a step without plain rows. A
stand-in rejection module (vLLM's constraints as a function of the metadata) keeps these tests free of
vLLM."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from hf_securesd.vllm import verification

VOCAB = 8


@dataclass
class Metadata:
    """The fields of vLLM's SamplingMetadata (a dataclass) that the constraints read."""

    temperature: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    all_greedy: bool = False
    all_random: bool = True
    generators: dict | None = None


def top_k_only(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """A stand-in for vLLM's top-k/top-p op (top-k only): each row keeps its k largest scores."""
    if k is None:
        return logits
    kth = logits.sort(dim=-1, descending=True).values.gather(1, (k.long() - 1)[:, None])
    return logits.masked_fill(logits < kth, float("-inf"))


@pytest.fixture
def module():
    seen: list[Metadata] = []

    def apply_sampling_constraints(logits, cu_num_draft_tokens, metadata):
        seen.append(metadata)
        counts = torch.diff(cu_num_draft_tokens, prepend=torch.zeros(1, dtype=cu_num_draft_tokens.dtype))
        k = None if metadata.top_k is None else metadata.top_k.repeat_interleave(counts)
        return top_k_only(logits, k, None)

    sampler = type("Sampler", (), {"forward": lambda *a, **k: None, "apply_logits_processors": lambda *a, **k: None})
    fake = SimpleNamespace(rejection_sample=None, apply_sampling_constraints=apply_sampling_constraints,
                           PLACEHOLDER_TOKEN_ID=-1, Sampler=sampler)
    undo = verification.patch_rejection_module(fake, top_k_only)
    fake.seen = seen
    yield fake
    undo()
    verification._current_step = None


def run_step(module, plain_filters: tuple[bool, bool], top_k: list[int]) -> torch.Tensor:
    """Row 0 (SecureSD) and row 1 (plain), two drafted positions each; returns what vLLM reads back."""
    logits = torch.arange(4 * VOCAB, dtype=torch.float32).reshape(4, VOCAB)
    step = verification.StepPlan([SimpleNamespace(row=0)], logits, [2, 2], has_plain_rows=True,
                                 plain_filters=plain_filters)
    verification._current_step = step
    metadata = Metadata(temperature=torch.ones(2), top_k=torch.tensor(top_k, dtype=torch.int32), top_p=None)
    returned = module.apply_sampling_constraints(logits.clone(), torch.tensor([2, 4]), metadata)
    assert torch.equal(step.target_logits[:2], top_k_only(logits[:2], torch.tensor([top_k[0]] * 2), None))
    return returned


def test_only_securesd_rows_filter_vllms_call_gets_none_and_their_positions_keep_their_filter(module):
    returned = run_step(module, plain_filters=(False, False), top_k=[2, VOCAB])
    assert module.seen[-1].top_k is None  # vLLM's filter code is not reached for the SecureSD row's top_k
    logits = torch.arange(4 * VOCAB, dtype=torch.float32).reshape(4, VOCAB)
    assert torch.equal(returned[:2], top_k_only(logits[:2], torch.tensor([2, 2]), None))  # its own top-k
    assert torch.equal(returned[2:], logits[2:])  # the plain row asked for none


def test_a_plain_row_asking_for_top_k_keeps_vllms_call_as_it_was(module):
    returned = run_step(module, plain_filters=(True, False), top_k=[2, 3])
    assert torch.equal(module.seen[-1].top_k, torch.tensor([2, 3], dtype=torch.int32))
    logits = torch.arange(4 * VOCAB, dtype=torch.float32).reshape(4, VOCAB)
    assert torch.equal(returned, top_k_only(logits, torch.tensor([2, 2, 3, 3]), None))
