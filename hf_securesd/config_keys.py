"""Misspelt SecureSD keys in a generation config.

A `GenerationConfig` keeps a key it does not know as an attribute without a word, so a saved
generation_config.json holding ``"secure-schedule"`` or ``"secureSchedule"`` would decode with the
relaxed verifier and no lossless prefix at all: the unsafe direction. A key that is not one of
transformers' own fields and spells one of SecureSD's fields another way (`spelling.nearly`: case,
separators, fullwidth or look-alike letters, a close misspelling such as a plural or a dropped letter)
is refused by the `generate` calls that run SecureSD.
"""

from __future__ import annotations

from typing import Iterable

from transformers import GenerationConfig

from .spelling import nearly
from .validation import SecureSDConfigError

SECURESD_FIELDS = ("verifier", "secure_schedule", "output_deviation")
_STANDARD_KEYS = frozenset(vars(GenerationConfig()))


def misspelt_fields(keys: Iterable[str]) -> list[tuple[str, str]]:
    """(key, the SecureSD field it misspells) for each of `keys` that is neither a SecureSD field nor
    one of transformers' own generation fields (nor private, ``_...``), and spells a SecureSD field
    another way."""
    found = []
    for key in keys:
        if not isinstance(key, str) or key in SECURESD_FIELDS or key in _STANDARD_KEYS or key.startswith("_"):
            continue
        field = next((field for field in SECURESD_FIELDS if nearly(key, field)), None)
        if field is not None:
            found.append((key, field))
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
