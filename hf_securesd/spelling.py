"""Whether a key spells a name another way: any case, separators, fullwidth or look-alike letters, or a
close misspelling. The `generate` integration (misspelt generation-config keys, `config_keys`) and the
vLLM plugin (misspelt request keys, `vllm.request`) refuse such keys instead of ignoring them."""

from __future__ import annotations

import difflib
import unicodedata
from functools import lru_cache

NEAR_RATIO = 0.88  # difflib similarity from which a key counts as a misspelling

# Cyrillic and Greek letters drawn like Latin ones (lower case, after NFKC): "ѕесurеѕd" reads "securesd".
_LOOK_ALIKES = str.maketrans(
    "аеорсухѕіјԁһӏԛԝгԍвмнтκνορτυχαει",
    "aeopcyxsijdhlqwrgbmhtkvoptuxaei",
)


def letters(key: str) -> str:
    """The letters and digits of `key` in lower case, after NFKC (fullwidth "ｓｅｃ" reads "sec") and with
    Cyrillic and Greek look-alikes of Latin letters read as those ("ѕ" Cyrillic dze reads "s")."""
    folded = unicodedata.normalize("NFKC", key).lower().translate(_LOOK_ALIKES)
    return "".join(char for char in folded if char.isalnum())


def nearly(key: str, name: str) -> bool:
    """Whether `key` spells `name` (letters and digits only, any case, compatibility forms such as
    fullwidth letters read as their plain letters) or is a close misspelling of it."""
    target = name.replace("_", "")
    spelt = letters(key)
    if len(spelt) > 2 * len(target):  # cannot reach the ratio (2m / (a + b) with m <= b is then < 2/3)
        return False
    return _near_letters(spelt, target)


@lru_cache(maxsize=256)
def _near_letters(spelt: str, target: str) -> bool:
    """`nearly` on normalised letters (cached: a server sees the same few keys request after request)."""
    return spelt == target or difflib.SequenceMatcher(None, spelt, target).ratio() >= NEAR_RATIO
