"""The adapter's greedy lossless rounds (`hf_securesd.vllm.sampler`): built from the target's argmax over
vLLM's tensors, with no [G, k+1, V] logits and no draft logits, and writing exactly target greedy in the
layouts vLLM's proposers give (n-gram: ragged one-hot rows, some without drafts; EAGLE and draft models:
every request with all its drafts and their draft logits; a step with plain rows beside ours).
These tests need neither vLLM nor a model, so they also run in the main environment."""

from __future__ import annotations

import pytest
import torch

from hf_securesd import MARS, Lossless, Segments, Step
from hf_securesd.vllm.request import SecureSDRequest
from hf_securesd.vllm.sampler import (
    PLACEHOLDER, RowPlan, _gather_index, _host_argmax_round, _Layout, _round, _rows_facts, _target_argmax,
    _usable_counts, verify_rows,
)

VOCAB, K = 13, 5
LOSSLESS = SecureSDRequest(Lossless(), None)
# eta = 0 at every position reached here: the lossless rule, evaluated through the logits.
LOSSLESS_THROUGH_LOGITS = SecureSDRequest(MARS(theta=0.5), Step(L=1_000))
LAYOUTS = {  # name -> (draft counts per request, the SecureSD rows, one-hot proposer)
    "ngram": ([5, 0, 3, 5, 1, 0, 2, 4], list(range(8)), True),
    "eagle": ([K] * 8, list(range(8)), False),
    "with_plain_rows": ([3, 5, 0, 2], [1, 2, 3], True),
}


class VllmStep:
    """A greedy step laid out as vLLM lays it out: drafts equal to the target's argmax about 60% of the
    time, request 0's third draft invalid (-1) where it has one."""

    def __init__(self, counts: list[int], seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.counts = counts
        num_tokens, batch = sum(counts), len(counts)
        self.raw = torch.randn(num_tokens + batch, VOCAB, generator=generator)
        starts = [sum(counts[:row]) for row in range(batch)]
        drafted = [start + row + j for row, start in enumerate(starts) for j in range(counts[row])]
        self.target = self.raw[drafted] * 1.5  # stands for vLLM's processing
        self.bonus = self.raw[[start + row + counts[row] for row, start in enumerate(starts)]] * 1.5
        self.bonus_ids = self.bonus.argmax(-1).to(torch.int32)[:, None]  # vLLM's greedy bonus tokens
        argmax = self.target.argmax(-1)
        others = torch.randint(0, VOCAB, argmax.shape, generator=generator)
        self.drafts = torch.where(torch.rand(argmax.shape, generator=generator) < 0.6, argmax, others)
        self.drafts = self.drafts.to(torch.int32)
        if counts[0] >= 3:
            self.drafts[2] = -1
        self.draft_logits = torch.randn(batch, K, VOCAB, generator=generator)

    def plans(self, rows: list[int], request: SecureSDRequest, one_hot: bool) -> list[RowPlan]:
        logits = [None if one_hot else self.draft_logits[row] for row in rows]
        return [
            RowPlan(row, request, 2 * row, logit, logit, one_hot=one_hot) for row, logit in zip(rows, logits)
        ]

    def run(self, plans: list[RowPlan]) -> torch.Tensor:
        output = torch.full((len(self.counts), max(self.counts) + 1), 77, dtype=torch.int32)
        verify_rows(plans, output, self.drafts, self.counts, self.raw, self.target, self.bonus, self.bonus_ids,
                    [True] * len(self.counts))
        return output

    def target_greedy(self, row: int) -> list[int]:
        """Row `row`'s tokens under greedy lossless verification, from the logits directly."""
        start = sum(self.counts[:row])
        tokens = []
        for j in range(self.counts[row]):
            best, draft = int(self.target[start + j].argmax()), int(self.drafts[start + j])
            if draft < 0:
                return tokens + [best]
            tokens.append(best)
            if draft != best:
                return tokens
        return tokens + [int(self.bonus[row].argmax())]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("seed", range(4))
def test_greedy_lossless_writes_target_greedy(layout: str, seed: int) -> None:
    counts, rows, one_hot = LAYOUTS[layout]
    step = VllmStep(counts, seed)
    output = step.run(step.plans(rows, LOSSLESS, one_hot))
    through_logits = step.run(step.plans(rows, LOSSLESS_THROUGH_LOGITS, one_hot))
    assert torch.equal(output, through_logits)
    for row in range(len(counts)):
        written = output[row].tolist()
        if row not in rows:
            assert written == [77] * len(written)  # a plain row: vLLM's, untouched
            continue
        expected = step.target_greedy(row)
        assert written == expected + [PLACEHOLDER] * (len(written) - len(expected)), f"row {row}"


@pytest.mark.parametrize("rows", [[0, 1, 2], [2, 0]])
def test_a_step_without_drafts_writes_each_rows_bonus_argmax(rows: list[int]) -> None:
    """An n-gram step that matched nothing (num_tokens = 0): each SecureSD row gets the argmax of its bonus
    position, then placeholders; the others keep vLLM's tokens."""
    step = VllmStep([0, 0, 0], seed=5)
    output = torch.full((3, 3), 77, dtype=torch.int32)  # a buffer wider than the step needs: every column is written
    verify_rows(step.plans(rows, LOSSLESS, one_hot=True), output, step.drafts, step.counts, step.raw, step.target,
                step.bonus, step.bonus_ids, [True] * 3)
    for row in range(3):
        expected = [int(step.bonus[row].argmax())] + [PLACEHOLDER] * 2 if row in rows else [77] * 3
        assert output[row].tolist() == expected, row


def test_a_step_where_no_row_accepts_writes_x_star_at_each_rows_first_position() -> None:
    counts = [3, 0, 2]
    step = VllmStep(counts, seed=6)
    step.drafts = (step.target.argmax(-1) + 1) % VOCAB  # every draft differs from x*
    step.drafts = step.drafts.to(torch.int32)
    output = step.run(step.plans([0, 1, 2], LOSSLESS, one_hot=True))
    assert output[0].tolist() == [int(step.target[0].argmax())] + [PLACEHOLDER] * 3
    assert output[1].tolist() == [int(step.bonus[1].argmax())] + [PLACEHOLDER] * 3
    assert output[2].tolist() == [int(step.target[3].argmax())] + [PLACEHOLDER] * 3


def test_the_results_are_one_per_plan_built_when_read() -> None:
    counts = [3, 0, 2]
    step = VllmStep(counts, seed=8)
    plans = step.plans([0, 2], LOSSLESS, one_hot=True)
    output = torch.full((3, 4), 77, dtype=torch.int32)
    results = verify_rows(plans, output, step.drafts, counts, step.raw, step.target, step.bonus, step.bonus_ids,
                          [True] * 3)
    assert len(results) == 2 and [r.row for r in results] == [0, 2] and [r.position for r in results] == [0, 4]
    assert results[1].verified == 2 and results[0].verified == 2  # row 0's third draft is invalid (-1)
    for result in results:
        written = output[result.row].tolist()
        assert written[result.accepted + 1 :] == [PLACEHOLDER] * (3 - result.accepted)
    assert list(results) == results[:] and results[-1] is results[1]
    assert results == list(results) and results == tuple(results) and results != list(results)[:1]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_greedy_lossless_round_holds_the_argmax_and_no_logits(layout: str) -> None:
    """The round carries x* [G, k+1] arranged as the logits round would hold its logits, and no logits."""
    counts, rows, one_hot = LAYOUTS[layout]
    step = VllmStep(counts, seed=7)
    layout_ = _Layout(counts)
    tensors = (step.drafts, step.raw, step.target, step.bonus, step.bonus_ids, [True] * len(counts))

    def build(request: SecureSDRequest):
        plans = step.plans(rows, request, one_hot)
        usable = _usable_counts(plans, step.drafts, layout_)
        return _round(plans, usable, layout_, *tensors)

    ours, with_logits = build(LOSSLESS), build(LOSSLESS_THROUGH_LOGITS)
    assert ours.target_logits is None and ours.target_raw_logits is None
    assert ours.draft_logits is None and ours.draft_raw_logits is None
    assert torch.equal(ours.target_argmax, with_logits.target_logits.argmax(-1))
    for name in ("draft_tokens", "draft_counts", "starts"):
        assert torch.equal(getattr(ours, name), getattr(with_logits, name)), name


MORE_LAYOUTS = {"viewed_full": ([K] * 4, list(range(4)), False), "no_drafts": ([0] * 5, [0, 2, 4], True),
                "no_drafts_viewed": ([0] * 3, [0, 1, 2], True)}


@pytest.mark.parametrize("layout", [*LAYOUTS, *MORE_LAYOUTS])
def test_the_host_route_arranges_what_the_torch_route_arranges(layout: str) -> None:
    """On CPU tensors a greedy lossless round's drafts and x* are arranged through NumPy
    (`_host_argmax_round`); the torch route (`_gather_index`, `_target_argmax`, for other devices) gives
    the same tensors, dtypes included, gathered and viewed, with and without drafts in the step."""
    counts, rows, one_hot = LAYOUTS.get(layout) or MORE_LAYOUTS[layout]
    step = VllmStep(counts, seed=11)
    layout_ = _Layout(counts)
    usable = _usable_counts(step.plans(rows, LOSSLESS, one_hot), step.drafts, layout_)
    viewed = layout.endswith("viewed") or layout == "viewed_full"
    drafts, best = _host_argmax_round(tuple(rows), usable, layout_, viewed, step.drafts, step.target, step.bonus_ids)
    k = max(usable)
    index = None if viewed else _gather_index(tuple(rows), tuple(usable), tuple(counts), torch.device("cpu"))
    expected_drafts = step.drafts if index is None else step.drafts.index_select(0, index[0]).clamp_min(0)
    assert torch.equal(drafts, expected_drafts.view(len(rows), k).long())
    assert torch.equal(best, _target_argmax(step.target, step.bonus_ids, len(rows), k, index))
    assert drafts.dtype == best.dtype == torch.long


@pytest.mark.parametrize("counts", [[0, 0, 0], [2, 0, 3]])
def test_a_greedy_rows_x_star_at_its_bonus_position_is_vllms_greedy_bonus_token(counts: list[int]) -> None:
    """vLLM's sampler took the argmax of the bonus logits for greedy rows; the round reads that token rather
    than reducing the [B, V] logits again (a token given here that is not the argmax shows which is read)."""
    step = VllmStep(counts, seed=9)
    step.drafts = step.target.argmax(-1).to(torch.int32)  # every draft accepted: each row reaches its bonus
    step.bonus_ids = (step.bonus_ids + 1) % VOCAB
    output = step.run(step.plans([0, 1, 2], LOSSLESS, one_hot=True))
    for row in range(3):
        written = output[row].tolist()
        assert written[counts[row]] == int(step.bonus_ids[row]), row


def test_a_sampled_row_keeps_the_logits() -> None:
    """A step with one row at T > 0 reads q: its round holds the processed logits."""
    counts = [K, K]
    step = VllmStep(counts, seed=3)
    plans = step.plans([0, 1], LOSSLESS, one_hot=False)
    layout = _Layout(counts)
    round_ = _round(plans, _usable_counts(plans, step.drafts, layout), layout, step.drafts, step.raw,
                    step.target, step.bonus, step.bonus_ids, [True, False])
    assert round_.target_logits is not None and round_.target_argmax is None
    assert round_.draft_logits is not None


def counted(plans: list[RowPlan]) -> list[RowPlan]:
    """The same plans with only each row's proposal count, as the runner gives them for a round that reads
    no draft logits (`RowPlan.proposed`)."""
    return [
        RowPlan(plan.row, plan.request, plan.position, None, None, one_hot=plan.one_hot,
                proposed=plan.draft_raw_logits.shape[0])
        for plan in plans
    ]


@pytest.mark.parametrize("seed", range(3))
def test_a_greedy_lossless_round_verifies_rows_given_only_their_proposal_count(seed: int) -> None:
    counts = [K] * 8
    step = VllmStep(counts, seed)
    plans = step.plans(list(range(8)), LOSSLESS, one_hot=False)
    assert torch.equal(step.run(counted(plans)), step.run(plans))
    # The drafter recorded 1 of row 0's drafts: only that one is verified, then x* after it.
    output = step.run([RowPlan(0, LOSSLESS, 0, None, None, proposed=1)])
    best = step.target[:2].argmax(-1).tolist()
    expected = best if int(step.drafts[0]) == best[0] else best[:1]
    assert output[0].tolist() == expected + [PLACEHOLDER] * (K + 1 - len(expected))


def test_a_round_that_reads_draft_logits_refuses_rows_given_only_a_count() -> None:
    """Such a row cannot be verified as asked: a clear error (the engine hook then gives every SecureSD row
    of the step the target's token alone, lossless), never verification against made-up draft logits."""
    step = VllmStep([K, K], seed=1)
    plans = counted(step.plans([0, 1], LOSSLESS_THROUGH_LOGITS, one_hot=False))
    with pytest.raises(ValueError, match=r"batch row 0 verifies 2 drafts .* only their count was kept"):
        step.run(plans)


def test_row_facts_are_built_once_for_the_same_requests() -> None:
    """The same requests (objects) and generators in the same rows get the facts built before; another
    generator or request gets new ones."""
    step = VllmStep([K, K], seed=2)
    plans = step.plans([0, 1], LOSSLESS, one_hot=False)
    first = _rows_facts(plans)
    assert first.lossless and not first.reads_tokens
    assert _rows_facts(step.plans([0, 1], LOSSLESS, one_hot=False)) is first
    generator = torch.Generator().manual_seed(3)
    seeded = [RowPlan(0, LOSSLESS, 0, None, None, generator), plans[1]]
    specs = _rows_facts(seeded).specs
    assert specs is not first.specs and specs[0].generator is generator and specs[1].generator is None
    other = SecureSDRequest(Lossless(), None)  # equal to LOSSLESS, another object
    specs = _rows_facts([RowPlan(0, other, 0, None, None), plans[1]]).specs
    assert specs is not first.specs and specs[0].verifier is specs[1].verifier  # equal verifiers: one object


def test_row_facts_say_whether_every_verifier_is_lossless_and_whether_a_schedule_reads_tokens() -> None:
    step = VllmStep([K, K], seed=2)
    mixed = [RowPlan(0, LOSSLESS, 0, None, None), RowPlan(1, SecureSDRequest(MARS(theta=0.5), None), 0, None, None)]
    facts = _rows_facts(mixed)
    assert not facts.lossless and not facts.reads_tokens
    segments = SecureSDRequest(Lossless(), Segments(boundary=[7]))
    facts = _rows_facts([RowPlan(0, segments, 0, None, None), step.plans([1], LOSSLESS, one_hot=False)[0]])
    assert facts.lossless and facts.reads_tokens


@pytest.mark.parametrize("request_", [LOSSLESS, LOSSLESS_THROUGH_LOGITS], ids=["argmax_round", "logits_round"])
def test_a_step_whose_drafts_were_not_recorded_takes_the_target_token(request_: SecureSDRequest) -> None:
    """Near max_model_len vLLM skips drafting for the whole batch but still schedules placeholder drafts:
    no row has a usable draft (k = 0), and each takes the target's token at its first position."""
    counts = [3, 2]
    step = VllmStep(counts, seed=5)
    plans = [RowPlan(row, request_, 4, None, None, proposed=0) for row in range(len(counts))]
    output = step.run(plans)
    firsts = [int(step.target[sum(counts[:row])].argmax()) for row in range(len(counts))]
    assert output.tolist() == [[first] + [PLACEHOLDER] * max(counts) for first in firsts]
