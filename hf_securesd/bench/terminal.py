"""Text from results files made safe to print on a terminal (`printable`) or to write into a report
(`readable`): control characters (ESC, BEL, a carriage return, ...) could otherwise set the window
title, clear the screen or hide the line, and bidirectional overrides reorder what a reader sees; on one
line (`printable_line`); and a command's one-line error built from them (`print_error`)."""

from __future__ import annotations

import sys
import unicodedata

from hf_securesd.cli import shorten_long_values


def printable(text: str) -> str:
    """`text` with every control or format character except a tab or a newline shown as its
    escape (``\\x1b``, ``\\u202e``), so printing it cannot drive the terminal."""
    return "".join(
        char if char in "\t\n" or unicodedata.category(char) not in ("Cc", "Cf") else repr(char)[1:-1]
        for char in text
    )


def printable_line(text: str) -> str:
    """`printable`, with line breaks shown as escapes too (``\\n``, and Unicode's line and paragraph
    separators, where some terminals and viewers break; a carriage return already is), so text from a
    results file printed on a line of its own cannot add a forged line after it."""
    return printable(text).replace("\n", "\\n").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


# Unicode's bidirectional embeddings, overrides and isolates (LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI):
# they reorder the text that follows them, so a name could show a reader other characters than it holds.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def readable(text: str) -> str:
    """`text` for a written report, card or figure: control characters (but a tab or a newline) and
    bidirectional controls shown as their escapes; other format characters stay, so that joined emoji,
    soft hyphens and the joiners and direction marks of Arabic, Hebrew, Persian and Indic scripts
    display as written."""
    return "".join(
        repr(char)[1:-1] if char in BIDI_CONTROLS or (char not in "\t\n" and unicodedata.category(char) == "Cc")
        else char
        for char in text
    )


def print_error(message: object) -> None:
    """Print `message` as a command's ``error:`` line on stderr: control characters escaped, line breaks
    included, so it stays one line (it may quote a results file's text), and long echoed values shortened
    (`shorten_long_values`)."""
    print(f"error: {shorten_long_values(printable_line(str(message)))}", file=sys.stderr)
