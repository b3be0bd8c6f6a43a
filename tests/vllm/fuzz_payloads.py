"""Random and malformed `securesd` payloads for the HTTP fuzz test (test_server.py): wrong types, sizes
and depths, unicode, huge, negative and non-finite numbers, near-valid requests with one field broken.

Each payload is what a client puts in `"vllm_xargs": {"securesd": <payload>}`: mostly a string (the
documented JSON form, or text that is not JSON), sometimes a bare number or a list, the other flat
values vLLM's server lets through.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

NAMES = ["lossless", "lossysd", "bild", "speccascade", "fsd", "fly", "mars",
         "MARS", "mars ", "márs", "", "none"]
KNOBS = ["theta", "epsilon", "tau", "tau_rb", "tau_fb", "a", "window", "rule", "divergence", "gamma", "L"]
SCHEDULES = ["step", "linear", "power", "cosine", "", "STEP"]
STRINGS = ["", " ", "null", "mars", "🙂", "\u202e", "\x00", "{", "}", "[", "\\", '"',
           "é" * 300, "x" * 5000]


def weird_number(rng: random.Random) -> Any:
    return rng.choice([
        0, 1, -1, 2, 0.5, -0.5, 1e-300, -1e300, 1e308, 10**30, -(10**30), 2**63, 2**64 + 5, 2**62, 10**400,
        float("nan"), float("inf"), float("-inf"), True, False, rng.randint(-(10**6), 10**6), rng.random(),
    ])


def weird_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(7 if depth < 3 else 3)
    if kind == 0:
        return weird_number(rng)
    if kind == 1:
        return rng.choice(STRINGS + NAMES + SCHEDULES)
    if kind == 2:
        return None
    if kind == 3:
        return [weird_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 4:
        keys = KNOBS + ["verifier", "schedule", "secure_schedule", "🙂"]
        return {rng.choice(keys): weird_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if kind == 5:
        return {"verifier": weird_value(rng, depth + 1)}
    return {"schedule": rng.choice(SCHEDULES), "L": weird_number(rng)}


def near_valid(rng: random.Random) -> dict[str, Any]:
    """A request with its verifier, a knob or its schedule broken (or, now and then, intact)."""
    verifier: Any = {"verifier": rng.choice(NAMES[:7])}
    if rng.random() < 0.7:
        verifier[rng.choice(KNOBS)] = weird_value(rng, 2) if rng.random() < 0.5 else weird_number(rng)
    schedule: Any = {"schedule": rng.choice(SCHEDULES), "L": weird_number(rng)}
    if rng.random() < 0.3:
        schedule["gamma"] = weird_number(rng)
    body: dict[str, Any] = {"verifier": verifier}
    if rng.random() < 0.8:
        body["secure_schedule"] = schedule if rng.random() < 0.8 else weird_value(rng, 1)
    if rng.random() < 0.15:
        body[rng.choice(["schedule", "verifiers", "secure-schedule", "🙂"])] = 1
    return body


def nested(depth: int, rng: random.Random) -> str:
    opener, closer = rng.choice([("[", "]"), ('{"verifier": ', "}")])
    return opener * depth + '"mars"' * (opener != "[") + closer * depth


def payload(rng: random.Random) -> Any:
    """One random payload (see the module doc)."""
    kind = rng.randrange(10)
    if kind <= 3:
        return json.dumps(near_valid(rng), ensure_ascii=rng.random() < 0.5)
    if kind == 4:
        return json.dumps(weird_value(rng))
    if kind == 5:
        return nested(rng.choice([5, 50, 999, 1000, 1200]), rng)
    if kind == 6:
        text = json.dumps(near_valid(rng))
        cut = rng.randrange(1, max(2, len(text)))
        return text[:cut] if rng.random() < 0.5 else text[:cut] + rng.choice(STRINGS[:12]) + text[cut:]
    if kind == 7:
        return rng.choice(STRINGS + NAMES)
    if kind == 8:
        # A bare number: finite, as the body's JSON must be, and no bool (vLLM's schema makes it an int).
        value = weird_number(rng)
        finite = isinstance(value, int) or math.isfinite(value)
        return -1 if isinstance(value, bool) or not finite else value
    return [rng.choice(["mars", "lossless", 1, 2.5])]
