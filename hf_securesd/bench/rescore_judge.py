"""The judge options `securesd rescore` builds its judge with: the recorded judge and options of a
results directory, except everything that says where requests go or which local files are read.

A results directory may come from anyone, so study.json must not choose where the user's API key
(``SECURESD_JUDGE_API_KEY``) and the recorded prompts and responses are sent, nor which of the
user's files is read and sent as the rubric. So:

- the endpoint and model of an ``openai`` judge come only from the user: ``--judge-base-url`` /
  ``--judge-model``, else ``SECURESD_JUDGE_BASE_URL`` / ``SECURESD_JUDGE_MODEL``, else the
  defaults. An endpoint or model that study.json records (``backend_kwargs`` or
  ``judge_backend``) and that differs from the user's is refused, naming both, unless the user
  named one with the flag (then the flag's is used, and the recorded one never);
- the model of a ``transformers`` judge (a Hub id or a local folder) comes only from
  ``--judge-model``;
- ``backend_kwargs`` ``api_key`` from study.json is dropped (the key comes from the environment);
- ``data_dir`` (where the rubric file is read) is the user's ``--data-dir`` or
  ``SECURESD_DATA_DIR``, never the recorded one.
- a flag the recorded judge does not use (``--judge-model`` with a string-matching judge,
  ``--judge-base-url`` with one or with a ``transformers`` judge) is refused (`check_judge_flags`),
  as ``securesd judge-validate`` refuses options its judge does not use, rather than ignored.
The recorded ``rubric`` text, ``threshold``, ``unparsed`` policy and numeric backend settings
(timeouts, retries) are kept: they change verdicts, not where anything goes. A numeric setting must
lie in the range the backend allows (`backends.BACKEND_SETTINGS`): a planted ``backoff: 1e9``
would otherwise hold rescore for years on the first HTTP 429.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Mapping

from hf_securesd.judges import StrongRejectJudge
from hf_securesd.judges.backends import (
    BACKEND_SETTINGS,
    OpenAIChatBackend,
    TransformersChatBackend,
    endpoint_settings,
)
from hf_securesd.judges.secrets import public_url

# backend settings that say where requests go, what is loaded, or with which credential
LOCATION_KEYS = ("base_url", "model", "api_key")
# rescore's judge flags -> the recorded judges (and backends) that use them, as `check_judge_flags` says it
FLAG_USERS = {"--judge-base-url": "strongreject with the openai backend", "--judge-model": "strongreject"}


def _endpoint(url: str) -> str:
    """`url` as endpoints are compared and shown: without credentials, a query string (`public_url`) or
    a trailing slash."""
    return public_url(url.rstrip("/"))


def _recorded(manifest: Mapping[str, Any], settings: Mapping[str, Any], key: str, described: str) -> str | None:
    """What study.json records for the judge's `key` (``backend_kwargs``, else ``judge_backend``)."""
    backend = manifest.get("judge_backend")
    value = settings.get(key) or (backend.get(described) if isinstance(backend, Mapping) else None)
    return value if isinstance(value, str) and value else None


def _check_recorded_settings(backend: str, settings: Mapping[str, Any]) -> None:
    """ValueError naming study.json's field and the allowed range when a recorded numeric setting of
    `backend` lies outside it (`BACKEND_SETTINGS`)."""
    bounds = BACKEND_SETTINGS.get(backend, {})
    taken = _backend_settings(backend)
    for name, value in settings.items():
        if taken is not None and name not in taken:
            raise ValueError(f"study.json: judge option 'backend_kwargs' has {name!r}, which the {backend} judge "
                             f"backend does not take (its settings: {', '.join(sorted(taken))}); fix it or start "
                             "a new --out directory; nothing was rewritten")
        problem = bounds[name].problem(value) if name in bounds else None
        if problem:
            raise ValueError(f"study.json: judge option 'backend_kwargs' {name!r}: {problem}; securesd never "
                             "records such a setting: fix it or start a new --out directory; nothing was "
                             "rewritten")


def _backend_settings(backend: str) -> set[str] | None:
    """The keyword settings `make_backend(backend, ...)` passes on (the backend's own parameters, less
    where it points: `LOCATION_KEYS`), or None for a backend this module does not know."""
    builders = {"openai": OpenAIChatBackend, "transformers": TransformersChatBackend.from_pretrained}
    if backend not in builders:
        return None
    return set(inspect.signature(builders[backend]).parameters) - {"self", *LOCATION_KEYS}


def _refuse(what: str, recorded: str, current: str, source: str, flag: str) -> ValueError:
    return ValueError(
        f"study.json records the judge {what} {recorded!r}, but yours is {current!r} ({source}); rescore "
        f"sends your API key and the recorded responses only where you say: pass {flag} {current} to rescore "
        f"with yours, or {flag} {recorded} if you trust the directory's; nothing was rewritten"
    )


def _openai_settings(manifest: Mapping[str, Any], settings: Mapping[str, Any],
                     base_url: str | None, model: str | None) -> dict[str, Any]:
    """The user's endpoint and model for an ``openai`` judge, checked against the recorded ones."""
    url, name = endpoint_settings(base_url, model)
    recorded_url = _recorded(manifest, settings, "base_url", "endpoint")
    if base_url is None and recorded_url is not None and _endpoint(recorded_url) != _endpoint(url):
        source = "SECURESD_JUDGE_BASE_URL" if os.environ.get("SECURESD_JUDGE_BASE_URL") else "the default"
        raise _refuse("endpoint", _endpoint(recorded_url), _endpoint(url), source, "--judge-base-url")
    recorded_model = _recorded(manifest, settings, "model", "model")
    if model is None and recorded_model is not None and recorded_model != name:
        source = "SECURESD_JUDGE_MODEL" if os.environ.get("SECURESD_JUDGE_MODEL") else "the default"
        raise _refuse("model", recorded_model, name, source, "--judge-model")
    return {"base_url": url, "model": name}


def check_judge_flags(manifest: Mapping[str, Any], base_url: str | None, model: str | None) -> None:
    """Refuse ``--judge-base-url`` / ``--judge-model`` (`base_url` / `model`; None: not given) when the
    judge study.json records does not use them, as `securesd judge-validate` refuses options its
    judge does not use: they would be silently ignored, and the user would believe the verdicts came
    from the model named."""
    judge = manifest.get("judge", "refusal_prefix")
    options = manifest.get("judge_options") or {}
    backend = options.get("backend", "openai") if judge == StrongRejectJudge.name else None
    used = {"--judge-base-url": backend == "openai", "--judge-model": backend is not None}
    recorded = judge if backend is None else f"{judge} with the {backend} backend"
    for flag, value in (("--judge-base-url", base_url), ("--judge-model", model)):
        if value is not None and not used[flag]:
            raise ValueError(f"{flag} is used only by {FLAG_USERS[flag]}, not by the recorded judge {recorded} "
                             "(study.json); leave it out; nothing was rewritten")


def trusted_judge_options(manifest: Mapping[str, Any], data_dir: str | os.PathLike | None,
                          base_url: str | None = None, model: str | None = None) -> dict[str, Any]:
    """The options to build the recorded judge with (see the module docstring); `base_url` and
    `model` are the user's ``--judge-base-url`` and ``--judge-model`` (None: not given), refused
    when the recorded judge does not use them (`check_judge_flags`)."""
    check_judge_flags(manifest, base_url, model)
    options = dict(manifest.get("judge_options") or {})
    if manifest.get("judge") != StrongRejectJudge.name:
        return options
    options.pop("data_dir", None)
    if data_dir is not None:
        options["data_dir"] = os.fspath(data_dir)
    backend = options.get("backend", "openai")
    recorded = options.get("backend_kwargs")
    if recorded is not None and not isinstance(recorded, Mapping):
        raise ValueError(f"study.json: judge option 'backend_kwargs' is {recorded!r}, not an object; "
                         "start a new --out directory")
    settings = {key: value for key, value in (recorded or {}).items() if key not in LOCATION_KEYS}
    _check_recorded_settings(str(backend), settings)
    if backend == "openai":
        settings.update(_openai_settings(manifest, recorded or {}, base_url, model))
    elif backend == "transformers":
        if model is None:
            raise ValueError(
                f"study.json records a transformers judge ({(recorded or {}).get('model')!r}); rescore loads a "
                "judge model only where you say: pass --judge-model MODEL (a Hub id or local folder); "
                "nothing was rewritten"
            )
        settings["model"] = model
    options["backend_kwargs"] = settings
    return options
