"""Text from results files made safe to print on a terminal: control characters (ESC, BEL, a
carriage return, ...) could otherwise set the window title, clear the screen or hide the line."""

from __future__ import annotations

import unicodedata


def printable(text: str) -> str:
    """`text` with every control or format character except a tab or a newline shown as its
    escape (``\\x1b``, ``\\u202e``), so printing it cannot drive the terminal."""
    return "".join(
        char if char in "\t\n" or unicodedata.category(char) not in ("Cc", "Cf") else repr(char)[1:-1]
        for char in text
    )
