"""Small helpers shared by the task scorers."""

from __future__ import annotations

import re
import unicodedata
from typing import Sequence

from hf_securesd.judges.refusal_prefix import normalize_text as fold_for_judging

# Cyrillic, Greek and Armenian letters drawn like the Latin letters of the prompt-injection answer
# labels (yes, no, not, equivalent, entailment: a e i l m n o q s t u v y), mapped to those letters.
# Only look-alikes of these letters are listed: the answers are short ASCII words, and a model
# told to spell one with look-alikes still gives that answer.
_CONFUSABLES = str.maketrans({
    "\u0430": "a", "\u0410": "A", "\u03b1": "a", "\u0391": "A",  # а А α Α
    "\u0435": "e", "\u0415": "E", "\u0395": "E",  # е Е Ε
    "\u0456": "i", "\u0406": "I", "\u03b9": "i", "\u0399": "I", "\u0131": "i",  # і І ι Ι ı
    "\u04cf": "l", "\u04c0": "l",  # ӏ Ӏ (palochka)
    "\u041c": "M", "\u039c": "M",  # М Μ
    "\u039d": "N", "\u0578": "n",  # Ν ո
    "\u043e": "o", "\u041e": "O", "\u03bf": "o", "\u039f": "O", "\u0585": "o",  # о О ο Ο օ
    "\u051b": "q",  # ԛ
    "\u0455": "s", "\u0405": "S",  # ѕ Ѕ
    "\u0422": "T", "\u03a4": "T",  # Т Τ
    "\u057d": "u", "\u03c5": "u",  # ս υ
    "\u03bd": "v", "\u0475": "v", "\u0474": "V",  # ν ѵ Ѵ
    "\u0443": "y", "\u0423": "Y", "\u04af": "y", "\u04ae": "Y", "\u03a5": "Y",  # у У ү Ү Υ
})
_NOT_ASCII_ALNUM = re.compile(r"[^0-9a-z]+")


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean of a non-empty sequence."""
    return float(sum(values)) / len(values)


def normalize_text(text: str) -> str:
    """Lower-case `text`, turn every run of non-alphanumeric characters into one space and strip:
    the form used to compare prompts (no Unicode folding, so that the draw of prompts stays as it
    is); model text is compared with `normalize_answer_text` instead."""
    return _NOT_ASCII_ALNUM.sub(" ", text.lower()).strip()


def _drop_marks(text: str) -> str:
    """`text` decomposed (NFKD) without its combining marks: accents are dropped, "yés" -> "yes"."""
    return "".join(char for char in unicodedata.normalize("NFKD", text) if not unicodedata.combining(char))


def normalize_answer_text(text: str) -> str:
    """`text` folded to the ASCII words a reader sees in it, for finding an answer in model-written
    text: compatibility forms to their plain letters (NFKD: fullwidth ``ｙｅｓ``, math bold),
    accents dropped (``yés``), the look-alikes of `_CONFUSABLES` to Latin letters (Cyrillic
    ``yеs``), then the refusal judge's fold (`hf_securesd.judges.refusal_prefix.normalize_text`:
    NFKC, invisible characters such as ``y\\u200bes`` removed, case folded), and last
    `normalize_text` (every run of characters other than ASCII letters and digits to one space).
    Plain ASCII text gives exactly `normalize_text`."""
    if text.isascii():
        return normalize_text(text)
    folded = fold_for_judging(_drop_marks(text).translate(_CONFUSABLES))
    return normalize_text(folded)
