"""Prompt lookup as a proposer: one-hot drafts from each row's own tokens, verified by the shared step.

Lossless greedy equals target greedy and HF's own prompt lookup decoding token for token; batched rows
equal one-at-a-time rows; lossless sampling follows the target's exact joint distribution; every
generate feature that works with a draft model works with prompt lookup."""

from __future__ import annotations

import copy

import pytest
import torch
from support import empirical_tv, exact_joint, noise_floor
from transformers import GenerationConfig, TextIteratorStreamer

import hf_securesd
from hf_securesd import FSD, MARS, BiLD, FLy, LossySD, SecureSDConfigError, SpecCascade, Step, VLLMFLy
from hf_securesd.proposers import PromptLookupProposer
from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair

REPEATING = [torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]]), torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]]),
             torch.tensor([[40, 41, 42, 43, 44, 40, 41]]), torch.tensor([[9, 9, 9, 9, 9]]), torch.tensor([[17, 3]])]


def test_lookup_matches_hf_rules():
    proposer = PromptLookupProposer.__new__(PromptLookupProposer)
    proposer.max_ngram, proposer.eos = 2, {99}
    assert proposer.lookup([1, 2, 3, 1, 2], 3) == [3, 1, 2]  # bigram [1, 2] first seen at 0
    assert proposer.lookup([1, 2, 3, 4, 2], 2) == [3, 4]  # no bigram match: unigram [2]
    assert proposer.lookup([1, 2, 99, 5, 1, 2], 4) == []  # the continuation starts with EOS: nothing
    assert proposer.lookup([7, 8, 9], 4) == []
    assert proposer.lookup([1, 2, 1, 2], 0) == []


def _reference_lookup(tokens: list[int], max_ngram: int, limit: int, eos: set[int]) -> list[int]:
    """HF's prompt lookup for one row, written out plainly: for n from max_ngram down, the first window
    equal to the last n tokens whose continuation is not empty; cut before the first EOS."""
    for size in range(max_ngram, 0, -1):
        if size >= len(tokens):
            continue
        tail = tokens[-size:]
        for start in range(len(tokens) - size + 1):
            continuation = tokens[start + size : start + size + limit]
            if tokens[start : start + size] == tail and continuation:
                cut = [i for i, token in enumerate(continuation) if token in eos]
                return continuation[: cut[0]] if cut else continuation
    return []


@pytest.mark.parametrize("alphabet", [2, 5, 40])
def test_lookup_equals_a_plain_reference_on_random_rows(alphabet):
    generator = torch.Generator().manual_seed(alphabet)
    proposer = PromptLookupProposer.__new__(PromptLookupProposer)
    for trial in range(300):
        length = int(torch.randint(0, 60, (), generator=generator))
        tokens = torch.randint(0, alphabet, (length,), generator=generator).tolist()
        proposer.max_ngram = int(torch.randint(1, 5, (), generator=generator)) if trial % 3 else 40
        proposer.eos = {0} if trial % 2 else set()
        limit = int(torch.randint(0, 7, (), generator=generator))
        expected = _reference_lookup(tokens, proposer.max_ngram, limit, proposer.eos)
        assert proposer.lookup(tokens, limit) == expected, (tokens, proposer.max_ngram, limit)
        assert proposer.lookup(torch.tensor(tokens, dtype=torch.long).numpy(), limit) == expected


@pytest.mark.parametrize("k", [1, 3, 6])
def test_lossless_greedy_equals_target_and_hf_prompt_lookup(llama_pair, k):
    _, target = llama_pair
    for prompt in REPEATING:
        plain = target.generate(prompt, max_new_tokens=20, do_sample=False)
        hf = target.generate(prompt, max_new_tokens=20, do_sample=False, prompt_lookup_num_tokens=k)
        ours = target.generate(prompt, max_new_tokens=20, do_sample=False, prompt_lookup_num_tokens=k,
                               verifier="lossless", return_dict_in_generate=True)
        assert torch.equal(ours.sequences, plain) and torch.equal(hf, plain)
        assert ours.speculative_stats.rounds <= 20


def test_prompt_lookup_actually_drafts(llama_pair):
    """A guard against a vacuous suite: on a prompt that repeats, an accept-everything rule keeps drafts."""
    _, target = llama_pair
    out = target.generate(REPEATING[0], max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=4,
                          verifier=LossySD(epsilon=1.0), return_dict_in_generate=True)
    stats = out.speculative_stats
    assert sum(stats.drafted_per_round) > 0 and stats.acceptance_rate == 1.0
    assert stats.rounds < 16


@pytest.mark.parametrize("verifier", ["lossless", MARS(theta=0.5), LossySD(epsilon=0.3), BiLD(tau_rb=2.0),
                                      SpecCascade(a=0.5)], ids=str)
@pytest.mark.parametrize("schedule", [None, Step(L=2)], ids=["none", "step2"])
def test_batched_rows_equal_one_at_a_time(llama_pair, verifier, schedule):
    _, target = llama_pair
    tokenizer_pad = 0
    prompts = REPEATING[:4]
    width = max(p.shape[1] for p in prompts)
    batch = torch.full((len(prompts), width), tokenizer_pad)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        batch[row, width - prompt.shape[1]:] = prompt[0]
        mask[row, width - prompt.shape[1]:] = 1
    kwargs = dict(max_new_tokens=14, do_sample=False, prompt_lookup_num_tokens=3, verifier=verifier,
                  secure_schedule=schedule, pad_token_id=tokenizer_pad, eos_token_id=None)
    together = target.generate(batch, attention_mask=mask, **kwargs)
    for row, prompt in enumerate(prompts):
        alone = target.generate(prompt, **kwargs)[0, prompt.shape[1]:]
        assert together[row, width:].tolist() == alone.tolist(), row


@pytest.mark.parametrize("verifier", [FSD(tau=0.3), BiLD(tau_rb=1.0, tau_fb=0.5), SpecCascade(a=0.3, rule="chow")],
                         ids=str)
def test_rules_that_read_the_draft_logits_are_refused(llama_pair, verifier):
    _, target = llama_pair
    with pytest.raises(SecureSDConfigError, match="prompt lookup has no draft distribution"):
        target.generate(REPEATING[0], max_new_tokens=4, verifier=verifier, prompt_lookup_num_tokens=3)


@pytest.mark.parametrize("bad, match", [
    (dict(prompt_lookup_num_tokens=0), "prompt_lookup_num_tokens"),
    (dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=0), "max_matching_ngram_size"),
    (dict(prompt_lookup_num_tokens=3, num_assistant_tokens=4), "does not apply to prompt lookup"),
    (dict(prompt_lookup_num_tokens=3, num_assistant_tokens=0), "num_assistant_tokens=0 does not apply"),
    (dict(prompt_lookup_num_tokens=3, num_assistant_tokens=False), "num_assistant_tokens=False does not apply"),
    (dict(prompt_lookup_num_tokens=3, assistant_confidence_threshold=0.4), "no draft probabilities"),
    (dict(prompt_lookup_num_tokens=3, assistant_confidence_threshold=False),
     r"assistant_confidence_threshold must be a probability in \[0, 1\].*got False"),
    (dict(prompt_lookup_num_tokens=3, assistant_confidence_threshold=1.5), "must be a probability"),
    (dict(prompt_lookup_num_tokens=3, assistant_early_exit=1), "assistant_early_exit=1 is not supported"),
    (dict(prompt_lookup_num_tokens=3, assistant_lookbehind=5), "assistant_lookbehind=5 is not supported"),
    (dict(prompt_lookup_num_tokens=3, target_lookbehind=5), "target_lookbehind=5 is not supported"),
])
def test_options_that_do_not_apply_are_refused(llama_pair, bad, match):
    _, target = llama_pair
    with pytest.raises(SecureSDConfigError, match=match):
        target.generate(REPEATING[0], max_new_tokens=4, verifier="lossless", **bad)


@pytest.mark.parametrize("ngram", [2, 0, "x"])
def test_prompt_lookups_ngram_size_with_a_draft_model_is_refused(llama_pair, ngram):
    """HF ignores max_matching_ngram_size with a draft model; a SecureSD call names it instead."""
    draft, target = llama_pair
    config = GenerationConfig(max_new_tokens=4)
    for passed in ({"max_matching_ngram_size": ngram}, {"generation_config": config}):
        if "generation_config" in passed:
            passed["generation_config"].max_matching_ngram_size = ngram
        with pytest.raises(SecureSDConfigError, match="max_matching_ngram_size=.* does not apply to a draft"):
            target.generate(REPEATING[0], max_new_tokens=4, verifier="lossless", assistant_model=draft,
                            **passed)


def test_a_saved_ngram_size_in_a_copy_of_the_models_config_is_not_refused(llama_pair):
    """Saved in the model's generation_config it is a prompt-lookup default; a copy of that config passed to
    a draft-model call (the usual way to change one field) carries it unchanged and is not refused."""
    draft, target = llama_pair
    saved = copy.deepcopy(target.generation_config)
    try:
        target.generation_config.max_matching_ngram_size = 3
        config = copy.deepcopy(target.generation_config)
        config.max_new_tokens = 4
        call = dict(generation_config=config, verifier="lossless", assistant_model=draft)
        target.generate(REPEATING[0], **call)
        config.max_matching_ngram_size = 2
        with pytest.raises(SecureSDConfigError, match="max_matching_ngram_size=2 .* does not apply"):
            target.generate(REPEATING[0], **call)
    finally:
        target.generation_config = saved


@pytest.mark.parametrize("field, value", [("num_assistant_tokens", 10), ("assistant_confidence_threshold", 0.3)])
def test_draft_model_settings_saved_in_the_models_config_are_ignored_by_prompt_lookup(llama_pair, field, value):
    """Saved in the target's generation_config they configure draft-model drafting; transformers ignores them
    for prompt lookup, and so does SecureSD (passed in the call's GenerationConfig they are refused)."""
    _, target = llama_pair
    kwargs = dict(max_new_tokens=10, do_sample=False, verifier="lossless", prompt_lookup_num_tokens=3)
    expected = target.generate(REPEATING[0], **kwargs)
    saved = copy.deepcopy(target.generation_config)
    try:
        setattr(target.generation_config, field, value)
        assert torch.equal(target.generate(REPEATING[0], **kwargs), expected)
        config = GenerationConfig(**{field: value})
        with pytest.raises(SecureSDConfigError, match="does not apply to prompt lookup"):
            target.generate(REPEATING[0], generation_config=config, **kwargs)
    finally:
        target.generation_config = saved


def test_prompt_lookup_from_the_models_generation_config_is_honoured(llama_pair):
    """transformers reads prompt_lookup_num_tokens (and the verifier) from the model's own generation_config."""
    _, target = llama_pair
    prompt = REPEATING[0]
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False, verifier="lossless", prompt_lookup_num_tokens=3,
                               return_dict_in_generate=True)
    saved = copy.deepcopy(target.generation_config)
    try:
        target.generation_config.prompt_lookup_num_tokens = 3
        ours = target.generate(prompt, max_new_tokens=12, do_sample=False, verifier="lossless", return_dict_in_generate=True)
        target.generation_config.verifier = "lossless"
        defaults_only = target.generate(prompt, max_new_tokens=12, do_sample=False)
        target.generation_config.assistant_early_exit = 1
        with pytest.raises(SecureSDConfigError, match="assistant_early_exit=1 is not supported"):
            target.generate(prompt, max_new_tokens=12, do_sample=False)
    finally:
        target.generation_config = saved
    assert torch.equal(ours.sequences, expected.sequences) and torch.equal(defaults_only, expected.sequences)
    assert ours.speculative_stats.drafted_per_round == expected.speculative_stats.drafted_per_round
    assert sum(expected.speculative_stats.drafted_per_round) > 0


@pytest.mark.parametrize("saved", ["mars", LossySD(epsilon=1.0)])
def test_verifier_none_in_the_call_switches_securesd_off_for_prompt_lookup(llama_pair, saved):
    """A verifier saved in a config is only a default: `verifier=None` in a prompt-lookup call runs HF's own
    prompt lookup decoding, as it does with a draft model (the saved verifier reached the assisted loop
    unresolved: a name failed deep inside it, an object decoded lossily). The same for a passed
    GenerationConfig, whose None fields transformers fills from the model's config, with prompt lookup or
    a draft model."""
    draft, target = llama_pair
    prompt = REPEATING[0]
    plain = target.generate(prompt, max_new_tokens=16, do_sample=False)
    saved_config = copy.deepcopy(target.generation_config)
    try:
        target.generation_config.verifier = saved
        in_call = target.generate(prompt, max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=4,
                                  verifier=None, return_dict_in_generate=True)
        passed = target.generate(prompt, generation_config=GenerationConfig(
            max_new_tokens=16, do_sample=False, prompt_lookup_num_tokens=4, verifier=saved,
            return_dict_in_generate=True), verifier=None)
        with_draft = target.generate(prompt, generation_config=GenerationConfig(
            max_new_tokens=16, do_sample=False, verifier=saved, return_dict_in_generate=True),
            verifier=None, assistant_model=draft)
        target.generation_config.prompt_lookup_num_tokens = 4
        in_config = target.generate(prompt, max_new_tokens=16, do_sample=False, verifier=None,
                                    return_dict_in_generate=True)
        relaxed = target.generate(prompt, max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    finally:
        target.generation_config = saved_config
    for output in (in_call, passed, with_draft, in_config):
        assert not hasattr(output, "speculative_stats") and torch.equal(output.sequences, plain)
    assert hasattr(relaxed, "speculative_stats")  # without verifier=None the saved verifier runs


def test_features_work_with_prompt_lookup(llama_pair):
    """Processors, stop strings, a streamer, statistics, the dynamic draft length and a cache."""
    _, target = llama_pair
    tokenizer = byte_tokenizer()
    prompt = REPEATING[0]
    plain = target.generate(prompt, max_new_tokens=16, do_sample=False, repetition_penalty=1.3,
                            no_repeat_ngram_size=3)
    ours = target.generate(prompt, max_new_tokens=16, do_sample=False, repetition_penalty=1.3,
                           no_repeat_ngram_size=3, prompt_lookup_num_tokens=3, verifier="lossless",
                           num_assistant_tokens_schedule="heuristic_transient")
    assert torch.equal(ours, plain)
    streamer = TextIteratorStreamer(tokenizer)
    streamed = target.generate(prompt, max_new_tokens=8, do_sample=False, prompt_lookup_num_tokens=3,
                               verifier="lossless", streamer=streamer)
    assert "".join(streamer) == tokenizer.decode(streamed[0])
    first = target.generate(prompt, max_new_tokens=6, do_sample=False, prompt_lookup_num_tokens=3,
                            verifier="lossless", return_dict_in_generate=True)
    follow = torch.cat([first.sequences, torch.tensor([[7]])], dim=1)
    continued = target.generate(follow, past_key_values=first.cache, max_new_tokens=6, do_sample=False,
                                prompt_lookup_num_tokens=3, verifier="lossless")
    assert torch.equal(continued, target.generate(follow, max_new_tokens=6, do_sample=False))


def test_rounds_where_the_lookup_finds_nothing_leave_a_heuristic_k_as_it_is(llama_pair):
    """Under a heuristic schedule k grows by 2 after a round whose drafts were all accepted and shrinks by 1
    otherwise; a prompt-lookup round that drafted nothing (no match) is neither, so k stays. Replayed from
    the statistics, no round may draft more than that k."""
    _, target = llama_pair
    out = target.generate(REPEATING[0], max_new_tokens=30, do_sample=False, prompt_lookup_num_tokens=2,
                          verifier="lossless", num_assistant_tokens_schedule="heuristic_transient",
                          return_dict_in_generate=True)
    stats = out.speculative_stats
    assert 0 in stats.drafted_per_round and any(stats.drafted_per_round)
    k = 2
    for drafted, accepted in zip(stats.drafted_per_round, stats.accepted_per_round):
        assert drafted <= k
        if drafted:
            k = k + 2 if accepted == drafted else max(1, k - 1)
    assert torch.equal(out.sequences, target.generate(REPEATING[0], max_new_tokens=30, do_sample=False))


VOCAB = 6
SAMPLING = dict(do_sample=True, temperature=0.8, top_k=5, top_p=1.0)
SAMPLED_PROMPT = torch.tensor([[1, 4, 2, 1, 4, 2, 1, 4]])


def test_lossless_sampling_with_prompt_lookup_follows_the_target():
    _, target = tiny_pair(TinyPairSpec(vocab_size=VOCAB, hidden_size=32, initializer_range=0.6, seed=3))
    target.generation_config.eos_token_id = None
    target = hf_securesd.wrap(target)
    exact = exact_joint(target, SAMPLED_PROMPT, VOCAB, 3, SAMPLING)
    floor = noise_floor(exact, 6000)
    torch.manual_seed(7)
    samples, drafted = [], 0
    for _ in range(30):
        out = target.generate(SAMPLED_PROMPT.expand(200, -1), max_new_tokens=3, prompt_lookup_num_tokens=2,
                              verifier="lossless", return_dict_in_generate=True, **SAMPLING)
        drafted += sum(out.speculative_stats.drafted_per_round)
        samples += [tuple(row[SAMPLED_PROMPT.shape[1]:].tolist()) for row in out.sequences]
    assert drafted > 0
    tv = empirical_tv(exact, samples)
    assert tv <= floor, f"TV {tv:.4f} above the noise floor {floor:.4f}"


@pytest.mark.parametrize("verifier", [FLy(tau=0.3, window=3), VLLMFLy(window=3)], ids=str)
def test_a_window_too_long_for_k_names_prompt_lookups_own_field(llama_pair, verifier):
    """The fix named num_assistant_tokens, which prompt lookup then refused."""
    _, target = llama_pair
    with pytest.raises(SecureSDConfigError, match=r"k is prompt_lookup_num_tokens=3 here: set prompt_lookup_num_tokens=4"):
        target.generate(REPEATING[0], max_new_tokens=4, verifier=verifier, prompt_lookup_num_tokens=3)
    assert target.generate(REPEATING[0], max_new_tokens=4, verifier=verifier, prompt_lookup_num_tokens=4).shape[1] > 0


def _digits_only(vocab: int = 259) -> list[int]:
    return [token for token in range(vocab) if not 48 <= token <= 57]


def test_a_state_only_a_rejected_draft_leads_to_does_not_stop_decoding():
    """Digits only and no repeated bigram: lookup drafts copy earlier bigrams, and after the rejected draft
    "401" the target's scores at a later position ban every digit. Plain decoding never reaches that state,
    so it is no error: the call decodes as plain greedy (it raised NonFiniteLogitsError)."""
    _, target = tiny_pair()
    ids = byte_tokenizer()("4754018", return_tensors="pt").input_ids
    options = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, suppress_tokens=_digits_only(),
                   no_repeat_ngram_size=2)
    expected = target.generate(ids, **options)
    wrapped = hf_securesd.wrap(copy.deepcopy(target))
    assert torch.equal(wrapped.generate(ids, prompt_lookup_num_tokens=8, verifier="lossless", **options), expected)


def test_a_batch_row_behind_a_state_no_row_reaches_decodes_as_alone():
    """Rows whose rejected drafts (or padding drafts past a row's own count) lead to positions with every
    token banned decode as plain greedy decodes the batch."""
    _, target = tiny_pair()
    rows = [[98], [97, 98, 100, 97], [98, 98, 97, 32, 100, 32, 97, 98, 32, 97, 98, 99, 100, 100]]
    width = max(map(len, rows))
    batch = torch.tensor([[258] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    allowed = [97, 98, 99, 100, 32, 256, 258]
    options = dict(max_new_tokens=20, do_sample=False, pad_token_id=258, eos_token_id=None, attention_mask=mask,
                   suppress_tokens=[token for token in range(259) if token not in allowed], no_repeat_ngram_size=2,
                   bad_words_ids=[[32], [98, 99]])
    expected = target.generate(batch, **options)
    wrapped = hf_securesd.wrap(copy.deepcopy(target))
    got = wrapped.generate(batch, prompt_lookup_num_tokens=10, max_matching_ngram_size=5, verifier="lossless", **options)
    assert torch.equal(got, expected)


def test_a_committed_state_with_every_token_banned_is_still_an_error():
    """Where plain decoding itself reaches a state with no allowed token, the round reaches it too: refused."""
    _, target = tiny_pair()
    ids = byte_tokenizer()("11", return_tensors="pt").input_ids
    wrapped = hf_securesd.wrap(target)
    with pytest.raises(hf_securesd.NonFiniteLogitsError, match="no allowed token"):
        wrapped.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None, prompt_lookup_num_tokens=3,
                         verifier="lossless", suppress_tokens=[token for token in range(259) if token not in (49, 50)],
                         no_repeat_ngram_size=1)


def test_a_prompt_mask_with_a_hole_is_looked_up_in_the_tokens_the_model_reads(monkeypatch):
    """A masked position inside the prompt is not read by the model, nor by the lookup; the row's real first
    token is (the lookup used to skip as many leading tokens as were masked, as for left padding)."""
    seen = []
    lookup = PromptLookupProposer.lookup
    monkeypatch.setattr(PromptLookupProposer, "lookup",
                        lambda self, tokens, limit: seen.append([int(t) for t in tokens]) or lookup(self, tokens, limit))
    _, target = tiny_pair()
    ids = torch.tensor([[7, 98, 99, 97, 98, 99, 97, 98]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 1]])
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None)
    got = hf_securesd.wrap(copy.deepcopy(target)).generate(
        ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None, prompt_lookup_num_tokens=3,
        verifier="lossless")
    assert torch.equal(got, expected)
    assert seen[0] == [7, 98, 97, 98, 99, 97, 98]
    generated = got[0, ids.shape[1]:].tolist()
    assert seen[-1][:7] == [7, 98, 97, 98, 99, 97, 98] and seen[-1][7:] == generated[: len(seen[-1]) - 7]


class _NothingAfter:
    """A row-wise processor that bans every token once `token` is among the generated ones."""

    def __init__(self, token: int, prompt_length: int) -> None:
        self.token, self.prompt_length = token, prompt_length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        done = (input_ids[:, self.prompt_length :] == self.token).any(dim=-1)
        return scores.masked_fill(done[:, None], float("-inf"))


@pytest.mark.parametrize("stop", ["eos", "criterion"])
def test_a_position_after_the_last_committed_token_is_not_read(stop):
    """A draft that equals the target (it accepts everything) drafts past the row's last token; the
    positions after it, which the processors leave empty, are cut by EOS or a stopping criterion before
    anything is committed from them: the call ends as plain generate does (it raised)."""
    from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    _, target = tiny_pair()
    ids = byte_tokenizer()("hello wor", return_tensors="pt").input_ids
    last = target.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)[0, -1].item()

    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == last

    def options() -> dict:
        ending = (dict(eos_token_id=last) if stop == "eos"
                  else dict(eos_token_id=None, stopping_criteria=StoppingCriteriaList([StopAt()])))
        return dict(max_new_tokens=12, do_sample=False, pad_token_id=256,
                    logits_processor=LogitsProcessorList([_NothingAfter(last, ids.shape[1])]), **ending)

    expected = target.generate(ids, **options())
    assert expected.shape[1] == ids.shape[1] + 4
    got = hf_securesd.wrap(copy.deepcopy(target)).generate(
        ids, assistant_model=copy.deepcopy(target), num_assistant_tokens=5, verifier="lossless", **options())
    assert torch.equal(got, expected)


def test_a_lookahead_rule_reads_every_position_of_its_block():
    """FLy decides a position from the drafts after it: an empty position inside a row's drafts is read by it,
    even when the row commits less, and is refused (zeros in its place would decide a draft)."""
    from transformers import LogitsProcessorList

    _, target = tiny_pair()
    ids = byte_tokenizer()("hello wor", return_tensors="pt").input_ids
    last = target.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)[0, -1].item()
    options = dict(max_new_tokens=12, do_sample=False, pad_token_id=256, eos_token_id=last,
                   logits_processor=LogitsProcessorList([_NothingAfter(last, ids.shape[1])]))
    wrapped = hf_securesd.wrap(copy.deepcopy(target))
    with pytest.raises(hf_securesd.NonFiniteLogitsError, match="no allowed token"):
        wrapped.generate(ids, assistant_model=copy.deepcopy(target), num_assistant_tokens=5,
                         verifier=FLy(tau=0.5, window=2), **options)
