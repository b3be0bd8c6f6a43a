"""Three routes into `generate`: `wrap(model)` (one instance), `patch()` (every model in the process)
and the `securesd_generate` callable for `custom_generate=`.

`generate()` dispatches through the model's class (`type(self)._assisted_decoding`), so `wrap`
swaps the instance's class for a same-named subclass carrying `SecureSDMixin`; `save_pretrained`
therefore still records the original architecture. Without `verifier=` every route is plain
transformers: the call goes to the original `generate` unchanged.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .decoding import speculative_decode
from .draft_length import DraftLength, resolve_draft_length
from .stats import SpeculativeStats
from .validation import check_models, check_options, resolve_request

_ORIGINAL_GENERATE = GenerationMixin.generate
_ORIGINAL_ASSISTED_DECODING = GenerationMixin._assisted_decoding
_GENERATE_SIGNATURE = inspect.signature(_ORIGINAL_GENERATE)
_CONFIG_FIELDS = ("verifier", "secure_schedule", "output_deviation")
_CHECKED_OPTIONS = (
    "prompt_lookup_num_tokens",
    "output_scores",
    "output_logits",
    "num_beams",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
)


@dataclass
class SecureSDGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus speculative statistics: `speculative_stats` (all rows merged)
    and `speculative_stats_per_row` (one `SpeculativeStats` per batch row)."""

    speculative_stats: SpeculativeStats | None = None
    speculative_stats_per_row: list[SpeculativeStats] | None = None


def _effective(name: str, arguments: dict[str, Any], generation_config: GenerationConfig | None, model) -> Any:
    """The value generate() will use for `name`: explicit kwarg > passed config > model's config."""
    if name in arguments:
        return arguments[name]
    for config in (generation_config, model.generation_config):
        if config is not None and getattr(config, name, None) is not None:
            return getattr(config, name)
    return None


def _prepare_call(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Validate a generate() call that uses a verifier and fill in resolved objects and k.

    Returns (args, kwargs) for the original generate; without a verifier they come back untouched
    (minus explicit `verifier=None` / `secure_schedule=None`)."""
    bound = _GENERATE_SIGNATURE.bind(model, *args, **kwargs)
    arguments = {**bound.arguments, **bound.arguments.get("kwargs", {})}
    generation_config = arguments.get("generation_config")
    verifier = _effective("verifier", arguments, generation_config, model)
    schedule = _effective("secure_schedule", arguments, generation_config, model)
    if verifier is None and schedule is None:
        return args, {key: value for key, value in kwargs.items() if key not in _CONFIG_FIELDS}
    draft_length = resolve_draft_length(arguments, generation_config, getattr(arguments.get("assistant_model"), "generation_config", None))
    resolved, schedule, k = resolve_request(verifier, schedule, draft_length.num_tokens)
    check_models(model, arguments.get("assistant_model"))
    options = {name: _effective(name, arguments, generation_config, model) for name in _CHECKED_OPTIONS}
    options.update({name: arguments.get(name) for name in ("tokenizer", "assistant_tokenizer", "streamer")})
    inputs = arguments.get("inputs", arguments.get("input_ids"))
    check_options(options, inputs if isinstance(inputs, torch.Tensor) else None)
    resolved_fields = {
        "verifier": resolved,
        "secure_schedule": schedule,
        "output_deviation": _effective("output_deviation", arguments, generation_config, model),
        **draft_length.generation_fields(),
    }
    if generation_config is None:
        return args, {**kwargs, **resolved_fields}
    # A config object was passed: resolve inside a copy of it (HF warns when configs and kwargs mix).
    generation_config = copy.deepcopy(generation_config)
    for name, value in resolved_fields.items():
        setattr(generation_config, name, value)
    bound.arguments["generation_config"] = generation_config
    for name in resolved_fields:
        bound.arguments.get("kwargs", {}).pop(name, None)
    return bound.args[1:], bound.kwargs


def _as_int(token: torch.Tensor | int | None) -> int | None:
    if token is None:
        return None
    return int(token.reshape(-1)[0]) if isinstance(token, torch.Tensor) else int(token)


def _run_speculative(
    model: PreTrainedModel,
    draft: PreTrainedModel,
    input_ids: torch.Tensor,
    logits_processor,
    stopping_criteria,
    generation_config: GenerationConfig,
    streamer,
    model_kwargs: dict[str, Any],
) -> SecureSDGenerateOutput | torch.Tensor:
    """Run our loop with the prepared inputs of `generate` and shape the result like HF's."""
    unsupported = {
        key
        for key, value in model_kwargs.items()
        if value is not None and key not in ("attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep")
    }
    if unsupported:
        raise ValueError(
            f"model inputs {sorted(unsupported)} are not supported with verifier=; "
            "speculative decoding here takes input_ids and attention_mask"
        )
    return_dict = generation_config.return_dict_in_generate
    result = speculative_decode(
        model,
        draft,
        input_ids,
        verifier=generation_config.verifier,
        schedule=generation_config.secure_schedule,
        draft_length=DraftLength.from_generation_config(generation_config),
        do_sample=bool(generation_config.do_sample),
        max_length=generation_config.max_length,
        eos_token_id=getattr(generation_config, "_eos_token_tensor", None),
        pad_token_id=_as_int(getattr(generation_config, "_pad_token_tensor", None)),
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        attention_mask=model_kwargs.get("attention_mask"),
        target_cache=model_kwargs.get("cache", model_kwargs.get("past_key_values")),
        streamer=streamer,
        # Exact TV deviation: closed form at T = 0; at T > 0 a vocabulary-wide pass per round, so opt-in.
        collect_deviation=bool(return_dict)
        and (not generation_config.do_sample or bool(getattr(generation_config, "output_deviation", None))),
        output_scores=bool(return_dict and generation_config.output_scores),
        output_logits=bool(return_dict and generation_config.output_logits),
    )
    if not return_dict:
        return result.sequences
    return SecureSDGenerateOutput(
        sequences=result.sequences,
        scores=result.scores,
        logits=result.raw_logits,
        cache=result.cache,
        speculative_stats=SpeculativeStats.merge(result.row_stats),
        speculative_stats_per_row=result.row_stats,
    )


def _assisted_decoding(
    self: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    inputs_tensor=None,
    assistant_model: PreTrainedModel | None = None,
    assistant_tokenizer=None,
    tokenizer=None,
    **model_kwargs,
):
    """HF's assisted decoding unless the generation config carries a verifier."""
    if getattr(generation_config, "verifier", None) is None:
        return _ORIGINAL_ASSISTED_DECODING(
            self,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            inputs_tensor=inputs_tensor,
            assistant_model=assistant_model,
            assistant_tokenizer=assistant_tokenizer,
            tokenizer=tokenizer,
            **model_kwargs,
        )
    return _run_speculative(
        self, assistant_model, input_ids, logits_processor, stopping_criteria, generation_config, streamer, model_kwargs
    )


class SecureSDMixin:
    """Adds `verifier=`, `secure_schedule=` and a honoured `num_assistant_tokens=` to `generate`."""

    def generate(self, *args, **kwargs):
        args, kwargs = _prepare_call(self, args, kwargs)
        return super().generate(*args, **kwargs)

    _assisted_decoding = _assisted_decoding


def _register_config_fields(generation_config: GenerationConfig) -> None:
    """Make `generate(verifier=..., secure_schedule=...)` accepted by HF's config update."""
    for name in _CONFIG_FIELDS:
        if not hasattr(generation_config, name):
            setattr(generation_config, name, None)


def wrap(model: PreTrainedModel) -> PreTrainedModel:
    """Enable SecureSD on this model instance (in place) and return it.

    Example:

    ```python
    >>> model = hf_securesd.wrap(AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-Coder-1.5B-Instruct"))
    >>> out = model.generate(**inputs, assistant_model=draft, verifier="mars", secure_schedule=Step(L=1))
    ```
    """
    if not isinstance(model, GenerationMixin):
        raise TypeError(f"wrap() needs a transformers model with generate(), got {type(model).__name__}")
    if not isinstance(model, SecureSDMixin):
        original = type(model)
        model.__class__ = type(original.__name__, (SecureSDMixin, original), {"__module__": original.__module__})
    _register_config_fields(model.generation_config)
    return model


def _patched_generate(self, *args, **kwargs):
    args, kwargs = _prepare_call(self, args, kwargs)
    return _ORIGINAL_GENERATE(self, *args, **kwargs)


def patch() -> None:
    """Enable SecureSD for every transformers model in this process (for pipelines you do not control)."""
    GenerationMixin.generate = _patched_generate
    GenerationMixin._assisted_decoding = _assisted_decoding
    for name in _CONFIG_FIELDS:
        setattr(GenerationConfig, name, None)


def unpatch() -> None:
    """Undo `patch()`."""
    GenerationMixin.generate = _ORIGINAL_GENERATE
    GenerationMixin._assisted_decoding = _ORIGINAL_ASSISTED_DECODING
    for name in _CONFIG_FIELDS:
        if name in vars(GenerationConfig):
            delattr(GenerationConfig, name)


def securesd_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    draft: PreTrainedModel | None = None,
    verifier: Any = "lossless",
    secure_schedule: Any = None,
    num_assistant_tokens: int | None = None,
    **model_kwargs,
):
    """Decoding loop for `model.generate(..., custom_generate=securesd_generate, draft=<draft>, verifier=...)`.

    transformers rebuilds a callable's arguments from its signature and drops `assistant_model`,
    so the draft is passed as `draft=`.
    """
    # generate() has filled HF's defaults into generation_config, so only this call's own argument and the
    # draft's generation_config can set the draft length here.
    draft_length = resolve_draft_length(
        {"num_assistant_tokens": num_assistant_tokens}, None, getattr(draft, "generation_config", None)
    )
    resolved, schedule, _ = resolve_request(verifier, secure_schedule, draft_length.num_tokens)
    check_models(model, draft)
    options = {name: getattr(generation_config, name, None) for name in _CHECKED_OPTIONS}
    check_options({**options, "streamer": streamer}, input_ids)
    generation_config.verifier = resolved
    generation_config.secure_schedule = schedule
    for name, value in draft_length.generation_fields().items():
        setattr(generation_config, name, value)
    return _run_speculative(
        model, draft, input_ids, logits_processor, stopping_criteria, generation_config, streamer, model_kwargs
    )

