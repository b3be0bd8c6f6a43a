"""What a results directory's study.json must hold for `report`, `rescore` and `bench` to read it:
each setting they use has the JSON type securesd writes, numbers finite and within float range
(`run_records.finite_real`), a session's torch threads a positive integer and the judge's measured
agreement rates within their ranges (`manifest_problem`). A manifest that
breaks this was not written by securesd; the caller stops with one line naming the file and the
field (`results.ResultsDir.read_manifest`)."""

from __future__ import annotations

from typing import Any, Mapping

from hf_securesd.bench.run_records import finite_real

TypeSpec = type | tuple[type, ...]
_NULL = type(None)
_TEXT_OR_NULL = (str, _NULL)
# top-level settings that the readers use where present, with their JSON types
MANIFEST_FIELDS: Mapping[str, TypeSpec] = {
    "target": _TEXT_OR_NULL, "draft": _TEXT_OR_NULL, "device": _TEXT_OR_NULL, "dtype": _TEXT_OR_NULL,
    "num_assistant_tokens": (int, _NULL), "batch_size": (int, _NULL), "judge": str, "judge_options": dict,
    "judge_backend": (dict, _NULL), "decoding": _TEXT_OR_NULL, "profile": _TEXT_OR_NULL,
    "defaults_profile": _TEXT_OR_NULL,
    "engine": _TEXT_OR_NULL, "models": dict, "sessions": list, "endpoints": (dict, _NULL),
    "judge_agreement": (dict, _NULL), "api": _TEXT_OR_NULL, "baseline_endpoint": _TEXT_OR_NULL,
    "draft_baseline_endpoint": _TEXT_OR_NULL, "tokenizer": _TEXT_OR_NULL, "token_ids": (bool, _NULL),
    "target_plain_requests": (bool, _NULL),
}
# the text fields of each session, of each model's entry, and of judge_backend
SESSION_TEXT = ("id", "host", "started")
MODEL_TEXT = ("name", "id", "location")
JUDGE_BACKEND_TEXT = ("kind", "model", "endpoint")


def _mistyped(value: Any, kind: TypeSpec) -> bool:
    """Whether `value` is not of `kind` (a JSON boolean is not an integer, and a number must be
    `finite_real`)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool not in kinds
    if isinstance(value, (int, float)) and not finite_real(value):
        return True
    return not isinstance(value, kinds)


def _text_problem(where: str, values: Any, keys: tuple[str, ...]) -> str | None:
    """What keeps `values` from being an object whose `keys`, where present, are text (or null)."""
    if not isinstance(values, dict):
        return f"{where} is {values!r}, not an object"
    wrong = [key for key in keys if key in values and _mistyped(values[key], _TEXT_OR_NULL)]
    return f"{where} has a {wrong[0]!r} that is not text: {values[wrong[0]]!r}" if wrong else None


def _session_problem(index: int, session: Any) -> str | None:
    """What keeps item `index` of 'sessions' from being a session securesd records: an object whose
    text fields are text and whose torch 'threads', where present, is a positive integer (or null)."""
    where = f"'sessions' item {index}"
    problem = _text_problem(where, session, SESSION_TEXT)
    if problem:
        return problem
    threads = session.get("threads")
    if threads is not None and (_mistyped(threads, int) or threads < 1):
        return f"{where} has 'threads' {threads!r}, not a positive integer (or null)"
    return None


def seed_problem(seed: Any) -> str | None:
    """What keeps `seed` from being a task seed (null, or an integer >= 0, as `bench --seed` takes)."""
    if seed is None:
        return None
    if _mistyped(seed, int) or seed < 0:
        return f"'seed' is {seed!r}, not an integer >= 0 (or null)"
    return None


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """The first setting of `manifest` that securesd would not have written, or None."""
    wrong = [key for key, kind in MANIFEST_FIELDS.items() if key in manifest and _mistyped(manifest[key], kind)]
    if wrong:
        return f"{wrong[0]!r} is {manifest[wrong[0]]!r}, not a JSON {_type_name(MANIFEST_FIELDS[wrong[0]])}"
    problems = [seed_problem(manifest.get("seed"))]
    if manifest.get("thinking_trace") not in (None, "yes", "no"):
        problems.append(f"'thinking_trace' is {manifest['thinking_trace']!r}, not \"yes\" or \"no\"")
    problems += [_session_problem(index, session)
                 for index, session in enumerate(manifest.get("sessions") or [])]
    problems += [_text_problem(f"'models' entry {role!r}", info, MODEL_TEXT)
                 for role, info in (manifest.get("models") or {}).items()]
    if manifest.get("judge_backend") is not None:
        problems.append(_text_problem("'judge_backend'", manifest["judge_backend"], JUDGE_BACKEND_TEXT))
    if manifest.get("judge_agreement") is not None:
        problems.append(agreement_problem(manifest["judge_agreement"]))
    endpoints = manifest.get("endpoints") or {}
    problems += [f"'endpoints' entry {name!r} is {url!r}, not a URL" for name, url in endpoints.items()
                 if not isinstance(url, str)]
    return next((problem for problem in problems if problem), None)


# the judge's measured agreement with human labels (`analysis.judge_agreement`): its fields and JSON types
AGREEMENT_FIELDS: Mapping[str, TypeSpec] = {
    "agreement": (int, float, _NULL), "kappa": (int, float, _NULL), "precision": (int, float, _NULL),
    "recall": (int, float, _NULL), "n": int, "labels": str,
}
# the range of each measured rate: shares in [0, 1], Cohen's kappa in [-1, 1]
AGREEMENT_RANGES: Mapping[str, tuple[float, float]] = {
    "agreement": (0, 1), "kappa": (-1, 1), "precision": (0, 1), "recall": (0, 1),
}


def agreement_problem(agreement: dict[str, Any]) -> str | None:
    """What keeps 'judge_agreement' from being what securesd writes (each rate a number in its range,
    `AGREEMENT_RANGES`, or null; n an integer, labels and match text), or None."""
    wrong = [key for key, kind in AGREEMENT_FIELDS.items() if key not in agreement or _mistyped(agreement[key], kind)]
    if agreement.get("match") is not None and not isinstance(agreement["match"], str):
        wrong.append("match")
    if wrong:
        return f"'judge_agreement' has no valid {wrong[0]!r} (it holds {agreement.get(wrong[0])!r})"
    outside = [key for key, (low, high) in AGREEMENT_RANGES.items()
               if agreement[key] is not None and not low <= agreement[key] <= high]
    if outside:
        low, high = AGREEMENT_RANGES[outside[0]]
        return f"'judge_agreement' has {outside[0]!r} {agreement[outside[0]]!r}, outside [{low}, {high}]"
    return None


def _type_name(kind: TypeSpec) -> str:
    names = {str: "string", int: "integer", dict: "object", list: "array", bool: "boolean", _NULL: "null"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(item, item.__name__) for item in kinds)
