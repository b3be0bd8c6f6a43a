"""The stopping criteria transformers prepared: a caller's MaxLengthCriteria / EosTokenCriteria replace
the ones built from the config (as in plain decoding), and a criterion reading `scores` gets them."""

from __future__ import annotations

import pytest
import torch
from transformers import MaxLengthCriteria, StoppingCriteria, StoppingCriteriaList
from transformers.generation.stopping_criteria import EosTokenCriteria

import hf_securesd
from hf_securesd import stopping
from hf_securesd.tiny import TinyPairSpec, tiny_pair

PROMPT = torch.tensor([[7, 8, 9, 10, 11], [0, 0, 12, 13, 14]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
SPEC = TinyPairSpec(architecture="llama", seed=4)


@pytest.fixture(scope="module")
def pair():
    draft, target = tiny_pair(SPEC)
    return draft, hf_securesd.wrap(target)


def _both(target, draft, rows: int, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    inputs = dict(input_ids=PROMPT[:rows], attention_mask=MASK[:rows], do_sample=False, pad_token_id=0, **kwargs)
    return target.generate(**inputs), target.generate(**inputs, assistant_model=draft, verifier="lossless")


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("extra", [-2, 0, 3, 9])
def test_a_callers_max_length_criteria_replaces_the_configs(pair, rows, extra):
    """Shorter than max_new_tokens, as long as the prompt (one token, as plain decoding gives), and longer
    than max_new_tokens (the caller's criterion replaces the config's length)."""
    draft, target = pair
    criteria = StoppingCriteriaList([MaxLengthCriteria(max_length=PROMPT.shape[1] + extra)])
    plain, ours = _both(target, draft, rows, max_new_tokens=6, stopping_criteria=criteria)
    assert plain.shape[1] == PROMPT.shape[1] + max(extra, 1)
    assert torch.equal(ours, plain)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_callers_eos_criteria_replaces_the_configs_eos(pair, rows):
    """The caller's EOS ends rows; the config's own EOS no longer does (plain decoding's merge)."""
    draft, target = pair
    greedy, _ = _both(target, draft, rows, max_new_tokens=20)
    response = greedy[0, PROMPT.shape[1] :].tolist()
    stop, config_eos = response[4], response[1]
    assert stop not in response[:4] and config_eos != stop
    criteria = StoppingCriteriaList([EosTokenCriteria(eos_token_id=[stop])])
    plain, ours = _both(target, draft, rows, max_new_tokens=20, stopping_criteria=criteria, eos_token_id=config_eos)
    row = plain[0, PROMPT.shape[1] :].tolist()
    assert row[: row.index(stop) + 1] == response[:5] and set(row[5:]) <= {0}  # ended at the stop, then padding
    assert torch.equal(ours, plain)


class StopOnTopScore(StoppingCriteria):
    """Stops once the last scores' top token is `token`: it reads `scores[-1]` as plain decoding passes it."""

    def __init__(self, token: int) -> None:
        self.token, self.seen = token, []

    def __call__(self, input_ids, scores, **kwargs):
        self.seen.append(len(scores))
        return (scores[-1].argmax(-1) == self.token).expand(input_ids.shape[0])


def test_criteria_receive_the_scores_with_output_scores(pair):
    draft, target = pair
    greedy, _ = _both(target, draft, 1, max_new_tokens=20)
    token = int(greedy[0, PROMPT.shape[1] + 5])
    runs = []
    for assistant in (None, draft):
        criterion = StopOnTopScore(token)
        extra = {} if assistant is None else dict(assistant_model=draft, verifier="lossless", num_assistant_tokens=8)
        out = target.generate(
            PROMPT[:1], max_new_tokens=20, do_sample=False, output_scores=True, return_dict_in_generate=True,
            stopping_criteria=StoppingCriteriaList([criterion]), **extra,
        )
        runs.append((out.sequences, criterion.seen))
    (plain, plain_seen), (ours, ours_seen) = runs
    assert torch.equal(ours, plain)
    assert ours_seen == plain_seen == list(range(1, len(plain_seen) + 1))  # one more score per token


def test_limits_read_the_merged_criteria():
    eos = torch.tensor([2])
    assert stopping.limits(StoppingCriteriaList(), 30, eos) == (30, eos)
    criteria = StoppingCriteriaList([
        MaxLengthCriteria(12), MaxLengthCriteria(9), EosTokenCriteria([5, 3]), EosTokenCriteria(torch.tensor(5)),
    ])
    length, ids = stopping.limits(criteria, 30, eos)
    assert length == 9 and ids.tolist() == [3, 5]


class StopAtLengthOrOnToken(MaxLengthCriteria):
    """A subclass that decides differently: transformers keeps it beside its own MaxLengthCriteria and
    calls it, so it must be called, not read as a length."""

    def __init__(self, max_length: int, token: int) -> None:
        super().__init__(max_length)
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_a_subclass_of_a_length_criterion_is_called_like_any_criterion(pair):
    draft, target = pair
    greedy, _ = _both(target, draft, 1, max_new_tokens=20)
    token = int(greedy[0, PROMPT.shape[1] + 9])
    criteria = StoppingCriteriaList([StopAtLengthOrOnToken(PROMPT.shape[1] + 2, token)])
    plain, ours = _both(target, draft, 1, max_new_tokens=20, stopping_criteria=criteria)
    assert plain.shape[1] > PROMPT.shape[1] + 2 and torch.equal(ours, plain)
