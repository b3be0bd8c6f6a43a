"""`verify_step` refuses a round it cannot verify, naming the field, row and position: target logits that
give no distribution (NaN, +inf at T > 0, every token masked), shapes that disagree, draft counts outside
[0, k], usable draft ids outside the vocabulary, missing raw logits; and a round of no rows is verified
to an output of no rows."""

from __future__ import annotations

import re

import pytest
import torch

from hf_securesd import FSD, FLy, MARS, BiLD, Lossless, LossySD, SpecCascade, Step, VLLMFLy
from hf_securesd.draws import draw_rows
from hf_securesd.step import RowSpec, VerificationRound, verify_step
from hf_securesd.verifiers.base import UnusableTargetError

V, K = 8, 3
VERIFIERS = [Lossless(), MARS(theta=0.5), LossySD(epsilon=0.3), BiLD(tau_rb=2.0), SpecCascade(a=0.3),
             FSD(tau=0.3), FLy(tau=0.1, window=1), VLLMFLy(entropy_threshold=0.1, window=1)]
BROKEN = {
    "masked": (lambda row: row.fill_(float("-inf")), "are -inf for every token"),
    "nan": (lambda row: row.__setitem__(5, float("nan")), "hold NaN"),
    "plus_inf": (lambda row: row.__setitem__(2, float("inf")), r"hold \+inf \(token 2\)"),
}


def make_round(rows: list[RowSpec], greedy: bool = False, counts: list[int] | None = None, seed: int = 0,
               **fields) -> VerificationRound:
    """A round of len(rows) rows with random logits and in-vocabulary drafts; `fields` replace any field."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(rows)
    target = torch.randn(batch, K + 1, V, generator=generator)
    draft = torch.randn(batch, K, V, generator=generator)
    values = dict(
        rows=rows, draft_tokens=torch.randint(0, V, (batch, K), generator=generator),
        draft_counts=None if counts is None else torch.tensor(counts), starts=torch.zeros(batch, dtype=torch.long),
        target_logits=target, target_raw_logits=target, greedy=greedy, draft_logits=draft, draft_raw_logits=draft,
    )
    values.update(fields)
    return VerificationRound(**values)


def broken_round(verifier, kind: str, greedy: bool, row: int = 1, position: int = 2) -> VerificationRound:
    round_ = make_round([RowSpec(verifier)] * 3, greedy=greedy)
    BROKEN[kind][0](round_.target_logits[row, position])
    return round_


@pytest.mark.parametrize("kind", sorted(BROKEN))
@pytest.mark.parametrize("verifier", VERIFIERS, ids=lambda verifier: verifier.name)
def test_sampling_from_target_logits_without_a_distribution_raises_naming_row_and_position(verifier, kind):
    """Before the fix: token V-1 with alpha NaN (FLy: torch's 'invalid multinomial distribution')."""
    with pytest.raises(UnusableTargetError, match=rf"row 1, position 2: the processed target logits {BROKEN[kind][1]}"):
        verify_step(broken_round(verifier, kind, greedy=False))


@pytest.mark.parametrize("kind", ["masked", "nan"])
@pytest.mark.parametrize("verifier", VERIFIERS, ids=lambda verifier: verifier.name)
def test_greedy_tensor_rounds_refuse_a_position_without_an_argmax(verifier, kind):
    """T = 0 on the tensor path (every rule but greedy lossless on a CPU, or with the deviation asked):
    before the fix an all -inf position silently gave token 0."""
    with pytest.raises(UnusableTargetError, match="row 1, position 2"):
        verify_step(broken_round(verifier, kind, greedy=True), collect_deviation=True)


def test_a_plus_inf_logit_is_the_argmax_at_temperature_zero():
    round_ = broken_round(MARS(theta=0.5), "plus_inf", greedy=True, row=0, position=0)
    round_.draft_tokens[0, 0] = 3
    out = verify_step(round_)
    assert int(out.accepted[0]) == 0 and int(out.next_tokens[0]) == 2


def test_the_row_is_numbered_in_the_round_when_rows_are_grouped():
    """Rows 0 and 2 are one group (MARS), row 1 another: the error names row 2 of the round, not row 1 of
    its group."""
    round_ = make_round([RowSpec(MARS(theta=0.5)), RowSpec(Lossless()), RowSpec(MARS(theta=0.5))])
    round_.target_logits[2, 1] = float("-inf")
    with pytest.raises(UnusableTargetError, match="row 2, position 1"):
        verify_step(round_)


def test_the_deviation_is_never_computed_from_an_unusable_target():
    with pytest.raises(UnusableTargetError):
        verify_step(broken_round(Lossless(), "nan", greedy=False), collect_deviation=True)


def test_draw_rows_never_turns_a_row_without_mass_into_a_token_id():
    """Before the fix a NaN row was clamped to V-1, a plausible token; its callers guarantee rows with mass."""
    probs = torch.tensor([[float("nan")] * 4, [0.0, 1.0, 0.0, 0.0]])
    tokens = draw_rows(probs).tolist()
    assert tokens[1] == 1 and not 0 <= tokens[0] < 4


@pytest.mark.parametrize("verifier", VERIFIERS, ids=lambda verifier: verifier.name)
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
@pytest.mark.parametrize("bad", [-1, V])
def test_a_usable_draft_outside_the_vocabulary_is_refused(verifier, greedy, bad):
    """Before the fix FSD accepted (and committed) draft ids 8 and -1; Lossless at T > 0 raised torch's
    IndexError."""
    if greedy and verifier.is_lossless:
        pytest.skip("greedy lossless: covered by test_greedy_lossless_rejects_any_id_that_is_not_x_star")
    round_ = make_round([RowSpec(verifier)] * 2, greedy=greedy)
    round_.draft_tokens[1, 1] = bad
    with pytest.raises(ValueError, match=rf"draft_tokens\[1, 1\] = {bad} is a usable draft .* V = {V}"):
        verify_step(round_)


@pytest.mark.parametrize("verifier", [Lossless(), MARS(theta=0.5), FSD(tau=0.3)], ids=lambda v: v.name)
def test_entries_past_a_rows_count_are_ignored_whatever_they_hold(verifier):
    round_ = make_round([RowSpec(verifier)] * 2, counts=[1, 3])
    round_.draft_tokens[0, 1:] = -1
    reference = make_round([RowSpec(verifier)] * 2, counts=[1, 3])
    reference.draft_tokens[0, 1:] = 0
    torch.manual_seed(0)
    got = verify_step(round_)
    torch.manual_seed(0)
    expected = verify_step(reference)
    assert torch.equal(got.accepted, expected.accepted) and torch.equal(got.next_tokens, expected.next_tokens)


@pytest.mark.parametrize("on_host", [True, False], ids=["host", "tensor"])
def test_greedy_lossless_rejects_any_id_that_is_not_x_star(on_host):
    """Its rule accepts a draft only when it equals x* (in [0, V)): an id outside the vocabulary is a
    mismatch, the same decision on the host path and the tensor path."""
    round_ = make_round([RowSpec(Lossless())] * 2, greedy=True)
    x_star = round_.target_logits.argmax(-1)
    round_.draft_tokens = torch.stack([x_star[0, :K], torch.tensor([x_star[1, 0], -1, V])])
    out = verify_step(round_, collect_deviation=not on_host)
    assert out.accepted.tolist() == [K, 1]
    assert out.next_tokens.tolist() == [int(x_star[0, K]), int(x_star[1, 1])]


@pytest.mark.parametrize("count", [-1, K + 2])
@pytest.mark.parametrize(
    "verifier, greedy, deviation",
    [(Lossless(), True, False), (Lossless(), True, True), (Lossless(), False, False), (MARS(theta=0.5), True, False),
     (MARS(theta=0.5), False, False), (FLy(tau=0.1, window=1), False, False)],
    ids=["lossless-greedy-host", "lossless-greedy-tensor", "lossless-sampled", "mars-greedy", "mars-sampled", "fly"],
)
def test_a_draft_count_outside_zero_to_k_is_refused(verifier, greedy, deviation, count):
    """Before the fix: capped at k or read as 0 without a word (greedy), torch's IndexError (sampled)."""
    round_ = make_round([RowSpec(verifier)] * 3, greedy=greedy, counts=[K, count, 0])
    with pytest.raises(ValueError, match=rf"draft_counts\[1\] = {count}, outside \[0, k\] with k = {K}"):
        verify_step(round_, collect_deviation=deviation)


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("target_logits", torch.zeros(2, K, V), f"target_logits has shape (2, {K}, {V})"),
        ("target_raw_logits", torch.zeros(2, K + 1, V + 1), "target_raw_logits has shape"),
        ("draft_logits", torch.zeros(2, K + 1, V), "draft_logits has shape"),
        ("draft_raw_logits", torch.zeros(1, K, V), "draft_raw_logits has shape"),
        ("draft_probs", torch.zeros(2, K, V - 1), "draft_probs has shape"),
        ("draft_counts", torch.tensor([1, 2, 3]), "draft_counts has shape (3,)"),
        ("starts", torch.zeros(2, 1, dtype=torch.long), "starts has shape"),
        ("greedy", torch.tensor([True, False, True]), "greedy has shape"),
        ("target_argmax", torch.zeros(2, K, dtype=torch.long), "target_argmax has shape"),
        ("responses", [[1]], "responses holds 1 rows but the round has 2"),
        ("draft_tokens", torch.zeros(2, K), "draft_tokens must be a [B, k] tensor of token ids"),
        ("rows", [RowSpec(MARS())], "rows holds 1 RowSpecs but draft_tokens has 2 rows"),
    ],
)
def test_a_field_whose_shape_disagrees_with_the_round_is_named(field, value, expected):
    round_ = make_round([RowSpec(MARS(theta=0.5), Step(L=1))] * 2)
    setattr(round_, field, value)
    with pytest.raises(ValueError, match=re.escape(expected)):
        verify_step(round_)


def test_a_relaxed_rule_without_raw_target_logits_is_told_to_give_them():
    """Before the fix: AttributeError: 'NoneType' object has no attribute 'masked_fill'."""
    round_ = make_round([RowSpec(MARS(theta=0.5))] * 2, target_raw_logits=None)
    with pytest.raises(ValueError, match="target_raw_logits is None, but a relaxed rule"):
        verify_step(round_)


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("deviation", [False, True])
@pytest.mark.parametrize("verifier", [Lossless(), MARS(theta=0.5)], ids=lambda verifier: verifier.name)
def test_a_round_of_no_rows_gives_an_output_of_no_rows(verifier, greedy, deviation):
    """Before the fix: IndexError in the grouping."""
    round_ = VerificationRound(
        rows=[], draft_tokens=torch.zeros(0, K, dtype=torch.long), draft_counts=None,
        starts=torch.zeros(0, dtype=torch.long), target_logits=torch.zeros(0, K + 1, V),
        target_raw_logits=torch.zeros(0, K + 1, V), greedy=greedy,
    )
    out = verify_step(round_, collect_deviation=deviation)
    assert out.accepted.shape == (0,) and out.next_tokens.shape == (0,) and out.host_lists() == ([], [])
    assert out.alpha.shape == (0, K) and out.eta.shape == (0, K)
    assert (out.deviation is not None) == deviation


@pytest.mark.parametrize("check_ranges", [True, False])
def test_range_checks_run_unless_an_adapter_vouches_for_its_rounds(monkeypatch, check_ranges):
    """`check_ranges=False` (the engines' adapters, which build rounds from their engine's own ids) skips the
    per-round range check and its host read; shapes and the target's distribution are still checked."""
    import hf_securesd.step as step

    checked = []
    original = step._checked
    monkeypatch.setattr(step, "_checked", lambda *args, **kwargs: checked.append(1) or original(*args, **kwargs))
    verify_step(make_round([RowSpec(MARS(theta=0.5))] * 2, counts=[1, 3]), check_ranges=check_ranges)
    assert bool(checked) == check_ranges
    with pytest.raises(ValueError, match="VerificationRound.starts has shape"):
        verify_step(make_round([RowSpec(MARS(theta=0.5))] * 2, starts=torch.zeros(3, dtype=torch.long)),
                    check_ranges=check_ranges)
    with pytest.raises(UnusableTargetError):
        verify_step(broken_round(MARS(theta=0.5), "nan", greedy=False), check_ranges=check_ranges)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("verifier", VERIFIERS, ids=lambda verifier: verifier.name)
def test_half_precision_logits_are_verified_as_float32(verifier, dtype):
    """Half-precision logits give the float32 round's output (draws included: the same generator state).
    Drafts close to the target are the case that failed: a small residual mass is recomputed in float64."""
    generator = torch.Generator().manual_seed(3)
    target = torch.randn(64, K + 1, V, generator=generator).to(dtype)
    draft = (target[:, :K].float() + 0.01 * torch.randn(64, K, V, generator=generator)).to(dtype)
    fields = dict(target_logits=target, target_raw_logits=target, draft_logits=draft, draft_raw_logits=draft)
    rows = [RowSpec(verifier)] * 64
    torch.manual_seed(0)
    half = verify_step(make_round(rows, **fields))
    torch.manual_seed(0)
    single = verify_step(make_round(rows, **{name: value.float() for name, value in fields.items()}))
    assert torch.equal(half.accepted, single.accepted) and torch.equal(half.next_tokens, single.next_tokens)


def test_logits_that_are_not_floating_point_are_refused():
    round_ = make_round([RowSpec(Lossless())], target_logits=torch.zeros(1, K + 1, V, dtype=torch.long))
    with pytest.raises(ValueError, match=r"VerificationRound.target_logits must hold floating-point values, got torch.int64"):
        verify_step(round_)
