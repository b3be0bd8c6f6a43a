"""`mixing.verify_round` at T = 0: the lossless rule reads x* alone and draws no random numbers; at T > 0 the
recovery is evaluated only where a row draws from it, with the same values."""

from __future__ import annotations

import pytest
import torch

from hf_securesd import MARS, Lossless, Step
from hf_securesd.mixing import bonus_distribution, mixed_recovery, recovery_at, verify_round
from hf_securesd.schedules import schedule_weights
from hf_securesd.verifiers.base import PRECISE_BELOW, RoundInputs

V, K = 11, 4


def greedy_round(seed: int, batch: int, lengths: list[int] | None) -> RoundInputs:
    """A greedy round whose drafts follow the target's argmax for a random number of positions."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, K + 1, V, generator=generator)
    drafts = torch.randint(0, V, (batch, K), generator=generator)
    follow = torch.randint(0, K + 1, (batch,), generator=generator)
    agree = torch.arange(K)[None] < follow[:, None]
    drafts = torch.where(agree, target[:, :K].argmax(-1), drafts)
    draft = torch.randn(batch, K, V, generator=generator)
    return RoundInputs(
        draft_tokens=drafts, target_logits=target, draft_logits=draft, target_raw_logits=target,
        draft_raw_logits=draft, greedy=True, draft_lengths=None if lengths is None else torch.tensor(lengths),
    )


def reference(round_inputs: RoundInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted counts and next tokens from the rule as written: accept while x_i = x*_i, within the row's
    draft length; the next token is x* at the first position not accepted."""
    argmax = round_inputs.target_logits.argmax(-1)
    lengths = round_inputs.row_draft_lengths().tolist()
    accepted, next_tokens = [], []
    for row, length in enumerate(lengths):
        count = 0
        while count < length and round_inputs.draft_tokens[row, count] == argmax[row, count]:
            count += 1
        accepted.append(count)
        next_tokens.append(int(argmax[row, count]))
    return torch.tensor(accepted), torch.tensor(next_tokens)


@pytest.mark.parametrize("lengths", [None, [4, 2, 0, 3, 1, 4]])
def test_greedy_lossless_round_follows_the_rule_and_draws_nothing(lengths):
    for seed in range(20):
        round_inputs = greedy_round(seed, batch=6, lengths=lengths)
        state = torch.random.get_rng_state()
        eta = schedule_weights(None, torch.zeros(6, dtype=torch.long), round_inputs.draft_tokens)
        accepted, next_tokens, alpha = verify_round(Lossless(), round_inputs, eta)
        assert torch.equal(torch.random.get_rng_state(), state)  # no uniforms drawn at T = 0
        expected_accepted, expected_next = reference(round_inputs)
        assert torch.equal(accepted, expected_accepted) and torch.equal(next_tokens, expected_next)
        matches = round_inputs.draft_tokens == round_inputs.target_logits[:, :K].argmax(-1)
        assert alpha.dtype == torch.float32 and torch.equal(alpha, matches.float())


def test_greedy_relaxed_round_with_a_lossless_knob_equals_lossless():
    """MARS at theta = 1 is the lossless rule: the same shortcut, the same outcome."""
    round_inputs = greedy_round(3, batch=6, lengths=None)
    eta = schedule_weights(Step(L=2), torch.zeros(6, dtype=torch.long), round_inputs.draft_tokens)
    lossless = verify_round(Lossless(), round_inputs, eta)
    mars = verify_round(MARS(theta=1.0), round_inputs, eta)
    assert all(torch.equal(a, b) for a, b in zip(lossless, mars))


def test_greedy_lossless_generate_leaves_the_global_generator_alone(llama_pair):
    """Like plain greedy decoding, greedy lossless speculative decoding consumes no random numbers."""
    draft, target = llama_pair
    prompt = torch.tensor([[5, 17, 42, 9, 77, 3]])
    plain_state = torch.random.get_rng_state()
    target.generate(prompt, do_sample=False, max_new_tokens=12, pad_token_id=0)
    assert torch.equal(torch.random.get_rng_state(), plain_state)
    target.generate(prompt, assistant_model=draft, verifier="lossless", do_sample=False, max_new_tokens=12,
                    pad_token_id=0)
    assert torch.equal(torch.random.get_rng_state(), plain_state)


def sampled_round(seed: int, batch: int, near_copies: bool) -> RoundInputs:
    """A T > 0 round; with near_copies some positions' draft nearly equals the target (residual mass below
    PRECISE_BELOW: the float64 recomputation), others are unrelated."""
    generator = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, K + 1, V, generator=generator) * 2
    draft = torch.randn(batch, K, V, generator=generator) * 2
    if near_copies:
        copied = torch.rand(batch, K, generator=generator) < 0.5
        draft = torch.where(copied[..., None], target[:, :K] + torch.randn(batch, K, V, generator=generator) * 1e-4, draft)
    drafts = torch.randint(0, V, (batch, K), generator=generator)
    return RoundInputs(drafts, target, draft, target, draft, greedy=False)


@pytest.mark.parametrize("near_copies", [False, True])
@pytest.mark.parametrize("verifier", [Lossless(), MARS(theta=0.5)], ids=["lossless", "mars"])
def test_recovery_at_one_position_per_row_equals_the_full_recovery(verifier, near_copies):
    """The recovery a round draws from (`recovery_at`, evaluated only at each row's rejection position)
    is bitwise the full [B, k, V] mixture's entry there: lossless rows, a schedule that is 0 at the chosen
    positions but not elsewhere (only the lossless rule evaluated), and a real mixture."""
    batch = 16
    rows = torch.arange(batch)
    positions = torch.arange(batch) % K
    early = torch.arange(K)[None].expand(batch, K)
    for eta in (
        torch.zeros(batch, K),
        (early > positions[:, None]).float(),  # 0 at each chosen position, 1 after it
        torch.full((batch, K), 0.3),
    ):
        round_inputs = sampled_round(int(eta.sum()), batch, near_copies)
        full = mixed_recovery(verifier, round_inputs, eta)[rows, positions]
        fresh = sampled_round(int(eta.sum()), batch, near_copies)  # no cached tensors shared with `full`
        picked = recovery_at(verifier, fresh, eta, positions)
        assert torch.equal(picked, full)
        if near_copies:
            mass = (fresh.verified_target_probs() - fresh.draft_probs).clamp_min(0).sum(-1)[rows, positions]
            assert bool((mass < PRECISE_BELOW).any())  # the float64 path ran for some chosen positions


@pytest.mark.parametrize("lengths", [None, [K, K, K], [0, 2, K]])
def test_bonus_distribution_is_q_after_each_rows_last_kept_draft(lengths):
    """Row b's bonus distribution is softmax(target logits) at position draft_lengths[b] (k when None)."""
    round_inputs = greedy_round(5, 3, lengths)
    round_inputs.greedy = False
    expected = torch.stack([
        round_inputs.target_logits[row, K if lengths is None else lengths[row]].softmax(-1) for row in range(3)
    ])
    assert torch.equal(bonus_distribution(round_inputs), expected)
