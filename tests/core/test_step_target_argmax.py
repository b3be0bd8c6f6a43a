"""A round verified from the target's argmax alone (`VerificationRound.target_argmax`, no logits): exact
for greedy lossless rows, refused with a clear error for every row that reads the target's distribution."""

from __future__ import annotations

import pytest
import torch

from hf_securesd import MARS, Lossless, Step
from hf_securesd.step import RowSpec, VerificationRound, verify_step

V, K = 9, 4


def logits_round(rows: list[RowSpec], counts: list[int], greedy: bool, seed: int = 0) -> VerificationRound:
    """A ragged round with random logits whose drafts match the target's argmax about half the time."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(rows)
    target = torch.randn(batch, K + 1, V, generator=generator)
    draft = torch.randn(batch, K, V, generator=generator)
    others = torch.randint(0, V, (batch, K), generator=generator)
    matches = torch.rand(batch, K, generator=generator) < 0.6
    tokens = torch.where(matches, target[:, :K].argmax(-1), others)
    return VerificationRound(
        rows=rows, draft_tokens=tokens, draft_counts=torch.tensor(counts), starts=torch.arange(batch) * 3,
        target_logits=target, target_raw_logits=target, greedy=greedy, draft_logits=draft,
        draft_raw_logits=draft,
    )


def argmax_only(round_: VerificationRound) -> VerificationRound:
    """The same round with the target's argmax in place of every logit tensor."""
    return VerificationRound(
        rows=round_.rows, draft_tokens=round_.draft_tokens, draft_counts=round_.draft_counts,
        starts=round_.starts, target_logits=None, target_raw_logits=None, greedy=round_.greedy,
        target_argmax=round_.target_logits.argmax(dim=-1),
    )


@pytest.mark.parametrize("seed", range(5))
def test_greedy_lossless_rows_verify_the_same_from_the_argmax(seed: int) -> None:
    rows = [RowSpec(Lossless()), RowSpec(Lossless(), Step(L=2)), RowSpec(Lossless()), RowSpec(Lossless())]
    full = logits_round(rows, [4, 0, 2, 3], greedy=True, seed=seed)
    expected = verify_step(full, collect_deviation=True)
    got = verify_step(argmax_only(full), collect_deviation=True)
    for name in ("accepted", "next_tokens", "alpha", "eta", "deviation"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_a_given_argmax_is_used_as_is() -> None:
    """The step reads x* from `target_argmax` (it does not recompute it from the logits)."""
    round_ = logits_round([RowSpec(Lossless())] * 2, [K, K], greedy=True)
    chosen = torch.full((2, K + 1), 5)
    round_.target_argmax = chosen
    round_.draft_tokens = torch.full((2, K), 5)
    out = verify_step(round_)
    assert out.accepted.tolist() == [K, K] and out.next_tokens.tolist() == [5, 5]


@pytest.mark.parametrize(
    "rows, greedy",
    [
        ([RowSpec(MARS(theta=0.5))] * 2, True),  # a relaxed rule reads the logits
        ([RowSpec(Lossless()), RowSpec(MARS(theta=0.5), Step(L=1))], True),  # one relaxed group suffices
        ([RowSpec(Lossless())] * 2, False),  # sampled lossless rows read q
    ],
)
def test_rows_that_read_the_distribution_refuse_a_round_without_logits(rows, greedy) -> None:
    round_ = argmax_only(logits_round(rows, [K, 2], greedy=greedy))
    with pytest.raises(ValueError, match="target_logits is None"):
        verify_step(round_)


def test_a_round_without_logits_or_argmax_is_refused() -> None:
    round_ = argmax_only(logits_round([RowSpec(Lossless())] * 2, [K, 1], greedy=True))
    round_.target_argmax = None
    with pytest.raises(ValueError, match="target_argmax"):
        verify_step(round_)


def test_a_greedy_lossless_round_evaluates_its_schedule_only_when_eta_is_read(monkeypatch) -> None:
    """The lossless rule at T = 0 reads no weight: the step's verdict needs no schedule evaluation, and
    StepOutput.eta still reports the weights (the same as when the rows are verified with a rule that
    reads them)."""
    import hf_securesd.step as step_module

    calls = []
    evaluate = step_module.schedule_weights

    def counting(*args, **kwargs):
        calls.append(1)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(step_module, "schedule_weights", counting)
    full = logits_round([RowSpec(Lossless(), Step(L=2))] * 3, [K, 2, 0], greedy=True)
    out = verify_step(argmax_only(full))
    assert calls == []
    relaxed = verify_step(logits_round([RowSpec(MARS(theta=0.5), Step(L=2))] * 3, [K, 2, 0], greedy=True))
    assert len(calls) == 1
    assert torch.equal(out.eta, relaxed.eta) and len(calls) == 2
    assert out.eta is out.eta and len(calls) == 2  # evaluated once
    assert out.eta.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]  # starts 0, 3, 6; Step(L=2)


class Constant(Step):
    """A schedule of the user's own (a subclass is not a built-in): eta = 2 everywhere, out of range."""

    def round_eta(self, starts, drafts, responses=None):
        return torch.full(drafts.shape, 2.0)


def test_a_schedule_of_the_users_own_is_checked_at_once_even_for_lossless_rows() -> None:
    round_ = argmax_only(logits_round([RowSpec(Lossless(), Constant(L=1))] * 2, [K, 1], greedy=True))
    with pytest.raises(ValueError, match="schedule Constant returned eta = 2.0"):
        verify_step(round_)


def test_the_mixer_refuses_a_missing_eta_for_a_rule_that_reads_it() -> None:
    from hf_securesd.mixing import verify_round
    from hf_securesd.verifiers.base import RoundInputs

    full = logits_round([RowSpec(MARS(theta=0.5))], [K], greedy=True)
    inputs = RoundInputs(
        draft_tokens=full.draft_tokens, target_logits=full.target_logits, draft_logits=full.draft_logits,
        target_raw_logits=full.target_raw_logits, draft_raw_logits=full.draft_raw_logits, greedy=True,
    )
    with pytest.raises(ValueError, match="eta is None, but .*mars"):
        verify_round(MARS(theta=0.5), inputs, None)
