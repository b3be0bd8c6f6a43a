"""Load the draft/target pair of a study: the tiny random pair (name ``tiny``, for the `smoke`
profile and tests) or any pair `hf_securesd.models.load_pair` resolves (registry names, Hub ids,
local folders)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

import hf_securesd
from hf_securesd.bench import json_input
from hf_securesd.bench.profiles import TINY
from hf_securesd.paths import path_kind, too_long_path

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# A folder transformers loads as a model holds one of these: a model's config, or a PEFT adapter's
MODEL_FOLDER_MARKERS = ("config.json", "adapter_config.json")


@dataclass
class StudyModels:
    """The tokenizer (the target's), the draft, the wrapped target, and what they are (`ids`:
    role -> {"name", "id", "location", "source"}) for the report."""

    tokenizer: PreTrainedTokenizerBase
    draft: PreTrainedModel
    target: PreTrainedModel
    ids: dict[str, dict[str, Any]] = field(default_factory=dict)


def looks_like_path(value: str) -> bool:
    """Whether a --target/--draft value that names nothing here can only be a local path, not a registry
    name or Hub id: absolute, or starting with ``./``, ``../`` or ``~`` (``org/name`` is a Hub id, as
    transformers reads it, even where an ``org`` folder exists)."""
    if os.path.isabs(value) or value in (os.curdir, os.pardir):
        return True
    return value.startswith(("~", f"{os.curdir}{os.sep}", f"{os.pardir}{os.sep}"))


def model_folder_problem(flag: str, value: str) -> str | None:
    """Why `value` (of option `flag`) cannot be the model it names, or None: a path that does not exist
    (`looks_like_path`), is too long, is a file, or is a folder without a config.json (what is found
    here is loaded before any registry name or Hub id, see `hf_securesd.models.resolve_model`)."""
    if value == TINY:
        return None
    fix = "give the folder save_pretrained wrote (holding config.json), a registry name or a Hub id"
    kind = path_kind(Path(value).expanduser())
    if kind == "too long":
        return too_long_path(flag, Path(value))
    if kind == "missing":
        return f"{flag} {value}: no such folder; give a model folder or a Hub id" if looks_like_path(value) else None
    if kind == "file":
        return f"{flag} {value} is a file, not a model folder; {fix}"
    folder = Path(value).expanduser()
    if not any((folder / name).is_file() for name in MODEL_FOLDER_MARKERS):
        return f"{flag} {value}: the folder holds no model (no config.json); {fix}"
    return None


def check_model_folders(models: dict[str, str]) -> None:
    """Refuse, before anything is loaded, a model option (flag -> value) whose value cannot be the model
    (`model_folder_problem`): one line naming the option, the problem and the fix."""
    for flag, value in models.items():
        problem = model_folder_problem(flag, value)
        if problem:
            raise ValueError(problem)


def _describe(name: str, location: str) -> dict[str, Any]:
    """Registry key, Hub id and the offline copy's recorded source, when known."""
    from hf_securesd.models import lookup

    spec = lookup(name)
    described: dict[str, Any] = {"name": name, "id": spec.hub_id if spec else name, "location": location}
    source = Path(location) / "securesd_source.json"
    if source.is_file():
        try:
            described["source"] = json_input.loads(source.read_bytes())
        except json.JSONDecodeError as error:
            raise ValueError(f"{source} is not readable JSON ({error}); delete it or fetch the model again "
                             "(`securesd models fetch`)") from None
    return described


def _left_padding(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_study_models(
    target: str,
    draft: str,
    *,
    device: str = "cpu",
    dtype: str = "bf16",
    offline: bool | None = None,
    cache_dir: str | None = None,
) -> StudyModels:
    """Load the pair in eval mode on `device` in `dtype` and wrap the target for SecureSD. The
    tokenizer pads on the left (batched generation), with eos as pad when it has no pad token."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if (target == TINY) != (draft == TINY):
        raise ValueError(
            f"--target and --draft must both be {TINY!r} (the tiny random pair) or both real models"
        )
    if target == TINY:
        from hf_securesd.tiny import TinyPairSpec, byte_tokenizer, tiny_pair

        spec = TinyPairSpec()
        draft_model, target_model = tiny_pair(spec)
        draft_model, target_model = (
            model.to(device=device, dtype=DTYPES[dtype]) for model in (draft_model, target_model)
        )
        tokenizer = byte_tokenizer()
        description = f"tiny random {spec.architecture} pair ({spec})"
        ids = {
            role: {"name": TINY, "id": f"{description}, {role}", "location": "hf_securesd.tiny"}
            for role in ("target", "draft")
        }
        return StudyModels(_left_padding(tokenizer), draft_model, hf_securesd.wrap(target_model), ids)
    from hf_securesd.models import load_pair, resolve_model

    tokenizer, draft_model, target_model = load_pair(
        draft, target, dtype=dtype, device=device, offline=offline, cache_dir=cache_dir
    )
    ids = {
        role: _describe(name, resolve_model(name, offline=offline, cache_dir=cache_dir, download=False))
        for role, name in (("target", target), ("draft", draft))
    }
    return StudyModels(_left_padding(tokenizer), draft_model, hf_securesd.wrap(target_model), ids)
