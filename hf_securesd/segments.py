"""Segment schedules: SecureSD weights that restart at boundary token sequences of the response.

A reasoning model writes its reply in segments (`<think> ... </think>` then the answer). `Segments`
applies one position schedule to the first segment (`before`) and another to every segment that
follows a boundary (`after`), each counting positions from its own segment's start:

* the first segment starts at response position 0;
* every time the response tokens so far end with one of the boundaries, a new `after` segment starts
  at the next token (its position 0). That holds for every occurrence of every boundary: a second
  `</think>` starts another `after` segment, so the opening of each new segment is verified again.
  Occurrences may overlap (the boundary `[7, 7]` in `7 7 7` starts segments after the second and the
  third token). The boundary's own tokens belong to the segment they close.

The eta of the drafted token at response position j reads the tokens before j: the tokens committed
before the round and the drafts before it in the same round (drafts that are all accepted whenever
position j is verified at all). A boundary split over several tokens, over two rounds, or completed
by a recovered or bonus token (committed by the next round) is therefore found exactly where it ends,
and each row of a batch crosses it at its own round. Boundaries are looked for in the response only:
a boundary inside the prompt (a chat template that closes the thinking itself) starts nothing.

`before` and `after` each take a position schedule (`Step`, `Linear`, `Power`, or a custom one that
reads positions only), `None` (the relaxed verifier unchanged, eta = 1) or `"lossless"` (eta = 0 for
the whole segment). A response in which no boundary occurs is verified exactly as `before` alone.

Example:

```python
>>> from hf_securesd import Segments, Step
>>> relax_thinking = Segments("</think>", before=None, after=Step(L=4))   # text: generate(tokenizer=...)
>>> by_ids = Segments([151668], before=Step(L=1), after="lossless")       # token ids: no tokenizer needed
>>> by_ids.round_eta(torch.tensor([3]), torch.tensor([[5, 151668, 9, 9]]), responses=[[1, 2, 3]])
tensor([[1., 1., 0., 0.]])
```
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, Sequence, Union

import torch

from .schedules import (
    Linear,
    Power,
    Schedule,
    Step,
    check_weights,
    is_integer,
    register_schedule,
    resolve_schedule,
    short_repr,
)
from .validation import SecureSDConfigError

LOSSLESS = "lossless"
Boundary = Union[str, tuple[int, ...]]
SegmentSchedule = Union[Schedule, str, None]
_POSITION_SCHEDULES = (Step, Linear, Power)  # eta always in [0, 1]; other position schedules are checked
_BOUNDARY_HELP = (
    "a boundary is a string (resolved with the tokenizer), a sequence of token ids such as [151668], "
    "or a list of those (several boundaries)"
)


class BoundaryResolutionError(SecureSDConfigError):
    """A text boundary that cannot be turned into token ids (no tokenizer, or an unfaithful split).
    `unresolved` holds the text boundaries left without a tokenizer (empty for an unfaithful split)."""

    def __init__(self, message: str, unresolved: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.unresolved = unresolved


def _token_ids(value: Any) -> tuple[int, ...] | None:
    """`value` as a tuple of token ids when it is an int or a sequence of ints, else None."""
    if is_integer(value):
        return (int(value),)
    if getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None)):
        value = value.tolist()  # a 1-d tensor or NumPy array of ids
    if isinstance(value, (list, tuple)) and value and all(is_integer(item) for item in value):
        return tuple(int(item) for item in value)
    return None


def _one_boundary(value: Any) -> Boundary:
    if isinstance(value, str):
        if not value:
            raise ValueError(
                "Segments boundary is an empty string; give the text that ends a segment, e.g. '</think>'"
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"Segments boundary {short_repr(value)} is not valid Unicode text ({error.reason} at character "
                f"{error.start}); give the boundary as text a tokenizer can encode, or as token ids"
            ) from None
        return value
    ids = _token_ids(value)
    if ids is None:
        _refuse_non_integer_ids(value)
        if isinstance(value, (list, tuple)) and not value:
            raise ValueError(f"Segments boundary {short_repr(value)} is empty; give it one token id or more")
        raise ValueError(f"Segments boundary {short_repr(value)} is not a boundary; {_BOUNDARY_HELP}")
    negative = [token for token in ids if token < 0]
    if negative:
        raise ValueError(
            f"Segments boundary {list(ids)} holds the negative token id {negative[0]}; ids are >= 0"
        )
    return ids


def _refuse_non_integer_ids(value: Any) -> None:
    """ValueError naming the first entry that is not an integer when `value` is a list or tuple of real
    numbers that are not all integers (a boundary of token ids written as floats, [1.0, 2.0])."""
    if not isinstance(value, (list, tuple)) or not value:
        return
    if all(isinstance(item, numbers.Real) and not isinstance(item, bool) for item in value):
        first = next(item for item in value if not is_integer(item))
        raise ValueError(
            f"Segments boundary {short_repr(value)} holds {short_repr(first)}, which is not a token id; token "
            "ids are integers, e.g. [151668]"
        )


def normalize_boundaries(boundary: Any) -> tuple[Boundary, ...]:
    """One boundary or a list of them -> a non-empty tuple of boundaries (strings or id tuples).

    A flat sequence of ints is one boundary of several tokens; a list whose items are strings or
    sequences of ints is several boundaries."""
    if isinstance(boundary, str) or _token_ids(boundary) is not None:
        return (_one_boundary(boundary),)
    if isinstance(boundary, (list, tuple)) and boundary:
        _refuse_non_integer_ids(boundary)
        if any(is_integer(item) for item in boundary):
            raise ValueError(
                f"Segments boundary {short_repr(boundary)} mixes token ids with other boundaries; write one "
                "boundary of several tokens as [id, id, ...] and several boundaries as "
                "[[id, ...], '</think>', ...]"
            )
        return tuple(_one_boundary(item) for item in boundary)
    if boundary is None or isinstance(boundary, (list, tuple)):
        raise ValueError(f"Segments boundary must be given, got {short_repr(boundary)}; {_BOUNDARY_HELP}")
    raise ValueError(f"Segments boundary {short_repr(boundary)} is not a boundary; {_BOUNDARY_HELP}")


def _segment_schedule(value: Any, side: str) -> SegmentSchedule:
    """Validate `before` / `after`: None, 'lossless', a position schedule or its dict form."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() == LOSSLESS:
            return LOSSLESS
        raise ValueError(
            f"Segments {side}={value!r} is not a segment schedule; use None (the relaxed verifier "
            "unchanged), 'lossless' (eta = 0 for the whole segment) or a position schedule such as Step(L=4)"
        )
    if isinstance(value, dict):
        try:
            value = resolve_schedule(value)
        except (TypeError, ValueError) as error:
            raise ValueError(f"Segments {side}: {error}") from None
    if not isinstance(value, Schedule):
        raise TypeError(
            f"Segments {side} must be None, 'lossless' or a position schedule (Step, Linear, Power), "
            f"got {type(value).__name__} {short_repr(value)}"
        )
    if value.reads_tokens:
        raise ValueError(
            f"Segments {side}={type(value).__name__}(...) reads tokens itself; segments do not nest: "
            "give every boundary to one Segments(boundary=[...]) and a position schedule here"
        )
    return value


def _segment_dict(value: SegmentSchedule) -> Any:
    return value.to_dict() if isinstance(value, Schedule) else value


def _segment_eta(value: SegmentSchedule, positions: torch.Tensor) -> torch.Tensor:
    """eta of one segment schedule at segment positions [B, k] -> [B, k] float32."""
    if value is None:
        return torch.ones(positions.shape, dtype=torch.float32, device=positions.device)
    if isinstance(value, str):  # "lossless", the only string left after validation
        return torch.zeros(positions.shape, dtype=torch.float32, device=positions.device)
    eta = value.eta(positions)
    if type(value) not in _POSITION_SCHEDULES:
        eta = check_weights(value, eta, tuple(positions.shape))
    return eta


class BoundaryMatcher:
    """Finds where token-id boundaries end in a token list. Finding the last boundary reads the tokens
    after it once per distinct last token of the boundaries (a few boundaries: a few passes; 10,000 with
    distinct last tokens over a 4,000-token reply: 0.36 s a round); each pass runs in C (`list.index`
    over a reversed copy), not token by token in Python. A vLLM request holds at most 64 values, so at
    most that many boundaries."""

    def __init__(self, patterns: Sequence[tuple[int, ...]]) -> None:
        self.patterns = tuple(dict.fromkeys(patterns))
        self.longest = max(len(pattern) for pattern in self.patterns)
        self._by_last: dict[int, list[tuple[int, ...]]] = {}
        for pattern in self.patterns:
            self._by_last.setdefault(pattern[-1], []).append(pattern)

    def ends_at(self, tokens: Sequence[int], stop: int) -> bool:
        """Whether tokens[:stop] ends with a boundary."""
        if stop <= 0:
            return False
        for pattern in self._by_last.get(tokens[stop - 1], ()):
            size = len(pattern)
            if stop >= size and tuple(tokens[stop - size : stop]) == pattern:
                return True
        return False

    def last_segment_start(self, tokens: list[int]) -> int | None:
        """Index just after the last boundary occurrence in `tokens` (where the current segment
        starts), or None when no boundary occurs. Searches backwards from the end, once per distinct
        last token of the boundaries, each search stopping at the best end found so far."""
        reversed_tokens = tokens[::-1]
        best: int | None = None
        for last in self._by_last:
            limit = len(tokens) if best is None else len(tokens) - best
            offset = 0
            while True:
                try:
                    offset = reversed_tokens.index(last, offset, limit)
                except ValueError:
                    break
                if self.ends_at(tokens, len(tokens) - offset):
                    best = len(tokens) - offset
                    break
                offset += 1
        return best

    def segment_starts(self, tokens: list[int]) -> list[int]:
        """Every index at which a new segment starts (just after each boundary occurrence), ascending."""
        return [stop for stop in range(1, len(tokens) + 1) if self.ends_at(tokens, stop)]


@register_schedule
@dataclass(frozen=True)
class Segments(Schedule):
    """A schedule per segment of the response, segments separated by boundary token sequences.

    Args:
        boundary: a string (resolved with the tokenizer: `generate(tokenizer=...)` or `with_tokenizer`),
            token ids (`[151668]`, one boundary of one or more tokens), or a list of those (several
            boundaries; an occurrence of any of them starts a new `after` segment).
        before: schedule of the first segment (response position 0 up to the first boundary): a position
            schedule, None (eta = 1, relaxed) or "lossless" (eta = 0).
        after: schedule of every segment after a boundary, positions counted from the token after the
            boundary; same choices. The default (`before=None, after="lossless"`) is TensorRT-LLM's
            policy for reasoning models: relaxed thinking, exact answer.

    See the module docstring for the exact rule.
    """

    boundary: Any
    before: SegmentSchedule = None
    after: SegmentSchedule = LOSSLESS
    token_boundaries: tuple[tuple[int, ...], ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    name: ClassVar[str] = "segments"
    reads_tokens: ClassVar[bool] = True

    def __post_init__(self) -> None:
        boundaries = normalize_boundaries(self.boundary)
        object.__setattr__(self, "boundary", boundaries)
        object.__setattr__(self, "before", _segment_schedule(self.before, "before"))
        object.__setattr__(self, "after", _segment_schedule(self.after, "after"))
        if all(not isinstance(item, str) for item in boundaries):
            object.__setattr__(self, "token_boundaries", boundaries)

    @property
    def text_boundaries(self) -> tuple[str, ...]:
        """The boundaries given as text (they need a tokenizer)."""
        return tuple(item for item in self.boundary if isinstance(item, str))

    def with_tokenizer(self, tokenizer: Any) -> "Segments":
        """This schedule with its text boundaries resolved to token ids by `tokenizer` (equal to it and
        serialised the same way: the text is kept). A string that is one entry of the vocabulary and
        decodes back to itself (an added token such as Qwen3's `</think>`) is that token; other text is the tokenizer's split of it
        alone, refused unless it decodes back to the same text. A model may split the same text
        differently in context: give those splits as token-id boundaries too."""
        resolved = tuple(
            item if not isinstance(item, str) else text_to_ids(tokenizer, item) for item in self.boundary
        )
        copy = Segments(self.boundary, self.before, self.after)
        object.__setattr__(copy, "token_boundaries", resolved)
        return copy

    def matcher(self) -> BoundaryMatcher:
        """The token-id boundaries' matcher; raises when a text boundary has not been resolved."""
        if self.token_boundaries is None:
            raise BoundaryResolutionError(
                f"Segments boundary {', '.join(map(repr, self.text_boundaries))} is text and needs the "
                "model's tokenizer: pass tokenizer=<the target's tokenizer> to generate (a pipeline needs it "
                "in its call too: transformers' pipelines do not pass their own on), or resolve it once with "
                "schedule.with_tokenizer(tokenizer), or give the boundary as token ids, e.g. "
                "Segments([151668], ...)",
                unresolved=tuple(self.text_boundaries),
            )
        return _matcher(self.token_boundaries)

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        raise TypeError(
            "Segments.eta(positions) is undefined: the weight of a position depends on the tokens before it. "
            "Use round_eta(starts, drafts, responses) (schedule_weights does)"
        )

    def round_eta(
        self, starts: torch.Tensor, drafts: torch.Tensor, responses: Sequence[Sequence[int]] | None = None
    ) -> torch.Tensor:
        """eta [B, k] float32 of one round (see `Schedule.round_eta`).

        Args:
            starts: [B] long, response position of each row's first draft.
            drafts: [B, k] drafted tokens; entries past a row's draft count may hold anything (their eta
                is never used, and their tokens only affect the eta of later unused entries).
            responses: per row, the response tokens committed before the round (required); its last token
                sits at position starts[b] - 1 (a shorter list is taken to end there too).
        """
        segment_start = self.segment_starts_of_round(starts, drafts, responses)
        positions = starts[:, None] + torch.arange(drafts.shape[1], device=starts.device)
        starts_tensor = torch.tensor(segment_start, dtype=torch.long, device=starts.device).reshape(
            positions.shape
        )
        in_after = starts_tensor >= 0
        before = _segment_eta(self.before, positions)
        if not bool(in_after.any()):
            return before
        after = _segment_eta(self.after, (positions - starts_tensor).clamp_min(0))
        return torch.where(in_after, after, before)

    def segment_starts_of_round(
        self, starts: torch.Tensor, drafts: torch.Tensor, responses: Sequence[Sequence[int]] | None
    ) -> list[list[int]]:
        """[B][k]: response position where the segment of each draft starts, -1 in the first segment."""
        matcher = self.matcher()
        batch, k = drafts.shape
        if responses is None or len(responses) != batch:
            got = "None" if responses is None else f"{len(responses)} rows"
            raise ValueError(
                f"Segments needs responses: the committed response tokens of each of the {batch} rows, "
                f"got {got}"
            )
        host_starts = starts.tolist()
        host_drafts = drafts.tolist()
        tail_size = matcher.longest - 1
        result = []
        for start, row_drafts, response in zip(host_starts, host_drafts, responses):
            if isinstance(response, torch.Tensor):
                response = response.tolist()
            response = response if isinstance(response, list) else [int(token) for token in response]
            if len(response) > start:
                raise ValueError(
                    f"a row's response holds {len(response)} committed tokens but its first draft sits at "
                    "position "
                    f"{start}; responses[b] must be the tokens before position starts[b]"
                )
            offset = start - len(response)  # response position of response[0]
            found = matcher.last_segment_start(response)
            current = -1 if found is None else offset + found
            tail = response[max(len(response) - tail_size, 0) :] if tail_size else []
            window = tail + row_drafts
            row = []
            for i in range(k):
                if i and matcher.ends_at(window, len(tail) + i):
                    current = start + i
                row.append(current)
            result.append(row)
        return result

    def segment_starts(self, tokens: Sequence[int]) -> list[int]:
        """Response positions at which the `after` segments of `tokens` (a whole response) start."""
        return self.matcher().segment_starts(list(tokens))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form; one boundary is written flat (`"</think>"`, `[151668]`), several as a list."""
        boundaries = [item if isinstance(item, str) else list(item) for item in self.boundary]
        return {
            "schedule": self.name,
            "boundary": boundaries[0] if len(boundaries) == 1 else boundaries,
            "before": _segment_dict(self.before),
            "after": _segment_dict(self.after),
        }


def warn_if_continuing_segments(
    schedule: Schedule | None, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> None:
    """Warn when a call that continues from a cache (`past_key_values`) holds a `Segments` boundary in its
    input [B, P] (attention_mask [B, P], 0 on padding, or None).

    A continued call is a new response for the schedule: its positions and segments count from its first
    new token and a boundary in the input starts nothing, so a reply whose answer began in an earlier call
    continues in the `before` segment. That is the documented rule (boundaries are looked for in the
    response only), but here it relaxes the part of a reply that `after` protects: say so, and how to keep
    it."""
    if not isinstance(schedule, Segments) or schedule.token_boundaries is None or schedule.before == schedule.after:
        return  # `before` equal to `after` (the way to keep an answer begun earlier): the input changes nothing
    matcher = schedule.matcher()
    for row, tokens in enumerate(input_ids.tolist()):
        if attention_mask is not None:
            tokens = [token for token, shown in zip(tokens, attention_mask[row].tolist()) if shown]
        found = matcher.last_segment_start(tokens)
        if found is None:
            continue
        warnings.warn(
            f"secure_schedule {schedule.to_dict()}: this call continues from a cache (past_key_values) and its input "
            f"holds a segment boundary (row {row}). A continued call is a new response for the schedule: "
            "positions and segments count from its first new token and "
            "boundaries in the input start nothing, so this reply continues in the `before` segment. To "
            "continue an answer that already began, pass Segments(boundary, before=<the after schedule>, "
            "after=<the after schedule>) for this call, or generate the reply in one call "
            "(docs/segments.md, *Continuing a reply*).",
            UserWarning,
            stacklevel=2,
        )
        return


@lru_cache(maxsize=256)
def _matcher(patterns: tuple[tuple[int, ...], ...]) -> BoundaryMatcher:
    return BoundaryMatcher(patterns)


def text_to_ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    """Token ids of a text boundary (see `Segments.with_tokenizer`)."""
    if tokenizer is None:
        raise BoundaryResolutionError(
            f"Segments boundary {text!r} is text and needs the model's tokenizer: pass tokenizer= to "
            "generate, "
            "or give the boundary as token ids"
        )
    try:
        single, ids, decoded = _tokenized(tokenizer, text)
    except Exception as error:  # noqa: BLE001 - whatever was passed as tokenizer=: named with the fix
        raise BoundaryResolutionError(
            f"tokenizer= ({type(tokenizer).__name__}) could not tokenize the Segments boundary {text!r}: "
            f"{type(error).__name__}: {short_repr(str(error), 200)}; pass the target's own tokenizer (a transformers "
            "tokenizer), or give the boundary as token ids"
        ) from error
    if single is not None:
        return single
    if not ids:
        raise BoundaryResolutionError(f"the tokenizer encodes the Segments boundary {text!r} to no tokens")
    if decoded != text:
        raise BoundaryResolutionError(
            f"the tokenizer splits the Segments boundary {text!r} into {list(ids)}, which decodes to "
            f"{decoded!r}: "
            "give the boundary as the token ids the model emits, e.g. Segments([id, ...], ...)"
        )
    return ids


def _tokenized(tokenizer: Any, text: str) -> tuple[tuple[int] | None, tuple[int, ...], str | None]:
    """(the one vocabulary entry that stands for `text`, else None; its ids, its ids decoded) by `tokenizer`."""
    vocabulary = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if text in vocabulary and tokenizer.decode([int(vocabulary[text])]) == text:
        # One entry that stands for this text (an added token). A byte-level vocabulary also has keys such
        # as "§" or "é" that stand for one byte of the text's encoding, not for the text: those go below.
        return (int(vocabulary[text]),), (), None
    ids = tuple(int(token) for token in tokenizer.encode(text, add_special_tokens=False))
    return None, ids, tokenizer.decode(list(ids)) if ids else None


_BOUNDARY_ID_FIX = (
    "give the boundary as text with tokenizer= (resolved with this model's tokenizer), or as this model's own "
    "token ids"
)


def check_boundary_ids(schedule: Schedule | None, vocab_size: int, fix: str = _BOUNDARY_ID_FIX) -> None:
    """Refuse a `Segments` schedule whose token-id boundaries hold an id the model cannot emit (>= its
    `vocab_size` scores): that boundary would never occur, and the segments after it would silently never
    start. Any other schedule, and text boundaries not resolved yet, pass. `fix`: how the caller's user
    gives a usable boundary (ends the error message)."""
    if not isinstance(schedule, Segments) or schedule.token_boundaries is None:
        return
    for boundary in schedule.token_boundaries:
        outside = [token for token in boundary if token >= vocab_size]
        if outside:
            raise SecureSDConfigError(
                f"Segments boundary {list(boundary)} holds the token id {outside[0]}, outside this model's "
                f"vocabulary ({vocab_size} tokens), so it would never occur and its segments never start; {fix}"
            )


def resolve_boundaries(schedule: Schedule | None, tokenizer: Any) -> Schedule | None:
    """A `Segments` with text boundaries resolved by `tokenizer` (when one is given); raises
    `BoundaryResolutionError` naming the fix when text boundaries remain and there is no tokenizer.
    Any other schedule is returned unchanged."""
    if not isinstance(schedule, Segments) or not schedule.text_boundaries:
        return schedule
    if tokenizer is not None:
        return schedule.with_tokenizer(tokenizer)
    schedule.matcher()  # raises unless resolved earlier
    return schedule
