"""Three routes into `generate`: `wrap(model)` (one instance), `patch()` (every model in the process)
and the `securesd_generate` callable for `custom_generate=`.

`generate()` dispatches through the model's class (`type(self)._assisted_decoding`), so `wrap`
swaps the instance's class for a same-named subclass carrying `SecureSDMixin`; `save_pretrained`
therefore still records the original architecture, and pickling stores the original class (the model
is wrapped again on load). The callable checks its arguments through the same `_securesd_fields` as
the wrapped `generate`. Without `verifier=` every route is plain
transformers: the call goes to the original `generate` unchanged.
"""

from __future__ import annotations

import copy
import functools
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .cache_support import check_cache_layers, check_cache_support
from .config_keys import refuse_misspelt_fields
from .decoding import DecodeSettings, PromptLookup, speculative_decode
from .draft_length import DEFAULT_MAX_MATCHING_NGRAM_SIZE, DraftLength, resolve_draft_length, resolve_prompt_lookup
from .positions import check_positions
from .saved_fields import CONFIG_FIELDS, restore_saved_fields
from .segments import (
    BoundaryResolutionError,
    Segments,
    check_boundary_ids,
    resolve_boundaries,
    warn_if_continuing_segments,
)
from . import stopping
from .stats import SegmentStats, SpeculativeStats, segment_statistics
from .validation import (
    OTHER_METHODS,
    PROMPT_LOOKUP,
    SecureSDConfigError,
    SecureSDConfigTypeError,
    check_model_inputs,
    check_models,
    check_options,
    check_input_ids_form,
    check_inputs,
    check_processors,
    check_padding,
    check_prompt_ids,
    check_lengths,
    checked_flag,
    check_proposer,
    resolve_request,
    vocab_size,
)
from .schedules import Schedule, resolve_schedule
from .verifiers import Verifier, resolve_verifier

_ORIGINAL_GENERATE = GenerationMixin.generate
_ORIGINAL_ASSISTED_DECODING = GenerationMixin._assisted_decoding
_GENERATE_SIGNATURE = inspect.signature(_ORIGINAL_GENERATE)
CALLABLE_DEFAULT_VERIFIER = "lossless"  # custom_generate=securesd_generate with no verifier anywhere
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


def _custom_generate_call(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """`custom_generate=securesd_generate` on a wrapped or patched model runs the wrapped path with the draft
    as `assistant_model` (transformers would drop `assistant_model=` for a callable). Returns the call's
    kwargs for that path, or None when the call does not use that callable."""
    if kwargs.get("custom_generate") is not securesd_generate:
        return None
    kwargs = dict(kwargs)
    del kwargs["custom_generate"]
    return _draft_as_assistant_model(kwargs)


def _draft_as_assistant_model(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's kwargs with `draft=` (the callable's and the Hub folder's name for the draft) moved to
    `assistant_model=`; both naming different models is refused."""
    if "draft" not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    draft = kwargs.pop("draft")
    if draft is not None:
        if kwargs.get("assistant_model") not in (None, draft):
            raise SecureSDConfigError("draft= and assistant_model= name different models; pass the draft once")
        kwargs["assistant_model"] = draft
    return kwargs


def _prepare_call(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Validate a generate() call that uses a verifier and fill in resolved objects and k (see
    `_securesd_fields`). Returns (args, kwargs) for the original generate."""
    rerouted = _custom_generate_call(kwargs)
    if rerouted is None and kwargs.get("custom_generate") is not None:
        return args, kwargs  # another decoding method (or the Hub folder) handles its own arguments
    kwargs = kwargs if rerouted is None else rerouted
    restore_saved_fields(model)
    _register_config_fields(model.generation_config)
    bound, arguments = _bind(model, args, kwargs)
    generation_config = arguments.get("generation_config")
    default_verifier = None if rerouted is None else CALLABLE_DEFAULT_VERIFIER
    fields = _securesd_fields(model, arguments, generation_config, default_verifier)
    if fields is not None:
        return _with_fields(bound, generation_config, fields)
    if _drafts(model, arguments, generation_config):
        return _switched_off(model, bound, generation_config)
    return _stripped(args, kwargs)


def _switched_off(
    model: PreTrainedModel, bound: inspect.BoundArguments, generation_config: GenerationConfig | None
) -> tuple[tuple, dict[str, Any]]:
    """The call of plain speculative decoding (HF's) with no verifier: a verifier in a config must not reach
    the assisted loop. transformers fills a passed config's None fields from the model's config, so when
    the model's config holds one, the None goes in the call's keywords too (they are applied last)."""
    off = {"verifier": None, "secure_schedule": None}
    args, kwargs = _with_fields(bound, generation_config, off)
    saved = [getattr(model.generation_config, name, None) for name in off]
    if generation_config is not None and any(value is not None for value in saved):
        kwargs = {**kwargs, **off}
    return args, kwargs


def _drafts(
    model: PreTrainedModel, arguments: dict[str, Any], generation_config: GenerationConfig | None
) -> bool:
    """Whether the call decodes speculatively: a draft model, or prompt lookup (in the call or a config)."""
    return (
        arguments.get("assistant_model") is not None
        or _effective("prompt_lookup_num_tokens", arguments, generation_config, model) is not None
    )


def _requested_verifier(
    model: PreTrainedModel, arguments: dict[str, Any], generation_config: GenerationConfig | None, default: Any
) -> Any:
    """The verifier a call asks for: explicit kwarg > passed config > model's config > `default` (the
    callable's lossless rule; None on the other routes). A call-level `verifier=None` switches SecureSD
    off. A schedule without any verifier is refused: given in the call or a passed config, and, for a call
    that would decode speculatively (a draft, or the callable), in the model's own config too (transformers
    merges that into the config a callable receives, so every route sees it the same way)."""
    verifier = _effective("verifier", arguments, generation_config, model)
    if verifier is not None:
        return verifier
    schedule = arguments.get("secure_schedule")
    if schedule is None and "verifier" not in arguments:
        if generation_config is not None:
            schedule = getattr(generation_config, "secure_schedule", None)  # a passed config's own schedule
        if schedule is None and (default is not None or arguments.get("assistant_model") is not None):
            schedule = getattr(model.generation_config, "secure_schedule", None)
    if schedule is not None:
        resolve_request(None, schedule, None)  # raises: a schedule needs a verifier
    return None if "verifier" in arguments else default


def _securesd_fields(
    model: PreTrainedModel, arguments: dict[str, Any], generation_config: GenerationConfig | None, default_verifier: Any
) -> dict[str, Any] | None:
    """Resolve and check what a generate call asks of SecureSD; every route goes through here.

    `arguments` holds the call's explicit arguments (the draft as `assistant_model`), `generation_config`
    a passed GenerationConfig. The verifier comes from the call (`verifier=`), else from the passed
    config, else from the model's (saved) generation config, else `default_verifier`. A verifier taken
    from a config is a default: a call without a draft model runs plain decoding. Returns the generation
    fields SecureSD runs with, or None when the call runs plain transformers decoding."""
    draft = arguments.get("assistant_model")
    verifier = _requested_verifier(model, arguments, generation_config, default_verifier)
    if verifier is None:
        return None
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise SecureSDConfigTypeError(
            f"generation_config= takes a transformers GenerationConfig, not {type(generation_config).__name__}; "
            "pass GenerationConfig(**fields), or give the fields to generate as keyword arguments"
        )
    options = {name: _effective(name, arguments, generation_config, model) for name in _CHECKED_OPTIONS}
    lookup = options["prompt_lookup_num_tokens"]
    if draft is None and lookup is None and "verifier" not in arguments:
        return None  # a configured verifier without a proposer: plain decoding
    _refuse_misspelt_fields(model, generation_config)  # SecureSD runs: a misspelt field may not be ignored
    if draft is None and lookup is None:
        check_models(model, None)  # no proposer: said before a draft-length field is blamed on a draft model
    draft_length = _draft_length(model, arguments, generation_config, lookup is not None)
    if draft_length.written_back:  # a heuristic call (maybe with another verifier) stored it, not the user
        draft_length = draft_length.at_least(_smallest_k(verifier))
    check_model_inputs(arguments, _effective("cache_implementation", arguments, generation_config, model))
    resolved, schedule, _ = resolve_request(
        verifier, _effective("secure_schedule", arguments, generation_config, model), draft_length.num_tokens,
        "prompt_lookup_num_tokens" if lookup is not None else "num_assistant_tokens",
    )
    schedule = resolve_boundaries(schedule, arguments.get("tokenizer"))  # text boundaries -> token ids
    options.update({name: arguments.get(name) for name in ("assistant_tokenizer", "streamer", "synced_gpus")})
    _check_call(model, arguments, options, resolved, schedule)
    return {
        "verifier": resolved,
        "secure_schedule": schedule,
        "output_deviation": checked_flag(
            "output_deviation", _effective("output_deviation", arguments, generation_config, model)
        ),
        **draft_length.generation_fields(),
    }


def _smallest_k(verifier: Any) -> int:
    """The smallest draft length `verifier` (as the call gives it) is defined for; 1 when it does not
    resolve (`resolve_request` then says why)."""
    try:
        return resolve_verifier(verifier).needs().min_draft_tokens
    except (TypeError, ValueError):
        return 1


def _refuse_misspelt_fields(model: PreTrainedModel, generation_config: GenerationConfig | None) -> None:
    """SecureSDConfigError for a misspelt SecureSD key in the passed or the model's generation config."""
    refuse_misspelt_fields(model.generation_config, "the model's generation config")
    refuse_misspelt_fields(generation_config, "the GenerationConfig passed to generate")


def _draft_length(
    model: PreTrainedModel, arguments: dict[str, Any], generation_config: GenerationConfig | None, lookup: bool
) -> DraftLength:
    """The call's draft-length controls: prompt lookup's when `lookup`, else the draft model's."""
    draft = arguments.get("assistant_model")
    if lookup:
        return resolve_prompt_lookup(
            arguments, generation_config, draft, _effective("max_matching_ngram_size", arguments, generation_config, model),
            target_config=model.generation_config,
        )
    return resolve_draft_length(
        arguments, generation_config, getattr(draft, "generation_config", None), target_config=model.generation_config
    )


def _check_call(
    model: PreTrainedModel, arguments: dict[str, Any], options: dict[str, Any], verifier: Verifier, schedule: Any
) -> None:
    """The checks of a SecureSD call that run before any decoding: lengths, inputs, options, the proposer
    (draft model or prompt lookup), both models' caches and the schedule's boundary ids."""
    check_lengths(arguments.get("max_new_tokens"), arguments.get("max_length"))
    inputs = arguments.get("inputs", arguments.get("input_ids"))
    if inputs is not None:
        check_input_ids_form(inputs)
        if isinstance(arguments.get("attention_mask"), torch.Tensor):
            check_inputs(inputs, arguments["attention_mask"])
    check_options(options, inputs)
    if options["prompt_lookup_num_tokens"] is not None:
        check_proposer(verifier, PROMPT_LOOKUP)
    else:
        check_models(model, arguments.get("assistant_model"))
        check_cache_layers("draft", arguments.get("assistant_model"), None)
    check_cache_layers("target", model, arguments.get("past_key_values", arguments.get("cache")))
    check_boundary_ids(schedule, vocab_size(model))


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


def _check_positions(
    model: PreTrainedModel, draft: PreTrainedModel | None, input_ids: torch.Tensor, attention_mask: object,
    max_length: int,
) -> None:
    """Neither model is fed a position beyond its learned position table (`positions`); input_ids [B, P],
    attention_mask [B, P] or None (positions count a row's unmasked tokens)."""
    longest = int(attention_mask.sum(-1).max()) if isinstance(attention_mask, torch.Tensor) else input_ids.shape[1]
    max_new_tokens = max(int(max_length) - input_ids.shape[1], 0)
    for role, checked in (("target", model), ("draft", draft)):
        if checked is not None:
            check_positions(role, checked, longest, max_new_tokens)


def _stripped(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The call without our fields, for plain transformers decoding."""
    return args, {key: value for key, value in kwargs.items() if key not in CONFIG_FIELDS}


def _as_int(token: torch.Tensor | int | None) -> int | None:
    if token is None:
        return None
    return int(token.reshape(-1)[0]) if isinstance(token, torch.Tensor) else int(token)


_MODEL_INPUTS = ("attention_mask", "position_ids", "cache", "past_key_values", "use_cache", "logits_to_keep")
# output flags transformers leaves among a callable's model inputs: options, refused by `check_options`
_OUTPUT_FLAGS = ("output_attentions", "output_hidden_states")


def _check_model_inputs(model_kwargs: dict[str, Any]) -> None:
    """Refuse model inputs other than the ids, the attention mask, the positions and a cache
    (`inputs_embeds`, `pixel_values`, ...), naming them."""
    unsupported = {key for key, value in model_kwargs.items()
                   if value is not None and key not in (*_MODEL_INPUTS, *_OUTPUT_FLAGS)}
    if unsupported:
        raise SecureSDConfigError(
            f"model inputs {sorted(unsupported)} are not supported with verifier=; "
            "speculative decoding here takes input_ids and attention_mask"
        )


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
    _check_model_inputs(model_kwargs)
    # The call's keywords were checked before transformers merged them; a GenerationConfig's were not.
    check_lengths(
        generation_config.max_new_tokens, generation_config.max_length, where=" (in the call or its generation_config)"
    )
    check_inputs(input_ids, model_kwargs.get("attention_mask"), pad_token_id=generation_config.pad_token_id)
    check_prompt_ids(input_ids, {"target": model, "draft": draft})
    pad_token_id = _as_int(getattr(generation_config, "_pad_token_tensor", None))
    check_padding(input_ids.shape[0], pad_token_id, stopping_criteria)
    check_processors(logits_processor)
    input_ids = input_ids.long()  # both models embed the same int64 ids (int32/int16/uint8 ids are honoured)
    return_dict = generation_config.return_dict_in_generate
    target_cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    # A caller's MaxLengthCriteria / EosTokenCriteria replaced the ones transformers built from the config.
    # Plain decoding checks the criteria after each token, so even a length the prompt already reaches
    # gives one token.
    max_length, eos_token_id = stopping.limits(
        stopping_criteria, generation_config.max_length, getattr(generation_config, "_eos_token_tensor", None)
    )
    max_length = max(max_length, input_ids.shape[1] + 1)
    _check_caches(model, draft, target_cache, input_ids, max_length)
    _check_positions(model, draft, input_ids, model_kwargs.get("attention_mask"), max_length)
    settings = DecodeSettings(
        verifier=generation_config.verifier,
        schedule=generation_config.secure_schedule,
        draft_length=DraftLength.from_generation_config(generation_config),
        do_sample=bool(generation_config.do_sample),
        max_length=max_length,
        eos_token_id=eos_token_id,
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
    if target_cache is not None and target_cache.get_seq_length() > 0:  # transformers' fresh cache is empty
        warn_if_continuing_segments(settings.schedule, input_ids, model_kwargs.get("attention_mask"))
    lookup = None
    if draft is None:
        lookup = PromptLookup(
            generation_config.max_matching_ngram_size or DEFAULT_MAX_MATCHING_NGRAM_SIZE,
            getattr(generation_config, "_eos_token_tensor", None),
        )
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
        """`PreTrainedModel.save_pretrained`, keeping the SecureSD fields (see `_save_with_fields`)."""
        return _save_with_fields(self, super().save_pretrained, save_directory, args, kwargs)

    def __reduce_ex__(self, protocol: int):
        """Pickle (and copy) as the model's own class, wrapped again on load: the wrapped class is built
        at run time, so pickle could not find it by name."""
        _, (_, *new_args), *state = object.__reduce_ex__(self, max(protocol, 2))
        return (_new_wrapped, (_unwrapped_class(type(self)), *new_args), *state)

    _assisted_decoding = _assisted_decoding


def _unwrapped_class(cls: type) -> type:
    """The model class that `wrap` subclassed."""
    return next(base for base in cls.__mro__[1:] if not issubclass(base, SecureSDMixin))


def _wrapped_class(original: type) -> type:
    """The same-named subclass of `original` carrying `SecureSDMixin` (one per original class)."""
    if original not in _WRAPPED_CLASSES:
        _WRAPPED_CLASSES[original] = type(original.__name__, (SecureSDMixin, original), {"__module__": original.__module__})
    return _WRAPPED_CLASSES[original]


_WRAPPED_CLASSES: dict[type, type] = {}


def _new_wrapped(original: type, *args: Any) -> PreTrainedModel:
    """An empty instance of the wrapped `original` class, for unpickling (pickle then restores its state)."""
    model = original.__new__(original, *args)
    model.__class__ = _wrapped_class(original)
    return model


def _save_with_fields(model: PreTrainedModel, save, save_directory, args: tuple, kwargs: dict[str, Any]):
    """Run `save(save_directory, *args, **kwargs)` (a `save_pretrained`). When the generation config
    carries a verifier, the saved generation_config.json keeps the SecureSD fields on load (transformers
    drops unknown keys from a file marked `"_from_model_config": true`) and the folder also gets the
    `custom_generate/` entry point, so plain transformers loading it with `trust_remote_code=True` runs
    SecureSD too."""
    config = model.generation_config
    saved_forms = _check_saved_fields(config)
    if getattr(config, "verifier", None) is None:
        return save(save_directory, *args, **kwargs)
    from .hub import export_custom_generate

    try:
        options = inspect.signature(save).bind(save_directory, *args, **kwargs).arguments
    except TypeError:  # arguments save_pretrained does not take: its own error
        return save(save_directory, *args, **kwargs)
    if not model.should_save_on_this_rank(options.get("is_main_process", True)):
        return save(save_directory, *args, **kwargs)  # a rank told not to save writes nothing
    originals = {name: getattr(config, name) for name in ("_from_model_config", *saved_forms)}
    config._from_model_config = False
    for name, form in saved_forms.items():  # the canonical JSON form (a NumPy or tensor knob as a float)
        setattr(config, name, form)
    upload = model.__dict__.get("_upload_modified_files")

    def entry_point_then_upload(working_dir, *upload_args: Any, **upload_kwargs: Any) -> Any:
        """push_to_hub=True uploads inside `save`: the entry point is written first, so it goes up too."""
        export_custom_generate(working_dir, overwrite=True)
        if upload is not None:  # a hook of the caller's own on this instance runs too
            return upload(working_dir, *upload_args, **upload_kwargs)
        return type(model)._upload_modified_files(model, working_dir, *upload_args, **upload_kwargs)

    model._upload_modified_files = entry_point_then_upload
    try:
        result = save(save_directory, *args, **kwargs)
    finally:
        for name, value in originals.items():
            setattr(config, name, value)
        if upload is None:
            del model._upload_modified_files
        else:
            model._upload_modified_files = upload
    export_custom_generate(save_directory, overwrite=True)  # save_pretrained writes over a folder by design
    return result


def _check_saved_fields(config: GenerationConfig) -> dict[str, dict[str, Any]]:
    """Raise SecureSDConfigError, before anything is written, when the config's verifier, schedule or
    output_deviation could not run: a saved model would otherwise publish it and fail only when someone
    generates with it. Returns the saved form (`to_dict`) of each verifier and schedule set."""
    saved_forms = {}
    for name, resolve in (("verifier", resolve_verifier), ("secure_schedule", resolve_schedule)):
        value = getattr(config, name, None)
        if value is None:
            continue
        try:
            resolved = resolve(value)
        except (TypeError, ValueError) as error:
            raise SecureSDConfigError(
                f"generation_config.{name} cannot be saved: {error}. Set a valid value (or None) on "
                "model.generation_config before save_pretrained"
            ) from None
        _check_round_trip(name, resolved, resolve)
        saved_forms[name] = resolved.to_dict()
    try:
        checked_flag("generation_config.output_deviation", getattr(config, "output_deviation", None))
    except SecureSDConfigError as error:
        raise SecureSDConfigError(f"{error}; set it before save_pretrained") from None
    return saved_forms


def _check_round_trip(name: str, value: Verifier | Schedule, resolve: Callable[[Any], Any]) -> None:
    """Raise SecureSDConfigError unless `value`'s saved form (`to_dict`) loads back as the same rule: a
    custom verifier or schedule class is saved under a name a later process cannot resolve, or under a
    built-in's name (a subclass) and would load as that built-in."""
    if not _loads_back(value, resolve):
        parts = (value.before, value.after) if isinstance(value, Segments) else ()
        custom = next((part for part in parts if isinstance(part, Schedule) and not _loads_back(part, resolve)),
                      value)
        raise SecureSDConfigError(
            f"generation_config.{name} cannot be saved: {type(custom).__name__} is not one of the library's "
            f"verifiers and schedules, and its saved form {value.to_dict()} would not load back as it. Pass it to "
            f"generate at call time ({name}=...) and set model.generation_config.{name} to None (or a built-in "
            "one) before save_pretrained"
        )


def _loads_back(value: Verifier | Schedule, resolve: Callable[[Any], Any]) -> bool:
    """Whether `value`'s saved form (`to_dict`) resolves to the same rule: its class and saved form."""
    saved = value.to_dict()
    try:
        loaded = resolve(saved)
    except (TypeError, ValueError):
        return False
    return type(loaded) is type(value) and loaded.to_dict() == saved


def _register_config_fields(generation_config: GenerationConfig) -> None:
    """Make `generate(verifier=..., secure_schedule=...)` accepted by HF's config update."""
    for name in CONFIG_FIELDS:
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
        model.__class__ = _wrapped_class(type(model))
    restore_saved_fields(model)
    _register_config_fields(model.generation_config)
    return model


def hub_generate(model: PreTrainedModel, *args, **kwargs):
    """Entry point of the Hub `custom_generate/generate.py`: `generate()` of the wrapped model.

    transformers calls it with every `generate` argument (`assistant_model=` included) when a call
    passes `custom_generate="<repo or folder>"`, or on every call of a model loaded with
    `trust_remote_code=True` from a folder that holds `custom_generate/`. It runs the call as a wrapped
    model's (as `wrap()` does): SecureSD with a draft and a verifier, plain transformers otherwise. A model
    that is not wrapped stays so (the call runs on `_wrapped_view`), and its calls without
    `custom_generate`, in this thread or another, stay plain transformers (its saved verifier is read
    back onto its generation config, which plain transformers does not read). The draft may be passed as
    `draft=` too, as to `securesd_generate`."""
    kwargs = _draft_as_assistant_model(kwargs)
    if isinstance(model, SecureSDMixin):
        return type(model).generate(model, *args, **kwargs)
    view = _wrapped_view(model)
    return type(view).generate(view, *args, **kwargs)


def _wrapped_view(model: PreTrainedModel) -> PreTrainedModel:
    """`model` seen as its wrapped class: a new instance that shares the model's state (its `__dict__`:
    parameters, submodules, configs, hooks), so a call on it runs as a wrapped model's while `model` keeps
    its own class, for this thread and every other (`wrap` reads the saved fields back as it does)."""
    view = object.__new__(_wrapped_class(type(model)))
    view.__dict__ = model.__dict__
    return wrap(view)


def _patched_generate(self, *args, **kwargs):
    key = (GenerationMixin, "generate")
    if _patching.reentered(key, self):  # back from inside what ours called: transformers' own, once
        return _TRANSFORMERS_METHODS[key](self, *args, **kwargs)
    if _patching.active and not isinstance(self, SecureSDMixin):  # a wrapped model's generate prepared the call
        args, kwargs = _prepare_call(self, args, kwargs)
    return _patching.call_before(key, self, *args, **kwargs)


def _patched_assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config, *args,
                               **kwargs):
    """`GenerationMixin._assisted_decoding` under `patch()`: SecureSD's (`_assisted_decoding`) for a call
    whose generation config carries a verifier while patched; otherwise what was installed before
    `patch()` (transformers' own, or another library's wrapper of it)."""
    key = (GenerationMixin, "_assisted_decoding")
    arguments = (self, input_ids, logits_processor, stopping_criteria, generation_config, *args)
    if _patching.reentered(key, self):
        return _TRANSFORMERS_METHODS[key](*arguments, **kwargs)
    if _patching.active and getattr(generation_config, "verifier", None) is not None:
        return _assisted_decoding(*arguments, **kwargs)
    return _patching.call_before(key, *arguments, **kwargs)


def _patched_save_pretrained(self, save_directory, *args, **kwargs):
    """`PreTrainedModel.save_pretrained` under `patch()`: a verifier saved with the model and dropped by
    transformers on load is read back first, then saved as `SecureSDMixin.save_pretrained` does."""
    key = (PreTrainedModel, "save_pretrained")
    if _patching.reentered(key, self):
        return _TRANSFORMERS_METHODS[key](self, save_directory, *args, **kwargs)
    save = functools.partial(_patching.call_before, key, self)
    if not _patching.active:
        return save(save_directory, *args, **kwargs)
    restore_saved_fields(self)
    return _save_with_fields(self, save, save_directory, args, kwargs)


# what transformers itself defines for each attribute `patch()` replaces
_TRANSFORMERS_METHODS: dict[tuple[type, str], Callable] = {
    (GenerationMixin, "generate"): _ORIGINAL_GENERATE,
    (GenerationMixin, "_assisted_decoding"): _ORIGINAL_ASSISTED_DECODING,
    (PreTrainedModel, "save_pretrained"): PreTrainedModel.save_pretrained,
}


@dataclass
class _Patching:
    """Process-wide state of `patch()`: how many `patch()` calls are not yet undone, what each patched
    attribute held when ours was installed over it (`saved`), and which of them this thread is calling
    from ours right now, for which model (`_calling`). `patch()` and `unpatch()` hold `lock` while they
    change it, so that threads patching and unpatching at once keep the count and what is installed
    together (a thread's `patch()` could otherwise return while another thread's last `unpatch()` took
    ours away)."""

    count: int = 0
    active: bool = False
    saved: dict[tuple[type, str], Callable] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _calling: threading.local = field(default_factory=threading.local)

    def call_before(self, key: tuple[type, str], model: Any, *args: Any, **kwargs: Any) -> Any:
        """Call what the attribute `key` held before ours was installed (`saved`) for `model`."""
        method = self.saved[key]
        if method is _TRANSFORMERS_METHODS[key]:  # transformers' own never calls ours back: no loop to watch
            return method(model, *args, **kwargs)
        calling = self._calling.__dict__.setdefault("calls", set())
        marker = (key, id(model))
        calling.add(marker)
        try:
            return method(model, *args, **kwargs)
        finally:
            calling.discard(marker)

    def reentered(self, key: tuple[type, str], model: Any) -> bool:
        """Whether ours for `key` is called for `model` from inside the saved method it called for that same
        model (`call_before`): a wrapper that reaches ours without saying so (no `__wrapped__`) was saved by
        a later `patch()`. Such a call goes to transformers' method, so ours never calls itself in a loop;
        a nested call for another model (a guard model's own SecureSD `generate`) runs as usual."""
        return (key, id(model)) in self._calling.__dict__.get("calls", ())


_patching = _Patching()
_PATCHED_ATTRIBUTES = (
    (GenerationMixin, "generate", _patched_generate),
    (GenerationMixin, "_assisted_decoding", _patched_assisted_decoding),
    (PreTrainedModel, "save_pretrained", _patched_save_pretrained),
)


def _reaches(method: Any, ours: Callable) -> bool:
    """Whether `method` is `ours` or a wrapper of it that says so (its `__wrapped__` chain, as
    `functools.wraps` sets it, leads to ours)."""
    for _ in range(100):  # a chain of wrappers, never a loop
        if method is ours:
            return True
        method = getattr(method, "__wrapped__", None)
        if method is None:
            return False
    return False


def patch() -> None:
    """Enable SecureSD for every transformers model in this process (for pipelines you do not control).

    Calls nest: SecureSD stays enabled until `unpatch()` has been called once per `patch()`, so a library
    that patches and unpatches around its own work does not turn off a caller's patch. Whatever another
    library installed before (a wrapper of `generate` or `save_pretrained`) is called by ours and put back
    by the last `unpatch()`; a wrapper of ours (`functools.wraps`) that it installed after is kept and
    used. Safe to call from several threads."""
    with _patching.lock:
        _patching.count += 1
        if _patching.count > 1:
            return
        for owner, name, ours in _PATCHED_ATTRIBUTES:
            current = getattr(owner, name)
            if _reaches(current, ours):
                continue  # ours is installed already, or reached through a wrapper of it
            _patching.saved[(owner, name)] = current
            setattr(owner, name, ours)
        for name in CONFIG_FIELDS:
            setattr(GenerationConfig, name, None)
        _patching.active = True


def unpatch() -> None:
    """Undo one `patch()` (nothing without one); the last one puts back what each patched method held
    before ours. A method someone else installed over ours after `patch()` is left in place; ours,
    reached through it, then passes every call straight on: SecureSD is off either way. Safe to call from
    several threads."""
    with _patching.lock:
        if not _patching.count:
            return
        _patching.count -= 1
        if _patching.count:
            return
        _patching.active = False
        for owner, name, ours in _PATCHED_ATTRIBUTES:
            if getattr(owner, name) is ours:
                setattr(owner, name, _patching.saved[(owner, name)])
        for name in CONFIG_FIELDS:
            if name in vars(GenerationConfig):
                delattr(GenerationConfig, name)


class _Unset:
    """The default of a `securesd_generate` argument the call did not pass."""

    def __repr__(self) -> str:
        return "<not passed>"


UNSET: Any = _Unset()


def securesd_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    draft: PreTrainedModel | None = None,
    verifier: Any = UNSET,
    secure_schedule: Any = UNSET,
    num_assistant_tokens: Any = UNSET,
    num_assistant_tokens_schedule: Any = UNSET,
    assistant_confidence_threshold: Any = UNSET,
    output_deviation: Any = UNSET,
    stop_strings: Any = UNSET,
    **model_kwargs,
):
    """Decoding loop for `model.generate(..., custom_generate=securesd_generate, draft=<draft>, verifier=...)`.

    The verifier and schedule are resolved and checked as on a wrapped model (explicit kwarg > passed
    GenerationConfig > the model's generation config); with no verifier anywhere the rule is lossless.
    On a plain model transformers rebuilds a callable's arguments from its signature and drops
    `assistant_model` and `tokenizer`, so the draft is passed as `draft=`. On a wrapped or patched model
    both `draft=` and `assistant_model=` work (the call then takes the wrapped path). The arguments after
    `draft` are named here so that transformers hands them over as given instead of merging them into
    `generation_config`.
    """
    explicit = {
        name: value
        for name, value in (
            ("verifier", verifier),
            ("secure_schedule", secure_schedule),
            ("num_assistant_tokens", num_assistant_tokens),
            ("num_assistant_tokens_schedule", num_assistant_tokens_schedule),
            ("assistant_confidence_threshold", assistant_confidence_threshold),
            ("output_deviation", output_deviation),
        )
        if value is not UNSET
    }
    _check_callable_call(generation_config, draft, stop_strings)
    _check_model_inputs(model_kwargs)  # before the positions are read (inputs_embeds leaves no ids for them)
    restore_saved_fields(model)
    arguments = {
        **{key: value for key, value in model_kwargs.items() if key != "position_ids"},
        **explicit,
        "input_ids": input_ids,
        "position_ids": _callers_position_ids(input_ids, model_kwargs),
        "assistant_model": draft,
        "streamer": streamer,
        "synced_gpus": synced_gpus,
    }
    try:
        fields = _securesd_fields(model, arguments, generation_config, CALLABLE_DEFAULT_VERIFIER)
    except BoundaryResolutionError as error:
        if not error.unresolved:
            raise
        raise BoundaryResolutionError(
            f"Segments boundary {', '.join(map(repr, error.unresolved))} is text and needs the model's tokenizer, "
            "which transformers does not pass to a callable custom_generate on a model that is not wrapped; "
            "resolve it once with schedule.with_tokenizer(tokenizer), give the boundary as token ids, or wrap "
            "the model (hf_securesd.wrap(model)) and pass tokenizer= with assistant_model=<draft>",
            unresolved=error.unresolved,
        ) from None
    if fields is None:
        raise SecureSDConfigError(
            "verifier=None switches SecureSD off, but custom_generate=securesd_generate is SecureSD's decoding "
            "loop; for transformers' own assisted decoding drop custom_generate and pass assistant_model=<draft>, "
            "or pass a verifier"
        )
    for name, value in fields.items():
        setattr(generation_config, name, value)
    return _run_speculative(
        model, draft, input_ids, logits_processor, stopping_criteria, generation_config, streamer, model_kwargs
    )


def _check_callable_call(generation_config: GenerationConfig, draft: PreTrainedModel | None, stop_strings: Any) -> None:
    """Refuse what `custom_generate=securesd_generate` on a model that is not wrapped cannot see: the draft
    and the tokenizer, which transformers does not hand to a callable, and prompt lookup drafting."""
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
    if stop_strings is not UNSET and stop_strings is not None:
        raise SecureSDConfigError(
            "stop_strings= needs tokenizer=, which transformers does not pass to a callable custom_generate on a "
            "model that is not wrapped; wrap the model (hf_securesd.wrap(model)) and pass assistant_model=<draft>, "
            "or use custom_generate=hf_securesd.hub.path() with trust_remote_code=True"
        )


def _callers_position_ids(input_ids: torch.Tensor, model_kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The caller's own `position_ids=`, or None. transformers fills in the default positions (from the
    attention mask) before it calls a callable, so only positions that differ from those can be told
    apart; positions equal to them decode the same tokens."""
    position_ids = model_kwargs.get("position_ids")
    if position_ids is None:
        return None
    mask = model_kwargs.get("attention_mask")
    if mask is None:  # transformers drops an all-ones mask
        mask = torch.ones(input_ids.shape, dtype=torch.long, device=input_ids.device)
    default = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    rows, length = default.shape
    same = (
        position_ids.ndim == 2
        and position_ids.shape[0] in (1, rows)
        and position_ids.shape[1] == length
        and torch.equal(position_ids.to(default.device).expand(rows, length), default)
    )
    return None if same else position_ids
