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


class _RowZeroStops(StoppingCriteria):
    """The widely copied `StopOnTokens` idiom: reads row 0 and returns one verdict for the whole batch."""

    def __init__(self, token: int, form: str) -> None:
        self.token, self.form = token, form

    def __call__(self, input_ids, scores, **kwargs):
        hit = input_ids[0, -1] == self.token
        return {"bool": bool(hit), "0-d": hit, "[1]": hit.reshape(1)}[self.form]


class _PerRowStops(StoppingCriteria):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def _a_token_greedy_reaches(target, rows: int) -> int:
    greedy = target.generate(input_ids=PROMPT[:rows], attention_mask=MASK[:rows], do_sample=False, pad_token_id=0,
                             max_new_tokens=12)
    return int(greedy[0, PROMPT.shape[1] + 3])  # row 0's fourth new token


@pytest.mark.parametrize("form", ["bool", "0-d", "[1]"])
def test_one_verdict_for_a_whole_batch_is_refused_naming_the_criterion(pair, form):
    draft, target = pair
    criteria = StoppingCriteriaList([_RowZeroStops(_a_token_greedy_reaches(target, 2), form)])
    with pytest.raises(hf_securesd.SecureSDConfigError, match=r"_RowZeroStops returned one verdict for the whole batch.*\[batch_size\] bool tensor"):
        target.generate(input_ids=PROMPT, attention_mask=MASK, do_sample=False, pad_token_id=0, max_new_tokens=12,
                        stopping_criteria=criteria, assistant_model=draft, verifier="lossless")


@pytest.mark.parametrize("form", ["bool", "0-d", "[1]"])
def test_one_verdict_for_one_row_is_honoured(pair, form):
    draft, target = pair
    criteria = StoppingCriteriaList([_RowZeroStops(_a_token_greedy_reaches(target, 1), form)])
    plain, ours = _both(target, draft, 1, max_new_tokens=12, stopping_criteria=criteria)
    assert plain.shape[1] < PROMPT.shape[1] + 12  # the criterion fired
    assert torch.equal(ours, plain)


def test_per_row_verdicts_in_a_batch_are_honoured(pair):
    draft, target = pair
    criteria = StoppingCriteriaList([_PerRowStops(_a_token_greedy_reaches(target, 2))])
    plain, ours = _both(target, draft, 2, max_new_tokens=12, stopping_criteria=criteria)
    assert plain.shape[1] > PROMPT.shape[1] + 4 and (plain[0, PROMPT.shape[1] + 4 :] == 0).all()  # row 0 stopped
    assert torch.equal(ours, plain)
