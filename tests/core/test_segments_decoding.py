"""`Segments` inside `generate`: where the boundary lands in the round structure, batches whose rows
cross it at different rounds, the TensorRT-LLM policy, runs without a boundary, text boundaries and the
segment statistics.

The verifier is LossySD(epsilon=1), which accepts every draft where eta = 1, so a run without
SecureSD accepts all k drafts each round (round r drafts positions 5r..5r+3 with k = 4 and its bonus
token sits at 5r+4) and a boundary can be placed exactly: on a round's first draft, mid-round, on the
bonus token, split over two tokens or over two rounds. Each check is against

* full forwards of the target on the returned sequence (a token verified losslessly at T = 0 is the
  target's greedy choice given the same prefix), and
* an independent greedy reference of the whole loop (drafts from full draft forwards, the segment rule
  from tests/core/test_segments.py's reference), token for token, and its verification record for the
  segment statistics.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from test_segments import reference_eta

import hf_securesd
from hf_securesd import VERIFIERS, LossySD, Segments, Step, securesd_generate
from hf_securesd.segments import BoundaryResolutionError
from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair
from hf_securesd.validation import SecureSDConfigError

K = 4
NEW_TOKENS = 26
L = 3
RELAXED = LossySD(epsilon=1.0)
TEXTS = (
    "hi",
    "The quick brown fox",
    "def add(a, b):",
    "What is 2 + 2?",
    "x",
    "Once upon a time",
    "SELECT * FROM",
    "12345",
    "<html>",
    "import numpy",
    "Why is the sky blue?",
    "aaaa",
)


@pytest.fixture(scope="module")
def pair():
    """(draft, wrapped target) with no EOS, so every run has NEW_TOKENS tokens."""
    draft, target = tiny_pair(TinyPairSpec(architecture="llama", seed=0))
    for model in (draft, target):
        model.generation_config.eos_token_id = None
    return draft, hf_securesd.wrap(target)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def prompt_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


def run(pair, prompt_ids: torch.Tensor, schedule, attention_mask=None, verifier=RELAXED, **kwargs):
    draft, target = pair
    return target.generate(
        prompt_ids,
        attention_mask=attention_mask,
        assistant_model=draft,
        verifier=verifier,
        secure_schedule=schedule,
        num_assistant_tokens=K,
        max_new_tokens=kwargs.pop("max_new_tokens", NEW_TOKENS),
        do_sample=kwargs.pop("do_sample", False),
        return_dict_in_generate=True,
        **kwargs,
    )


def response_of(out, row: int, width: int) -> list[int]:
    return out.sequences[row, width:].tolist()


@torch.no_grad()
def target_choices(target, prompt: list[int], response: list[int]) -> list[int]:
    """The target's greedy token at each response position, given the returned tokens before it."""
    logits = target(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return logits.argmax(-1).tolist()


@torch.no_grad()
def reference_generate(pair, prompt: list[int], boundaries, before, after):
    """The greedy loop (README, *SecureSD schedules*) for LossySD(epsilon=1) under a segment schedule whose eta is 0
    or 1 everywhere (Step, None, 'lossless'): a draft is accepted where eta = 1 or where it is the
    target's choice. Returns the response and the verified drafts as (position, accepted)."""
    draft, target = pair
    response: list[int] = []
    verified: list[tuple[int, bool]] = []
    while len(response) < NEW_TOKENS:
        count = min(K, NEW_TOKENS - len(response) - 1)
        context = prompt + response
        drafts: list[int] = []
        for _ in range(count):
            drafts.append(int(draft(torch.tensor([context + drafts])).logits[0, -1].argmax()))
        scores = target(torch.tensor([context + drafts])).logits[0, len(context) - 1 :]
        for i in range(count):
            best = int(scores[i].argmax())
            eta = reference_eta(response, boundaries, before, after)
            assert eta in (0.0, 1.0)
            accepted = drafts[i] == best or eta == 1.0
            verified.append((len(response), accepted))
            response.append(drafts[i] if accepted else best)
            if not accepted:
                break
        else:
            response.append(int(scores[count].argmax()))
    return response[:NEW_TOKENS], verified


def expected_segment_counts(response, verified, boundaries):
    """{("before"|"after", segment position): [verified, accepted]} from the reference's record."""
    counts: dict[tuple[str, int], list[int]] = {}
    starts = [
        end
        for end in range(1, len(response) + 1)
        if any(end >= len(b) and tuple(response[end - len(b) : end]) == b for b in boundaries)
    ]
    for position, accepted in verified:
        earlier = [start for start in starts if start <= position]
        key = ("after", position - earlier[-1]) if earlier else ("before", position)
        cell = counts.setdefault(key, [0, 0])
        cell[0] += 1
        cell[1] += int(accepted)
    return counts, starts


def library_segment_counts(segment_stats):
    counts = {}
    for side in ("before", "after"):
        part = getattr(segment_stats, side)
        for position, (n, a) in enumerate(zip(part.verified, part.accepted)):
            if n:
                counts[(side, position)] = [n, a]
    return counts


# Where the boundary ends in the run without it (positions of its tokens), for k = 4.
PLACEMENTS = {
    "first_draft": (5,),  # round 1's first draft: round 1's later drafts are in the after segment
    "mid_round": (7,),
    "bonus": (9,),  # round 1's bonus token: round 2 starts in the after segment
    "split_in_round": (6, 7),
    "split_over_rounds": (9, 10),  # round 1's bonus token, then round 2's first draft
}


def first_occurrence_end(response: list[int], boundary: tuple[int, ...]) -> int | None:
    for end in range(len(boundary), len(response) + 1):
        if tuple(response[end - len(boundary) : end]) == boundary:
            return end
    return None


def find_case(pair, tokenizer, positions: tuple[int, ...]):
    """A prompt whose relaxed run puts a first boundary occurrence at `positions`, with at least one of
    the L tokens after it not the target's choice (so the schedule must change the output)."""
    _, target = pair
    for text in TEXTS:
        prompt = prompt_of(tokenizer, text)
        out = run(pair, torch.tensor([prompt]), None)
        base = response_of(out, 0, len(prompt))
        assert out.speculative_stats.accepted_per_round[:3] == [K, K, K]  # the round structure assumed
        boundary = tuple(base[p] for p in positions)
        if first_occurrence_end(base, boundary) != positions[-1] + 1:
            continue
        start = positions[-1] + 1
        choices = target_choices(target, prompt, base)
        if any(base[j] != choices[j] for j in range(start, start + L)):
            return prompt, boundary, base
    raise AssertionError(f"no prompt places a boundary at {positions}: extend TEXTS")


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_after_step_makes_the_tokens_after_the_boundary_the_target_choice(pair, tokenizer, placement):
    _, target = pair
    prompt, boundary, base = find_case(pair, tokenizer, PLACEMENTS[placement])
    schedule = Segments([list(boundary)], before=None, after=Step(L=L))
    out = run(pair, torch.tensor([prompt]), schedule)
    response = response_of(out, 0, len(prompt))
    start = PLACEMENTS[placement][-1] + 1

    assert response[:start] == base[:start]  # before the boundary: the relaxed run
    choices = target_choices(target, prompt, response)
    assert response[start : start + L] == choices[start : start + L]
    assert response != base  # the schedule changed something

    expected, verified = reference_generate(pair, prompt, [boundary], None, Step(L=L))
    assert response == expected
    counts, starts = expected_segment_counts(response, verified, [boundary])
    assert out.segment_stats_per_row[0].segment_starts == [starts] and starts[0] == start
    assert library_segment_counts(out.segment_stats) == counts
    after = out.segment_stats.after
    assert all(after.tv[s] == 0.0 for s in range(L) if s < len(after.tv_verified) and after.tv_verified[s])


def test_left_padded_batch_rows_cross_at_different_rounds(pair, tokenizer):
    """One boundary token that each row of a left-padded batch first emits in a different round."""
    _, target = pair
    prompts = [prompt_of(tokenizer, text) for text in TEXTS]
    bases = [response_of(run(pair, torch.tensor([p]), None), 0, len(p)) for p in prompts]
    chosen = None
    for token in range(256):
        rounds = {}
        for index, base in enumerate(bases):
            if token in base[: NEW_TOKENS - L - 1]:
                rounds.setdefault(base.index(token) // (K + 1), index)
        if len(rounds) >= 3:
            chosen = token, sorted(rounds.values())[:3]
            break
    assert chosen is not None, "no token is emitted in three different rounds by different prompts"
    token, rows = chosen
    texts = [TEXTS[i] for i in rows]
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    width = encoded["input_ids"].shape[1]
    schedule = Segments([token], before=None, after=Step(L=L))
    out = run(pair, encoded["input_ids"], schedule, attention_mask=encoded["attention_mask"])
    crossings = []
    for row, index in enumerate(rows):
        response = response_of(out, row, width)
        expected, _ = reference_generate(pair, prompts[index], [(token,)], None, Step(L=L))
        assert response == expected
        start = bases[index].index(token) + 1
        crossings.append(start // (K + 1))
        choices = target_choices(target, prompts[index], response)
        assert response[start : start + L] == choices[start : start + L]
        assert out.segment_stats_per_row[row].segment_starts[0][0] == start
    assert len(set(crossings)) == 3
    assert [starts[0] for starts in out.segment_stats.segment_starts] == [
        bases[index].index(token) + 1 for index in rows
    ]


def test_tensorrt_policy_exact_answer_relaxed_thinking(pair, tokenizer):
    """before=None, after='lossless': every token after the boundary is the target's choice, the tokens
    up to it are the relaxed run's."""
    _, target = pair
    prompt, boundary, base = find_case(pair, tokenizer, PLACEMENTS["mid_round"])
    out = run(pair, torch.tensor([prompt]), Segments([list(boundary)], before=None, after="lossless"))
    response = response_of(out, 0, len(prompt))
    start = PLACEMENTS["mid_round"][-1] + 1
    assert response[:start] == base[:start]
    assert response[start:] == target_choices(target, prompt, response)[start:]
    assert response[:start] != target_choices(target, prompt, response)[:start]  # the thinking was relaxed
    assert all(value == 0.0 for value in out.segment_stats.after.tv if value == value)


def absent_token(*responses: list[int]) -> int:
    return next(token for token in range(256) if all(token not in response for response in responses))


@pytest.mark.parametrize("name", list(VERIFIERS))
def test_no_boundary_in_the_reply_is_before_alone(pair, tokenizer, name):
    verifier = VERIFIERS[name].sweep()[-1]
    prompt = torch.tensor([prompt_of(tokenizer, "Once upon a time")])
    plain = run(pair, prompt, Step(L=2), verifier=verifier)
    token = absent_token(plain.sequences[0].tolist())
    segmented = run(pair, prompt, Segments([token], before=Step(L=2), after="lossless"), verifier=verifier)
    assert torch.equal(segmented.sequences, plain.sequences)
    assert segmented.speculative_stats.to_dict() == plain.speculative_stats.to_dict()
    assert segmented.segment_stats.segment_starts == [[]] and not segmented.segment_stats.after.verified


def test_no_boundary_in_the_reply_is_before_alone_when_sampling(pair, tokenizer):
    prompt = torch.tensor([prompt_of(tokenizer, "What is 2 + 2?")])
    verifier = VERIFIERS["mars"].sweep()[-1]
    torch.manual_seed(11)
    plain = run(pair, prompt, Step(L=3), verifier=verifier, do_sample=True)
    token = absent_token(plain.sequences[0].tolist())
    torch.manual_seed(11)
    segmented = run(pair, prompt, Segments([token], before=Step(L=3)), verifier=verifier, do_sample=True)
    assert torch.equal(segmented.sequences, plain.sequences)


def test_text_boundary_through_generate_tokenizer(pair, tokenizer):
    prompt = prompt_of(tokenizer, "The quick brown fox")
    base = response_of(run(pair, torch.tensor([prompt]), None), 0, len(prompt))
    position = next(j for j in range(3, 15) if 32 < base[j] < 127 and base[j] not in base[:j])
    text = chr(base[position])
    by_ids = run(pair, torch.tensor([prompt]), Segments([base[position]], after=Step(L=L)))
    by_text = run(pair, torch.tensor([prompt]), Segments(text, after=Step(L=L)), tokenizer=tokenizer)
    assert torch.equal(by_text.sequences, by_ids.sequences)
    assert by_text.segment_stats.segment_starts == [[position + 1]]
    resolved = Segments(text, after=Step(L=L)).with_tokenizer(tokenizer)  # resolved once, no tokenizer=
    assert torch.equal(run(pair, torch.tensor([prompt]), resolved).sequences, by_ids.sequences)


def test_text_boundary_without_tokenizer_is_refused_before_decoding(pair, tokenizer):
    prompt = torch.tensor([prompt_of(tokenizer, "hi")])
    with pytest.raises(BoundaryResolutionError, match="pass tokenizer=<the target's tokenizer> to generate .a pipeline"):
        run(pair, prompt, Segments("</think>"))


def test_boundary_ids_outside_the_vocabulary_are_refused_before_decoding(pair, tokenizer):
    """Qwen3's `</think>` id on a model of 259 tokens would never occur: the exact segment would silently
    never start. Refused on every route: a draft model, prompt lookup and custom_generate."""
    draft, target = pair
    prompt = torch.tensor([prompt_of(tokenizer, "hi")])
    with pytest.raises(SecureSDConfigError, match="token id 151668, outside this model's vocabulary"):
        run(pair, prompt, Segments([151668]))
    with pytest.raises(SecureSDConfigError, match="token id 259, outside"):
        target.generate(prompt, prompt_lookup_num_tokens=3, verifier=RELAXED, secure_schedule=Segments(259),
                        max_new_tokens=NEW_TOKENS, do_sample=False)
    plain_draft, plain_target = tiny_pair(TinyPairSpec(architecture="llama", seed=0))
    with pytest.raises(SecureSDConfigError, match="token id 259, outside"):
        plain_target.generate(prompt, custom_generate=securesd_generate, draft=plain_draft, verifier=RELAXED,
                              secure_schedule=Segments(259), max_new_tokens=NEW_TOKENS, do_sample=False)


def test_saved_generation_config_with_a_text_boundary(pair, tokenizer, tmp_path):
    draft, target = tiny_pair(TinyPairSpec(architecture="llama", seed=0))
    for model in (draft, target):
        model.generation_config.eos_token_id = None
    hf_securesd.wrap(target)
    target.generation_config.verifier = RELAXED
    target.generation_config.secure_schedule = Segments("e", before=None, after=Step(L=2))
    target.save_pretrained(tmp_path)
    reloaded = hf_securesd.wrap(type(target).from_pretrained(tmp_path))
    prompt = torch.tensor([prompt_of(tokenizer, "hi")])
    options = dict(assistant_model=draft, num_assistant_tokens=K, max_new_tokens=NEW_TOKENS, do_sample=False)
    expected = target.generate(prompt, secure_schedule=Segments([ord("e")], after=Step(L=2)), **options)
    assert torch.equal(reloaded.generate(prompt, tokenizer=tokenizer, **options), expected)
    with pytest.raises(BoundaryResolutionError, match="tokenizer"):
        reloaded.generate(prompt, **options)


def test_custom_generate_route_takes_resolved_boundaries(pair, tokenizer):
    draft, _ = pair
    plain_draft, plain_target = tiny_pair(TinyPairSpec(architecture="llama", seed=0))
    for model in (plain_draft, plain_target):
        model.generation_config.eos_token_id = None
    prompt = torch.tensor([prompt_of(tokenizer, "hi")])
    options = dict(
        custom_generate=securesd_generate,
        draft=plain_draft,
        verifier=RELAXED,
        num_assistant_tokens=K,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
    )
    with pytest.raises(BoundaryResolutionError, match="with_tokenizer"):
        plain_target.generate(prompt, secure_schedule=Segments("e"), **options)
    resolved = plain_target.generate(
        prompt, secure_schedule=Segments("e").with_tokenizer(tokenizer), **options
    )
    assert torch.equal(
        resolved, plain_target.generate(prompt, secure_schedule=Segments([ord("e")]), **options)
    )


def test_statistics_are_absent_without_a_segment_schedule(pair, tokenizer):
    out = run(pair, torch.tensor([prompt_of(tokenizer, "hi")]), Step(L=1))
    assert out.segment_stats is None and out.segment_stats_per_row is None


def test_continuing_a_reply_past_its_boundary_warns_and_the_documented_way_keeps_the_answer_exact(pair, tokenizer):
    """A call that continues from a cache is a new response for the schedule (docs/segments.md, *Continuing a
    reply*): when its input already holds the boundary it warns, and continuing with `before` set to the
    `after` schedule keeps the answer the target's choice."""
    _, target = pair
    prompt, boundary, base = find_case(pair, tokenizer, PLACEMENTS["mid_round"])
    schedule = Segments([list(boundary)], before=None, after="lossless")
    start = PLACEMENTS["mid_round"][-1] + 1
    first = run(pair, torch.tensor([prompt]), schedule, max_new_tokens=start + 2)
    assert first.segment_stats.segment_starts == [[start]]
    new_tokens = NEW_TOKENS - start - 2
    shown = torch.ones_like(first.sequences)  # the tiny vocabulary's pad id may be a generated token: show it
    with pytest.warns(UserWarning, match="continues from a cache .past_key_values. and its input holds a segment boundary"):
        run(pair, first.sequences, schedule, shown, max_new_tokens=new_tokens,
            past_key_values=copy.deepcopy(first.cache))
    kept = Segments([list(boundary)], before="lossless", after="lossless")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the documented way: before = after, nothing to warn about
        second = run(pair, first.sequences, kept, shown, max_new_tokens=new_tokens, past_key_values=first.cache)
    reply = first.sequences[0, len(prompt):].tolist() + second.sequences[0, first.sequences.shape[1]:].tolist()
    assert reply[start:] == target_choices(target, prompt, reply)[start:]


def test_continuing_without_a_boundary_in_the_input_does_not_warn(pair, tokenizer):
    prompt = prompt_of(tokenizer, "Once upon a time")
    first = run(pair, torch.tensor([prompt]), None, max_new_tokens=6)
    token = absent_token(first.sequences[0].tolist())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        run(pair, first.sequences, Segments([token], after="lossless"), max_new_tokens=4,
            past_key_values=first.cache)


def test_a_first_call_whose_prompt_holds_the_boundary_does_not_warn(pair, tokenizer):
    """transformers hands every call a cache (an empty one on a first call): only a call that continues a
    cached conversation is warned about (a prompt holding the boundary, such as a chat template that closes
    the thinking, is the documented rule's first case)."""
    prompt = prompt_of(tokenizer, "Once upon a time")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        run(pair, torch.tensor([prompt]), Segments([prompt[-1]], after="lossless"), max_new_tokens=4)
