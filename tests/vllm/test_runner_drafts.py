"""The runner hooks' hand-over of recorded draft logits (`hf_securesd.vllm.verification`): the [R, k, V]
stack of a proposal is built only when the next verification round reads draft logits. A greedy
lossless round (the rule reads the target's argmax alone) gets each row's proposal count instead, and
no stack; other rounds get each row's own [k, V] logits. A stand-in runner with the attributes the hooks
read (vLLM's `GPUModelRunner` has them) keeps these tests free of vLLM and of a model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_securesd.vllm import drafting, verification
from hf_securesd.vllm.request import request_for

K, VOCAB, PROMPT = 4, 17, 6
LOSSLESS = {"verifier": {"verifier": "lossless"}}
MARS = {"verifier": {"verifier": "mars", "theta": 0.5}}


class Drafter:
    """Stands for vLLM's draft-model/EAGLE proposer: it has `_sample_draft_tokens` (not one-hot)."""

    def _sample_draft_tokens(self, *args):  # never called here
        raise AssertionError


class Runner:
    """The attributes of vLLM's model runner that the hooks read, for a batch of SecureSD requests."""

    def __init__(self, configurations: list[dict | None], temperatures: list[float]) -> None:
        self.req_ids = [f"request-{row}" for row in range(len(configurations))]
        greedy = all(t == 0 for t in temperatures)
        metadata = SimpleNamespace(
            all_greedy=greedy, all_random=all(t > 0 for t in temperatures), generators={},
            temperature=None if greedy else torch.tensor(temperatures),
        )
        self.input_batch = SimpleNamespace(
            req_ids=self.req_ids, sampling_metadata=metadata,
            num_computed_tokens_cpu=np.full(len(configurations), PROMPT + 3),
            num_prompt_tokens=np.full(len(configurations), PROMPT), top_k_reqs=set(), top_p_reqs=set(),
        )
        # each row is fed its last committed token and its K drafts
        self.query_start_loc = SimpleNamespace(np=np.arange(len(configurations) + 1) * (1 + K))
        self.requests = {
            req_id: SimpleNamespace(
                req_id=req_id, output_token_ids=[1, 2, 3],
                sampling_params=SimpleNamespace(extra_args=None if config is None else {"securesd": config}),
            )
            for req_id, config in zip(self.req_ids, configurations)
        }
        self.drafter = Drafter()
        self.device = torch.device("cpu")
        generator = torch.Generator().manual_seed(0)
        self.recorded = [torch.randn(len(configurations), VOCAB, generator=generator) for _ in range(K)]
        self.plans: list = []

    def propose_draft_token_ids(self):
        """What the patched proposer records: per drafted position, the rows' [R, V] logits."""
        rows = self.drafter.securesd_rows
        for logits in self.recorded:
            rows.steps.append((logits, logits))
        return [[0] * K for _ in self.req_ids]

    def _sample(self, logits, spec_decode_metadata):
        """vLLM's sampling, here: keep the plans the hook built for this step."""
        self.plans = verification._current_step.plans
        return None


@pytest.fixture
def runner_class():
    class PatchedRunner(Runner):
        pass

    undo = verification.patch_runner(PatchedRunner)
    yield PatchedRunner
    undo()


def step(runner: Runner, monkeypatch) -> int:
    """One proposal and the verification step after it; returns how many times torch.stack ran."""
    calls = []
    stack = torch.stack

    def counting_stack(*args, **kwargs):
        calls.append(1)
        return stack(*args, **kwargs)

    monkeypatch.setattr(drafting.torch, "stack", counting_stack)
    runner.propose_draft_token_ids()
    metadata = SimpleNamespace(num_draft_tokens=[K] * len(runner.req_ids))
    runner._sample(torch.zeros(len(runner.req_ids) * (K + 1), VOCAB), metadata)
    monkeypatch.setattr(drafting.torch, "stack", stack)
    return len(calls)


def test_a_greedy_lossless_round_gets_counts_and_no_stack_is_built(runner_class, monkeypatch) -> None:
    runner = runner_class([LOSSLESS, LOSSLESS, None], [0.0, 0.0, 0.0])
    assert step(runner, monkeypatch) == 0
    assert [plan.row for plan in runner.plans] == [0, 1]
    for plan in runner.plans:
        assert plan.draft_raw_logits is None and plan.draft_logits is None
        assert plan.proposed == K and plan.recorded == K and not plan.one_hot


@pytest.mark.parametrize(
    "configurations, temperatures",
    [([MARS, LOSSLESS], [0.0, 0.0]), ([LOSSLESS, LOSSLESS], [0.0, 0.7])],
    ids=["a relaxed row", "a sampled row"],
)
def test_a_round_that_reads_draft_logits_gets_each_rows_own(
    runner_class, monkeypatch, configurations, temperatures
) -> None:
    runner = runner_class(configurations, temperatures)
    assert step(runner, monkeypatch) >= 1
    expected = torch.stack(runner.recorded, dim=1)  # [R, k, V]
    for plan in runner.plans:
        assert plan.proposed is None and plan.recorded == K
        assert torch.equal(plan.draft_raw_logits, expected[plan.row])
        assert torch.equal(plan.draft_logits, expected[plan.row])


def test_the_stack_is_built_once_per_proposal() -> None:
    first, second = torch.randn(3, VOCAB), torch.randn(3, VOCAB)
    rows = drafting.DraftRows([None, None, None], steps=[(first, first), (second, second)])
    raw, processed = rows.stacked()
    assert processed is raw and raw.shape == (3, 2, VOCAB)
    assert rows.stacked()[0] is raw
    assert torch.equal(rows.row_logits(1)[0], torch.stack([first[1], second[1]]))
    assert rows.row_logits(3) == (None, None)



@pytest.mark.parametrize(
    "configurations, temperatures, records",
    [([LOSSLESS, LOSSLESS, None], [0.0, 0.0, 0.0], False), ([MARS, LOSSLESS], [0.0, 0.0], True),
     ([LOSSLESS, LOSSLESS], [0.0, 0.7], True)],
    ids=["greedy lossless", "a relaxed row", "a sampled row"],
)
def test_a_proposal_records_draft_logits_only_for_rounds_that_read_them(
    runner_class, configurations, temperatures, records
) -> None:
    runner = runner_class(configurations, temperatures)
    runner.propose_draft_token_ids()
    assert runner._securesd_drafts.drafts.records_logits is records


class ArgmaxProposer:
    """Stands for vLLM's SpecDecodeBaseProposer at T = 0: its drafts are the argmax of the draft logits."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.model = SimpleNamespace(compute_logits=lambda hidden_states: logits)
        self.own_calls = 0

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        self.own_calls += 1
        return self.model.compute_logits(hidden_states).argmax(dim=-1), None


def test_a_greedy_proposal_that_no_round_reads_is_vllms_own_and_counted() -> None:
    """With records_logits false and a greedy batch, each drafted position is vLLM's own call (the same
    argmax drafts; the plain row makes it run in both cases) and is counted, with no logits kept;
    otherwise the logits of every position are kept."""

    class Proposer(ArgmaxProposer):
        pass

    undo = drafting.patch_proposer(Proposer, top_k_top_p=None)
    try:
        logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
        lossless = request_for({"securesd": LOSSLESS})
        greedy = SimpleNamespace(all_greedy=True, temperature=None, top_k=None, top_p=None, generators={})
        for records, kept in ((False, 0), (True, K)):
            proposer = Proposer(logits)
            rows = drafting.DraftRows([lossless, None, lossless], records_logits=records)
            proposer.securesd_rows = rows
            for _ in range(K):
                tokens, probs = proposer._sample_draft_tokens(torch.zeros(3, 8), greedy)
                assert torch.equal(tokens, logits.argmax(dim=-1)) and probs is None
            assert (len(rows.steps), rows.proposals, rows.batch_rows, proposer.own_calls) == (kept, K, 3, K)
    finally:
        undo()


class OneHotRunner(Runner):
    """A runner whose proposer is vLLM's n-gram one: no `_sample_draft_tokens` (one-hot drafts)."""

    def __init__(self, configurations: list[dict | None], temperatures: list[float]) -> None:
        super().__init__(configurations, temperatures)
        self.drafter = SimpleNamespace()

    def propose_draft_token_ids(self):
        return [[0] * K for _ in self.req_ids]


def test_a_one_hot_proposal_runs_untouched_and_its_rows_verify_every_draft() -> None:
    class PatchedRunner(OneHotRunner):
        pass

    undo = verification.patch_runner(PatchedRunner)
    try:
        runner = PatchedRunner([LOSSLESS, None, LOSSLESS], [0.0, 0.0, 0.0])
        assert runner.propose_draft_token_ids() == [[0] * K for _ in runner.req_ids]
        assert runner._securesd_drafts is None and not hasattr(runner.drafter, "securesd_rows")
        metadata = SimpleNamespace(num_draft_tokens=[K] * len(runner.req_ids))
        runner._sample(torch.zeros(len(runner.req_ids) * (K + 1), VOCAB), metadata)
    finally:
        undo()
    first_draft = 3 + 1  # PROMPT + 3 tokens computed: the first draft is response token 4
    assert [(plan.row, plan.position) for plan in runner.plans] == [(0, first_draft), (2, first_draft)]
    for plan in runner.plans:
        assert plan.one_hot and plan.proposed is None and plan.draft_raw_logits is None
