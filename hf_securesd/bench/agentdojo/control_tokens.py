"""Control tokens in message text: the tokenizer's special and added token strings that text could
spell out, and how one is broken (a zero-width space after its first character) so the tokenizer
reads it as plain characters. `HFPromptingLLM` applies it to every turn before the chat template."""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

# Inserted after the first character of a control-token string found in a message's text, so the
# tokenizer reads it as plain characters (checked per tokenizer in `HFPromptingLLM.__init__`).
TOKEN_BREAK = "\u200b"  # zero-width space: the text stays readable


def _control_strings(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The tokenizer's special and added token strings (longest first) that text could spell out.
    One-character tokens are left out: they cannot be broken by an insertion."""
    strings = set(tokenizer.get_added_vocab()) | set(tokenizer.all_special_tokens)
    return sorted((text for text in strings if len(text) > 1), key=len, reverse=True)


def _break_token(match: re.Match[str]) -> str:
    """The matched control string with `TOKEN_BREAK` after its first character."""
    return match[0][0] + TOKEN_BREAK + match[0][1:]
