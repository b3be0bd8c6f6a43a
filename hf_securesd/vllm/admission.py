"""Admission: reject a SecureSD request the engine cannot run before it reaches the engine.

Runs where vLLM validates every request (`InputProcessor._validate_params`, in the front-end process),
so the error comes back as vLLM's own validation error: HTTP 400 from the server, an exception from
`LLM.generate`, and the engine keeps serving everything else.
"""

from __future__ import annotations

from typing import Any, Callable

from ..validation import SecureSDConfigError
from .request import request_for


def check_request(params: Any, vllm_config: Any) -> None:
    """Raise SecureSDConfigError when `params` (SamplingParams) asks for SecureSD that `vllm_config`
    cannot give; return quietly for plain requests and for SecureSD requests it can run."""
    request = request_for(getattr(params, "extra_args", None))
    if request is None:
        return
    speculative = vllm_config.speculative_config
    if speculative is None:
        raise SecureSDConfigError(
            "this request asks for SecureSD verification but the engine runs without speculative decoding; "
            "start it with --speculative-config '{\"method\": \"draft_model\", \"model\": \"<draft>\", "
            "\"num_speculative_tokens\": 5}' (or send the request without \"securesd\")"
        )
    if not speculative.uses_draft_model():
        raise SecureSDConfigError(
            f"SecureSD verification needs a draft model's logits, but the engine drafts with method "
            f"{speculative.method!r}; start it with --speculative-config '{{\"method\": \"draft_model\", ...}}'"
        )
    if getattr(speculative, "use_heterogeneous_vocab", False):
        raise SecureSDConfigError(
            "SecureSD verification compares both models token by token and needs a draft with the target's "
            "vocabulary; this engine uses use_heterogeneous_vocab"
        )
    if getattr(speculative, "rejection_sample_method", "standard") != "standard":
        raise SecureSDConfigError(
            f"SecureSD verification replaces standard rejection sampling; this engine uses "
            f"rejection_sample_method={speculative.rejection_sample_method!r}"
        )
    if vllm_config.use_v2_model_runner:
        raise SecureSDConfigError(
            "SecureSD verification runs on vLLM's GPUModelRunner (the V1 runner); this engine uses Model Runner V2. "
            "Start it with VLLM_USE_V2_MODEL_RUNNER=0 (the plugin sets this when the variable is unset)"
        )
    try:
        request.verifier.check_draft_length(speculative.num_speculative_tokens)
    except ValueError as error:
        raise SecureSDConfigError(
            f"{error} (k is the engine's num_speculative_tokens here)"
        ) from None


def patch_admission(
    input_processor_class: type, sampling_params_class: type, error_class: type[Exception]
) -> Callable[[], None]:
    """Wrap `input_processor_class._validate_params` so SecureSD errors in a `sampling_params_class`
    request surface as `error_class` (vLLM's validation error); returns a function that undoes it."""
    original = input_processor_class._validate_params

    def _validate_params(self, params: Any, *args: Any, **kwargs: Any):
        result = original(self, params, *args, **kwargs)
        if isinstance(params, sampling_params_class):
            try:
                check_request(params, self.vllm_config)
            except SecureSDConfigError as error:
                raise error_class(str(error), parameter="extra_args.securesd") from None
        return result

    input_processor_class._validate_params = _validate_params

    def undo() -> None:
        input_processor_class._validate_params = original

    return undo
