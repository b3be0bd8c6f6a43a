"""card.json entries other than the card's own are refused with one line naming the entry, the
close match and the valid entries (a misspelt "engines" would otherwise drop its section silently)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hf_securesd.bench.card import CARD_ENTRIES, card_file, read_card_spec
from hf_securesd.bench.results import CorruptResultsError


def _spec(path: Path, spec: dict[str, Any]) -> Path:
    (path / "card.json").write_text(json.dumps(spec), encoding="utf-8")
    return path


@pytest.mark.parametrize("typo, meant", [("engine", "engines"), ("titel", "title"), ("preample", "preamble")])
def test_a_misspelt_entry_is_refused_naming_the_close_match(tmp_path, typo, meant):
    _spec(tmp_path, {"output": "card.md", "title": "T", typo: ["x"]})
    with pytest.raises(CorruptResultsError) as caught:
        read_card_spec(tmp_path)
    message = str(caught.value)
    assert "card.json" in message and f"unknown entry '{typo}'" in message and f'did you mean "{meant}"' in message
    assert all(f'"{key}"' in message for key in CARD_ENTRIES) and "\n" not in message


def test_an_unrelated_entry_is_refused_without_a_guess(tmp_path):
    _spec(tmp_path, {"output": "card.md", "title": "T", "bogus": 1})
    with pytest.raises(CorruptResultsError, match="unknown entry 'bogus'; the entries are") as caught:
        read_card_spec(tmp_path)
    assert "did you mean" not in str(caught.value)


def test_a_control_character_in_an_unknown_entry_is_shown_as_an_escape(tmp_path):
    _spec(tmp_path, {"output": "card.md", "title": "T", "\x1b[2J": 1})
    with pytest.raises(CorruptResultsError) as caught:
        read_card_spec(tmp_path)
    assert "\x1b" not in str(caught.value) and "\\x1b[2J" in str(caught.value)


def test_every_known_entry_is_accepted(tmp_path):
    spec = {"output": "card.md", "title": "T", "preamble": ["p"], "commands": ["securesd report ."],
            "closing": "c", "engines": []}
    assert read_card_spec(_spec(tmp_path, spec)) == spec


def test_card_text_cannot_carry_control_characters(tmp_path):
    _spec(tmp_path, {"output": "card.md", "title": "T\x1b]0;PWNED\x07", "preamble": "p\x1b[2J",
                     "commands": ["securesd report .\x1b[31m"], "closing": ["c\u202e"]})
    path, card = card_file(tmp_path, ["# report", "", "body"])
    assert path == tmp_path / "card.md"
    assert not any(char in card for char in "\x1b\x07\u202e")
    assert card.startswith("# T\\x1b]0;PWNED\\x07\n") and "p\\x1b[2J" in card and "c\\u202e" in card
