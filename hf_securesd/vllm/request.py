"""What one vLLM request asks of SecureSD: a verifier and an optional schedule.

A request selects SecureSD through `SamplingParams.extra_args["securesd"]`, holding the same dicts
that `GenerationConfig` serialises (`Verifier.to_dict()`, `Schedule.to_dict()`):

```python
>>> SamplingParams(max_tokens=64, extra_args={"securesd": {
...     "verifier": {"verifier": "mars", "theta": 0.5},
...     "secure_schedule": {"schedule": "step", "L": 1}}})
```

Over HTTP vLLM only forwards flat values through `vllm_xargs`, so there the same object is sent as a
JSON string: `"vllm_xargs": {"securesd": "{\\"verifier\\": \\"mars\\"}"}`. A bare verifier name
(`"mars"`) is accepted wherever a verifier dict is. A server-wide default comes from the
`SECURESD_VLLM_DEFAULT` environment variable (the same JSON); a request opts out of it with
`"securesd": None` (or `False`) in Python, `"securesd": "null"` over HTTP (vLLM turns a JSON `false` in
`vllm_xargs` into 0, which is refused with that fix). The fields and the rules' options go inside
`"securesd"`: beside it they are refused, never ignored. Nothing here imports vLLM.

Everything a client sends is untrusted: the JSON text is bounded in length and nesting depth before it
is parsed, the parsed object in size and depth before it is read, a key that looks like a misspelling
of `securesd` (or of a field) is refused with a "did you mean", and the schedule is evaluated once on
probe positions up to 2^62, so a request that parses cannot fail later inside the engine.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, Iterable, Mapping

import torch

from ..schedules import SCHEDULES, Schedule, check_weights, resolve_schedule, schedule_weights, short_repr
from ..segments import Segments
from ..spelling import letters, nearly
from ..validation import SecureSDConfigError
from ..verifiers import VERIFIERS, Verifier, resolve_verifier

EXTRA_ARGS_KEY = "securesd"
DEFAULT_ENV = "SECURESD_VLLM_DEFAULT"
_FIELDS = ("verifier", "secure_schedule")
# A request is at most two objects deep ({"verifier": {"verifier": "mars", "theta": 0.5}}), four with a
# segments schedule over several multi-token boundaries ({"secure_schedule": {"boundary": [[1, 2], [3]]}}),
# and a few hundred characters long; these bounds leave room and stop hostile input before any parsing.
MAX_JSON_CHARS = 4096
MAX_DEPTH = 5
MAX_VALUES = 64
MAX_STRING_CHARS = 256
# Response positions the schedule is evaluated at on admission: the first ones and one far beyond any
# response, where a schedule with a huge L must still give a weight in [0, 1].
_PROBE_STARTS = (0, 1, 2**62)
_PROBE_DRAFTS = 2
_EXAMPLE = '{"verifier": {"verifier": "mars", "theta": 0.5}, "secure_schedule": {"schedule": "step", "L": 1}}'


class TextBoundaryNeedsTokenizer(SecureSDConfigError):
    """A segments boundary given as text where no tokenizer resolves it (the engine resolves text with the
    model's tokenizer when it admits a request; an engine started with skip_tokenizer_init has none)."""


@dataclass(frozen=True)
class SecureSDRequest:
    """A resolved per-request configuration. `schedule` None means the pure relaxed verifier."""

    verifier: Verifier
    schedule: Schedule | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verifier": self.verifier.to_dict(),
            "secure_schedule": None if self.schedule is None else self.schedule.to_dict(),
        }

    def with_token_ids(self) -> dict[str, Any]:
        """`to_dict()` with a segments schedule's resolved text boundaries written as their token ids, so
        that a process without the tokenizer (vLLM's workers) reads the same boundaries."""
        form = self.to_dict()
        if isinstance(self.schedule, Segments) and self.schedule.token_boundaries is not None:
            boundaries = [list(ids) for ids in self.schedule.token_boundaries]
            form["secure_schedule"]["boundary"] = boundaries[0] if len(boundaries) == 1 else boundaries
        return form


def parse_request(
    value: Any, origin: str = f'extra_args["{EXTRA_ARGS_KEY}"]', tokenizer: Any = None
) -> SecureSDRequest | None:
    """`extra_args["securesd"]` (dict, JSON string, verifier name, or None/False) -> request or None.
    `tokenizer` (the model's, at admission) resolves a segments schedule's text boundaries.

    Raises SecureSDConfigError naming `origin` (and the field inside it) and the fix for anything it
    cannot use; it never raises anything else, whatever `value` is."""
    if value is None or value is False:
        return None
    if isinstance(value, str):
        value = _from_json(value, origin)
        if value is None or value is False:
            return None
    if isinstance(value, str):
        value = {"verifier": value}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        raise SecureSDConfigError(
            f"{origin} is the number {value!r}; over HTTP vLLM turns a JSON true/false in vllm_xargs into 1/0, so "
            f'send a verifier name or object as a JSON string ("mars", or {_EXAMPLE}), or the string "null" '
            "for plain vLLM"
        )
    if not isinstance(value, Mapping):
        raise SecureSDConfigError(
            f"{origin} must be an object such as {_EXAMPLE} (or its JSON string), got {short_repr(value)}"
        )
    _check_size(value, origin)
    _refuse_unknown_keys(value, _FIELDS, origin)
    verifier, schedule = value.get("verifier"), value.get("secure_schedule")
    _check_verifier_form(verifier, schedule, origin)
    resolved = _build(resolve_verifier, verifier, f'{origin}["verifier"]')
    schedule_origin = f'{origin}["secure_schedule"]'
    resolved_schedule = _build(resolve_schedule, _schedule_form(schedule, origin), schedule_origin)
    if tokenizer is not None and isinstance(resolved_schedule, Segments) and resolved_schedule.text_boundaries:
        resolved_schedule = _build(resolved_schedule.with_tokenizer, tokenizer, schedule_origin)
    if isinstance(resolved_schedule, Segments) and resolved_schedule.token_boundaries is None:
        texts = ", ".join(repr(_clip(text, 40)) for text in resolved_schedule.text_boundaries)
        raise TextBoundaryNeedsTokenizer(
            f"{schedule_origin}: the segments boundary {texts} is text, which vLLM resolves with the model's "
            "tokenizer when it admits a request, and this engine has none (skip_tokenizer_init=True); send the "
            'boundary as the token ids the model emits, "boundary": [id, ...]'
        )
    if resolved_schedule is not None:
        _build(_evaluate_once, resolved_schedule, schedule_origin)
    return SecureSDRequest(resolved, resolved_schedule)


def _build(constructor: Any, value: Any, origin: str) -> Any:
    """constructor(value), with anything it raises turned into a SecureSDConfigError naming `origin`.

    The value came from a client, so whatever the verifier, schedule or torch code raises on it (a
    ValueError for a bad knob, an OverflowError for a number too large for a float, ...) is a property
    of the request, never a reason to fail the server."""
    if isinstance(value, Mapping):
        _refuse_huge_options(value, origin)
    try:
        return constructor(value)
    except SecureSDConfigError as error:
        raise SecureSDConfigError(f"{origin}: {_clip(str(error), 400)}") from None
    except Exception as error:  # noqa: BLE001 - see the docstring
        kind = "" if isinstance(error, (ValueError, TypeError)) else f"{type(error).__name__}: "
        raise SecureSDConfigError(f"{origin}: {kind}{_clip(str(error), 400)}") from None


def _refuse_huge_options(options: Mapping, origin: str) -> None:
    """Refuse, by name, an integer option beyond float range (a schedule's L is exact at any size)."""
    for key, option in options.items():
        if key != "L" and isinstance(option, int) and not isinstance(option, bool) and abs(option) >= 2**1024:
            raise SecureSDConfigError(f"{origin}[{key!r}] is too large for a float: {short_repr(option, 40)}")


def _check_verifier_form(verifier: Any, schedule: Any, origin: str) -> None:
    names = ", ".join(VERIFIERS)
    if verifier is None:
        raise SecureSDConfigError(
            f"{origin} gives a secure_schedule without a verifier; add \"verifier\": \"mars\" "
            f"(or another name: {names}), or drop the schedule"
            if schedule is not None
            else f"{origin} names no verifier; add \"verifier\": \"mars\" (or another name: {names}), "
            "or send null for plain vLLM"
        )
    if isinstance(verifier, Mapping):
        name = verifier.get("verifier")
        if name is None:
            raise SecureSDConfigError(
                f'{origin}["verifier"] names no rule: add "verifier": "<name>" inside it, one of {names} '
                f'(e.g. {{"verifier": "mars", "theta": 0.5}}); got {short_repr(dict(verifier))}'
            )
        if not isinstance(name, str):
            raise SecureSDConfigError(
                f'{origin}["verifier"]["verifier"] must be a verifier name (one of {names}), got '
                f"{type(name).__name__} {short_repr(name)}; options such as theta sit beside it in that object"
            )
    elif not isinstance(verifier, str):
        raise SecureSDConfigError(
            f'{origin}["verifier"] must be a verifier name (one of {names}) or an object such as '
            f'{{"verifier": "mars", "theta": 0.5}}, got {type(verifier).__name__} {short_repr(verifier)}'
        )


def _schedule_form(schedule: Any, origin: str) -> Any:
    """The schedule as `resolve_schedule` takes it (a JSON object arrives as a Mapping, not a dict)."""
    if isinstance(schedule, Mapping):
        name = schedule.get("schedule")
        if not isinstance(name, str):
            raise SecureSDConfigError(
                f'{origin}["secure_schedule"]["schedule"] must be a schedule name ("step", "linear" or '
                f'"power"), got {type(name).__name__} {short_repr(name)}; e.g. {{"schedule": "step", "L": 1}}'
            )
        return dict(schedule)
    return schedule


def _evaluate_once(schedule: Schedule) -> None:
    """Evaluate `schedule` at probe positions (0, 1 and 2^62 on); raise unless every eta is in [0, 1]."""
    starts = torch.tensor(_PROBE_STARTS, dtype=torch.long)
    drafts = torch.zeros(len(_PROBE_STARTS), _PROBE_DRAFTS, dtype=torch.long)
    eta = schedule_weights(schedule, starts, drafts, [[] for _ in _PROBE_STARTS])
    check_weights(schedule, eta, tuple(drafts.shape))


def _check_size(value: Mapping, origin: str) -> None:
    """Refuse an object nested deeper than MAX_DEPTH, holding more than MAX_VALUES values, a string
    longer than MAX_STRING_CHARS or a key that is not a string. Iterative: depth cannot exhaust the stack."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while pending:
        item, depth = pending.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise SecureSDConfigError(
                f"{origin} holds more than {MAX_VALUES} values (each key, value and list entry counts, each "
                f"token id of a segments boundary too); a request is small: {_EXAMPLE}"
            )
        if isinstance(item, str) and len(item) > MAX_STRING_CHARS:
            raise SecureSDConfigError(
                f"{origin} holds a string of {len(item)} characters (at most {MAX_STRING_CHARS})"
            )
        children: Iterable[Any] = ()
        if isinstance(item, Mapping):
            bad_keys = [key for key in item if not isinstance(key, str)]
            if bad_keys:
                raise SecureSDConfigError(
                    f"{origin} has a non-string key {short_repr(bad_keys[0])}; keys are field names"
                )
            children = list(item.keys()) + list(item.values())
        elif isinstance(item, (list, tuple)):
            children = item
        if children and depth >= MAX_DEPTH:
            raise SecureSDConfigError(
                f"{origin} is nested more than {MAX_DEPTH} levels deep; a request is two objects deep: "
                f"{_EXAMPLE}"
            )
        pending.extend((child, depth + 1) for child in children)


def _refuse_unknown_keys(value: Mapping, valid: Iterable[str], origin: str) -> None:
    valid = tuple(valid)
    unknown = sorted(str(key) for key in value if key not in valid)
    if not unknown:
        return
    hints = [
        f"{short_repr(key)} (did you mean {close[0]!r}?)"
        if (close := difflib.get_close_matches(key, valid, n=1, cutoff=0.6))
        else short_repr(key)
        for key in unknown
    ]
    raise SecureSDConfigError(f"{origin} has unknown key(s) {', '.join(hints)}; valid keys: {list(valid)}")


def _from_json(text: str, origin: str) -> Any:
    if len(text) > MAX_JSON_CHARS:  # bounded before anything else reads it, surrounding whitespace included
        raise SecureSDConfigError(
            f"{origin} is {len(text)} characters long (at most {MAX_JSON_CHARS}); a request is short: {_EXAMPLE}"
        )
    stripped = text.strip()
    if not stripped.startswith(("{", "[", '"', "null", "false", "true")):
        if len(stripped) > MAX_STRING_CHARS:
            raise SecureSDConfigError(
                f"{origin} is a string of {len(stripped)} characters (at most {MAX_STRING_CHARS})"
            )
        return stripped  # a bare verifier name
    if json_depth(stripped) > MAX_DEPTH:
        raise SecureSDConfigError(
            f"{origin} is JSON nested more than {MAX_DEPTH} levels deep; a request is two objects deep: "
            f"{_EXAMPLE}"
        )
    try:
        return json.loads(stripped, object_pairs_hook=partial(_without_repeats, origin=origin))
    except _RepeatedKey as error:
        raise SecureSDConfigError(str(error)) from None
    except json.JSONDecodeError as error:
        raise SecureSDConfigError(
            f"{origin} is not valid JSON ({error.msg} at column {error.colno}): {short_repr(text)}"
        ) from None
    except ValueError as error:  # e.g. an integer literal longer than Python's digit limit
        raise SecureSDConfigError(f"{origin} is not usable JSON: {short_repr(str(error))}") from None


def _without_repeats(pairs: list[tuple[str, Any]], origin: str) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is refused (which of its values was meant?)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _RepeatedKey(f"{origin} gives the key {short_repr(key)} more than once; send each key once")
        seen[key] = value
    return seen


class _RepeatedKey(Exception):
    """Raised inside `json.loads` (whose ValueError handling would rewrap a SecureSDConfigError)."""


def json_depth(text: str) -> int:
    """The deepest nesting of objects and arrays in JSON `text` (brackets inside strings do not count),
    found without parsing, in one pass."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def looks_like_securesd(key: Any) -> bool:
    """Whether `key` (another key beside the request's fields) is probably a misspelling of "securesd", or
    a key that starts with it ("securesd_config", "securesd.verifier")."""
    if not isinstance(key, str) or key == EXTRA_ARGS_KEY:
        return False
    return nearly(key, EXTRA_ARGS_KEY) or letters(key).startswith(EXTRA_ARGS_KEY)


def spells_securesd(key: Any) -> bool:
    """Whether `key` (another key beside the request's fields) is "securesd" written otherwise (any case,
    separators, fullwidth or look-alike letters: "secure_sd", "SecureSD") or a key that starts with it
    ("securesd_config"): unlike `looks_like_securesd`, no close misspelling ("secured")."""
    return isinstance(key, str) and key != EXTRA_ARGS_KEY and letters(key).startswith(EXTRA_ARGS_KEY)


def refuse_misspelled_key(keys: Iterable[Any], origin: str) -> None:
    """Raise SecureSDConfigError when one of `keys` looks like a misspelling of "securesd", or is (or
    nearly is) one of the fields that go inside it ("verifier", "secure_schedule"): the request asked
    for SecureSD under a key the plugin would silently ignore."""
    for key in keys:
        if key == EXTRA_ARGS_KEY:
            continue
        if looks_like_securesd(key):
            raise SecureSDConfigError(
                f"{origin} has the key {short_repr(key)}, which SecureSD does not read; did you mean "
                f'"{EXTRA_ARGS_KEY}"? Rename it (or drop it for plain vLLM)'
            )
        field = _field_named(key)
        if field is not None:
            _refuse_field_beside(key, field, origin)


def _refuse_field_beside(key: Any, field: str, origin: str) -> None:
    """Raise the error for `key`, beside "securesd", naming what the request field `field` it stands for is."""
    raise SecureSDConfigError(
        f"{origin} has the key {short_repr(key)} beside \"{EXTRA_ARGS_KEY}\", where SecureSD does not read "
        f'it: "{field}" goes inside "{EXTRA_ARGS_KEY}", e.g. "vllm_xargs": {{"{EXTRA_ARGS_KEY}": '
        f"{json.dumps(_EXAMPLE)}}} (a JSON string over HTTP)"
    )


# Keys that, beside a request selecting SecureSD, name its schedule in other words: sent there, the
# schedule would be dropped and the rule run without it.
_SCHEDULE_WORDS = frozenset({"schedule", "sched", "eta"})


def refuse_options_beside(keys: Iterable[Any], origin: str) -> None:
    """Raise SecureSDConfigError when a request that selects SecureSD also has, beside "securesd", a key
    that names its schedule or verifier in other words ("schedule", "step", "mars", ...) or an option of
    one (theta, L, tau, ...): those go inside "securesd" (an option inside its verifier or schedule object),
    and beside it nothing reads them."""
    options = _option_names()
    for key in keys:
        if not isinstance(key, str) or key == EXTRA_ARGS_KEY:
            continue
        word = key.strip().lower()
        if word in _SCHEDULE_WORDS or word in SCHEDULES:
            _refuse_field_beside(key, "secure_schedule", origin)
        if word in VERIFIERS:
            _refuse_field_beside(key, "verifier", origin)
        if key in options:
            raise SecureSDConfigError(
                f"{origin} has the key {short_repr(key)} beside \"{EXTRA_ARGS_KEY}\", where SecureSD does not read "
                f"it: a verifier's or a schedule's option goes inside its object, e.g. {_EXAMPLE}"
            )


def _field_named(key: Any) -> str | None:
    """The request field ("verifier" or "secure_schedule") that `key` names or nearly names, or None."""
    if not isinstance(key, str):
        return None
    return next((field for field in _FIELDS if nearly(key, field)), None)


@lru_cache(maxsize=1)
def _option_names() -> frozenset[str]:
    """Every option name of a registered verifier or schedule (their dataclass fields)."""
    import dataclasses

    names: set[str] = set()
    for rule in (*VERIFIERS.values(), *SCHEDULES.values()):
        if dataclasses.is_dataclass(rule):
            names.update(field.name for field in dataclasses.fields(rule))
    return frozenset(names)


@lru_cache(maxsize=8)
def _default_for(text: str) -> SecureSDRequest | None:
    return parse_request(text, origin=f"the server-wide default {DEFAULT_ENV}")


def server_default() -> SecureSDRequest | None:
    """The `SECURESD_VLLM_DEFAULT` configuration of this process, or None when unset."""
    text = os.environ.get(DEFAULT_ENV, "").strip()
    return _default_for(text) if text else None


def request_for(extra_args: Mapping[str, Any] | None) -> SecureSDRequest | None:
    """The configuration a request runs with: its own `extra_args["securesd"]` when the key is present
    (null/false = plain vLLM), else the server-wide default. A key that looks like a misspelling of
    "securesd" is refused rather than ignored, with or without "securesd" beside it."""
    origin = "extra_args (vllm_xargs over HTTP)"
    if extra_args:
        refuse_misspelled_key(extra_args, origin)  # also beside "securesd"
        if EXTRA_ARGS_KEY in extra_args:
            request = parse_request(extra_args[EXTRA_ARGS_KEY])
        else:
            request = server_default()
        if request is not None:
            refuse_options_beside(extra_args, origin)
        return request
    return server_default()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
