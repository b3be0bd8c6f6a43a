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
`"securesd": null` (or `false`). Nothing here imports vLLM.

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
from functools import lru_cache
from typing import Any, Iterable, Mapping

import torch

from ..schedules import Schedule, check_weights, resolve_schedule, schedule_weights
from ..segments import Segments
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
    if not isinstance(value, Mapping):
        raise SecureSDConfigError(
            f"{origin} must be an object such as {_EXAMPLE} (or its JSON string), got {_short(value)}"
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
            raise SecureSDConfigError(f"{origin}[{key!r}] is too large for a float: {_short(option, 40)}")


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
                f'(e.g. {{"verifier": "mars", "theta": 0.5}}); got {_short(dict(verifier))}'
            )
        if not isinstance(name, str):
            raise SecureSDConfigError(
                f'{origin}["verifier"]["verifier"] must be a verifier name (one of {names}), got '
                f"{type(name).__name__} {_short(name)}; options such as theta sit beside it in that object"
            )
    elif not isinstance(verifier, str):
        raise SecureSDConfigError(
            f'{origin}["verifier"] must be a verifier name (one of {names}) or an object such as '
            f'{{"verifier": "mars", "theta": 0.5}}, got {type(verifier).__name__} {_short(verifier)}'
        )


def _schedule_form(schedule: Any, origin: str) -> Any:
    """The schedule as `resolve_schedule` takes it (a JSON object arrives as a Mapping, not a dict)."""
    if isinstance(schedule, Mapping):
        name = schedule.get("schedule")
        if not isinstance(name, str):
            raise SecureSDConfigError(
                f'{origin}["secure_schedule"]["schedule"] must be a schedule name ("step", "linear" or '
                f'"power"), got {type(name).__name__} {_short(name)}; e.g. {{"schedule": "step", "L": 1}}'
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
                f"{origin} holds more than {MAX_VALUES} values; a request is small: {_EXAMPLE}"
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
                    f"{origin} has a non-string key {_short(bad_keys[0])}; keys are field names"
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
        f"{_short(key)} (did you mean {close[0]!r}?)"
        if (close := difflib.get_close_matches(key, valid, n=1, cutoff=0.6))
        else _short(key)
        for key in unknown
    ]
    raise SecureSDConfigError(f"{origin} has unknown key(s) {', '.join(hints)}; valid keys: {list(valid)}")


def _from_json(text: str, origin: str) -> Any:
    stripped = text.strip()
    if not stripped.startswith(("{", "[", '"', "null", "false", "true")):
        if len(stripped) > MAX_STRING_CHARS:
            raise SecureSDConfigError(
                f"{origin} is a string of {len(stripped)} characters (at most {MAX_STRING_CHARS})"
            )
        return stripped  # a bare verifier name
    if len(stripped) > MAX_JSON_CHARS:
        raise SecureSDConfigError(
            f"{origin} is {len(stripped)} characters of JSON (at most {MAX_JSON_CHARS}); "
            f"a request is short: {_EXAMPLE}"
        )
    if json_depth(stripped) > MAX_DEPTH:
        raise SecureSDConfigError(
            f"{origin} is JSON nested more than {MAX_DEPTH} levels deep; a request is two objects deep: "
            f"{_EXAMPLE}"
        )
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as error:
        raise SecureSDConfigError(
            f"{origin} is not valid JSON ({error.msg} at column {error.colno}): {_short(text)}"
        ) from None
    except ValueError as error:  # e.g. an integer literal longer than Python's digit limit
        raise SecureSDConfigError(f"{origin} is not usable JSON: {_short(str(error))}") from None


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
    """Whether `key` (another key beside the request's fields) is probably a misspelling of "securesd"."""
    if not isinstance(key, str) or key == EXTRA_ARGS_KEY:
        return False
    letters = "".join(char for char in key.lower() if char.isalnum())
    return letters == EXTRA_ARGS_KEY or difflib.SequenceMatcher(None, letters, EXTRA_ARGS_KEY).ratio() >= 0.88


def refuse_misspelled_key(keys: Iterable[Any], origin: str) -> None:
    """Raise SecureSDConfigError when one of `keys` looks like a misspelling of "securesd": the request
    asked for SecureSD under a key the plugin would silently ignore."""
    for key in keys:
        if looks_like_securesd(key):
            raise SecureSDConfigError(
                f"{origin} has the key {_short(key)}, which SecureSD does not read; did you mean "
                f'"{EXTRA_ARGS_KEY}"? Rename it (or drop it for plain vLLM)'
            )


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
    if extra_args:
        refuse_misspelled_key(extra_args, "extra_args (vllm_xargs over HTTP)")  # also beside "securesd"
        if EXTRA_ARGS_KEY in extra_args:
            return parse_request(extra_args[EXTRA_ARGS_KEY])
    return server_default()


def _short(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (client values can be long)."""
    return _clip(repr(value), limit)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
