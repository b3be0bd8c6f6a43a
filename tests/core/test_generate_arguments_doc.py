"""docs/generate_arguments.md says what happens to every argument of `generate()` and every
`GenerationConfig` field with a verifier: a field transformers adds cannot go unmentioned."""

from __future__ import annotations

import inspect
from pathlib import Path

from transformers import GenerationConfig, GenerationMixin

DOC = Path(__file__).resolve().parents[2] / "docs" / "generate_arguments.md"


def test_every_generation_config_field_is_documented():
    text = DOC.read_text()
    fields = [name for name in GenerationConfig().to_dict() if not name.startswith("_")]
    assert [name for name in fields if f"`{name}`" not in text] == []


def test_every_generate_parameter_is_documented():
    text = DOC.read_text()
    parameters = inspect.signature(GenerationMixin.generate).parameters
    named = [name for name, parameter in parameters.items() if name != "self" and parameter.kind is not parameter.VAR_KEYWORD]
    assert [name for name in named if f"`{name}`" not in text] == []
