"""The one verification step every engine calls (`hf_securesd.step.verify_step`)."""

from __future__ import annotations

import pytest
import torch

from hf_securesd import MARS, Lossless, LossySD, Segments, Step
from hf_securesd import step as core_step
from hf_securesd.step import RowSpec, VerificationRound, verify_step

V, K = 9, 3


def ragged_round(rows: list[RowSpec], counts: list[int], seed: int = 0, greedy: bool = False) -> VerificationRound:
    generator = torch.Generator().manual_seed(seed)
    batch = len(rows)
    target = torch.randn(batch, K + 1, V, generator=generator) * 2
    draft = torch.randn(batch, K, V, generator=generator) * 2
    tokens = torch.randint(0, V, (batch, K), generator=generator)
    return VerificationRound(
        rows=rows, draft_tokens=tokens, draft_counts=torch.tensor(counts), starts=torch.arange(batch) * 2,
        target_logits=target, target_raw_logits=target, greedy=greedy, draft_logits=draft, draft_raw_logits=draft,
    )


def test_grouping_by_verifier_equals_verifying_each_row_alone():
    specs = [RowSpec(MARS(theta=0.5)), RowSpec(Lossless(), Step(L=3)), RowSpec(MARS(theta=0.5), Step(L=1)),
             RowSpec(LossySD(epsilon=0.4))]
    whole = ragged_round(specs, [3, 2, 0, 1], greedy=True)
    together = verify_step(whole, collect_deviation=True)
    for row, spec in enumerate(specs):
        alone = VerificationRound(
            rows=[spec], draft_tokens=whole.draft_tokens[row:row + 1], draft_counts=whole.draft_counts[row:row + 1],
            starts=whole.starts[row:row + 1], target_logits=whole.target_logits[row:row + 1],
            target_raw_logits=whole.target_raw_logits[row:row + 1], greedy=True,
            draft_logits=whole.draft_logits[row:row + 1], draft_raw_logits=whole.draft_raw_logits[row:row + 1],
        )
        single = verify_step(alone, collect_deviation=True)
        assert together.accepted[row] == single.accepted[0] and together.next_tokens[row] == single.next_tokens[0]
        assert torch.equal(together.eta[row], single.eta[0])
        assert torch.allclose(together.deviation[row], single.deviation[0])


def test_a_row_without_usable_drafts_draws_from_q_at_its_first_position():
    round_ = ragged_round([RowSpec(LossySD(epsilon=1.0))] * 2, [0, 0], greedy=True)
    out = verify_step(round_)
    assert out.accepted.tolist() == [0, 0]
    assert out.next_tokens.tolist() == round_.target_logits[:, 0].argmax(-1).tolist()


def test_per_row_generators_fix_each_rows_draws_whatever_the_batch():
    def run(seeds: list[int], counts: list[int]) -> list[tuple[int, int]]:
        specs = [RowSpec(MARS(theta=0.9), generator=torch.Generator().manual_seed(s)) for s in seeds]
        out = verify_step(ragged_round(specs, counts, seed=4))
        return list(zip(out.accepted.tolist(), out.next_tokens.tolist()))

    first = run([11, 12, 13], [3, 2, 3])
    assert run([11, 12, 13], [3, 2, 3]) == first
    outcomes = {tuple(run([s, 12, 13], [3, 2, 3])[0]) for s in range(40)}
    assert len(outcomes) > 1  # different seeds give different draws
    # row 1 alone, with the same generator seed, draws exactly what it drew inside the batch
    specs = [RowSpec(MARS(theta=0.9), generator=torch.Generator().manual_seed(12))]
    whole = ragged_round([RowSpec(MARS(theta=0.9))] * 3, [3, 2, 3], seed=4)
    alone = VerificationRound(
        rows=specs, draft_tokens=whole.draft_tokens[1:2], draft_counts=whole.draft_counts[1:2],
        starts=whole.starts[1:2], target_logits=whole.target_logits[1:2], target_raw_logits=whole.target_raw_logits[1:2],
        greedy=False, draft_logits=whole.draft_logits[1:2], draft_raw_logits=whole.draft_raw_logits[1:2],
    )
    out = verify_step(alone)
    assert (int(out.accepted[0]), int(out.next_tokens[0])) == first[1]


def test_generate_goes_through_the_shared_step(llama_pair, monkeypatch):
    draft, target = llama_pair
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    before = target.generate(prompt, max_new_tokens=8, do_sample=False, assistant_model=draft, verifier="lossless")
    calls = []
    original = core_step.verify_step

    def always_token_seven(round_, collect_deviation=False, check_ranges=True):
        calls.append(round_)
        out = original(round_, collect_deviation)
        out.accepted.zero_()
        out.next_tokens.fill_(7)
        return out

    monkeypatch.setattr(core_step, "verify_step", always_token_seven)
    after = target.generate(prompt, max_new_tokens=8, do_sample=False, assistant_model=draft, verifier="lossless")
    assert calls and after[0, prompt.shape[1]:].tolist() == [7] * 8 and not torch.equal(before, after)


def test_greedy_lossless_cpu_rounds_decided_on_the_host_equal_the_torch_rule():
    """A CPU round of greedy lossless rows is decided on the host from lists; `mixing.verify_round` (the
    torch rule every other round takes) gives the same accepted counts, next tokens and alpha, on ragged
    rounds with drafts that often match x*, with and without counts and a given x*."""
    from hf_securesd.mixing import verify_round
    from hf_securesd.verifiers.base import RoundInputs

    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        batch = 1 + seed % 6
        round_ = ragged_round([RowSpec(Lossless())] * batch, torch.randint(0, K + 1, (batch,), generator=generator).tolist(),
                              seed=seed, greedy=True)
        x_star = round_.target_logits.argmax(-1)
        matching = torch.rand(batch, K, generator=generator) < 0.7
        round_.draft_tokens = torch.where(matching, x_star[:, :K], round_.draft_tokens)
        if seed % 3 == 0:
            round_.draft_counts = None
        if seed % 2:
            round_.target_argmax, round_.target_logits, round_.target_raw_logits = x_star, None, None
        host = verify_step(round_)
        assert host.host_lists() == (host.accepted.tolist(), host.next_tokens.tolist())
        inputs = RoundInputs(
            draft_tokens=round_.draft_tokens, target_logits=round_.target_logits, draft_logits=None,
            target_raw_logits=round_.target_raw_logits, draft_raw_logits=None, greedy=True,
            draft_lengths=round_.draft_counts, given_target_argmax=round_.target_argmax,
        )
        accepted, next_tokens, alpha = verify_round(Lossless(), inputs, None)
        assert torch.equal(host.accepted, accepted) and torch.equal(host.next_tokens, next_tokens), seed
        assert torch.equal(host.alpha, alpha), seed


def test_a_greedy_lossless_round_without_drafts_takes_x_star_at_each_rows_first_position():
    """k = 0 (no row drafted): every row accepts nothing and ends with x*[:, 0], decided on the host and by
    the torch rule alike (a round on the meta device takes the torch route); alpha is [B, 0]."""
    from hf_securesd.mixing import verify_round
    from hf_securesd.verifiers.base import RoundInputs

    generator = torch.Generator().manual_seed(5)
    target = torch.randn(4, 1, V, generator=generator)
    round_ = VerificationRound(
        rows=[RowSpec(Lossless())] * 4, draft_tokens=torch.zeros(4, 0, dtype=torch.long), draft_counts=None,
        starts=torch.tensor([0, 3, 1, 7]), target_logits=target, target_raw_logits=target, greedy=True,
    )
    host = verify_step(round_)
    assert host.host_lists() == ([0] * 4, target[:, 0].argmax(-1).tolist())
    assert host.alpha.shape == (4, 0) and host.eta.shape == (4, 0)
    given = verify_step(VerificationRound(**{**vars(round_), "target_logits": None, "target_raw_logits": None,
                                             "target_argmax": target.argmax(-1)}))
    assert given.host_lists() == host.host_lists()
    inputs = RoundInputs(draft_tokens=round_.draft_tokens, target_logits=target, draft_logits=None,
                         target_raw_logits=target, draft_raw_logits=None, greedy=True)
    accepted, next_tokens, alpha = verify_round(Lossless(), inputs, None)
    assert (accepted.tolist(), next_tokens.tolist()) == host.host_lists() and alpha.shape == (4, 0)
    # counts past k = 0 are refused there as anywhere
    with pytest.raises(ValueError, match=r"draft_counts\[2\] = 1, outside \[0, k\] with k = 0"):
        verify_step(VerificationRound(**{**vars(round_), "draft_counts": torch.tensor([0, 0, 1, 0])}))


def test_draft_probabilities_the_proposer_gives_are_the_ones_verified():
    """At T > 0 a round's `draft_probs` is p itself (not recomputed): the proposer's own softmax gives the
    same outcome as none given, for the same seed, and other probabilities change what is accepted."""
    specs = [RowSpec(Lossless()), RowSpec(MARS(theta=0.5), Step(L=1)), RowSpec(LossySD(epsilon=0.3))]
    base = ragged_round(specs, [3, 2, 3], seed=4)

    def run(draft_probs):
        round_ = VerificationRound(**{**vars(base), "draft_probs": draft_probs})
        torch.manual_seed(0)
        out = verify_step(round_, collect_deviation=True)
        return out.accepted.tolist(), out.next_tokens.tolist(), out.alpha, out.deviation

    computed = run(None)
    given = run(torch.stack([base.draft_logits[:, i].softmax(-1) for i in range(K)], dim=1))
    assert computed[:2] == given[:2]
    assert torch.equal(computed[2], given[2]) and torch.equal(computed[3], given[3])
    # p one-hot on each drafted token: lossless acceptance becomes min(1, q(x)), another alpha.
    one_hot = torch.nn.functional.one_hot(base.draft_tokens, V).float()
    assert not torch.equal(run(one_hot)[2][0], computed[2][0])


class _OneTokenTokenizer:
    """A tokenizer stand-in whose vocabulary holds `text` as the single token `token_id`."""

    def __init__(self, text: str, token_id: int) -> None:
        self.text, self.token_id = text, token_id

    def get_vocab(self) -> dict[str, int]:
        return {self.text: self.token_id}

    def decode(self, ids: list[int]) -> str:
        return self.text if ids == [self.token_id] else "?"


def test_equal_segments_resolved_by_different_tokenizers_are_weighed_apart():
    """Two rows whose `Segments("</think>")` compare equal but were resolved to different ids (one model's
    tokenizer each) each find their own boundary in the same round."""
    first = Segments("</think>", before=None, after="lossless").with_tokenizer(_OneTokenTokenizer("</think>", 4))
    second = Segments("</think>", before=None, after="lossless").with_tokenizer(_OneTokenTokenizer("</think>", 6))
    assert first == second and first.token_boundaries != second.token_boundaries
    specs = [RowSpec(MARS(theta=0.5), first), RowSpec(MARS(theta=0.5), second)]
    round_ = ragged_round(specs, [3, 3], greedy=True)
    round_ = VerificationRound(**{**vars(round_), "draft_tokens": torch.tensor([[4, 1, 1], [6, 1, 1]]),
                                  "responses": [[2, 3], [2, 3]], "starts": torch.tensor([2, 2])})
    eta = verify_step(round_).eta
    assert eta.tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]  # each row's own boundary, drafted first
