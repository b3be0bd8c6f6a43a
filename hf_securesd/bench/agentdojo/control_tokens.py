"""Control tokens in message text: the tokenizer's special and added token strings that text could
spell out, and how one is broken (a zero-width space after its first character) so the tokenizer
reads it as plain characters. `HFPromptingLLM` applies it to every turn before the chat template.

A tokenizer may normalise text before it matches added tokens (NFKC turns ``＜|tool|＞`` into
``<|tool|>``, a Lowercase normalizer ``<|TOOL|>``), so look-alikes are found on a folded copy of
the text (each character NFKC-normalised and case-folded) and broken in the original. What the
tokenizer itself still reads as a control token is then found by encoding the text, and broken
where its offsets point; text that stays a control token after that is refused (`ControlTokenError`)."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Sequence

from transformers import PreTrainedTokenizerBase

# Inserted after the first character of a control-token string found in a message's text, so the
# tokenizer reads it as plain characters (checked per tokenizer in `HFPromptingLLM.__init__`).
TOKEN_BREAK = "\u200b"  # zero-width space: the text stays readable
MAX_BREAK_ROUNDS = 8  # rounds of breaking what the tokenizer still reads as a control token

_FULLWIDTH = str.maketrans({chr(code): chr(code + 0xFEE0) for code in range(0x21, 0x7F)})


class ControlTokenError(ValueError):
    """Text the tokenizer reads as a control token however it is broken by `TOKEN_BREAK`."""


def _control_strings(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The tokenizer's special and added token strings (longest first) that text could spell out.
    One-character tokens are left out: they cannot be broken by an insertion."""
    strings = set(tokenizer.get_added_vocab()) | set(tokenizer.all_special_tokens)
    return sorted((text for text in strings if len(text) > 1), key=len, reverse=True)


@lru_cache(maxsize=65536)
def _fold_char(char: str) -> str:
    """One character NFKC-normalised and case-folded (``＜`` -> ``<``, ``T`` -> ``t``)."""
    return unicodedata.normalize("NFKC", char).casefold()


def fold(text: str) -> tuple[str, list[int] | None]:
    """`text` with each character folded by `_fold_char`, and for each character of the result the
    index in `text` of the character it comes from (None: the same index, as for ASCII text)."""
    if text.isascii():
        return text.lower(), None
    pieces, owners = [], []
    for index, char in enumerate(text):
        folded = _fold_char(char)
        pieces.append(folded)
        owners.extend([index] * len(folded))
    return "".join(pieces), owners


def lookalike_pattern(controls: Sequence[str]) -> re.Pattern[str] | None:
    """A pattern matching the folded form of any of `controls` in folded text (longest first)."""
    folded = sorted({fold(control)[0] for control in controls}, key=len, reverse=True)
    folded = [text for text in folded if len(text) > 1]
    return re.compile("|".join(map(re.escape, folded))) if folded else None


def _insert_breaks(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """`text` with `TOKEN_BREAK` after the first character of each (start, end) span of two or more
    characters; a one-character span is replaced by its folded form, to be broken next round."""
    pieces, last = [], 0
    for start, end in sorted(set(spans)):
        if start < last:
            continue
        if end - start > 1:
            pieces.append(text[last:start + 1] + TOKEN_BREAK)
            last = start + 1
        else:
            pieces.append(text[last:start] + _fold_char(text[start]))
            last = end
    return "".join(pieces) + text[last:]


def break_lookalikes(text: str, pattern: re.Pattern[str] | None) -> str:
    """`text` with every control-token string and look-alike (same folded form) broken by
    `TOKEN_BREAK`, repeated until none is left (a token may overlap itself)."""
    if pattern is None:
        return text
    for _ in range(len(text) + 1):
        folded, owners = fold(text)
        matches = [(match.start(), match.end()) for match in pattern.finditer(folded)]
        if not matches:
            return text
        if owners is not None:
            matches = [(owners[start], owners[end - 1] + 1) for start, end in matches]
        text = _insert_breaks(text, matches)
    raise ControlTokenError("control-token look-alikes could not be broken with a zero-width space")


def control_ids(tokenizer: PreTrainedTokenizerBase, controls: Sequence[str]) -> frozenset[int]:
    """Token ids of `controls` (the unknown-token id left out: plain text can encode to it)."""
    ids = set(tokenizer.convert_tokens_to_ids(list(controls)))
    return frozenset(ids - {tokenizer.unk_token_id, None})


def control_spans(
    tokenizer: PreTrainedTokenizerBase, ids: frozenset[int], text: str
) -> list[tuple[int, int]]:
    """(start, end) in `text` of each token the tokenizer encodes `text` to whose id is in `ids`;
    a tokenizer without offsets (not a fast one) gives (0, len(text)) when there is one."""
    if not tokenizer.is_fast:
        found = set(tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))) & ids
        return [(0, len(text))] if found else []
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [tuple(offsets) for token, offsets in zip(encoding["input_ids"], encoding["offset_mapping"])
            if token in ids]


def break_encoded_controls(tokenizer: PreTrainedTokenizerBase, ids: frozenset[int], text: str) -> str:
    """`text` with what the tokenizer still reads as a control token broken where its offsets
    point; `ControlTokenError` when it still does after `MAX_BREAK_ROUNDS` rounds."""
    if not ids:
        return text
    for _ in range(MAX_BREAK_ROUNDS):
        spans = control_spans(tokenizer, ids, text)
        if not spans:
            return text
        if not tokenizer.is_fast:
            break
        text = _insert_breaks(text, spans)
    spans = control_spans(tokenizer, ids, text)
    if spans:
        start, end = spans[0]
        read = text[start:end].replace(TOKEN_BREAK, "")
        raise ControlTokenError(
            f"the tokenizer reads {read!r} in message text as a control token even with "
            "zero-width spaces inserted, so text from tools could forge chat turns"
        )
    return text


def token_variants(control: str) -> list[str]:
    """Spellings of `control` that a normalising tokenizer may read as it: as it is, upper-,
    lower- and title-case, and in fullwidth forms (all of it, or its ASCII punctuation only)."""
    punctuation = str.maketrans({char: char.translate(_FULLWIDTH) for char in control
                                 if char.isascii() and not char.isalnum()})
    variants = [control, control.upper(), control.lower(), control.title(),
                control.translate(_FULLWIDTH), control.translate(punctuation)]
    return list(dict.fromkeys(variants))
