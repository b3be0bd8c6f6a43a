"""Misspelt SecureSD keys in a generation config.

A `GenerationConfig` keeps a key it does not know as an attribute without a word, so a saved
generation_config.json holding ``"secure-schedule"`` or ``"secureSchedule"`` would decode with the
relaxed verifier and no lossless prefix at all: the unsafe direction. A key that is not one of
transformers' own fields and spells one of SecureSD's fields another way (case, ``-``/``_``, a plural,
a slip of one or two letters) is refused by the `generate` calls that decode speculatively.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable

from transformers import GenerationConfig

from .validation import SecureSDConfigError

SECURESD_FIELDS = ("verifier", "secure_schedule", "output_deviation")
_CLOSE = 0.85  # difflib ratio from which a key reads as a slip of a field's name
_STANDARD_KEYS = frozenset(vars(GenerationConfig()))


def _spelling(key: str) -> str:
    """`key` without case, separators and a trailing plural s."""
    return re.sub(r"[^0-9a-z]", "", key.lower()).removesuffix("s")


_FIELD_SPELLINGS = {_spelling(field): field for field in SECURESD_FIELDS}


def misspelt_fields(keys: Iterable[str]) -> list[tuple[str, str]]:
    """(key, the SecureSD field it misspells) for each of `keys` that is neither a SecureSD field nor
    one of transformers' own generation fields, and spells a SecureSD field another way."""
    found = []
    for key in keys:
        if not isinstance(key, str) or key in SECURESD_FIELDS or key in _STANDARD_KEYS or key.startswith("_"):
            continue
        close = difflib.get_close_matches(_spelling(key), _FIELD_SPELLINGS, n=1, cutoff=_CLOSE)
        if close:
            found.append((key, _FIELD_SPELLINGS[close[0]]))
    return found


def refuse_misspelt_fields(config: GenerationConfig | None, where: str) -> None:
    """Raise SecureSDConfigError naming the first misspelt SecureSD key of `config` (`where` says which
    config it is, e.g. "the model's generation config")."""
    if config is None:
        return
    misspelt = misspelt_fields(vars(config))
    if misspelt:
        key, field = misspelt[0]
        raise SecureSDConfigError(
            f"{where} holds {key!r}, which SecureSD does not read: did you mean {field!r}? Rename the key "
            f"(in generation_config.json for a saved model) or remove it; a misspelt {field} would be "
            "ignored and the call would decode without it"
        )
