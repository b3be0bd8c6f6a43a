"""`Segments`: the eta rule against an independent reference, serialisation, validation and errors.

The reference reads the rule straight from its documentation: the eta of the token at response
position j depends on the tokens before j (committed ones, then the drafts before it); every position
at which those tokens end with a boundary starts an `after` segment at the next token; positions count
from the segment's start; the first segment uses `before`."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import GenerationConfig

from hf_securesd import Linear, Power, Schedule, Segments, Step
from hf_securesd.schedules import resolve_schedule, schedule_weights
from hf_securesd.segments import BoundaryResolutionError, check_boundary_ids, resolve_boundaries
from hf_securesd.tiny import byte_tokenizer
from hf_securesd.validation import SecureSDConfigError


def closed_form(schedule, position: int) -> float:
    """eta of a segment schedule at a segment position, from the segment rules (docs/segments.md)."""
    if schedule is None:
        return 1.0
    if schedule == "lossless":
        return 0.0
    if isinstance(schedule, Step):
        return float(position >= schedule.L)
    if schedule.L == 0:
        return 1.0
    gamma = schedule.gamma if isinstance(schedule, Power) else 1.0
    return min(1.0, position / schedule.L) ** gamma


def reference_eta(tokens_before: list[int], boundaries: list[tuple[int, ...]], before, after) -> float:
    """eta of the token that follows `tokens_before` (the whole response before it)."""
    segment_start = None
    for end in range(1, len(tokens_before) + 1):
        if any(end >= len(b) and tuple(tokens_before[end - len(b) : end]) == b for b in boundaries):
            segment_start = end
    position = len(tokens_before)
    if segment_start is None:
        return closed_form(before, position)
    return closed_form(after, position - segment_start)


def reference_round(response, drafts, boundaries, before, after) -> list[float]:
    return [
        reference_eta(list(response) + list(drafts[:i]), boundaries, before, after)
        for i in range(len(drafts))
    ]


SEGMENT_SCHEDULES = [None, "lossless", Step(L=2), Linear(L=3), Power(L=4, gamma=2.0), Step(L=0)]


def test_round_eta_matches_the_reference_on_random_rounds():
    """Random responses and drafts over a 4-token vocabulary (boundaries occur often, split over the
    committed tokens and the drafts, overlapping, repeated), several boundaries of 1 to 5 tokens (so a
    boundary may start in a response shorter than the longest one), every segment schedule."""
    rng = random.Random(0)
    checked_in_after = 0
    for trial in range(1000):
        boundaries = [
            tuple(rng.randrange(4) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))
        ]
        before, after = rng.choice(SEGMENT_SCHEDULES), rng.choice(SEGMENT_SCHEDULES)
        schedule = Segments(boundaries, before=before, after=after)
        batch, k = rng.randint(1, 4), rng.randint(1, 6)
        responses = [[rng.randrange(4) for _ in range(rng.choice((0, 1, 2, 3, rng.randint(0, 12))))] for _ in range(batch)]
        drafts = torch.tensor([[rng.randrange(4) for _ in range(k)] for _ in range(batch)])
        starts = torch.tensor([len(response) for response in responses])
        eta = schedule_weights(schedule, starts, drafts, responses)
        assert eta.shape == (batch, k) and eta.dtype == torch.float32
        for row in range(batch):
            expected = reference_round(responses[row], drafts[row].tolist(), boundaries, before, after)
            assert eta[row].tolist() == pytest.approx(expected, abs=1e-6), (
                trial,
                row,
                boundaries,
                before,
                after,
            )
        rows = schedule.segment_starts_of_round(starts, drafts, responses)
        checked_in_after += sum(start >= 0 for row in rows for start in row)
    assert checked_in_after > 500  # the after segments were exercised, not only the first one


@pytest.mark.parametrize(
    "response, drafts, expected",
    [
        # boundary [9] on the round's first draft: drafts 1.. are the after segment's positions 0..
        ([1, 2], [9, 3, 3, 3], [1, 0, 0, 1]),
        # mid-round
        ([1, 2], [3, 9, 3, 3], [1, 1, 0, 0]),
        # completed by the last committed token (a recovered or bonus token of the previous round)
        ([1, 9], [3, 3, 3, 3], [0, 0, 1, 1]),
        # a second occurrence restarts the after segment
        ([9, 3, 3, 3], [9, 3, 3, 3], [1, 0, 0, 1]),
    ],
    ids=["first-draft", "mid-round", "committed", "restart"],
)
def test_boundary_placements_within_a_round(response, drafts, expected):
    schedule = Segments([9], before=None, after=Step(L=2))
    eta = schedule.round_eta(torch.tensor([len(response)]), torch.tensor([drafts]), [response])
    assert eta[0].tolist() == expected


def test_a_long_boundary_starting_in_a_short_response_is_found_within_the_round():
    """The boundary [0, 0, 1] starts in the 2 committed tokens and ends on the first draft: the drafts
    after it are the after segment's. A response shorter than the longest boundary but one was read
    from a negative index, so only its last token was seen and the boundary was missed until the next
    round."""
    schedule = Segments([[0, 0, 1], [2, 2, 2, 1]])  # before None (eta 1), after "lossless" (eta 0)
    eta = schedule.round_eta(torch.tensor([2]), torch.tensor([[1, 2, 0]]), [[0, 0]])
    assert eta.tolist() == [[1.0, 0.0, 0.0]]


def test_boundary_split_over_committed_tokens_and_drafts():
    schedule = Segments([7, 8], before="lossless", after=None)  # relaxed only after "7 8"
    # "7" committed, "8" the first draft: the drafts after it are relaxed
    assert schedule.round_eta(torch.tensor([2]), torch.tensor([[8, 1, 1]]), [[0, 7]])[0].tolist() == [0, 1, 1]
    # "7" as the last draft: the boundary is not complete inside this round
    assert schedule.round_eta(torch.tensor([1]), torch.tensor([[1, 1, 7]]), [[0]])[0].tolist() == [0, 0, 0]
    # a stray "8" without "7" is no boundary
    assert schedule.round_eta(torch.tensor([1]), torch.tensor([[8, 1, 1]]), [[0]])[0].tolist() == [0, 0, 0]


def test_rows_cross_the_boundary_at_their_own_round():
    schedule = Segments([5], before=Step(L=1), after="lossless")
    responses = [[1, 1, 1], [1, 5], [5, 1, 1, 1, 1, 1]]
    drafts = torch.tensor([[1, 5, 1], [1, 1, 1], [1, 1, 1]])
    starts = torch.tensor([3, 2, 6])
    eta = schedule.round_eta(starts, drafts, responses)
    assert eta.tolist() == [[1, 1, 0], [0, 0, 0], [0, 0, 0]]


def test_no_boundary_is_exactly_before_alone():
    generator = torch.Generator().manual_seed(3)
    for before in (Step(L=3), Linear(L=5), Power(L=4, gamma=0.5)):
        schedule = Segments([[250, 251], [252]], before=before, after="lossless")
        drafts = torch.randint(0, 200, (6, 5), generator=generator)
        responses = [torch.randint(0, 200, (n,), generator=generator).tolist() for n in (0, 1, 3, 7, 9, 20)]
        starts = torch.tensor([len(response) for response in responses])
        assert torch.equal(
            schedule_weights(schedule, starts, drafts, responses),
            schedule_weights(before, starts, drafts, responses),
        )


def test_huge_positions_and_a_shorter_response_window():
    """A response shorter than `starts` is taken to end at starts - 1 (its first token sits later)."""
    schedule = Segments([5], before=Step(L=10), after=Linear(L=4))
    eta = schedule.round_eta(torch.tensor([2**62, 100]), torch.tensor([[1, 1], [1, 1]]), [[], [5, 1]])
    assert eta.tolist() == [[1.0, 1.0], [0.25, 0.5]]


def test_draft_entries_past_a_row_count_may_hold_anything():
    schedule = Segments([5], before=None, after="lossless")
    eta = schedule.round_eta(torch.tensor([0]), torch.tensor([[-1, 2**40, 5, -7]]), [[]])
    assert eta.tolist() == [[1, 1, 1, 0]]


def test_responses_as_tensors_or_tuples_read_the_same():
    schedule = Segments([5, 6], before=None, after="lossless")
    drafts = torch.tensor([[1, 1]])
    expected = [[0.0, 0.0]]
    for response in ([0, 5, 6], torch.tensor([0, 5, 6]), (0, 5, 6)):
        assert schedule.round_eta(torch.tensor([3]), drafts, [response]).tolist() == expected


def test_segment_starts_of_a_whole_response():
    schedule = Segments([[7, 7], [3]], before=None, after="lossless")
    assert schedule.segment_starts([1, 7, 7, 7, 3, 2]) == [3, 4, 5]


# --- serialisation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [
        Segments("</think>"),
        Segments("</think>", before=Step(L=1), after=Step(L=4)),
        Segments([151668], before=Linear(L=3), after=Power(L=2, gamma=2.0)),
        Segments([[1, 2], "</answer>", [3]], before="lossless", after=None),
    ],
)
def test_to_dict_round_trips_through_json(schedule):
    values = schedule.to_dict()
    again = resolve_schedule(json.loads(json.dumps(values)))
    assert again == schedule and again.to_dict() == values and hash(again) == hash(schedule)


def test_to_dict_form():
    schedule = Segments("</think>", before=None, after=Step(L=4))
    assert schedule.to_dict() == {
        "schedule": "segments",
        "boundary": "</think>",
        "before": None,
        "after": {"schedule": "step", "L": 4},
    }
    assert Segments([151668]).to_dict()["boundary"] == [151668]  # one boundary: flat
    assert Segments([[1, 2], "x"]).to_dict()["boundary"] == [[1, 2], "x"]


def test_generation_config_saves_and_reloads_a_segment_schedule(tmp_path):
    config = GenerationConfig(secure_schedule=Segments("</think>", before=Step(L=1), after=Step(L=4)))
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["secure_schedule"] == Segments("</think>", before=Step(L=1), after=Step(L=4)).to_dict()
    reloaded = GenerationConfig.from_pretrained(tmp_path)
    assert resolve_schedule(reloaded.secure_schedule) == Segments(
        "</think>", before=Step(L=1), after=Step(L=4)
    )


def test_text_boundaries_resolve_with_the_tokenizer_and_keep_their_text():
    tokenizer = byte_tokenizer()
    schedule = Segments(["ab", "<|im_end|>", [5]])
    resolved = schedule.with_tokenizer(tokenizer)
    assert resolved.token_boundaries == ((97, 98), (258,), (5,))  # bytes, an added token, ids as given
    assert resolved == schedule and resolved.to_dict() == schedule.to_dict()
    assert resolve_boundaries(schedule, tokenizer).token_boundaries == resolved.token_boundaries
    assert resolve_boundaries(resolved, None) is resolved  # resolved earlier: no tokenizer needed
    assert Segments([5, 6]).token_boundaries == ((5, 6),)  # ids need no tokenizer


class _BrokenTokenizer:
    def get_vocab(self) -> dict:
        return {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list:
        raise RuntimeError("no vocabulary loaded")


@pytest.mark.parametrize("tokenizer, cause", [
    ("not a tokenizer", "TypeError"), (_BrokenTokenizer(), "RuntimeError: 'no vocabulary loaded'"),
])
def test_an_unusable_tokenizer_is_named_with_the_boundary_and_the_fix(tokenizer, cause):
    """Whatever was passed as tokenizer= and fails to tokenize a text boundary gives one error naming
    tokenizer=, the boundary and the fix, not the exception from inside the object."""
    with pytest.raises(BoundaryResolutionError) as error:
        resolve_boundaries(Segments(["ab", [5]]), tokenizer)
    message = str(error.value)
    assert message.startswith(f"tokenizer= ({type(tokenizer).__name__}) could not tokenize the Segments boundary 'ab': {cause}")
    assert message.endswith("pass the target's own tokenizer (a transformers tokenizer), or give the boundary as token ids")


def test_a_text_boundary_without_a_tokenizer_names_the_fix():
    schedule = Segments("</think>")
    with pytest.raises(BoundaryResolutionError, match="pass tokenizer=") as error:
        schedule.round_eta(torch.tensor([0]), torch.tensor([[1]]), [[]])
    assert isinstance(error.value, SecureSDConfigError)
    with pytest.raises(BoundaryResolutionError, match="token ids"):
        resolve_boundaries(schedule, None)


def test_a_vocabulary_key_that_stands_for_a_byte_is_split_like_other_text():
    """A byte-level vocabulary has keys such as "§" that stand for one byte of an encoding: "§" is the two
    tokens the model writes, not the key's one token (which also ends "ç" and would start a segment there)."""
    tokenizer = byte_tokenizer()
    assert "§" in tokenizer.get_vocab() and tokenizer.decode([tokenizer.get_vocab()["§"]]) != "§"
    for text in ("§", "é"):
        resolved = Segments(text).with_tokenizer(tokenizer)
        assert resolved.token_boundaries == (tuple(tokenizer.encode(text, add_special_tokens=False)),)
    assert Segments("§").with_tokenizer(tokenizer).segment_starts(tokenizer.encode("une façade")) == []
    assert Segments("<|im_end|>").with_tokenizer(tokenizer).token_boundaries == ((258,),)  # an added token


def test_boundary_ids_outside_the_vocabulary_are_refused():
    check_boundary_ids(Segments([5, 258]), 259)
    check_boundary_ids(Segments("</think>"), 259)  # text not resolved yet: checked once it is
    check_boundary_ids(None, 259)
    with pytest.raises(SecureSDConfigError, match=r"token id 259, outside this model's vocabulary \(259 tokens\)"):
        check_boundary_ids(Segments([[5], [1, 259]]), 259)


class _UnfaithfulTokenizer:
    def get_vocab(self):
        return {}

    def encode(self, text, add_special_tokens=False):
        return [1, 2]

    def decode(self, ids):
        return " </think>"


def test_a_text_boundary_whose_split_does_not_decode_back_is_refused():
    with pytest.raises(BoundaryResolutionError, match="give the boundary as the token ids"):
        Segments("</think>").with_tokenizer(_UnfaithfulTokenizer())


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(boundary=""), ValueError, "empty string"),
        (dict(boundary="a\ud800"), ValueError, "is not valid Unicode text .* at character 1"),
        (dict(boundary=[]), ValueError, "must be given"),
        (dict(boundary=None), ValueError, "must be given"),
        (dict(boundary=[1, "a"]), ValueError, "mixes token ids"),
        (dict(boundary=[-3]), ValueError, "negative token id"),
        (dict(boundary=[[1], 2.5]), ValueError, "is not a boundary"),
        (dict(boundary=[[]]), ValueError, r"boundary \[\] is empty; give it one token id or more"),
        (dict(boundary=[[5], ()]), ValueError, r"boundary \(\) is empty"),
        (dict(boundary=[True]), ValueError, "is not a boundary"),
        (dict(boundary=torch.ones(2, 2, dtype=torch.long)), ValueError, "is not a boundary"),
        (dict(boundary=3.0), ValueError, "is not a boundary"),
        (dict(boundary="x", before="exact"), ValueError, "'lossless'"),
        (dict(boundary="x", after=3), TypeError, "position schedule"),
        (dict(boundary="x", after=Segments("y")), ValueError, "do not nest"),
        (
            dict(boundary="x", after={"schedule": "step", "L": -1}),
            ValueError,
            "Segments after: schedule length",
        ),
        (dict(boundary="x", before={"schedule": "nope"}), ValueError, "Segments before: unknown schedule"),
    ],
)
def test_bad_arguments_are_refused_with_the_field_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        Segments(**kwargs)


@pytest.mark.parametrize("boundary, named", [([1.0, 2.0], "1.0"), ([[1, 2], [3.0]], "3.0"), ([5, 2.5], "2.5")])
def test_token_ids_written_as_floats_are_refused_as_not_integers(boundary, named):
    with pytest.raises(ValueError, match=rf"holds {named}, which is not a token id; token ids are integers"):
        Segments(boundary)


def test_resolve_schedule_errors_for_segment_dicts():
    with pytest.raises(ValueError, match=r"needs the option\(s\) \['boundary'\]"):
        resolve_schedule({"schedule": "segments"})
    with pytest.raises(ValueError, match=r"has no option\(s\) \['bogus'\]"):
        resolve_schedule({"schedule": "segments", "boundary": "x", "bogus": 1})
    with pytest.raises(ValueError, match="token_boundaries"):  # not an option: it is derived
        resolve_schedule({"schedule": "segments", "boundary": "x", "token_boundaries": [[1]]})
    assert (
        resolve_schedule({"schedule": "segments", "boundary": "x", "after": "LOSSLESS"}).after == "lossless"
    )


def test_eta_of_positions_alone_is_refused():
    with pytest.raises(TypeError, match="round_eta"):
        Segments([1]).eta(torch.arange(3))


def test_responses_are_required_and_checked():
    schedule = Segments([1])
    with pytest.raises(ValueError, match="needs responses"):
        schedule_weights(schedule, torch.tensor([0]), torch.tensor([[1]]), None)
    with pytest.raises(ValueError, match="needs responses"):
        schedule_weights(schedule, torch.tensor([0, 0]), torch.tensor([[1], [1]]), [[]])
    with pytest.raises(ValueError, match="responses\\[b\\] must be the tokens before"):
        schedule_weights(schedule, torch.tensor([1]), torch.tensor([[1]]), [[2, 2, 2]])


class _Outside(Schedule):
    """A custom position schedule with a bug: eta outside [0, 1]."""

    name = "outside"

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.full(positions.shape, 2.0)


def test_a_custom_position_schedule_inside_segments_is_checked():
    schedule = Segments([1], before=None, after=_Outside())
    assert schedule.round_eta(torch.tensor([0]), torch.tensor([[0, 0]]), [[]]).tolist() == [[1, 1]]
    with pytest.raises(ValueError, match="schedule _Outside returned eta = 2.0"):
        schedule.round_eta(torch.tensor([0]), torch.tensor([[1, 0]]), [[]])
