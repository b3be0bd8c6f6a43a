"""When the plugin may change vLLM, and what a SecureSD request gets when it may not.

Installed, the package is loaded into every vLLM process through the `vllm.general_plugins` entry
point. It changes nothing there until the operator opts in: `SECURESD_VLLM=1`, or a server-wide
default in `SECURESD_VLLM_DEFAULT` (`SECURESD_VLLM=0` keeps it off even then). Without the opt-in,
and when this vLLM lacks a symbol the plugin needs (`features`), the only changes are the refusals:
a request that asks for SecureSD fails validation (HTTP 400, or an exception from `LLM.generate`)
with the reason and the fix (`patch_refusal`; where the OpenAI server builds a request's parameters,
a beam search request, whose parameters never carry `vllm_xargs`, and a top-level "securesd" field,
which the server drops: `patch_http_refusal`), and every other request runs vLLM's own code.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping

from ..validation import SecureSDConfigError
from .admission import HTTP_REQUEST_CLASSES, patch_http_requests
from .request import DEFAULT_ENV, EXTRA_ARGS_KEY, looks_like_securesd, parse_request, request_for, spells_securesd

OPT_IN_ENV = "SECURESD_VLLM"


def opt_in(environ: Mapping[str, str]) -> tuple[bool, str | None]:
    """(enabled, why not): whether the operator asked for the plugin in `environ` (os.environ).

    `SECURESD_VLLM=1` enables it, `=0` keeps it off; unset (or empty), a non-empty
    `SECURESD_VLLM_DEFAULT` enables it. Any other value keeps it off and is named in the refusal."""
    value = (environ.get(OPT_IN_ENV) or "").strip()
    if value not in ("", "0", "1"):
        return False, (
            f"{OPT_IN_ENV}={value!r} is not understood, so hf-securesd's vLLM plugin is off in this server; "
            f"set {OPT_IN_ENV}=1 to enable it (or 0 to keep it off), or send the request without \"securesd\""
        )
    if value == "1" or (value == "" and (environ.get(DEFAULT_ENV) or "").strip()):
        return True, None
    if value == "0":
        how = f"start vLLM with {OPT_IN_ENV}=1 (0 keeps it off even with {DEFAULT_ENV} set)"
        return False, (
            f"hf-securesd is installed but its vLLM plugin is off in this server ({OPT_IN_ENV}=0): {how} to serve "
            "\"securesd\" requests, or send the request without \"securesd\""
        )
    return False, (
        f"hf-securesd is installed but its vLLM plugin is off in this server: start vLLM with {OPT_IN_ENV}=1 "
        f"(or a server-wide default in {DEFAULT_ENV}) to serve \"securesd\" requests, or send the request "
        "without \"securesd\""
    )


def asks_for_securesd(extra_args: Mapping[str, Any] | None, include_default: bool) -> bool:
    """Whether a request's `extra_args` select SecureSD (a malformed selection counts as asking, and so
    does "securesd" written otherwise, `spells_securesd`); with `include_default`, a request without the
    key inherits the server-wide default."""
    try:
        if include_default:
            return request_for(extra_args) is not None
        if not extra_args:
            return False
        if any(spells_securesd(key) for key in extra_args):
            return True
        if EXTRA_ARGS_KEY not in extra_args:
            return False
        return parse_request(extra_args[EXTRA_ARGS_KEY]) is not None
    except SecureSDConfigError:
        return True


def patch_refusal(
    sampling_params_class: type, message: str, include_default: bool = True
) -> Callable[[], None]:
    """Make every SamplingParams that asks for SecureSD (with `include_default`, also by inheriting the
    server-wide default) fail with `message` when it is built or validated; returns a function that
    undoes it."""
    original = sampling_params_class._verify_args

    def _verify_args(self: Any, *args: Any, **kwargs: Any):
        result = original(self, *args, **kwargs)
        if asks_for_securesd(getattr(self, "extra_args", None), include_default):
            raise SecureSDConfigError(message)
        return result

    sampling_params_class._verify_args = _verify_args

    def undo() -> None:
        sampling_params_class._verify_args = original

    return undo


def patch_http_refusal(message: str, include_default: bool = True) -> Callable[[], None]:
    """Make the OpenAI request classes (`admission.HTTP_REQUEST_CLASSES`) refuse with `message` what
    `patch_refusal` never sees: a body with a top-level "securesd" field or a close misspelling (which
    vLLM's server drops), and a beam search request that asks for SecureSD in `vllm_xargs` (with
    `include_default`, also by inheriting the server-wide default; beam search builds its own
    parameters without `vllm_xargs`). Only the classes this process has already imported are wrapped:
    the OpenAI server imports them before it loads plugins, and a process that serves no HTTP imports
    nothing for this. Returns a function that undoes it."""

    def top_level(request: Any) -> None:
        if any(key == EXTRA_ARGS_KEY or looks_like_securesd(key) for key in getattr(request, "model_extra", None) or {}):
            raise SecureSDConfigError(message)

    def beam_search(request: Any) -> None:
        top_level(request)
        if asks_for_securesd(getattr(request, "vllm_xargs", None), include_default):
            raise SecureSDConfigError(message)

    imported = [getattr(sys.modules.get(module), name, None) for module, name in HTTP_REQUEST_CLASSES]
    return patch_http_requests(
        [cls for cls in imported if isinstance(cls, type)], _validation_error,
        {"to_sampling_params": top_level, "to_beam_search_params": beam_search},
    )


def _validation_error(message: str, parameter: str) -> Exception:
    """vLLM's validation error (an HTTP 400 naming `parameter`) for `message`, or a SecureSDConfigError
    (a ValueError) where this vLLM's error class does not take the parameter."""
    try:
        from vllm.exceptions import VLLMValidationError

        return VLLMValidationError(message, parameter=parameter)
    except (ImportError, TypeError):
        return SecureSDConfigError(message)
