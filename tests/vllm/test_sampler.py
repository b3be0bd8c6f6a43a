"""Engine-free tests of the vLLM adapter's verification (`hf_securesd.vllm.sampler`) on synthetic logits
laid out as vLLM lays them out (request by request, drafted positions then the bonus position).

* Theorem 1 per verifier x schedule: the first emitted token of N rows follows
  out(y) = alpha_mix(y) p(y) + (1 - sum alpha_mix p) R_mix(y) at that row's response position.
* Lossless: the first emitted token follows q (no token-0 anomaly on a 259-token vocabulary).
* T = 0: a ragged batch mixing verifiers, schedules and positions gives, row for row, exactly what
  `verify_round` gives on that row alone; Step(L) switches at the exact response position.
These tests need neither vLLM nor a model, so they also run in the main environment.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from hf_securesd import FSD, MARS, BiLD, FLy, Linear, Lossless, LossySD, Power, SpecCascade, Step
from hf_securesd.mixing import one_step_output, verify_round
from hf_securesd.verifiers.base import RoundInputs
from hf_securesd.vllm.request import SecureSDRequest
from hf_securesd.vllm.sampler import PLACEHOLDER, RowPlan, _Layout, _round, fall_back_rows, verify_rows

N = 8_000
K = 3
POSITION = 1
SCHEDULES = {"none": None, "step": Step(L=2), "linear": Linear(L=3), "power": Power(L=3, gamma=2.0)}
VERIFIERS = {
    "lossless": Lossless(),
    "lossysd": LossySD(epsilon=0.2),
    "bild": BiLD(tau_rb=1.5),
    "speccascade": SpecCascade(a=0.5),
    "fsd": FSD(tau=0.3),
    "fly": FLy(tau=0.3, window=1),
    "mars": MARS(theta=0.9),
}
TARGET = torch.tensor([3.0, 2.8, 1.0, 0.5, -1.0, -2.0])
DRAFT = torch.tensor([1.5, 2.9, 2.0, -0.5, 0.3, -1.0])


def eta_for(schedule, positions: torch.Tensor) -> torch.Tensor:
    """eta at `positions`; no schedule is the relaxed verifier unchanged (eta = 1)."""
    return torch.ones(positions.shape) if schedule is None else schedule.eta(positions)


def slot_logits(base: torch.Tensor, slots: int) -> torch.Tensor:
    """[slots, V]: the base logits rolled by one token per slot, so every slot differs."""
    return torch.stack([base.roll(slot) for slot in range(slots)])


class Step_:
    """A vLLM-shaped step of `rows` identical requests with K drafts each, drafts sampled from p."""

    def __init__(self, rows: int, greedy: bool, generator: torch.Generator) -> None:
        self.rows = rows
        self.target = slot_logits(TARGET, K + 1)  # [K+1, V] raw target logits per request
        self.draft = slot_logits(DRAFT, K)  # [K, V]
        p = self.draft.softmax(-1)
        if greedy:
            self.drafts = self.draft.argmax(-1).expand(rows, K).clone()
        else:
            self.drafts = torch.multinomial(p.repeat(rows, 1), 1, generator=generator).view(rows, K)
        sampled = torch.multinomial(self.target[K].softmax(-1).expand(rows, -1), 1, generator=generator)[:, 0]
        # vLLM's bonus tokens: for greedy requests its sampler's argmax of the bonus logits (`greedy_sample`)
        self.bonus = self.target[K].argmax().expand(rows).clone() if greedy else sampled
        self.greedy = greedy

    def run(self, request: SecureSDRequest, position: int = POSITION) -> torch.Tensor:
        plans = [RowPlan(row, request, position, self.draft, self.draft) for row in range(self.rows)]
        output = torch.full((self.rows, K + 1), 7, dtype=torch.int32)
        verify_rows(
            plans,
            output,
            self.drafts.reshape(-1).to(torch.int32),
            [K] * self.rows,
            self.target.repeat(self.rows, 1),
            self.target[:K].repeat(self.rows, 1),
            self.target[K].expand(self.rows, -1),
            self.bonus[:, None],
            [self.greedy] * self.rows,
        )
        return output

    def round_inputs(self) -> RoundInputs:
        rows = self.rows
        return RoundInputs(
            draft_tokens=self.drafts.long(),
            target_logits=self.target.expand(rows, -1, -1),
            draft_logits=self.draft.expand(rows, -1, -1),
            target_raw_logits=self.target.expand(rows, -1, -1),
            draft_raw_logits=self.draft.expand(rows, -1, -1),
            greedy=self.greedy,
        )


def assert_follows(samples: torch.Tensor, expected: torch.Tensor) -> None:
    """Every cell within 5 standard errors of a multinomial proportion (plus 1e-9)."""
    observed = torch.bincount(samples.long(), minlength=expected.numel()).double() / samples.numel()
    expected = expected.double()
    tolerance = 5 * (expected * (1 - expected) / samples.numel()).sqrt() + 1e-9
    assert bool(((observed - expected).abs() <= tolerance).all()), f"observed {observed.tolist()} expected {expected.tolist()}"


@pytest.mark.parametrize("schedule", list(SCHEDULES), ids=list(SCHEDULES))
@pytest.mark.parametrize("verifier", list(VERIFIERS), ids=list(VERIFIERS))
def test_theorem1_per_verifier_and_schedule(verifier: str, schedule: str) -> None:
    torch.manual_seed(0)
    step = Step_(N, greedy=False, generator=torch.Generator().manual_seed(1))
    request = SecureSDRequest(VERIFIERS[verifier], SCHEDULES[schedule])
    output = step.run(request)
    positions = POSITION + torch.arange(K).expand(N, K)
    eta = eta_for(SCHEDULES[schedule], positions)
    # Randomised rules (FLy at T > 0) draw per row: averaging over the N rows gives the expectation.
    expected = one_step_output(VERIFIERS[verifier], step.round_inputs(), eta)[:, 0].mean(dim=0)
    assert (output[:, 0] >= 0).all()
    assert_follows(output[:, 0], expected)


def test_lossless_first_token_follows_target_without_token0_excess() -> None:
    """259-token vocabulary where token 0 is rare for the target: its frequency must match q(0)."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(3)
    vocab = 259
    target = torch.randn(K + 1, vocab, generator=generator) * 2.0
    draft = target[:K] + torch.randn(K, vocab, generator=generator)
    target[:, 0] = -4.0
    rows = N
    drafts = torch.multinomial(draft.softmax(-1).repeat(rows, 1), 1, generator=generator).view(rows, K)
    bonus = torch.multinomial(target[K].softmax(-1).expand(rows, -1), 1, generator=generator)[:, 0]
    plans = [RowPlan(row, SecureSDRequest(Lossless(), None), 1, draft, draft) for row in range(rows)]
    output = torch.full((rows, K + 1), PLACEHOLDER, dtype=torch.int32)
    verify_rows(plans, output, drafts.reshape(-1).to(torch.int32), [K] * rows, target.repeat(rows, 1),
                target[:K].repeat(rows, 1), target[K].expand(rows, -1), bonus, [False] * rows)
    q = target[0].softmax(-1).double()
    observed_zero = float((output[:, 0] == 0).double().mean())
    assert observed_zero <= float(q[0]) + 5 * math.sqrt(float(q[0]) / rows) + 1e-3
    assert chi_square_p_value(output[:, 0], q) > 1e-4


def chi_square_p_value(samples: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test of `samples` against `expected` [V], cells expecting fewer than 5 pooled into one."""
    observed = torch.bincount(samples.long(), minlength=expected.numel()).double()
    counts = expected * samples.numel()
    small = counts < 5
    observed = torch.cat([observed[~small], observed[small].sum()[None]])
    counts = torch.cat([counts[~small], counts[small].sum()[None]])
    return float(chisquare(observed.numpy(), counts.numpy() * observed.sum().item() / counts.sum().item()).pvalue)


def one_row_reference(verifier, schedule, position, target, processed, draft, drafts, bonus, greedy):
    """verify_round on this row alone (k = its own n), with the bonus rule applied."""
    n = drafts.numel()
    round_inputs = RoundInputs(drafts[None].long(), processed[None], draft[None], target[None], draft[None], greedy)
    eta = eta_for(schedule, position + torch.arange(n))[None]
    accepted, token, _ = verify_round(verifier, round_inputs, eta)
    a = int(accepted)
    last = int(bonus) if a == n else int(token)
    return drafts[:a].tolist() + [last]


def test_ragged_greedy_batch_matches_each_row_alone() -> None:
    """Rows with different n, positions, verifiers and schedules in one step, plus rows with no
    drafts, an invalid (-1) draft and no draft logits, each equal to its own single-row verification."""
    generator = torch.Generator().manual_seed(5)
    vocab = 11
    specs = [  # (verifier, schedule, position, n)
        (MARS(theta=0.5), Step(L=2), 0, 3),
        (MARS(theta=0.5), None, 4, 1),
        (LossySD(epsilon=0.5), Step(L=3), 2, 4),
        (BiLD(tau_rb=3.0), Linear(L=2), 1, 2),
        (FSD(tau=0.6), Step(L=1), 5, 4),
        (FLy(tau=0.1, window=2), None, 3, 4),
        (SpecCascade(a=0.7), Step(L=1), 1, 3),
        (Lossless(), None, 2, 0),
        (MARS(theta=0.5), None, 6, 2),  # gets an invalid second draft below
        (MARS(theta=0.5), None, 7, 2),  # no draft logits
    ]
    counts = [n for *_, n in specs]
    targets = [torch.randn(n + 1, vocab, generator=generator) * 2 for n in counts]
    drafts_logits = [t[: max(n, 1)] + torch.randn(max(n, 1), vocab, generator=generator) for t, n in zip(targets, counts)]
    drafts = [
        torch.where(torch.rand(n, generator=generator) < 0.5, t[:n].argmax(-1), d[:n].argmax(-1))
        for t, d, n in zip(targets, drafts_logits, counts)
    ]
    drafts[8][1] = -1
    bonus = torch.tensor([int(t[-1].argmax()) for t in targets])
    plans = [
        RowPlan(row, SecureSDRequest(v, s), pos, None if row == 9 else drafts_logits[row], drafts_logits[row])
        for row, (v, s, pos, _) in enumerate(specs)
    ]
    output = torch.full((len(specs), 5), 99, dtype=torch.int32)
    results = verify_rows(
        plans, output, torch.cat(drafts).to(torch.int32), counts, torch.cat(targets),
        torch.cat([t[:n] for t, n in zip(targets, counts)]), torch.stack([t[-1] for t in targets]), bonus,
        [True] * len(specs),
    )
    for row, (verifier, schedule, position, n) in enumerate(specs):
        if row == 9 or n == 0:
            expected = [int(targets[row][0].argmax())]
        else:
            usable = 1 if row == 8 else n
            expected = one_row_reference(
                verifier, schedule, position, targets[row][: usable + 1],
                torch.cat([targets[row][:usable], targets[row][usable - 1 : usable]]),
                drafts_logits[row][:usable], drafts[row][:usable], bonus[row], True,
            )
            if row == 8 and len(expected) == 2:  # the one usable draft was accepted: the token is q's argmax there
                expected[-1] = int(targets[row][1].argmax())
        got = [t for t in output[row].tolist() if t != PLACEHOLDER]
        assert got == expected, f"row {row}: {got} != {expected}"
    by_row = {result.row: result for result in results}
    assert by_row[2].position == 2 and by_row[2].verified == 4
    assert by_row[8].verified == 1 and by_row[9].verified == 0


def test_a_last_row_without_drafts_is_verified_with_the_others() -> None:
    """The batch's last request drafted nothing (its start lies past every draft): it draws from q at its
    bonus position, and the row before it is verified as alone (vLLM's batch 8, k = 3 layout)."""
    generator = torch.Generator().manual_seed(9)
    vocab = 7
    targets = [torch.randn(3, vocab, generator=generator) * 2, torch.randn(1, vocab, generator=generator) * 2]
    draft_logits = targets[0][:2] + torch.randn(2, vocab, generator=generator)
    drafts = targets[0][:2].argmax(-1)
    plans = [
        RowPlan(0, SecureSDRequest(MARS(theta=0.5), None), 1, draft_logits, draft_logits),
        RowPlan(1, SecureSDRequest(Lossless(), None), 1, None, None),
    ]
    output = torch.full((2, 3), 99, dtype=torch.int32)
    verify_rows(
        plans, output, drafts.to(torch.int32), [2, 0], torch.cat(targets), targets[0][:2],
        torch.stack([targets[0][-1], targets[1][0]]), torch.tensor([0, 0]), [True, True],
    )
    assert [t for t in output[0].tolist() if t != PLACEHOLDER] == drafts.tolist() + [int(targets[0][-1].argmax())]
    assert [t for t in output[1].tolist() if t != PLACEHOLDER] == [int(targets[1][0].argmax())]


@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("position", [0, 1, 2, 4])
def test_step_switches_at_the_exact_response_position(L: int, position: int) -> None:
    """Drafts that all differ from the target's argmax; LossySD(1) accepts anything where eta = 1.
    With Step(L), the drafts at response positions < L are rejected (lossless) and the others accepted."""
    vocab, k = 7, 4
    target = torch.zeros(k + 1, vocab)
    target[:, 3] = 5.0  # x* = 3 everywhere
    drafts = torch.tensor([1, 2, 4, 5], dtype=torch.int32)
    draft = torch.zeros(k, vocab)
    plans = [RowPlan(0, SecureSDRequest(LossySD(epsilon=1.0), Step(L=L)), position, draft, draft)]
    output = torch.full((1, k + 1), PLACEHOLDER, dtype=torch.int32)
    verify_rows(plans, output, drafts, [k], target, target[:k], target[k:], torch.tensor([6]), [True])
    lossless_slots = max(0, L - position)
    if lossless_slots == 0:
        expected = drafts.tolist() + [3]  # all accepted: the bonus token, x* at the bonus position
    else:
        expected = [3]  # the first draft sits at a lossless position and differs from x*
    assert [t for t in output[0].tolist() if t != PLACEHOLDER] == expected


POISON = 9


def test_a_failing_row_takes_the_targets_token_and_spares_the_others(monkeypatch) -> None:
    """A rule that raises on one row's drafts: the group is verified again row by row, the failing row
    gets its token from the target alone (lossless: argmax q at T = 0) and every other row is verified as
    if nothing had happened."""
    original = MARS.acceptance

    def acceptance(self, round_inputs, candidates):
        if bool((round_inputs.draft_tokens == POISON).any()):
            raise RuntimeError("a rule failing on these logits")
        return original(self, round_inputs, candidates)

    monkeypatch.setattr(MARS, "acceptance", acceptance)
    generator = torch.Generator().manual_seed(11)
    vocab, n = 12, 3
    targets = [torch.randn(n + 1, vocab, generator=generator) * 2 for _ in range(4)]
    draft_logits = [t[:n] + torch.randn(n, vocab, generator=generator) for t in targets]
    drafts = [t[:n].argmax(-1) for t in targets]
    drafts[1][0] = POISON
    requests = [SecureSDRequest(MARS(theta=0.5), None)] * 3 + [SecureSDRequest(Lossless(), Step(L=1))]
    plans = [RowPlan(row, requests[row], 2, draft_logits[row], draft_logits[row]) for row in range(4)]
    bonus = torch.tensor([int(t[-1].argmax()) for t in targets])
    output = torch.full((4, n + 1), 99, dtype=torch.int32)
    results = verify_rows(
        plans, output, torch.cat(drafts).to(torch.int32), [n] * 4, torch.cat(targets),
        torch.cat([t[:n] for t in targets]), torch.stack([t[-1] for t in targets]), bonus, [True] * 4,
    )
    for row in (0, 2, 3):
        expected = one_row_reference(
            requests[row].verifier, requests[row].schedule, 2, targets[row], targets[row],
            draft_logits[row], drafts[row], bonus[row], True,
        )
        assert [t for t in output[row].tolist() if t != PLACEHOLDER] == expected
    assert output[1].tolist() == [int(targets[1][0].argmax())] + [PLACEHOLDER] * n
    assert {result.row: result.verified for result in results} == {0: n, 1: 0, 2: n, 3: n}


def test_a_row_whose_target_logits_hold_nan_at_t1_never_commits_an_out_of_range_token(caplog) -> None:
    """The shared step refuses a target without a distribution (it used to draw token V - 1, and with the
    draw's clamp gone it would give the id V); the adapter logs it and the row takes the target-only token,
    inside the vocabulary, while the other rows are verified as usual."""
    generator = torch.Generator().manual_seed(5)
    vocab, n = 12, 3
    targets = [torch.randn(n + 1, vocab, generator=generator) for _ in range(3)]
    targets[1][1, 4] = float("nan")
    drafts = [t[:n].argmax(-1) for t in targets]
    requests = [SecureSDRequest(MARS(theta=0.5), None)] * 3
    plans = [RowPlan(row, requests[row], 2, None, None, one_hot=True) for row in range(3)]
    output = torch.full((3, n + 1), 99, dtype=torch.int32)
    results = verify_rows(
        plans, output, torch.cat(drafts).to(torch.int32), [n] * 3, torch.cat(targets),
        torch.cat([t[:n] for t in targets]), torch.stack([t[-1] for t in targets]), torch.zeros(3, dtype=torch.long),
        [False] * 3,
    )
    written = [[t for t in row if t != PLACEHOLDER] for row in output.tolist()]
    assert all(0 <= token < vocab for row in written for token in row)
    assert {result.row: result.verified for result in results}[1] == 0
    assert "batch row 1" in caplog.text and "position 1: the processed target logits hold NaN" in caplog.text


def test_fall_back_rows_draws_each_row_from_the_target() -> None:
    """The step-wide fallback: every SecureSD row's token follows q at its first drafted position."""
    torch.manual_seed(0)
    rows, n = N, 2
    target = slot_logits(TARGET, n)
    plans = [RowPlan(row, SecureSDRequest(MARS(), None), 1, None, None) for row in range(rows)]
    output = torch.zeros((rows, n + 1), dtype=torch.int32)
    fall_back_rows(plans, output, [n] * rows, target.repeat(rows, 1), torch.zeros(rows, dtype=torch.long),
                   [False] * rows)
    assert (output[:, 1:] == PLACEHOLDER).all()
    assert_follows(output[:, 0], target[0].softmax(-1))


def seeded_run(seed: int, one_hot: bool = False) -> list[list[int]]:
    """A T = 1 step of 6 MARS rows, each with its own generator seeded `seed` + row."""
    step = Step_(6, greedy=False, generator=torch.Generator().manual_seed(2))
    request = SecureSDRequest(MARS(theta=0.5), Step(L=2))
    plans = [
        RowPlan(row, request, POSITION, None if one_hot else step.draft, None if one_hot else step.draft,
                torch.Generator().manual_seed(seed + row), one_hot=one_hot)
        for row in range(6)
    ]
    output = torch.full((6, K + 1), PLACEHOLDER, dtype=torch.int32)
    verify_rows(plans, output, step.drafts.reshape(-1).to(torch.int32), [K] * 6, step.target.repeat(6, 1),
                step.target[:K].repeat(6, 1), step.target[K].expand(6, -1), step.bonus, [False] * 6)
    return output.tolist()


def test_per_request_generators_fix_every_draw() -> None:
    """With each row's generator seeded, the step's output (acceptance draws, recovered and bonus tokens)
    is the same whatever torch's global generator does; another seed changes it."""
    torch.manual_seed(1)
    first = seeded_run(100)
    torch.manual_seed(2)
    assert seeded_run(100) == first
    assert seeded_run(200) != first


def test_one_hot_rows_are_verified_without_draft_logits() -> None:
    """A proposer without a draft distribution (n-gram): its drafts are verified as one-hot
    proposals (lossless at T = 0: the drafts that equal x* are kept, then x*)."""
    vocab, k = 7, 4
    target = torch.zeros(k + 1, vocab)
    target[:, 3] = 5.0
    drafts = torch.tensor([3, 3, 1, 3], dtype=torch.int32)
    plans = [RowPlan(0, SecureSDRequest(Lossless(), None), 1, None, None, one_hot=True)]
    output = torch.full((1, k + 1), PLACEHOLDER, dtype=torch.int32)
    results = verify_rows(
        plans, output, drafts, [k], target, target[:k], target[k:], torch.tensor([6]), [True]
    )
    assert [t for t in output[0].tolist() if t != PLACEHOLDER] == [3, 3, 3]
    assert results[0].verified == k and results[0].accepted == 2
    assert seeded_run(100, one_hot=True) == seeded_run(100, one_hot=True)


def test_the_adapter_verifies_through_the_core_step(monkeypatch) -> None:
    """The vLLM adapter has no verification of its own: replacing the core step changes its output."""
    from hf_securesd import step as core_step

    torch.manual_seed(0)
    lossless = SecureSDRequest(Lossless(), None)
    before = Step_(4, greedy=True, generator=torch.Generator().manual_seed(1)).run(lossless)

    def every_draft_rejected_token_five(round_, collect_deviation=False, check_ranges=True):
        rows = round_.draft_tokens.shape[0]
        return core_step.StepOutput(
            accepted=torch.zeros(rows, dtype=torch.long), next_tokens=torch.full((rows,), 5),
            alpha=torch.zeros(round_.draft_tokens.shape), eta=torch.zeros(round_.draft_tokens.shape),
        )

    monkeypatch.setattr(core_step, "verify_step", every_draft_rejected_token_five)
    after = Step_(4, greedy=True, generator=torch.Generator().manual_seed(1)).run(lossless)
    assert after.tolist() == [[5] + [PLACEHOLDER] * K] * 4 != before.tolist()


@pytest.mark.parametrize("verifier", ["lossless", "mars"])
def test_viewed_and_gathered_layouts_build_the_same_round(verifier) -> None:
    """A step whose requests all verify all their drafts is viewed in vLLM's layout; the same rows in
    another order are gathered. Both rounds hold the same tensors row for row (a greedy lossless round
    holds the target's argmax in place of every logit tensor, the only thing its rule reads), and verify
    to the same tokens."""
    generator = torch.Generator().manual_seed(5)
    rows, vocab = 4, 11
    target_raw = torch.randn(rows * (K + 1), vocab, generator=generator)
    processed = target_raw.view(rows, K + 1, vocab) / 0.7  # stands for vLLM's processing
    drafts = torch.randint(0, vocab, (rows * K,), generator=generator, dtype=torch.int32)
    draft_logits = torch.randn(rows, K, vocab, generator=generator)
    request = SecureSDRequest(VERIFIERS[verifier], Step(L=2))
    plans = [RowPlan(row, request, 3 + row, draft_logits[row], draft_logits[row]) for row in range(rows)]
    layout = _Layout([K] * rows)
    bonus_ids = processed[:, K].argmax(-1).to(torch.int32)[:, None]  # vLLM's greedy bonus tokens
    step = (drafts, target_raw, processed[:, :K].reshape(-1, vocab), processed[:, K], bonus_ids, [True] * rows)
    viewed = _round(plans, [K] * rows, layout, *step)
    order = list(reversed(range(rows)))
    gathered = _round([plans[row] for row in order], [K] * rows, layout, *step)
    back = torch.tensor(order).argsort()
    held = ("target_argmax",) if verifier == "lossless" else (
        "target_logits", "target_raw_logits", "draft_logits", "draft_raw_logits"
    )
    for name in ("draft_tokens", *held, "starts"):
        assert torch.equal(getattr(viewed, name), getattr(gathered, name)[back]), name
    # Every row keeps its k drafts: both rounds say so with no counts (the core reads None as k).
    assert viewed.draft_counts is None and gathered.draft_counts is None
    if verifier == "lossless":
        assert viewed.target_logits is None and viewed.target_raw_logits is None
        assert torch.equal(viewed.target_argmax, processed.argmax(-1))
    else:
        assert torch.equal(viewed.target_logits, processed)
        assert torch.equal(viewed.target_raw_logits, target_raw.view(rows, K + 1, vocab))
    outputs = []
    for chosen in (plans, [plans[row] for row in order]):
        output = torch.full((rows, K + 1), PLACEHOLDER, dtype=torch.int32)
        bonus_ids = step[3].argmax(-1)
        verify_rows(chosen, output, drafts, [K] * rows, target_raw, step[2], step[3], bonus_ids, step[4])
        outputs.append(output)
    assert torch.equal(outputs[0], outputs[1])


def test_a_request_failing_every_step_logs_one_error_and_then_counts(caplog, monkeypatch) -> None:
    """A request whose every step fails verification (a target with no distribution: hostile penalties or
    constraints) cannot flood the server's log: its first failure is one ERROR line with its
    configuration, the later ones are counted and reported in one WARNING at most every interval, with
    the requests that failed most. Each failing step still falls back to the target alone."""
    import logging

    from hf_securesd.vllm import sampler

    now = [0.0]
    failures = sampler.FailureLog(interval_s=30.0, clock=lambda: now[0])
    monkeypatch.setattr(sampler, "FAILURES", failures)
    caplog.set_level(logging.INFO, logger="hf_securesd.vllm.sampler")
    vocab, n = 12, 2
    target = torch.randn(n + 1, vocab, generator=torch.Generator().manual_seed(1))
    target[1, 4] = float("nan")  # the shared step refuses this target at T = 1

    def step(req_id: str) -> list[int]:
        plans = [RowPlan(0, SecureSDRequest(MARS(theta=0.5), None), 2, None, None, one_hot=True, req_id=req_id)]
        output = torch.full((1, n + 1), 99, dtype=torch.int32)
        results = verify_rows(plans, output, target[:n].argmax(-1).to(torch.int32), [n], target, target[:n],
                              target[n:], torch.zeros(1, dtype=torch.long), [False])
        assert results[0].verified == 0  # the fallback: the target's token alone
        return [t for t in output[0].tolist() if t != PLACEHOLDER]

    def records(level: int) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "hf_securesd.vllm.sampler" and r.levelno == level]

    for _ in range(50):
        assert len(step("hostile")) == 1
        now[0] += 0.1
    step("other")
    errors = records(logging.ERROR)
    assert len(errors) == 2 and "request hostile" in errors[0].getMessage()
    assert "further failures are only counted" in errors[0].getMessage()
    assert not records(logging.WARNING)  # 5 s: no count yet
    now[0] = 31.0
    step("other")
    (count,) = records(logging.WARNING)
    assert "49 more verification failures" in count.getMessage() and "hostile 49" in count.getMessage()
    step("hostile")  # counted again, reported no sooner than another interval
    assert len(records(logging.ERROR)) == 2 and len(records(logging.WARNING)) == 1
    now[0] = 62.0
    verify_rows([], torch.zeros((0, 1), dtype=torch.int32), torch.zeros(0), [], target, target, target,
                torch.zeros(0), [])  # a step with no SecureSD row reports nothing
    assert len(records(logging.WARNING)) == 1
    step("fine-later")
    assert len(records(logging.WARNING)) == 2


def test_failure_log_forgets_the_oldest_request_beyond_its_bound(caplog) -> None:
    import logging

    from hf_securesd.vllm.sampler import FailureLog

    caplog.set_level(logging.INFO, logger="hf_securesd.vllm.sampler")
    failures = FailureLog(remember=2, clock=lambda: 0.0)
    for req_id in ("a", "b", "a", "c", "a", "b"):
        failures.failed(RowPlan(0, SecureSDRequest(MARS(), None), 1, None, None, req_id=req_id), RuntimeError("x"))
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert [m.split("request ")[1][0] for m in logged] == ["a", "b", "c", "b"]
    unnamed = RowPlan(0, SecureSDRequest(MARS(), None), 1, None, None)
    failures.failed(unnamed, RuntimeError("x"))
    failures.failed(unnamed, RuntimeError("x"))
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 6
