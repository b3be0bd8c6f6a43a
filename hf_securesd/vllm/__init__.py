"""SecureSD inside vLLM: every verifier and schedule of this package in `vllm serve` and `LLM(...)`.

Installed with `pip install "hf-securesd[vllm]"`, vLLM loads `register` in each of its processes
through the `vllm.general_plugins` entry point. A request selects SecureSD per request:

```python
>>> from vllm import LLM, SamplingParams
>>> llm = LLM(model=target, speculative_config={"method": "draft_model", "model": draft,
...                                             "num_speculative_tokens": 5})
>>> llm.generate(prompts, SamplingParams(max_tokens=64, extra_args={"securesd": {
...     "verifier": {"verifier": "mars", "theta": 0.5}, "secure_schedule": {"schedule": "step", "L": 1}}}))
```

Over HTTP the same object travels as a JSON string in `vllm_xargs` (see `request`), and
`SECURESD_VLLM_DEFAULT` sets a server-wide default. Requests that ask for nothing run vLLM's own
sampler untouched. Verification goes through the shared rules (`verifiers/`, `mixing.py`,
`schedules.py`); this subpackage only adapts vLLM's tensors to them (`sampler`), records the draft
logits (`drafting`), hooks the runner (`verification`), and checks requests on admission (`admission`).

Nothing changes in vLLM until the operator opts in with `SECURESD_VLLM=1` (or sets
`SECURESD_VLLM_DEFAULT`): without it a SecureSD request is refused with how to enable the plugin and
everything else runs as without this package (`compat`). With it, the plugin first checks every vLLM
symbol it patches or reads (`features`); if one does not match, SecureSD requests are refused naming
it, and nothing is patched.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from .compat import OPT_IN_ENV, opt_in
from .features import SUPPORTED_RELEASES
from .request import DEFAULT_ENV, EXTRA_ARGS_KEY, SecureSDRequest, parse_request, server_default
from .stats import speculative_stats

logger = logging.getLogger(__name__)
_undo: list[Callable[[], None]] = []
_uninstalled_refusal: list[Callable[[], None]] = []  # what `uninstall()` left in place of the patches
_enabled: list[bool] = []  # [True] once the operator's opt-in reached `register()` in this process
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
UNINSTALLED_MESSAGE = (
    "hf-securesd's vLLM plugin was uninstalled in this process (hf_securesd.vllm.uninstall()), so this request, "
    "which asks for SecureSD, would run as plain vLLM; call hf_securesd.vllm.register() to serve it, or send it "
    'without the "securesd" key'
)


def register() -> None:
    """Entry point of vLLM's `vllm.general_plugins` group. Runs once per process and never raises.

    Without the opt-in (`SECURESD_VLLM=1` or `SECURESD_VLLM_DEFAULT`) it only makes SecureSD requests
    fail validation with how to enable the plugin. With it, and when every symbol in
    `features.REQUIRED` matches, it selects the V1 model runner (unless `VLLM_USE_V2_MODEL_RUNNER` is
    set), installs the patches and logs one WARNING line saying so. On a mismatch, or if patching
    fails, SecureSD requests are refused with the reason and plain requests are served as usual.
    After `uninstall()` it lifts the refusal that left and registers again."""
    _lift_uninstalled_refusal()
    if _undo:
        return
    import vllm
    from vllm.sampling_params import SamplingParams

    from .compat import patch_http_refusal, patch_refusal
    from .features import check_installed, mismatch_message

    enabled, message = opt_in(os.environ)
    if not enabled:
        logger.debug("hf-securesd: vLLM plugin not enabled (%s); nothing patched", OPT_IN_ENV)
        _undo.append(patch_refusal(SamplingParams, message, include_default=False))
        _undo.append(patch_http_refusal(message, include_default=False))
        return
    _enabled[:] = [True]
    mismatches = check_installed()
    if mismatches:
        message = mismatch_message(vllm.__version__, mismatches)
    else:
        try:
            changes = _install()
            logger.warning("hf-securesd vLLM plugin enabled: %s", changes)
            _check_server_default()
            return
        except Exception as error:  # noqa: BLE001 - any failure must leave vLLM serving plain requests
            _undo_patches()
            message = f"hf-securesd's vLLM plugin could not install on vllm {vllm.__version__}: {error!r}"
            logger.exception(message)
    logger.error(message)
    _undo.append(patch_refusal(SamplingParams, message))
    _undo.append(patch_http_refusal(message))


def _install() -> str:
    """Select the V1 model runner and patch it (the V2 runner, vLLM's GPU default, is not patched);
    returns what was changed, for the log."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from .admission import patch_admission
    from .drafting import patch_proposer
    from .verification import patch_rejection_module, patch_runner

    if RUNNER_ENV in os.environ:
        value = os.environ[RUNNER_ENV]
        runner = (
            f"{RUNNER_ENV}=0 already set (the V1 runner, which SecureSD patches)" if value.strip() == "0"
            else f"kept {RUNNER_ENV}={value!r} as set (SecureSD requests need the V1 runner, =0)"
        )
    else:
        os.environ[RUNNER_ENV] = "0"
        _undo.append(lambda: os.environ.pop(RUNNER_ENV, None))
        runner = f"selected vLLM's V1 model runner ({RUNNER_ENV}=0), the runner SecureSD patches"
    _undo.append(patch_admission(InputProcessor, SamplingParams, VLLMValidationError))
    _undo.append(patch_proposer(SpecDecodeBaseProposer, apply_top_k_top_p))
    _undo.append(patch_runner(GPUModelRunner))
    _undo.append(patch_rejection_module(rejection_sampler, apply_top_k_top_p))
    return (
        f"{runner}; patched GPUModelRunner._sample/propose_draft_token_ids, "
        "SpecDecodeBaseProposer._sample_draft_tokens, rejection_sampler.rejection_sample/"
        "apply_sampling_constraints, the bonus Sampler.forward/apply_logits_processors and request "
        "validation; requests without \"securesd\" run vLLM's own code"
    )


def _check_server_default() -> None:
    """Log, once per process, a server-wide default that cannot be parsed (requests then get the error)."""
    from .request import TextBoundaryNeedsTokenizer

    try:
        default = server_default()
    except TextBoundaryNeedsTokenizer:
        logger.info("hf-securesd: the server-wide default's segments boundary is text, resolved with the "
                    "model's tokenizer as each request is admitted (an engine without a tokenizer refuses "
                    "such requests)")
        return
    except ValueError as error:
        logger.error("hf-securesd: %s", error)
        return
    if default is not None:
        logger.info("hf-securesd: server-wide default %s", default.to_dict())


def uninstall(refuse: bool = True) -> None:
    """Undo every patch `register` installed (for embedding processes and tests).

    refuse: when the operator enabled the plugin in this process (its patches installed, or SecureSD
    requests refused for a vLLM it cannot patch), a request that then carries the "securesd" key is
    refused, offline and over HTTP, saying the plugin was uninstalled, instead of running as plain
    vLLM; a second `uninstall()` keeps that, and `register()` lifts it. Requests without the key,
    including those that would inherit the server-wide default, run as plain vLLM. False, or a plugin
    never enabled here, leaves vLLM exactly as without this package, which ignores the "securesd" key
    and serves such requests as plain ones: for measuring vLLM's own code."""
    was_enabled = bool(_enabled) or bool(_uninstalled_refusal)
    _undo_patches()
    _lift_uninstalled_refusal()
    _enabled.clear()
    if not (refuse and was_enabled):
        return
    try:
        from vllm.sampling_params import SamplingParams
    except ImportError:  # no vLLM in this process: no request to refuse
        return
    from .compat import patch_http_refusal, patch_refusal

    _uninstalled_refusal.append(patch_refusal(SamplingParams, UNINSTALLED_MESSAGE, include_default=False))
    _uninstalled_refusal.append(patch_http_refusal(UNINSTALLED_MESSAGE, include_default=False))


def _undo_patches() -> None:
    while _undo:
        _undo.pop()()


def _lift_uninstalled_refusal() -> None:
    while _uninstalled_refusal:
        _uninstalled_refusal.pop()()


__all__ = [
    "register",
    "uninstall",
    "speculative_stats",
    "SecureSDRequest",
    "parse_request",
    "SUPPORTED_RELEASES",
    "OPT_IN_ENV",
    "DEFAULT_ENV",
    "EXTRA_ARGS_KEY",
]
