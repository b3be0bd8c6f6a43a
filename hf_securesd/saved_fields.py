"""SecureSD's fields of a saved generation config, put back where transformers dropped them on load.

A generation_config.json marked `"_from_model_config": true` (most Hub checkpoints) is loaded without its
non-standard keys, `verifier` and `secure_schedule` among them. transformers does not record which file
it read (nor the revision), so the file is found again from the model's `name_or_path`:

* a local folder: its generation_config.json;
* a Hub repository: the generation_config.json of every revision in the local Hub cache
  (`huggingface_hub`'s cache folder), since any of them may be the one loaded.

Only files whose standard fields are those of the loaded config (transformers' hash of the config it
loaded) can be the one loaded. Their SecureSD fields are restored when they all agree; when they differ
(two revisions alike but for the verifier), nothing is restored and a warning names the files, so a
pinned revision never takes another revision's verifier. A file that changed since the load is not
taken either (a warning says so).
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any

from huggingface_hub import constants as hub_constants
from huggingface_hub.file_download import repo_folder_name
from transformers import GenerationConfig, PreTrainedModel
from transformers.utils import GENERATION_CONFIG_NAME

from .config_keys import misspelt_fields

CONFIG_FIELDS = ("verifier", "secure_schedule", "output_deviation")  # SecureSD's GenerationConfig fields
logger = logging.getLogger(__name__)


def restore_saved_fields(model: PreTrainedModel) -> None:
    """Put back `verifier` / `secure_schedule` (and misspellings of them, so a speculative call refuses
    them) that transformers dropped on load, once per model instance (at `wrap`, or at the first
    `generate` of a patched model); fields already set on the config win, an explicit None included.
    See the module docstring for which file they come from."""
    config = model.generation_config
    if not getattr(config, "_from_model_config", False) or getattr(model, "_securesd_fields_read", False):
        return
    model._securesd_fields_read = True
    source = getattr(model, "name_or_path", "") or ""
    if not source:
        return
    candidates = [(path, saved, _securesd_fields(saved, unset_in=config))
                  for path, saved in _saved_configs(str(source))]
    if not any(fields for _, _, fields in candidates):
        return
    loaded = [(path, fields) for path, saved, fields in candidates if _loaded_from(config, saved)]
    if not loaded:
        path, _, fields = next(candidate for candidate in candidates if candidate[2])
        logger.warning(
            "SecureSD: %s holds %s, but it is not the generation_config.json this model's config was loaded "
            "from (the folder changed since the load); they were not restored. Set them on "
            "model.generation_config (or pass them to generate)", path, " and ".join(fields),
        )
        return
    if any(fields != loaded[0][1] for _, fields in loaded[1:]):
        logger.warning(
            "SecureSD: the generation config of %s may have been loaded from any of %s (revisions alike but for "
            "their SecureSD fields), which hold different SecureSD fields; none were restored. Set them on "
            "model.generation_config (or pass them to generate)", source, ", ".join(path for path, _ in loaded),
        )
        return
    for name, value in loaded[0][1].items():
        setattr(config, name, value)


def _saved_configs(source: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, contents) of every generation_config.json the model may have been loaded from: a local
    folder's, or each cached revision's of a Hub repository (unreadable files are skipped)."""
    if os.path.isdir(source):
        paths = [os.path.join(source, GENERATION_CONFIG_NAME)]
    else:
        try:
            repo = repo_folder_name(repo_id=source, repo_type="model")
        except (TypeError, ValueError):
            return []
        snapshots = os.path.join(hub_constants.HF_HUB_CACHE, repo, "snapshots")
        paths = sorted(glob.glob(os.path.join(glob.escape(snapshots), "*", GENERATION_CONFIG_NAME)))
    found = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                saved = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(saved, dict):
            found.append((path, saved))
    return found


def _securesd_fields(saved: dict[str, Any], unset_in: GenerationConfig) -> dict[str, Any]:
    """The SecureSD fields (and misspellings of them) that a saved generation config sets (not None) and
    `unset_in` does not (a field set on the loaded config, an explicit None included, wins)."""
    names = (*CONFIG_FIELDS, *(key for key, _ in misspelt_fields(saved)))
    return {name: saved[name] for name in names if saved.get(name) is not None and name not in vars(unset_in)}


def _loaded_from(config: GenerationConfig, saved: dict[str, Any]) -> bool:
    """Whether `saved` (a generation_config.json) is, but for SecureSD's fields, the file `config` was
    loaded from: the hash transformers took of the config it loaded equals that of one loaded from it."""
    original = getattr(config, "_original_object_hash", None)
    if original is None:
        return False
    standard = {key: value for key, value in saved.items() if key not in CONFIG_FIELDS}
    try:
        return hash(GenerationConfig.from_dict(standard)) == original
    except (TypeError, ValueError):
        return False
