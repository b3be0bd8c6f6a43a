"""Judges that decide whether a jailbreak attack succeeded, selectable by name.

>>> from hf_securesd.judges import get_judge
>>> judge = get_judge("refusal_prefix")
>>> [v.attack_succeeded for v in judge.judge(["goal"], ["Sure, here is how ..."])]
[True]
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from hf_securesd.judges.backends import endpoint_settings, settings_dict
from hf_securesd.judges.base import Judge, JudgeError, Verdict
from hf_securesd.judges.refusal_prefix import ExactRefusalPrefixJudge, RefusalPrefixJudge
from hf_securesd.judges.secrets import public_url
from hf_securesd.judges.strongreject import StrongRejectJudge

JUDGES: dict[str, type[Judge]] = {
    RefusalPrefixJudge.name: RefusalPrefixJudge,
    ExactRefusalPrefixJudge.name: ExactRefusalPrefixJudge,
    StrongRejectJudge.name: StrongRejectJudge,
}


def _check_option_names(name: str, options: Mapping[object, object], hint: str = "") -> None:
    """ValueError when `name` is no judge, or when judge `name` does not take one of `options`, naming
    that option and the ones it takes (followed by `hint`, how to pass them)."""
    if name not in JUDGES:
        raise ValueError(f"unknown judge {name!r}; choose one of {', '.join(JUDGES)}.")
    parameters = inspect.signature(JUDGES[name]).parameters
    unknown = [key for key in options if key not in parameters]
    if unknown:
        raise ValueError(f"judge {name!r} takes no option {unknown[0]!r}; its options are "
                         f"{', '.join(parameters)}{hint}.")


def judge_takes(name: str, option: str) -> bool:
    """Whether the judge registered as `name` takes `option` (False for an unknown judge)."""
    return name in JUDGES and option in inspect.signature(JUDGES[name]).parameters


def get_judge(name: str, **kwargs: object) -> Judge:
    """The judge registered as `name` ("refusal_prefix", "refusal_prefix_exact" or "strongreject"),
    built with `kwargs`; an option the judge does not take is refused as `check_judge_options` does."""
    _check_option_names(name, kwargs)
    return JUDGES[name](**kwargs)


def check_judge_options(name: str, options: Mapping[str, object]) -> None:
    """ValueError, naming the option and the valid ones, when judge `name` does not take
    `options`; then the values are checked as building the judge checks them: the judge is built once,
    except a StrongREJECT judge with the ``transformers`` backend, whose every option is checked without
    loading the judge model (`StrongRejectJudge.check_options`: its threshold, unparsed policy, rubric
    and data folder, backend settings). Run this before any generation, so a mistyped option fails at
    once, not after hours of generation."""
    _check_option_names(name, options, " (--judge-option KEY=VALUE)")
    try:
        if name == StrongRejectJudge.name and options.get("backend") == "transformers":
            StrongRejectJudge.check_options(**options)
        else:
            get_judge(name, **dict(options))
    except (TypeError, ValueError) as error:
        raise ValueError(f"judge {name!r} options {dict(options)}: {error}") from None


def describe_judge(name: str, options: Mapping[str, object]) -> dict[str, object] | None:
    """The model behind judge `name` built with `options`, as study.json and the report record it:
    None for the judges that match strings; for StrongREJECT its backend ``kind``, ``model`` and,
    for the ``openai`` backend, the ``endpoint`` URL without credentials (`public_url`; resolved as the backend
    resolves it: `backend_kwargs`, else the ``SECURESD_JUDGE_*`` variables, else the defaults).
    Nothing is loaded or requested."""
    if name != StrongRejectJudge.name:
        return None
    backend = options.get("backend", "openai")
    try:
        settings = settings_dict(options.get("backend_kwargs"))
    except ValueError:  # the judge refuses such options; nothing more is known of its model
        settings = {}
    if backend == "openai":
        url, model = endpoint_settings(settings.get("base_url"), settings.get("model"))
        return {"kind": "openai", "model": model, "endpoint": public_url(url)}
    return {"kind": str(backend), "model": settings.get("model")}


__all__ = ["JUDGES", "ExactRefusalPrefixJudge", "Judge", "JudgeError", "RefusalPrefixJudge",
           "StrongRejectJudge", "Verdict", "check_judge_options", "describe_judge", "get_judge", "judge_takes"]
