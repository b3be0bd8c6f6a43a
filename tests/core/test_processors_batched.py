"""Logits processors inside the speculative loop: each row sees exactly its own prefix (committed
tokens plus the tokens drafted earlier in the round) and its own batch row, and processors are
called batched (one call per draft step and one per round for the target, whatever the batch)."""

from __future__ import annotations

import pytest
import torch
from support import random_prompts
from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from hf_securesd import FSD, LossySD, NonFiniteLogitsError, SecureSDConfigError
from hf_securesd import fused_warpers
from hf_securesd.fused_penalty import PenaltyThenTemperature
from hf_securesd.fused_warpers import TopKTopP
from hf_securesd.prefixes import RowProcessing, TokenBuffer
from hf_securesd.tiny import byte_tokenizer

TEXTS = ("hi", "The quick brown fox jumps", "def add(a, b):", "x", "Once upon a time, in a land far away")


@pytest.fixture
def captured_rounds(monkeypatch):
    """Every verified round (`step.VerificationRound`) and its accepted counts."""
    from hf_securesd import step

    rounds = []
    original = step.verify_step

    def capture(round_, collect_deviation=False, check_ranges=True):
        result = original(round_, collect_deviation, check_ranges)
        rounds.append((round_, result.accepted.clone()))
        return result

    monkeypatch.setattr(step, "verify_step", capture)
    return rounds


def test_draft_processors_see_the_tokens_drafted_earlier_in_the_round(llama_pair, captured_rounds):
    draft, target = llama_pair
    prompt = torch.tensor([[7, 7, 30, 31, 7, 30]])
    out = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=draft, verifier="lossless",
                          repetition_penalty=3.0, num_assistant_tokens=5)
    penalty = RepetitionPenaltyLogitsProcessor(3.0)
    committed = prompt[0].tolist()
    checked = 0
    for round_inputs, accepted in captured_rounds:
        drafts = round_inputs.draft_tokens[0].tolist()
        for step in range(len(drafts)):
            prefix = torch.tensor([committed + drafts[:step]])
            expected = penalty(prefix, round_inputs.draft_raw_logits[:, step].clone())
            assert torch.allclose(round_inputs.draft_logits[:, step], expected), f"draft step {step}"
            checked += 1
        for position in range(len(drafts) + 1):
            prefix = torch.tensor([committed + drafts[:position]])
            expected = penalty(prefix, round_inputs.target_raw_logits[:, position].clone())
            assert torch.allclose(round_inputs.target_logits[:, position], expected), f"target position {position}"
        n = int(accepted[0])
        committed += drafts[:n] + [int(round_inputs.target_logits[0, n].argmax())]
    assert committed == out[0].tolist()
    assert checked > len(captured_rounds), "no round drafted more than one token"


@pytest.mark.parametrize("verifier", [LossySD(epsilon=1.0), FSD(tau=0.69)], ids=["lossysd", "fsd"])
def test_no_repeat_ngram_holds_for_accept_everything_verifiers(llama_pair, verifier):
    """no_repeat_ngram_size=1 bans every token already present; a verifier that accepts (almost) every
    draft keeps that only if the draft's processed logits saw its own earlier drafts."""
    draft, target = llama_pair
    for prompt in random_prompts(10, seed=11, min_len=3, max_len=6):
        out = target.generate(prompt, max_new_tokens=16, do_sample=False, assistant_model=draft, verifier=verifier,
                              no_repeat_ngram_size=1)
        sequence = out[0].tolist()
        response = sequence[prompt.shape[1]:]
        seen = set(prompt[0].tolist())
        for token in response:
            assert token not in seen, f"{token} repeated in {sequence}"
            seen.add(token)


def _row_and_prefix_rule(batch_id: int, ids: torch.Tensor) -> list[int]:
    """Allowed next tokens as a function of the batch row, the prefix length and the last tokens."""
    base = (int(ids[-1]) * 3 + int(ids[-2]) + 11 * batch_id + len(ids)) % 200
    return list(range(base, base + 4)) + [20 + 10 * batch_id + j for j in range(3)]


def _padded_batch(texts):
    return byte_tokenizer()(list(texts), return_tensors="pt", padding=True)


def test_row_dependent_processor_sees_its_batch_row_and_exact_prefix(llama_pair):
    """prefix_allowed_tokens_fn depends on the batch id, the prefix and its length: lossless batched
    greedy must equal the target's own batched greedy decoding, row for row."""
    draft, target = llama_pair
    batch = _padded_batch(TEXTS)
    reference = target.generate(**batch, max_new_tokens=12, do_sample=False, prefix_allowed_tokens_fn=_row_and_prefix_rule)
    out = target.generate(**batch, max_new_tokens=12, do_sample=False, assistant_model=draft, verifier="lossless",
                          prefix_allowed_tokens_fn=_row_and_prefix_rule, return_dict_in_generate=True)
    assert out.sequences.tolist() == reference.tolist()
    accepted = [stats.accepted_tokens for stats in out.speculative_stats_per_row]
    assert len(set(accepted)) > 1, "rows advanced in lockstep: the batch was not ragged"


def test_a_grammar_function_meets_only_real_prefixes_of_its_own_row(llama_pair):
    """A grammar over the generated tokens (as written for plain `generate`) that allows nothing for a
    state no row reaches: batched lossless greedy equals plain greedy, and the function is called only
    with prefixes of its own row's final sequence (a batch call at another row's length used to show it
    a left-filled or cut row: HF then raised "returned an empty list")."""
    draft, target = llama_pair
    batch = _padded_batch(("HI", "ABCD", "x"))
    width = batch["input_ids"].shape[1]
    allowed_after_prompt = list(range(97, 123))
    calls: list[tuple[int, list[int]]] = []

    def grammar(batch_id: int, sent: torch.Tensor) -> list[int]:
        calls.append((batch_id, sent.tolist()))
        generated = sent[width:].tolist()
        return [] if any(token not in allowed_after_prompt for token in generated) else allowed_after_prompt

    kwargs = dict(**batch, max_new_tokens=10, do_sample=False, prefix_allowed_tokens_fn=grammar)
    reference = target.generate(**kwargs)
    calls.clear()
    out = target.generate(**kwargs, assistant_model=draft, verifier="lossless", num_assistant_tokens=4,
                          return_dict_in_generate=True)
    assert out.sequences.tolist() == reference.tolist()
    prompts = batch["input_ids"].tolist()
    # each call shows its own row: its padded prompt, then tokens the draft or the target chose for it
    assert calls and all(sent[:width] == prompts[batch_id] for batch_id, sent in calls)


class RecordingBias(LogitsProcessor):
    """Adds a bias that depends on the row's batch index and full prefix, and records every call."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.calls.append(input_ids.clone())
        bias = torch.zeros_like(scores)
        for row in range(input_ids.shape[0]):
            favoured = (int(input_ids[row].sum()) + 17 * row + input_ids.shape[1]) % scores.shape[-1]
            bias[row, favoured] = 4.0
        return scores + bias


def test_custom_processor_sees_each_rows_own_full_prefix_and_batch_row(llama_pair):
    draft, target = llama_pair
    batch = _padded_batch(TEXTS)
    reference = target.generate(**batch, max_new_tokens=14, do_sample=False,
                                logits_processor=LogitsProcessorList([RecordingBias()]))
    recorder = RecordingBias()
    out = target.generate(**batch, max_new_tokens=14, do_sample=False, assistant_model=draft, verifier="lossless",
                          logits_processor=LogitsProcessorList([recorder]), num_assistant_tokens=4)
    assert out.tolist() == reference.tolist()
    assert all(call.shape[0] == len(TEXTS) for call in recorder.calls), "a call did not have the batch's shape"


class PrecisionChanging(LogitsProcessor):
    """Adds a float64 bias (torch promotes the scores), then casts to `dtype`: plain decoding goes on in it."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, input_ids, scores):
        bias = torch.zeros(scores.shape[-1], dtype=torch.float64)
        bias[65] = 0.5
        return (scores + bias).to(self.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_processor_that_changes_the_precision_equals_target_greedy(llama_pair, dtype):
    draft, target = llama_pair
    batch = _padded_batch(TEXTS)
    processors = LogitsProcessorList([PrecisionChanging(dtype)])
    reference = target.generate(**batch, max_new_tokens=14, do_sample=False, logits_processor=processors)
    out = target.generate(**batch, max_new_tokens=14, do_sample=False, assistant_model=draft, verifier="lossless",
                          logits_processor=processors)
    assert out.tolist() == reference.tolist()


class Misshaping(LogitsProcessor):
    def __init__(self, change) -> None:
        self.change = change

    def __call__(self, input_ids, scores):
        return self.change(scores)


@pytest.mark.parametrize("change, got", [
    (lambda scores: scores.squeeze(0), r"a \(259,\) torch.float32 tensor"),  # a [V] row from the [1, V] input
    (lambda scores: scores[:, :-3], r"a \(1, 256\) torch.float32 tensor"),
    (lambda scores: scores.argmax(-1, keepdim=True).expand_as(scores), r"a \(1, 259\) torch.int64 tensor"),
    (lambda scores: scores.tolist(), r"list"),
])
def test_a_processor_that_returns_other_than_its_inputs_shape_is_named(llama_pair, change, got):
    """Plain decoding may read such scores without noticing (a [V] row at batch 1 broadcasts); the loop would
    read them as other rows or tokens, so it refuses them instead of answering wrongly."""
    draft, target = llama_pair
    batch = _padded_batch(TEXTS[:1])
    with pytest.raises(SecureSDConfigError, match=rf"logits processor Misshaping returned {got} for scores of shape \(1, 259\)"):
        target.generate(**batch, max_new_tokens=6, do_sample=False, assistant_model=draft, verifier="lossless",
                        logits_processor=LogitsProcessorList([Misshaping(change)]))


def test_row_independent_processors_are_called_once_per_step_for_all_rows(llama_pair, monkeypatch):
    """Temperature/top-k/top-p/repetition penalty: one call per draft step and one per round for all
    k+1 target positions, whatever the batch size; batched output equals the target's own."""
    draft, target = llama_pair
    calls = {"n": 0}
    # HF puts the temperature right after the penalty: the two run as one pass (`fused_penalty`).
    original = PenaltyThenTemperature.__call__

    def counted(self, input_ids, scores, **kwargs):
        calls["n"] += 1
        return original(self, input_ids, scores, **kwargs)

    monkeypatch.setattr(PenaltyThenTemperature, "__call__", counted)
    forwards = {"draft": 0, "target": 0}
    handles = [
        draft.register_forward_hook(lambda *_: forwards.__setitem__("draft", forwards["draft"] + 1)),
        target.register_forward_hook(lambda *_: forwards.__setitem__("target", forwards["target"] + 1)),
    ]
    try:
        batch = _padded_batch(TEXTS)
        torch.manual_seed(0)
        out = target.generate(**batch, max_new_tokens=16, do_sample=True, temperature=0.7, top_k=50, top_p=0.9,
                              repetition_penalty=1.3, assistant_model=draft, verifier="lossless",
                              return_dict_in_generate=True)
    finally:
        for handle in handles:
            handle.remove()
    assert calls["n"] == forwards["draft"] + forwards["target"]
    assert out.sequences.shape[0] == len(TEXTS)


def test_batched_repetition_penalty_equals_target_greedy_row_for_row(llama_pair):
    """Ragged rows are filled on the left with their own first token: the penalty sees the same token set."""
    draft, target = llama_pair
    batch = _padded_batch(TEXTS)
    reference = target.generate(**batch, max_new_tokens=16, do_sample=False, repetition_penalty=1.8)
    out = target.generate(**batch, max_new_tokens=16, do_sample=False, repetition_penalty=1.8, assistant_model=draft,
                          verifier="lossless", return_dict_in_generate=True)
    assert out.sequences.tolist() == reference.tolist()
    assert len({tuple(s.accepted_per_round) for s in out.speculative_stats_per_row}) > 1


@pytest.mark.parametrize("every_row", [True, False])
def test_views_are_right_aligned_own_prefixes(every_row):
    buffer = TokenBuffer(torch.tensor([[9, 1, 2], [3, 4, 5]]), room=1)
    buffer.write(torch.tensor([0, 1]), 0, torch.tensor([[6, 7], [8, 0]]), every_row=every_row)
    views = buffer.views(torch.tensor([0, 1, 1]), torch.tensor([5, 3, 4]), width=5)
    assert views.tolist() == [[9, 1, 2, 6, 7], [3, 3, 3, 4, 5], [3, 3, 4, 5, 8]]
    hidden = buffer.views(torch.tensor([0, 1]), torch.tensor([5, 4]), width=6, hidden=torch.tensor([1, 0]))
    assert hidden.tolist() == [[1, 1, 1, 2, 6, 7], [3, 3, 3, 4, 5, 8]]


@pytest.mark.parametrize("hidden", [None, torch.tensor([1, 0, 2])])
@pytest.mark.parametrize("rows", [None, torch.tensor([2, 0])])
def test_token_sets_hold_each_prefix_s_tokens_and_nothing_else(rows, hidden):
    """Row a*n + i of `token_sets` holds exactly the tokens of `views` at the same prefix (the penalty's
    input), for ragged lengths, every row or some, with and without hidden left padding."""
    generator = torch.Generator().manual_seed(0)
    buffer = TokenBuffer(torch.randint(0, 50, (3, 4), generator=generator), room=6)
    buffer.advance(torch.arange(3), torch.tensor([0, 2, 1]), [0, 1, 2], [0, 2, 1])
    buffer.write(torch.arange(3), 0, torch.randint(50, 100, (3, 5), generator=generator), every_row=True)
    picked = torch.arange(3) if rows is None else rows
    for offset, n in ((0, 1), (2, 1), (0, 4)):
        width = int(buffer.lengths[picked].max()) + offset + n - 1
        sets = buffer.token_sets(rows, offset, n, width, hidden)
        prefixes = (buffer.lengths[picked, None] + offset + torch.arange(n)).reshape(-1)
        views = buffer.views(picked.repeat_interleave(n), prefixes, width, hidden)
        assert sets.shape == views.shape
        assert [set(row) for row in sets.tolist()] == [set(row) for row in views.tolist()], (offset, n)


@pytest.mark.parametrize("batch", [3, 10])
@pytest.mark.parametrize("temperature", [None, 0.7])
@pytest.mark.parametrize("hides", [False, True])
def test_draft_steps_penalise_each_rows_own_tokens_across_rounds(hides, temperature, batch):
    """The draft steps of a round reuse the committed tokens' sets built at its first step: over rounds
    (new committed tokens, rows leaving), each call equals HF's penalty (then its temperature, fused with
    it) applied to every row alone with exactly its committed tokens (hidden left padding excluded) and
    the drafts before the step."""
    generator = torch.Generator().manual_seed(3)
    vocab = 12
    hidden = torch.arange(batch) % 3 if hides else None
    buffer = TokenBuffer(torch.randint(0, vocab, (batch, 4), generator=generator), room=4)
    try:
        penalty = RepetitionPenaltyLogitsProcessor(4.0, prompt_ignore_length=hidden)
    except ValueError:
        pytest.skip("this transformers release takes no [B] prompt_ignore_length")
    chain = [penalty] + ([TemperatureLogitsWarper(temperature)] if temperature else [])
    processing = RowProcessing(LogitsProcessorList(chain), buffer)
    host_rows, rows = list(range(batch)), torch.arange(batch)
    skipped = [0] * batch if hidden is None else hidden.tolist()
    for round_index in range(4):
        if round_index == 2:
            host_rows = [row for row in host_rows if row != 1]  # row 1 finished
            rows = torch.tensor(host_rows)
        drafts = torch.randint(0, vocab, (len(host_rows), 3), generator=generator)
        first = 1 if round_index == 3 else 0  # a round may also begin past step 0 (its first draft written)
        buffer.write(rows, 0, drafts[:, :first], every_row=len(host_rows) == batch)
        for step in range(first, 3):
            raw = torch.randn(len(host_rows), 1, vocab, generator=generator)
            out = processing(raw, rows, host_rows, offset=step)[:, 0]
            for a, row in enumerate(host_rows):
                own = buffer.tokens[row, skipped[row] : buffer.host_lengths[row]].tolist() + drafts[a, :step].tolist()
                expected = RepetitionPenaltyLogitsProcessor(4.0)(torch.tensor([own]), raw[a].clone())
                if temperature:
                    expected = TemperatureLogitsWarper(temperature)(None, expected)
                assert torch.equal(out[a : a + 1], expected), (round_index, step, row)
            buffer.write(rows, step, drafts[:, step : step + 1], every_row=len(host_rows) == batch)
        counts = torch.randint(1, 4, (len(host_rows),), generator=generator)
        buffer.advance(rows, counts, host_rows, counts.tolist())


@pytest.mark.parametrize("outside", [False, True])
@pytest.mark.parametrize("batch", [1, 4])
def test_the_fused_penalty_checks_ids_once_per_round(outside, batch, monkeypatch):
    """The fused penalty needs every id in [0, V): the check runs at a round's first draft step and its
    answer serves the steps after it (committed tokens plus drafts drawn from V scores). A committed id
    >= V (an embedding larger than the output layer) sends every step of that round to HF's pair, which
    drops it (releases before that raise on it, and so does the call): each call still equals HF's
    penalty then temperature on the row alone."""
    import hf_securesd.prefixes as prefixes_module

    checks = {"n": 0}
    original = prefixes_module.ids_within

    def counted(ids, vocab):
        checks["n"] += 1
        return original(ids, vocab)

    monkeypatch.setattr(prefixes_module, "ids_within", counted)
    generator = torch.Generator().manual_seed(5)
    vocab = 12
    prompt = torch.randint(0, vocab, (batch, 5), generator=generator)
    if outside:
        prompt[0, 2] = vocab + 3
    buffer = TokenBuffer(prompt, room=4)
    processing = RowProcessing(LogitsProcessorList([RepetitionPenaltyLogitsProcessor(3.0), TemperatureLogitsWarper(0.6)]), buffer)
    assert type(processing._batched[0]) is PenaltyThenTemperature
    host_rows, rows = list(range(batch)), torch.arange(batch)
    for round_index in range(3):
        drafts = torch.randint(0, vocab, (batch, 3), generator=generator)
        for step in range(3):
            raw = torch.randn(batch, 1, vocab, generator=generator)
            out = _outcome(lambda: processing(raw, rows, host_rows, offset=step)[:, 0])
            expected = []
            for row in host_rows:
                own = buffer.tokens[row, : buffer.host_lengths[row]].tolist() + drafts[row, :step].tolist()
                expected.append(_outcome(lambda: TemperatureLogitsWarper(0.6)(
                    None, RepetitionPenaltyLogitsProcessor(3.0)(torch.tensor([own]), raw[row].clone()))))
            if isinstance(out, type):  # this release's HF penalty raises on an id >= V, as it does for the batch
                assert out in expected, (round_index, step)
            else:
                for row in host_rows:
                    assert torch.equal(out[row : row + 1], expected[row]), (round_index, step, row)
            buffer.write(rows, step, drafts[:, step : step + 1], every_row=True)
        counts = torch.randint(1, 4, (batch,), generator=generator)
        buffer.advance(rows, counts, host_rows, counts.tolist())
        assert checks["n"] == round_index + 1


def _outcome(call):
    """call()'s tensor, or the type of the exception it raised."""
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - compared by type with the reference's
        return type(error)


class ForceToken(LogitsProcessor):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.token] = float("inf")
        return scores


@pytest.mark.parametrize("verifier", ["lossless", "mars"])
def test_an_infinite_logit_takes_all_the_mass_when_sampling(llama_pair, verifier):
    draft, target = llama_pair
    torch.manual_seed(1)
    out = target.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=10, do_sample=True, assistant_model=draft,
                          verifier=verifier, logits_processor=LogitsProcessorList([ForceToken(42)]))
    assert out[0, 3:].tolist() == [42] * 10


def test_a_temperature_that_overflows_gets_a_clear_error(llama_pair):
    draft, target = llama_pair
    with pytest.raises(NonFiniteLogitsError, match="several tokens score \\+inf.*do_sample=False"):
        target.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=10, do_sample=True, temperature=1e-45,
                        assistant_model=draft, verifier="lossless")



def _minimum_length_processors() -> list:
    from transformers import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

    return [
        MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=3, min_new_tokens=4, eos_token_id=[7, 9]),
        TemperatureLogitsWarper(0.5),
        MinLengthLogitsProcessor(min_length=8, eos_token_id=258),
    ]


@pytest.mark.parametrize("offset", [0, 2])
def test_min_length_processors_are_batched_and_each_row_sees_its_own_length(offset):
    """Ragged rows (committed lengths 3 and 6) at draft steps offset .. offset + 3: one batched pass
    equals HF's processors called on each row alone with its exact prefix, bit for bit."""
    from hf_securesd.prefixes import RowProcessing, row_independent

    processors = _minimum_length_processors()
    assert all(row_independent(processor, prompt_length=3) for processor in processors)
    buffer = TokenBuffer(torch.tensor([[1, 2, 3], [4, 5, 6]]), room=8)
    buffer.write(torch.tensor([1]), 0, torch.tensor([[10, 11, 12]]), every_row=False)
    buffer.advance(torch.tensor([1]), torch.tensor([3]), [1], [3])
    buffer.write(torch.tensor([0, 1]), 0, torch.arange(20, 32).reshape(2, 6), every_row=True)
    raw = torch.randn(2, 4, 259, generator=torch.Generator().manual_seed(offset))
    rows = torch.tensor([0, 1])
    processed = RowProcessing(LogitsProcessorList(processors), buffer)(raw, rows, [0, 1], offset)
    banned = 0
    for a, row in enumerate([0, 1]):
        for i in range(4):
            length = buffer.host_lengths[row] + offset + i
            ids = buffer.tokens[row : row + 1, :length]
            expected = raw[a : a + 1, i].clone()
            for processor in processors:
                expected = processor(ids, expected)
            assert torch.equal(processed[a, i], expected[0]), (row, i)
            banned += int(torch.isinf(expected[0]).sum())
    assert 0 < banned < 3 * 8, "the test must cover rows below and above each minimum"


def test_min_new_tokens_in_a_padded_batch_equals_target_greedy(llama_pair):
    """With EOS set to a token the target emits early, min_new_tokens decides where rows stop: lossless
    batched greedy must equal the target's own batched greedy decoding, row for row."""
    draft, target = llama_pair
    batch = _padded_batch(TEXTS)
    free = target.generate(**batch, max_new_tokens=12, do_sample=False)
    eos = int(free[0, batch["input_ids"].shape[1] + 2])  # the first row's third new token
    references = []
    for min_new_tokens in (0, 6):
        kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0, min_new_tokens=min_new_tokens)
        reference = target.generate(**batch, **kwargs)
        out = target.generate(**batch, **kwargs, assistant_model=draft, verifier="lossless", num_assistant_tokens=4)
        assert out.tolist() == reference.tolist(), min_new_tokens
        references.append(reference[0].tolist())
    assert references[0] != references[1], "min_new_tokens must change where the first row stops"


def test_row_processing_writes_in_place_only_into_a_processors_new_tensor(monkeypatch):
    """With top-k/top-p first, the raw logits are left as they were; after the temperature, the fused pass
    writes into the temperature's output (one vocabulary-sized copy fewer), with the same result."""
    monkeypatch.setattr(fused_warpers, "FUSE_FROM", 0)
    buffer = TokenBuffer(torch.randint(0, 259, (2, 5)), room=3)
    raw = torch.randn(2, 3, 259, generator=torch.Generator().manual_seed(2)) * 3
    kept_raw = raw.clone()
    calls = []
    original = TopKTopP.apply

    def recording(self, input_ids, scores, in_place):
        out = original(self, input_ids, scores, in_place)
        calls.append((in_place, out is scores))
        return out

    monkeypatch.setattr(TopKTopP, "apply", recording)
    top_k, top_p, temperature = TopKLogitsWarper(50), TopPLogitsWarper(0.9), TemperatureLogitsWarper(0.7)
    alone = RowProcessing([top_k, top_p], buffer)(raw, torch.arange(2), [0, 1], 0)
    after = RowProcessing([temperature, top_k, top_p], buffer)(raw, torch.arange(2), [0, 1], 0)
    assert calls == [(False, False), (True, True)]
    assert torch.equal(raw, kept_raw)
    flat = raw.reshape(6, 259)
    assert torch.equal(alone, top_p(None, top_k(None, flat)).reshape(2, 3, 259))
    assert torch.equal(after, top_p(None, top_k(None, temperature(None, flat))).reshape(2, 3, 259))


@pytest.mark.parametrize("option", [{"encoder_repetition_penalty": 1.8}, {"encoder_no_repeat_ngram_size": 1}])
def test_prompt_processors_equal_target_greedy_for_both_proposers(llama_pair, option):
    """transformers applies the encoder_* processors to a decoder-only model's prompt: honoured, row for row."""
    draft, target = llama_pair
    batch = _padded_batch(TEXTS)
    reference = target.generate(**batch, max_new_tokens=12, do_sample=False, **option)
    assert reference.tolist() != target.generate(**batch, max_new_tokens=12, do_sample=False).tolist()
    for proposer in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
        out = target.generate(**batch, max_new_tokens=12, do_sample=False, verifier="lossless", **proposer, **option)
        assert out.tolist() == reference.tolist()


@pytest.mark.parametrize("proposer", ["draft", "lookup"])
@pytest.mark.parametrize("beyond", [0, 3])
def test_a_penalty_ignoring_the_whole_prompt_equals_plain_generate(proposer, beyond):
    """A user's repetition penalty with a [B] prompt_ignore_length of the whole prompt (or more): only
    generated tokens are penalised. It is called per prefix length (the batched path shows ignored
    positions as a kept prompt token, and a row that keeps none has none), equal to plain `generate`."""
    import hf_securesd
    from hf_securesd.tiny import TinyPairSpec, tiny_pair

    draft, target = tiny_pair(TinyPairSpec(architecture="llama", seed=4))
    hf_securesd.wrap(target)
    ids = torch.tensor([[72, 101, 108, 108, 111, 32, 72, 101, 108], [0, 0, 65, 66, 67, 65, 66, 67, 65]])
    mask = torch.tensor([[1] * 9, [0, 0] + [1] * 7])

    def penalty() -> LogitsProcessorList:
        try:
            return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(
                2.0, prompt_ignore_length=torch.tensor([9 + beyond, 9 + beyond]))])
        except ValueError:
            pytest.skip("this transformers release takes no [B] prompt_ignore_length")

    call = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    expected = target.generate(ids, logits_processor=penalty(), **call)
    proposed = dict(assistant_model=draft) if proposer == "draft" else dict(prompt_lookup_num_tokens=4)
    assert torch.equal(target.generate(ids, logits_processor=penalty(), verifier="lossless", **proposed, **call),
                       expected)
