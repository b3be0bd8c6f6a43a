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
import json
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import GENERATION_CONFIG_NAME, cached_file

from .cache_support import check_cache_layers, check_cache_support
from .decoding import DecodeSettings, PromptLookup, speculative_decode
from .draft_length import DEFAULT_MAX_MATCHING_NGRAM_SIZE, DraftLength, resolve_draft_length, resolve_prompt_lookup
from .segments import Segments, check_boundary_ids, resolve_boundaries
from .stats import SegmentStats, SpeculativeStats, segment_statistics
from .validation import (
    OTHER_METHODS,
    PROMPT_LOOKUP,
    SecureSDConfigError,
    check_model_inputs,
    check_models,
    check_options,
    check_inputs,
    check_padding,
    check_lengths,
    check_proposer,
    resolve_request,
    vocab_size,
)

_ORIGINAL_GENERATE = GenerationMixin.generate
_ORIGINAL_ASSISTED_DECODING = GenerationMixin._assisted_decoding
_GENERATE_SIGNATURE = inspect.signature(_ORIGINAL_GENERATE)
_CONFIG_FIELDS = ("verifier", "secure_schedule", "output_deviation")
_CHECKED_OPTIONS = (
    "prompt_lookup_num_tokens",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
    "num_beams",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "guidance_scale",
    *OTHER_METHODS,
)


# transformers >= 5.18 names the returned cache `cache`, 5.17 `past_key_values`.
_CACHE_FIELD = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


@dataclass
class SecureSDGenerateOutput(GenerateDecoderOnlyOutput):
    """`GenerateDecoderOnlyOutput` plus speculative statistics: `speculative_stats` (all rows merged)
    and `speculative_stats_per_row` (one `SpeculativeStats` per batch row); with a `Segments` schedule
    also `segment_stats` (rows pooled) and `segment_stats_per_row` (`stats.SegmentStats`), else None."""

    speculative_stats: SpeculativeStats | None = None
    speculative_stats_per_row: list[SpeculativeStats] | None = None
    segment_stats: SegmentStats | None = None
    segment_stats_per_row: list[SegmentStats] | None = None


if _CACHE_FIELD != "cache":  # transformers 5.17: also offer the newer name, `out.cache`
    SecureSDGenerateOutput.cache = property(lambda self: self.past_key_values)


def _effective(name: str, arguments: dict[str, Any], generation_config: GenerationConfig | None, model) -> Any:
    """The value generate() will use for `name`: explicit kwarg > passed config > model's config."""
    if name in arguments:
        return arguments[name]
    for config in (generation_config, model.generation_config):
        if config is not None and getattr(config, name, None) is not None:
            return getattr(config, name)
    return None


def _bind(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> tuple[inspect.BoundArguments, dict[str, Any]]:
    """Bind a generate() call; returns the binding and a flat view of every argument (kwargs included)."""
    bound = _GENERATE_SIGNATURE.bind(model, *args, **kwargs)
    return bound, {**bound.arguments, **bound.arguments.get("kwargs", {})}


def _with_fields(
    bound: inspect.BoundArguments, generation_config: GenerationConfig | None, fields: dict[str, Any]
) -> tuple[tuple, dict[str, Any]]:
    """The call's (args, kwargs) with `fields` set: as kwargs, or inside a copy of a passed config
    (transformers warns when a config object and generation kwargs are mixed)."""
    call_kwargs = bound.arguments.get("kwargs", {})
    if generation_config is None:
        call_kwargs.update(fields)
    else:
        generation_config = copy.deepcopy(generation_config)
        for name, value in fields.items():
            setattr(generation_config, name, value)
            call_kwargs.pop(name, None)
        bound.arguments["generation_config"] = generation_config
    return bound.args[1:], bound.kwargs


def _custom_generate_call(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """`custom_generate=securesd_generate` on a wrapped or patched model runs the wrapped path with the draft
    as `assistant_model` (transformers would drop `assistant_model=` for a callable). Returns None when the
    call does not use that callable."""
    if kwargs.get("custom_generate") is not securesd_generate:
        return None
    kwargs = dict(kwargs)
    del kwargs["custom_generate"]
    draft = kwargs.pop("draft", None)
    if draft is not None:
        if kwargs.get("assistant_model") not in (None, draft):
            raise SecureSDConfigError("draft= and assistant_model= name different models; pass the draft once")
        kwargs["assistant_model"] = draft
    kwargs.setdefault("verifier", "lossless")
    return args, kwargs


def _prepare_call(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Validate a generate() call that uses a verifier and fill in resolved objects and k.

    The verifier comes from the call (`verifier=`), else from a passed GenerationConfig, else from the
    model's (saved) generation config. A call-level `verifier=None` switches SecureSD off. A verifier
    taken from a config is a default: a call without a draft model runs plain decoding. Returns
    (args, kwargs) for the original generate."""
    rerouted = _custom_generate_call(model, args, kwargs)
    if rerouted is not None:
        args, kwargs = rerouted
    elif kwargs.get("custom_generate") is not None:
        return args, kwargs  # another decoding method (or the Hub folder) handles its own arguments
    restore_saved_fields(model)
    _register_config_fields(model.generation_config)
    bound, arguments = _bind(model, args, kwargs)
    generation_config = arguments.get("generation_config")
    draft = arguments.get("assistant_model")
    verifier = _effective("verifier", arguments, generation_config, model)
    if verifier is None:
        schedule = arguments.get("secure_schedule")
        if schedule is None and "verifier" not in arguments and generation_config is not None:
            schedule = getattr(generation_config, "secure_schedule", None)  # a passed config's own schedule
        if schedule is not None:
            resolve_request(None, schedule, None)  # raises: a schedule needs a verifier
        fields = {"verifier": None, "secure_schedule": None}
        return _with_fields(bound, generation_config, fields) if draft is not None else _stripped(args, kwargs)
    options = {name: _effective(name, arguments, generation_config, model) for name in _CHECKED_OPTIONS}
    lookup = options["prompt_lookup_num_tokens"]
    if draft is None and lookup is None and "verifier" not in arguments:
        return _stripped(args, kwargs)  # a configured verifier without a proposer: plain decoding
    if lookup is not None:
        draft_length = resolve_prompt_lookup(
            arguments, generation_config, draft, _effective("max_matching_ngram_size", arguments, generation_config, model),
            target_config=model.generation_config,
        )
    else:
        draft_length = resolve_draft_length(
            arguments, generation_config, getattr(draft, "generation_config", None), target_config=model.generation_config
        )
    check_model_inputs(arguments, _effective("cache_implementation", arguments, generation_config, model))
    resolved, schedule, k = resolve_request(
        verifier, _effective("secure_schedule", arguments, generation_config, model), draft_length.num_tokens
    )
    schedule = resolve_boundaries(schedule, arguments.get("tokenizer"))  # text boundaries -> token ids
    options.update({name: arguments.get(name) for name in ("assistant_tokenizer", "streamer", "synced_gpus")})
    check_lengths(arguments.get("max_new_tokens"), arguments.get("max_length"))
    inputs = arguments.get("inputs", arguments.get("input_ids"))
    if isinstance(inputs, torch.Tensor) and isinstance(arguments.get("attention_mask"), torch.Tensor):
        check_inputs(inputs if inputs.ndim == 2 else inputs[None], arguments["attention_mask"])
    check_options(options, inputs if isinstance(inputs, torch.Tensor) else None)
    if lookup is not None:
        check_proposer(resolved, PROMPT_LOOKUP)
    else:
        check_models(model, draft)
        check_cache_layers("draft", draft, None)
    check_cache_layers("target", model, arguments.get("past_key_values", arguments.get("cache")))
    check_boundary_ids(schedule, vocab_size(model))
    return _with_fields(
        bound,
        generation_config,
        {
            "verifier": resolved,
            "secure_schedule": schedule,
            "output_deviation": _effective("output_deviation", arguments, generation_config, model),
            **draft_length.generation_fields(),
        },
    )


def _check_caches(
    model: PreTrainedModel, draft: PreTrainedModel | None, target_cache: object | None, input_ids: torch.Tensor,
    max_length: int,
) -> None:
    """Both models' caches can be rolled back draft by draft for this call (`cache_support`); input_ids
    [B, P]."""
    batch, prompt_length = input_ids.shape
    max_new_tokens = max(int(max_length) - prompt_length, 0)
    check_cache_support("target", model, target_cache, batch, prompt_length, max_new_tokens)
    if draft is not None:
        check_cache_support("draft", draft, None, batch, prompt_length, max_new_tokens)


def _stripped(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The call without our fields, for plain transformers decoding."""
    return args, {key: value for key, value in kwargs.items() if key not in _CONFIG_FIELDS}


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
        raise SecureSDConfigError(
            f"model inputs {sorted(unsupported)} are not supported with verifier=; "
            "speculative decoding here takes input_ids and attention_mask"
        )
    check_inputs(input_ids, model_kwargs.get("attention_mask"))
    pad_token_id = _as_int(getattr(generation_config, "_pad_token_tensor", None))
    check_padding(input_ids.shape[0], pad_token_id, stopping_criteria)
    input_ids = input_ids.long()  # both models embed the same int64 ids (int32/int16/uint8 ids are honoured)
    return_dict = generation_config.return_dict_in_generate
    target_cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    _check_caches(model, draft, target_cache, input_ids, generation_config.max_length)
    settings = DecodeSettings(
        verifier=generation_config.verifier,
        schedule=generation_config.secure_schedule,
        draft_length=DraftLength.from_generation_config(generation_config),
        do_sample=bool(generation_config.do_sample),
        max_length=generation_config.max_length,
        eos_token_id=getattr(generation_config, "_eos_token_tensor", None),
        pad_token_id=pad_token_id,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        streamer=streamer,
        # Exact TV deviation: closed form at T = 0; at T > 0 a vocabulary-wide pass per round, so opt-in.
        collect_deviation=bool(return_dict)
        and (not generation_config.do_sample or bool(getattr(generation_config, "output_deviation", None))),
        output_scores=bool(return_dict and generation_config.output_scores),
        output_logits=bool(return_dict and generation_config.output_logits),
        collect_stats=bool(return_dict),
    )
    lookup = None
    if draft is None:
        lookup = PromptLookup(generation_config.max_matching_ngram_size or DEFAULT_MAX_MATCHING_NGRAM_SIZE)
    result = speculative_decode(
        model,
        input_ids,
        settings,
        draft=draft,
        prompt_lookup=lookup,
        attention_mask=model_kwargs.get("attention_mask"),
        target_cache=target_cache,
    )
    if not return_dict:
        return result.sequences
    segments = None
    if isinstance(settings.schedule, Segments):
        segments = segment_statistics(settings.schedule, result.sequences, input_ids.shape[1], result.row_stats)
    return SecureSDGenerateOutput(
        sequences=result.sequences,
        scores=result.scores,
        logits=result.raw_logits,
        **{_CACHE_FIELD: result.cache},
        speculative_stats=SpeculativeStats.merge(result.row_stats),
        speculative_stats_per_row=result.row_stats,
        segment_stats=None if segments is None else SegmentStats.merge(segments),
        segment_stats_per_row=segments,
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

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`; when the generation config carries a verifier, the folder
        also gets the `custom_generate/` entry point, so plain transformers loading it with
        `trust_remote_code=True` runs SecureSD too."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if getattr(self.generation_config, "verifier", None) is not None:
            from .hub import export_custom_generate

            export_custom_generate(save_directory)
        return result

    _assisted_decoding = _assisted_decoding


def _register_config_fields(generation_config: GenerationConfig) -> None:
    """Make `generate(verifier=..., secure_schedule=...)` accepted by HF's config update."""
    for name in _CONFIG_FIELDS:
        if not hasattr(generation_config, name):
            setattr(generation_config, name, None)


def restore_saved_fields(model: PreTrainedModel) -> None:
    """Put back `verifier` / `secure_schedule` that transformers dropped on load.

    A generation_config.json marked `"_from_model_config": true` (most Hub checkpoints) is loaded
    without its non-standard keys. This reads them from the model's saved file once per model
    instance; fields already set on the config win."""
    if not getattr(model.generation_config, "_from_model_config", False) or getattr(model, "_securesd_fields_read", False):
        return
    model._securesd_fields_read = True
    source = getattr(model, "name_or_path", "") or ""
    if not source:
        return
    try:
        path = cached_file(source, GENERATION_CONFIG_NAME, local_files_only=True, _raise_exceptions_for_missing_entries=False)
    except OSError:
        return
    if path is None:
        return
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    for name in _CONFIG_FIELDS:
        if saved.get(name) is not None and getattr(model.generation_config, name, None) is None:
            setattr(model.generation_config, name, saved[name])


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
    restore_saved_fields(model)
    _register_config_fields(model.generation_config)
    return model


def hub_generate(model: PreTrainedModel, *args, **kwargs):
    """Entry point of the Hub `custom_generate/generate.py`: `generate()` of the wrapped model.

    transformers calls it with every `generate` argument (`assistant_model=` included) when a call
    passes `custom_generate="<repo or folder>"`, or on every call of a model loaded with
    `trust_remote_code=True` from a folder that holds `custom_generate/`. It wraps the model instance
    (as `wrap()` does) and runs its generate: SecureSD with a draft and a verifier, plain
    transformers otherwise."""
    wrap(model)
    return type(model).generate(model, *args, **kwargs)


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

    On a plain model transformers rebuilds a callable's arguments from its signature and drops
    `assistant_model`, so the draft is passed as `draft=`. On a wrapped or patched model both
    `draft=` and `assistant_model=` work (the call then takes the wrapped path).
    """
    if generation_config.prompt_lookup_num_tokens is not None:
        raise SecureSDConfigError(
            "custom_generate=securesd_generate drafts with draft=; for prompt lookup drafting "
            "(prompt_lookup_num_tokens) wrap the model (hf_securesd.wrap(model)) and call generate without draft="
        )
    if draft is None:
        raise SecureSDConfigError(
            "custom_generate=securesd_generate needs a draft model, passed as draft=<draft model>: on a model "
            "that is not wrapped, transformers drops assistant_model= for a callable custom_generate. Pass draft=, "
            "or wrap the model (hf_securesd.wrap(model)) to use assistant_model="
        )
    # generate() has filled HF's defaults into generation_config, so only this call's own argument and the
    # draft's generation_config can set the draft length here.
    draft_length = resolve_draft_length(
        {"num_assistant_tokens": num_assistant_tokens}, None, getattr(draft, "generation_config", None),
        target_config=generation_config,
    )
    resolved, schedule, _ = resolve_request(verifier, secure_schedule, draft_length.num_tokens)
    schedule = resolve_boundaries(schedule, None)  # transformers passes no tokenizer= to a callable
    check_models(model, draft)
    check_cache_layers("draft", draft, None)
    check_cache_layers("target", model, model_kwargs.get("cache", model_kwargs.get("past_key_values")))
    check_boundary_ids(schedule, vocab_size(model))
    options = {name: getattr(generation_config, name, None) for name in _CHECKED_OPTIONS}
    check_options({**options, "streamer": streamer, "synced_gpus": synced_gpus}, input_ids)
    generation_config.verifier = resolved
    generation_config.secure_schedule = schedule
    for name, value in draft_length.generation_fields().items():
        setattr(generation_config, name, value)
    return _run_speculative(
        model, draft, input_ids, logits_processor, stopping_criteria, generation_config, streamer, model_kwargs
    )

