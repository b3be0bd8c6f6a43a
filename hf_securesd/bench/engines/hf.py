"""The ``hf`` engine: greedy `generate` in this process on the loaded pair (the target wrapped for
SecureSD), one `generate` call per batch, left-padded.

Prompts are encoded without extra special tokens (the chat template has them): input_ids and
attention_mask [B, P]. Speculative runs return each row's `SpeculativeStats`.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from hf_securesd.bench.engines import register_engine
from hf_securesd.bench.engines.base import Answer, Engine, EngineError, Generation, Prompt
from hf_securesd.bench.loading import StudyModels
from hf_securesd.bench.plan import DRAFT, LOSSLESS, TARGET, RunConfig


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trim(tokens: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """Drop the padding after a finished row: tokens [N] -> [n <= N]."""
    if pad_token_id is None:
        return tokens
    kept = (tokens != pad_token_id).nonzero()
    return tokens[: int(kept[-1]) + 1] if kept.numel() else tokens[:0]


@register_engine("hf")
class HFEngine(Engine):
    """`generate` on `models` (see `hf_securesd.bench.loading.load_study_models`)."""

    def __init__(self, models: StudyModels) -> None:
        self.models = models

    @property
    def tokenizer(self) -> Any:
        return self.models.tokenizer

    def check_configs(self, configs: Sequence[RunConfig]) -> None:
        endpoints = [config.key for config in configs if config.kind == "endpoint"]
        if endpoints:
            raise EngineError(
                f"the hf engine runs models in this process, not endpoints ({endpoints[0]}); "
                "use --engine openai for --endpoint"
            )

    def describe(self) -> dict[str, Any]:
        import transformers

        return {"engine": self.name, "engine_version": transformers.__version__, "models": self.models.ids}

    def generate(
        self, config: RunConfig, prompts: Sequence[Prompt], max_new_tokens: int, num_assistant_tokens: int
    ) -> list[Answer]:
        models = self.models
        model = models.draft if config.kind == "draft" else models.target
        texts = [prompt.text for prompt in prompts]
        inputs = models.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            model.device
        )
        options: dict[str, Any] = dict(
            do_sample=False, max_new_tokens=max_new_tokens, return_dict_in_generate=True
        )
        if config.kind == "speculative":
            options.update(
                assistant_model=models.draft,
                verifier=config.verifier,
                secure_schedule=config.schedule,
                num_assistant_tokens=num_assistant_tokens,
            )
        _synchronize(model.device)
        start, cpu_start = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            out = model.generate(**inputs, **options)
        _synchronize(model.device)
        seconds = (time.perf_counter() - start) / len(prompts)
        cpu_seconds = (time.process_time() - cpu_start) / len(prompts)
        prompt_length = inputs["input_ids"].shape[1]
        row_stats = getattr(out, "speculative_stats_per_row", None) if config.kind == "speculative" else None
        if config.kind == "speculative" and row_stats is None:
            row_stats = [out.speculative_stats]
        answers: list[Answer] = []
        for row in range(len(prompts)):
            new_tokens = _trim(out.sequences[row, prompt_length:], models.tokenizer.pad_token_id)
            stats = None if row_stats is None else row_stats[row]
            answers.append(
                Generation(
                    models.tokenizer.decode(new_tokens, skip_special_tokens=True),
                    stats.new_tokens if stats is not None else int(new_tokens.numel()),
                    seconds,
                    stats,
                    cpu_seconds,
                )
            )
        return answers

    def warm_up(self, prompt: Prompt, configs: Sequence[RunConfig], num_assistant_tokens: int) -> None:
        for config in (TARGET, DRAFT, LOSSLESS):
            self.generate(config, [prompt], 2, num_assistant_tokens)
