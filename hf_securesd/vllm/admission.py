"""Admission: reject a SecureSD request the engine cannot run before it reaches the engine.

Runs where vLLM validates every request (`InputProcessor._validate_params`, in the front-end process),
so the error comes back as vLLM's own validation error: HTTP 400 from the server, an exception from
`LLM.generate`, and the engine keeps serving everything else.

Two things an HTTP client can send never reach that point as a SecureSD request, so they are checked
where vLLM's OpenAI server turns the request body into engine parameters (`to_sampling_params` /
`to_beam_search_params` of the completion, chat and responses request classes):

* a top-level `"securesd"` field (or a close misspelling): the server keeps unknown body fields on the
  request object and never passes them on, so the request would run as plain vLLM;
* `use_beam_search` on a request that asks for SecureSD (itself or through the server-wide default):
  vLLM's beam search builds its own parameters without `vllm_xargs` and drafts nothing to verify;
* `best_of` > 1 on a request that asks for SecureSD: vLLM 0.32 keeps the field aside and returns one
  completion, so the request would not get what it asked for.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Iterable, Mapping

from ..segments import Segments, check_boundary_ids
from ..validation import SecureSDConfigError
from .request import (
    DEFAULT_ENV,
    EXTRA_ARGS_KEY,
    SecureSDRequest,
    TextBoundaryNeedsTokenizer,
    looks_like_securesd,
    parse_request,
    request_for,
)

logger = logging.getLogger(__name__)
# vLLM 0.32's OpenAI request classes (module, class) whose body fields become engine parameters.
HTTP_REQUEST_CLASSES = (
    ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest"),
    ("vllm.entrypoints.openai.responses.protocol", "ResponsesRequest"),
)
HTTP_PARAMETER = "vllm_xargs.securesd"
# The scale-out token route (`/inference/v1/generate`, `vllm serve --enable-scale-out`): (module, class) of
# its handler. Its schema drops unknown fields, so SecureSD sent outside sampling_params.extra_args is
# looked for in the raw body there.
SCALE_OUT_HANDLER = ("vllm.entrypoints.scale_out.token_in_token_out.serving", "ServingTokens")
# The Anthropic Messages route (`/v1/messages`): its request schema drops unknown fields before any of
# the request classes above sees them (it copies known fields into a chat request), so a top-level
# SecureSD field is looked for in the raw body of its handler.
ANTHROPIC_HANDLER = ("vllm.entrypoints.anthropic.serving", "AnthropicServingMessages")


# vLLM's speculative methods the plugin verifies: those whose proposer samples from a draft
# distribution over the target's vocabulary (the plugin records its logits), and those that propose
# deterministically (one-hot drafts, no draft logits).
WITH_DRAFT_DISTRIBUTION = ("draft_model", "eagle", "eagle3")
ONE_HOT = ("ngram",)
_PARALLEL = "drafts every position in one pass (parallel drafting), whose logits the plugin does not record"
NOT_VERIFIED = {
    "suffix": "suffix decoding needs the arctic-inference package (vLLM 0.32 asks for "
    "arctic-inference==0.1.1), which is published as source only, with no wheel for vLLM's CPU build, so "
    "the plugin has not been run with it",
    "mtp": "MTP drafting has not been run with the plugin (no model with MTP layers runs in its CPU test "
    "environment), so its response positions and draft logits are unverified",
    "medusa": "Medusa drafts from several heads at once, not token by token, and has not been run with it",
    "mlp_speculator": "the MLP speculator has not been run with the plugin",
    "dflash": f"DFlash {_PARALLEL}",
    "dspark": f"DSpark {_PARALLEL}",
    "ngram_gpu": "the GPU n-gram proposer has not been run with the plugin (use method \"ngram\")",
}
_START_HINT = (
    "start it with --speculative-config '{\"method\": \"draft_model\", \"model\": \"<draft>\", "
    "\"num_speculative_tokens\": 5}' (or ngram, eagle, eagle3)"
)


def check_request(params: Any, vllm_config: Any) -> None:
    """Raise SecureSDConfigError when `params` (SamplingParams) asks for SecureSD that `vllm_config`
    cannot give; return quietly for plain requests and for SecureSD requests it can run. A request that
    sends no "securesd" and inherits the server-wide default is told so: the fix is the server's."""
    request = request_for(getattr(params, "extra_args", None))
    if request is None:
        return
    if getattr(params, "logprob_token_ids", None) is not None:  # the request's own option, whatever its settings
        raise SecureSDConfigError(
            "logprob_token_ids cannot be combined with SecureSD verification: vLLM's rejection sampler fails "
            "on it under speculative decoding (a shape mismatch in _get_logprobs_tensors, after which the "
            "engine stops or hangs); ask for logprobs=N instead"
        )
    if EXTRA_ARGS_KEY in (getattr(params, "extra_args", None) or {}):
        _check_engine_can_run(request, vllm_config, f'extra_args["{EXTRA_ARGS_KEY}"]')
        return
    try:
        _check_engine_can_run(request, vllm_config, f"the server-wide default {DEFAULT_ENV}")
    except SecureSDConfigError as error:
        raise SecureSDConfigError(
            f"{error}. This request sent no \"{EXTRA_ARGS_KEY}\" and inherits the server-wide default "
            f"{DEFAULT_ENV}, which this engine cannot run: change it and restart the server, or send "
            f"\"{EXTRA_ARGS_KEY}\" in the request (\"null\" for plain decoding)"
        ) from None


def _check_engine_can_run(request: SecureSDRequest, vllm_config: Any, origin: str) -> None:
    """Whether this engine can run the parsed `request`'s settings; its errors name `origin` (the request's
    own field or the server-wide default)."""
    speculative = vllm_config.speculative_config
    if speculative is None:
        own = "" if origin.startswith("the server-wide") else ' (or send the request without "securesd")'
        raise SecureSDConfigError(
            f"{origin} asks for SecureSD verification but the engine runs without speculative decoding; "
            f"{_START_HINT}{own}"
        )
    check_proposer(request, speculative)
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
            "SecureSD verification runs on vLLM's GPUModelRunner (the V1 runner); this engine uses Model "
            "Runner V2. Start it with VLLM_USE_V2_MODEL_RUNNER=0 (the plugin sets this when it is unset)"
        )
    check_engine_draft_length(request, speculative.num_speculative_tokens, origin)
    scheduler = getattr(vllm_config, "scheduler_config", None)
    if getattr(request.schedule, "reads_tokens", False) and getattr(scheduler, "async_scheduling", False):
        raise SecureSDConfigError(
            f'{origin}["secure_schedule"]: {request.schedule.name} reads each request\'s '
            "committed response, and with vLLM's async scheduling (on in this engine) its last tokens are still "
            "placeholders when a step is verified. Start vLLM with --no-async-scheduling (async_scheduling="
            "False) to use it, or send a position schedule (step, linear, power)"
        )
    try:
        check_boundary_ids(
            request.schedule,
            vllm_config.model_config.get_vocab_size(),
            fix="give the boundary as text (the server resolves it with this model's tokenizer) or as this "
            "model's own token ids",
        )
    except SecureSDConfigError as error:
        raise SecureSDConfigError(f'{origin}["secure_schedule"]: {error}') from None


def check_engine_draft_length(request: SecureSDRequest, k: int, origin: str) -> None:
    """Raise SecureSDConfigError, in the request's and the server's terms, when the request's verifier is
    not defined for the engine's k drafts a step (`num_speculative_tokens`), e.g. a FLy window W > k - 1;
    `origin` names where the request's settings come from."""
    try:
        request.verifier.check_draft_length(k)
    except ValueError as error:
        origin = f'{origin}["verifier"]'
        smallest = request.verifier.needs().min_draft_tokens
        if k < smallest:
            window = getattr(request.verifier, "window", None)
            if window is not None and k >= 2:
                fix = (f'send "window": {k - 1} or less in the verifier object, or start the engine with '
                       f"num_speculative_tokens >= {smallest}")
            elif smallest > 2 and window is not None:
                fix = (f"start the engine with num_speculative_tokens >= {smallest} (>= 2 with a smaller "
                       '"window"), or send another verifier')
            else:
                fix = f"start the engine with num_speculative_tokens >= {smallest}, or send another verifier"
            raise SecureSDConfigError(
                f"{origin}: {request.verifier.name} needs at least {smallest} drafted tokens a step, and this "
                f"engine drafts k = {k} (num_speculative_tokens); {fix}"
            ) from None
        raise SecureSDConfigError(f"{origin}: {error} (k is the engine's num_speculative_tokens, {k})") from None


def check_proposer(request: SecureSDRequest, speculative: Any) -> None:
    """Raise SecureSDConfigError unless the engine's speculative method can feed the request's verifier:
    a method the plugin verifies, and, for a one-hot proposer, a rule that needs no draft distribution
    (`Verifier.needs`, read through `Verifier.check_proposer`)."""
    method = speculative.method
    if getattr(speculative, "parallel_drafting", False):
        raise SecureSDConfigError(
            f"SecureSD verification cannot run with parallel drafting (method {method!r} with "
            "parallel_drafting): the drafter proposes every position in one pass, whose logits the plugin "
            f"does not record per request; {_START_HINT}"
        )
    if method in ONE_HOT:
        try:
            request.verifier.check_proposer(
                f"vLLM's {method} proposer", has_raw_draft_logits=False,
                draft_model="an engine started with a draft model (--speculative-config "
                "'{\"method\": \"draft_model\", ...}', or eagle/eagle3)",
            )
        except ValueError as error:
            raise SecureSDConfigError(str(error)) from None
        return
    if method in WITH_DRAFT_DISTRIBUTION:
        return
    reason = NOT_VERIFIED.get(method, f"the plugin does not verify speculative method {method!r}")
    raise SecureSDConfigError(
        f"SecureSD verification cannot run on this engine: {reason}. Methods it verifies: "
        f"{', '.join(WITH_DRAFT_DISTRIBUTION + ONE_HOT)}; {_START_HINT}"
    )


def check_http_body(request: Any) -> None:
    """Raise SecureSDConfigError when an OpenAI request body carries SecureSD where vLLM drops it: a
    top-level "securesd" field (or a close misspelling), which the server keeps aside and ignores."""
    check_body_fields(getattr(request, "model_extra", None) or {})


def _asks_for_securesd(request: Any) -> bool:
    """Whether an OpenAI request asks for SecureSD: its vllm_xargs, or the server-wide default it did not opt
    out of (a text boundary, which the engine's tokenizer resolves later, asks for it too)."""
    try:
        return request_for(getattr(request, "vllm_xargs", None)) is not None
    except TextBoundaryNeedsTokenizer:
        return True


def check_best_of(request: Any) -> None:
    """Raise SecureSDConfigError when an OpenAI request that asks for SecureSD (its vllm_xargs, or the
    server-wide default it did not opt out of) sends a `best_of` other than a number up to 1: vLLM 0.32
    has no best_of in its SamplingParams, keeps the field aside (a declared field of some request classes,
    an unknown one of others, in any JSON form: "3", [2], true) and returns one completion, so the request
    would silently not get the best of anything."""
    best_of = getattr(request, "best_of", None)
    extra = getattr(request, "model_extra", None)
    if best_of is None and isinstance(extra, Mapping):
        best_of = extra.get("best_of")
    number = isinstance(best_of, (int, float)) and not isinstance(best_of, bool)
    if best_of is None or (number and best_of <= 1) or not _asks_for_securesd(request):
        return
    if number:
        raise SecureSDConfigError(
            f"best_of={best_of} cannot run with SecureSD: vLLM 0.32 accepts best_of and ignores it (it returns "
            "one completion from one sequence), so the request would not get the best of several; drop "
            "best_of (or send 1), or ask for n completions and choose among them"
        )
    raise SecureSDConfigError(
        f"best_of={_short(best_of)} cannot run with SecureSD: best_of is a number of completions, and vLLM 0.32 "
        "ignores it in any form (it returns one completion), so the request would not get what it asked for; "
        "drop best_of (or send 1), or ask for n completions and choose among them"
    )


def check_http_request(request: Any) -> None:
    """The checks of an OpenAI request that builds engine parameters: `check_http_body`, `check_best_of`."""
    check_http_body(request)
    check_best_of(request)


def check_body_fields(fields: Any) -> None:
    """Raise SecureSDConfigError when the top-level fields of a request body (a mapping; anything else is
    left to the route) hold "securesd" or a close misspelling, which vLLM's server ignores there, or hold
    one nested in another field (up to `NESTED_SEARCH_DEPTH` levels): `"extra_body": {"vllm_xargs":
    {"securesd": ...}}` (the OpenAI Python client's argument written into the JSON), `"extra_args":
    {"securesd": ...}` (the SamplingParams name), which it ignores as well. A `vllm_xargs` field (in the raw
    body of a route whose schema declares it) is where SecureSD belongs: not searched."""
    if not isinstance(fields, Mapping):
        return
    for key, value in fields.items():
        if key == EXTRA_ARGS_KEY or looks_like_securesd(key):
            raise SecureSDConfigError(
                f"the request body has a top-level field {_short(key)}, which vLLM's server ignores; SecureSD is "
                f"selected inside vllm_xargs: {XARGS_EXAMPLE} (a JSON string)"
            )
        path = None if key == "vllm_xargs" else _nested_securesd(value, NESTED_SEARCH_DEPTH)
        if path is not None:
            where = ".".join(name if _plain_name(name) else _short(name, 30) for name in (key, *path))
            raise SecureSDConfigError(
                f"the request body's field {where} is not read: vLLM's server reads SecureSD only from a "
                "top-level vllm_xargs and ignores it elsewhere (an OpenAI client's extra_body goes at the top "
                f"level of the JSON body); select it with {XARGS_EXAMPLE} (a JSON string)"
            )


XARGS_EXAMPLE = '"vllm_xargs": {"securesd": "{\\"verifier\\": \\"mars\\"}"}'
NESTED_SEARCH_DEPTH = 3  # levels of an unknown field searched for a SecureSD key (extra_body.vllm_xargs.securesd)


def _plain_name(name: Any) -> bool:
    """Whether a body key can be shown as it is in a message: a short identifier."""
    return isinstance(name, str) and name.isidentifier() and name.isascii() and len(name) <= 30


def _nested_securesd(value: Any, depth: int) -> tuple[str, ...] | None:
    """The keys leading to "securesd" (or a close misspelling) inside `value` (mappings nested up to
    `depth` levels), or None when there is none."""
    if depth <= 0 or not isinstance(value, Mapping):
        return None
    for key, inner in value.items():
        if key == EXTRA_ARGS_KEY or looks_like_securesd(key):
            return (key,)
        found = _nested_securesd(inner, depth - 1)
        if found is not None:
            return (key, *found)
    return None


def check_generate_body(body: Any) -> None:
    """Raise SecureSDConfigError when a `/inference/v1/generate` body (the parsed JSON, or None) carries
    SecureSD where that route's schema drops it: `securesd` (or a misspelling), or a `vllm_xargs` holding
    one, at the top of the body or directly inside `sampling_params`. That route reads SecureSD from
    `sampling_params.extra_args.securesd` only."""
    if not isinstance(body, Mapping):
        return
    sampling = body.get("sampling_params")
    for place, fields in (("the request body", body), ("sampling_params", sampling)):
        if not isinstance(fields, Mapping):
            continue
        for key, value in fields.items():
            xargs = key == "vllm_xargs" and isinstance(value, Mapping) and any(
                name == EXTRA_ARGS_KEY or looks_like_securesd(name) for name in value
            )
            if key == EXTRA_ARGS_KEY or looks_like_securesd(key) or xargs:
                raise SecureSDConfigError(
                    f"{place} has the field {key!r}, which /inference/v1/generate drops; on this route SecureSD "
                    'goes in sampling_params.extra_args: "sampling_params": {"extra_args": {"securesd": '
                    '{"verifier": "mars"}}}'
                )


def check_beam_search(request: Any) -> None:
    """Raise SecureSDConfigError when a beam search request asks for SecureSD (its vllm_xargs, or the
    server-wide default it did not opt out of): beam search drafts nothing, so nothing would be verified."""
    check_http_body(request)
    if _asks_for_securesd(request):
        raise SecureSDConfigError(
            "use_beam_search cannot run with SecureSD: vLLM's beam search neither drafts nor forwards "
            "vllm_xargs, so the request would be served as plain beam search. Drop use_beam_search, or send "
            '"vllm_xargs": {"securesd": "null"} for plain beam search'
        )


def resolve_text_boundaries(params: Any, tokenizer: Any) -> None:
    """A segments schedule with text boundaries (the request's own, or the server-wide default) resolved
    with the model's tokenizer, written back into `params.extra_args["securesd"]` as token ids, so vLLM's
    workers, which hold no tokenizer, verify with the same boundaries. Other requests are left as they are."""
    extra_args = getattr(params, "extra_args", None) or {}
    own = EXTRA_ARGS_KEY in extra_args
    raw = extra_args[EXTRA_ARGS_KEY] if own else os.environ.get(DEFAULT_ENV, "").strip() or None
    if raw is None or tokenizer is None:
        return
    origin = f'extra_args["{EXTRA_ARGS_KEY}"]' if own else f"the server-wide default {DEFAULT_ENV}"
    request = parse_request(raw, origin=origin, tokenizer=tokenizer)
    schedule = request.schedule if request is not None else None
    if isinstance(schedule, Segments) and schedule.text_boundaries:
        resolved = json.dumps(request.with_token_ids())
        try:  # the workers read the written form: it must pass the same bounds as a client's request
            parse_request(resolved, origin=origin)
        except SecureSDConfigError as error:
            counts = [len(ids) for ids in schedule.token_boundaries]
            raise SecureSDConfigError(
                f"{origin}: the segments boundary text resolves to {counts} token(s) with this model's tokenizer, "
                f"and written as token ids the request exceeds a request's bounds ({error}); use a shorter "
                "boundary (a few tokens, e.g. '</think>')"
            ) from None
        params.extra_args = {**extra_args, EXTRA_ARGS_KEY: resolved}


def _draft_tokens(vllm_config: Any) -> int:
    """The engine's drafts per step (`num_speculative_tokens`; 0 without speculative decoding)."""
    speculative = getattr(vllm_config, "speculative_config", None)
    value = getattr(speculative, "num_speculative_tokens", 0) if speculative is not None else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def engine_stop_ids(input_processor: Any) -> set[int]:
    """The ids vLLM 0.32 puts in every request's stop set (`SamplingParams.all_stop_token_ids`) besides
    the request's own stop_token_ids, read from its `InputProcessor` (`input_processor`): the renderer's
    EOS id and every id of the generation config's `eos_token_id` (an int or a list).
    `update_from_generation_config` adds them after admission, whatever `ignore_eos`, and the min-tokens
    processor bans them until `min_tokens` tokens are out. Anything unreadable is left out."""
    ids: set[int] = set()
    renderer = getattr(input_processor, "renderer", None)
    try:
        eos = renderer.get_eos_token_id() if renderer is not None else None
    except Exception:  # noqa: BLE001 - no tokenizer: vLLM has no EOS id either
        eos = None
    if isinstance(eos, int) and not isinstance(eos, bool):
        ids.add(eos)
    fields = getattr(input_processor, "generation_config_fields", None)
    configured = fields.get("eos_token_id") if isinstance(fields, Mapping) else None
    configured = [configured] if isinstance(configured, int) else configured
    if isinstance(configured, (list, tuple, set)):
        ids.update(token for token in configured if isinstance(token, int) and not isinstance(token, bool))
    return ids


def check_some_token_allowed(
    params: Any, tokenizer: Any, engine_stops: Iterable[int] = (), draft_tokens: int = 0
) -> None:
    """Raise SecureSDConfigError when a SecureSD request's `allowed_token_ids` leave it no token to emit
    after some response it can reach; the target's distribution is then empty and no rule defines the
    next token. Plain requests are vLLM's business.

    What vLLM 0.32 bans: a bad word's last token whenever the response ends with the word's other tokens
    (`apply_bad_words`; a one-token word at every position), and, while fewer than `min_tokens` tokens are
    out, every stop id: the request's `stop_token_ids` and `engine_stops`, the engine's EOS ids
    (`engine_stop_ids`, banned whatever `ignore_eos`). The bad words are tokenized as vLLM does
    (`SamplingParams.update_from_tokenizer`). What is banned after a response depends only on the longest
    bad-word prefix (a word less its last token, the empty prefix included) that the response ends with,
    so each prefix P is checked as a response's tail. P counts when its tokens are allowed, it holds no
    token that ends a response (a stop id; an EOS id unless `ignore_eos`) and no whole bad word (whose last
    token vLLM would have banned on the way); it leaves nothing when every allowed token is the last token
    of a bad word whose prefix ends P, or a stop id when P, as the whole response, is shorter than
    min_tokens + `draft_tokens` (the engine's drafts per step: at the position after a step's last draft
    vLLM bans the stop ids while the committed response, drafts not counted, is shorter than min_tokens).
    A P of `max_tokens` tokens or more is never followed by a token. `tokenizer` None: bad words are not
    tokenized here (vLLM ignores them without one)."""
    allowed = getattr(params, "allowed_token_ids", None)
    if not allowed or request_for(getattr(params, "extra_args", None)) is None:
        return
    allowed = set(allowed)
    # None: bad words vLLM refuses itself, or that fail to tokenize; the stop ids are still checked
    words = _bad_words_token_ids(getattr(params, "bad_words", None) or (), tokenizer) or []
    min_tokens = getattr(params, "min_tokens", 0) or 0
    own_stops = set(getattr(params, "stop_token_ids", None) or ())
    engine_stops = set(engine_stops)
    stops = own_stops | engine_stops
    ends = own_stops if getattr(params, "ignore_eos", False) else stops
    max_tokens = getattr(params, "max_tokens", None)
    # One character per token, so that "ends with" and "holds" are string operations.
    texts = [(word, _as_text(tokens)) for word, tokens in words]
    prefixes: dict[str, str] = {"": ""}
    for word, text in texts:
        prefixes.setdefault(text[:-1], word)
    for tail, word in sorted(prefixes.items(), key=lambda item: len(item[0])):
        tokens = [ord(char) for char in tail]
        if isinstance(max_tokens, int) and len(tokens) >= max_tokens:
            break  # the response ends before a token follows P (prefixes come shortest first)
        if not allowed.issuperset(tokens) or ends.intersection(tokens):
            continue
        if any(text in tail for _, text in texts):
            continue  # vLLM bans a bad word's last token, so no response ends with P
        banned = {ord(text[-1]) for _, text in texts if tail.endswith(text[:-1])}
        early = len(tokens) < min_tokens + draft_tokens and not stops.intersection(tokens)
        by_words = allowed <= banned
        if not by_words and not (early and allowed <= banned | stops):
            continue
        shown = sorted(allowed)[:8]
        if not tokens and by_words:
            raise SecureSDConfigError(
                f"allowed_token_ids {shown} are all banned by bad_words, so no token may ever be emitted and "
                "the next token is undefined; allow a token that bad_words does not ban"
            )
        if not tokens:
            eos = f" and the model's EOS ids {sorted(engine_stops)[:8]}, whatever ignore_eos" if engine_stops else ""
            raise SecureSDConfigError(
                f"allowed_token_ids {shown} hold only stop tokens (stop_token_ids{eos}) and bad words, which "
                f"min_tokens={min_tokens} bans until that many tokens are out, so the first token is undefined; "
                "allow a token that is neither, or drop min_tokens"
            )
        what, fix = "bad_words ban", ""
        if not by_words:
            what, fix = f"bad_words and min_tokens={min_tokens} (stop ids) ban", ", or lower min_tokens"
        raise SecureSDConfigError(
            f"allowed_token_ids {shown} leave no token after the response tokens {_listed(tokens)}"
            f"{_decoded(tokenizer, tokens)}, the start of bad word {_short(word)}: {what} every allowed token "
            "there, so the next token is undefined; allow a token that is not banned after those tokens, or "
            f"drop the bad word {_short(word)}{fix}"
        )


def _bad_words_token_ids(bad_words: Any, tokenizer: Any) -> list[tuple[str, list[int]]] | None:
    """(word, token ids) for each form vLLM bans for `bad_words`, tokenized as vLLM 0.32's
    `SamplingParams.update_from_tokenizer` does: the word without leading spaces, then with one leading
    space when that form's first token differs and its length is the same. An empty list without a
    tokenizer; None for words vLLM refuses itself (a word with no tokens, more forms than
    VLLM_MAX_NUM_BAD_WORDS, ids no string can hold) or that fail to tokenize: vLLM answers those."""
    if tokenizer is None:
        return []
    forms: list[tuple[str, list[int]]] = []
    limit = _max_bad_words()
    try:
        for word in bad_words:
            if not isinstance(word, str):
                return None
            plain = [int(token) for token in tokenizer.encode(word.lstrip(), add_special_tokens=False)]
            if not plain:
                return None
            forms.append((word, plain))
            spaced = [int(token) for token in tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)]
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                forms.append((word, spaced))
            if len(forms) > limit:
                return None
    except Exception:  # noqa: BLE001 - vLLM tokenizes them again and answers the failure itself
        return None
    if any(not 0 <= token <= _LAST_CHAR for _, ids in forms for token in ids):
        return None
    return forms


_LAST_CHAR = 0x10FFFF


def _as_text(tokens: list[int]) -> str:
    return "".join(map(chr, tokens))


def _max_bad_words() -> int:
    """vLLM's VLLM_MAX_NUM_BAD_WORDS (its default 128): beyond it vLLM refuses the request itself."""
    try:
        return int(os.environ.get("VLLM_MAX_NUM_BAD_WORDS", "128"))
    except ValueError:
        return 128


def _decoded(tokenizer: Any, tokens: list[int]) -> str:
    """` ('text')` for `tokens` decoded by `tokenizer` (shortened), or nothing when that fails."""
    try:
        return f" ({_short(tokenizer.decode(tokens))})"
    except Exception:  # noqa: BLE001 - the ids alone still name the place
        return ""


def _short(text: Any, limit: int = 60) -> str:
    """`text`'s repr, cut to about `limit` characters for a message."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(str(text))} characters)"


def _listed(tokens: list[int], limit: int = 8) -> str:
    return str(tokens) if len(tokens) <= limit else f"{str(tokens[:limit])[:-1]}, ...] ({len(tokens)} tokens)"


def patch_admission(
    input_processor_class: type, sampling_params_class: type, error_class: type[Exception]
) -> Callable[[], None]:
    """Wrap `input_processor_class._validate_params` so SecureSD errors in a `sampling_params_class`
    request surface as `error_class` (vLLM's validation error), and the OpenAI request classes
    (`HTTP_REQUEST_CLASSES`, see `patch_http_requests`); returns a function that undoes both."""
    original = input_processor_class._validate_params

    def _validate_params(self, params: Any, *args: Any, **kwargs: Any):
        result = original(self, params, *args, **kwargs)
        if isinstance(params, sampling_params_class):
            try:
                tokenizer = getattr(self, "tokenizer", None)
                resolve_text_boundaries(params, tokenizer)
                check_request(params, self.vllm_config)
                check_some_token_allowed(params, tokenizer, engine_stop_ids(self), _draft_tokens(self.vllm_config))
            except SecureSDConfigError as error:
                raise error_class(str(error), parameter="extra_args.securesd") from None
        return result

    input_processor_class._validate_params = _validate_params
    undo_http = patch_http_requests(_importable(HTTP_REQUEST_CLASSES), error_class)
    undo_generate = patch_generate_route(_importable((SCALE_OUT_HANDLER,)))
    undo_messages = patch_body_route(
        _importable((ANTHROPIC_HANDLER,)), "create_messages", check_body_fields, HTTP_PARAMETER
    )

    def undo() -> None:
        input_processor_class._validate_params = original
        undo_http()
        undo_generate()
        undo_messages()

    return undo


def patch_generate_route(handler_classes: list[type]) -> Callable[[], None]:
    """Wrap `serve_tokens` of the scale-out token route's handler so a body carrying SecureSD where the
    route drops it (`check_generate_body`) gets an HTTP 400; returns a function that undoes it."""
    return patch_body_route(
        handler_classes, "serve_tokens", check_generate_body, "sampling_params.extra_args.securesd"
    )


def patch_body_route(
    handler_classes: list[type], method: str, check: Callable[[Any], None], parameter: str
) -> Callable[[], None]:
    """Wrap the async `method(request, raw_request, ...)` of each handler class so that a JSON body whose
    fields the request's schema does not declare (its pydantic `model_fields`), which `check` is given,
    are refused by `check` (SecureSDConfigError) gets the handler's own error response, HTTP 400, naming
    `parameter`; returns a function that undoes it."""
    originals = [(cls, cls.__dict__[method]) for cls in handler_classes if method in cls.__dict__]

    def wrapped(original: Callable) -> Callable:
        async def checked(self, request: Any, raw_request: Any = None, *args: Any, **kwargs: Any):
            try:
                check(_undeclared_fields(await _json_body(raw_request), type(request)))
            except SecureSDConfigError as error:
                return self.create_error_response(str(error), param=parameter)
            return await original(self, request, raw_request, *args, **kwargs)

        return checked

    for cls, original in originals:
        setattr(cls, method, wrapped(original))

    def undo() -> None:
        for cls, original in originals:
            setattr(cls, method, original)

    return undo


def _undeclared_fields(body: Any, request_class: type) -> Any:
    """The fields of a JSON body (a mapping; anything else is returned as it is) that `request_class`
    (a pydantic model) does not declare: those its schema drops."""
    if not isinstance(body, Mapping):
        return body
    declared = getattr(request_class, "model_fields", None) or {}
    return {key: value for key, value in body.items() if key not in declared}


async def _json_body(raw_request: Any) -> Any:
    """The request's JSON body (read once by the server already, so cached), or None when unreadable."""
    if raw_request is None:
        return None
    try:
        return await raw_request.json()
    except Exception:  # noqa: BLE001 - not JSON, or not readable here: the route's own parsing decides
        return None


def _importable(locations: tuple[tuple[str, str], ...]) -> list[type]:
    """The classes at `locations` that this vLLM has; a missing one is logged (its route is unchecked)."""
    import importlib

    found = []
    for module_name, class_name in locations:
        try:
            found.append(getattr(importlib.import_module(module_name), class_name))
        except (ImportError, AttributeError) as error:
            logger.warning(
                "hf-securesd: %s.%s not found (%s); its request bodies are not checked",
                module_name, class_name, error,
            )
    return found


def patch_http_requests(
    request_classes: list[type],
    error_class: Callable[..., Exception],
    checks: Mapping[str, Callable[[Any], None]] | None = None,
) -> Callable[[], None]:
    """Wrap the methods of each class that build a request's parameters so a check's SecureSDConfigError
    surfaces as `error_class(message, parameter=...)` (HTTP 400); returns a function that undoes it.
    `checks`: method name -> check of the request object; by default `to_sampling_params` gets the
    top-level field and best_of checks (`check_http_request`) and `to_beam_search_params` the beam
    search check."""
    originals: list[tuple[type, str, Any]] = []

    def wrap(cls: type, name: str, check: Callable[[Any], None]) -> None:
        original = cls.__dict__.get(name)
        if original is None:
            return

        def checked(self, *args: Any, **kwargs: Any):
            try:
                check(self)
            except SecureSDConfigError as error:
                raise error_class(str(error), parameter=HTTP_PARAMETER) from None
            return original(self, *args, **kwargs)

        originals.append((cls, name, original))
        setattr(cls, name, checked)

    checks = checks if checks is not None else {"to_sampling_params": check_http_request,
                                                "to_beam_search_params": check_beam_search}
    for cls in request_classes:
        for name, check in checks.items():
            wrap(cls, name, check)

    def undo() -> None:
        for cls, name, original in reversed(originals):
            setattr(cls, name, original)

    return undo
