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
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from .compat import SUPPORTED_VLLM, unsupported_version_message
from .request import DEFAULT_ENV, EXTRA_ARGS_KEY, SecureSDRequest, parse_request, server_default
from .stats import speculative_stats

logger = logging.getLogger(__name__)
_undo: list[Callable[[], None]] = []


def register() -> None:
    """Entry point of vLLM's `vllm.general_plugins` group. Runs once per process and never raises:
    on an unsupported vLLM, or if patching fails, SecureSD requests are refused with a clear error
    and plain requests are served as usual."""
    if _undo:
        return
    import vllm
    from vllm.sampling_params import SamplingParams

    from .compat import patch_refusal

    message = unsupported_version_message(vllm.__version__)
    if message is None:
        try:
            _install()
            _check_server_default()
            return
        except Exception as error:  # noqa: BLE001 - any failure must leave vLLM serving plain requests
            uninstall()
            message = f"hf-securesd's vLLM plugin could not install on vllm {vllm.__version__}: {error!r}"
            logger.exception(message)
    logger.error(message)
    _undo.append(patch_refusal(SamplingParams, message))


def _install() -> None:
    """Patch vLLM 0.32's V1 model runner path. The V2 runner (vLLM's GPU default where Triton exists)
    is not patched: the plugin selects the V1 runner unless VLLM_USE_V2_MODEL_RUNNER is set."""
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

    if "VLLM_USE_V2_MODEL_RUNNER" not in os.environ:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        logger.info("hf-securesd: selecting vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0), the runner SecureSD patches")
    _undo.append(patch_admission(InputProcessor, SamplingParams, VLLMValidationError))
    _undo.append(patch_proposer(SpecDecodeBaseProposer, apply_top_k_top_p))
    _undo.append(patch_runner(GPUModelRunner))
    _undo.append(patch_rejection_module(rejection_sampler, apply_top_k_top_p))


def _check_server_default() -> None:
    """Log, once per process, a server-wide default that cannot be parsed (requests then get the error)."""
    try:
        default = server_default()
    except ValueError as error:
        logger.error("hf-securesd: %s", error)
        return
    if default is not None:
        logger.info("hf-securesd: server-wide default %s", default.to_dict())


def uninstall() -> None:
    """Undo every patch `register` installed (for tests and for embedding processes)."""
    while _undo:
        _undo.pop()()


__all__ = [
    "register",
    "uninstall",
    "speculative_stats",
    "SecureSDRequest",
    "parse_request",
    "SUPPORTED_VLLM",
    "DEFAULT_ENV",
    "EXTRA_ARGS_KEY",
]
