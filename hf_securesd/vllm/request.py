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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from ..schedules import Schedule, resolve_schedule
from ..validation import SecureSDConfigError
from ..verifiers import Verifier, resolve_verifier

EXTRA_ARGS_KEY = "securesd"
DEFAULT_ENV = "SECURESD_VLLM_DEFAULT"
_FIELDS = ("verifier", "secure_schedule")


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


def parse_request(value: Any, origin: str = f'extra_args["{EXTRA_ARGS_KEY}"]') -> SecureSDRequest | None:
    """`extra_args["securesd"]` (dict, JSON string, verifier name, or None/False) -> request or None.

    Raises SecureSDConfigError naming `origin` and the fix for anything it cannot use."""
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
            f"{origin} must be an object such as {{\"verifier\": {{\"verifier\": \"mars\", \"theta\": 0.5}}, "
            f"\"secure_schedule\": {{\"schedule\": \"step\", \"L\": 1}}}} (or its JSON string), got {value!r}"
        )
    unknown = set(value) - set(_FIELDS)
    if unknown:
        raise SecureSDConfigError(f"{origin} has unknown key(s) {sorted(unknown)}; valid keys: {list(_FIELDS)}")
    verifier, schedule = value.get("verifier"), value.get("secure_schedule")
    if verifier is None:
        raise SecureSDConfigError(
            f"{origin} gives a secure_schedule without a verifier; add \"verifier\": \"mars\" (or another name: "
            "lossless, lossysd, bild, speccascade, fsd, fly, mars), or drop the schedule"
            if schedule is not None
            else f"{origin} names no verifier; add \"verifier\": \"mars\" (or another name), or send null for plain vLLM"
        )
    try:
        resolved = resolve_verifier(verifier)
        resolved_schedule = resolve_schedule(schedule)
    except (TypeError, ValueError) as error:
        raise SecureSDConfigError(f"{origin}: {error}") from None
    return SecureSDRequest(resolved, resolved_schedule)


def _from_json(text: str, origin: str) -> Any:
    stripped = text.strip()
    if not stripped.startswith(("{", '"', "null", "false")):
        return stripped  # a bare verifier name
    try:
        return json.loads(stripped)
    except json.JSONDecodeError as error:
        raise SecureSDConfigError(f"{origin} is not valid JSON ({error.msg} at column {error.colno}): {text!r}") from None


@lru_cache(maxsize=8)
def _default_for(text: str) -> SecureSDRequest | None:
    return parse_request(text, origin=f"the server-wide default {DEFAULT_ENV}")


def server_default() -> SecureSDRequest | None:
    """The `SECURESD_VLLM_DEFAULT` configuration of this process, or None when unset."""
    text = os.environ.get(DEFAULT_ENV, "").strip()
    return _default_for(text) if text else None


def request_for(extra_args: Mapping[str, Any] | None) -> SecureSDRequest | None:
    """The configuration a request runs with: its own `extra_args["securesd"]` when the key is present
    (null/false = plain vLLM), else the server-wide default."""
    if extra_args and EXTRA_ARGS_KEY in extra_args:
        return parse_request(extra_args[EXTRA_ARGS_KEY])
    return server_default()
