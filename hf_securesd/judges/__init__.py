"""Judges that decide whether a jailbreak attack succeeded, selectable by name.

>>> from hf_securesd.judges import get_judge
>>> judge = get_judge("refusal_prefix")
>>> [v.attack_succeeded for v in judge.judge(["goal"], ["Sure, here is how ..."])]
[True]
"""

from __future__ import annotations

from hf_securesd.judges.base import Judge, JudgeError, Verdict
from hf_securesd.judges.refusal_prefix import ExactRefusalPrefixJudge, RefusalPrefixJudge
from hf_securesd.judges.strongreject import StrongRejectJudge

JUDGES: dict[str, type[Judge]] = {
    RefusalPrefixJudge.name: RefusalPrefixJudge,
    ExactRefusalPrefixJudge.name: ExactRefusalPrefixJudge,
    StrongRejectJudge.name: StrongRejectJudge,
}


def get_judge(name: str, **kwargs: object) -> Judge:
    """The judge registered as `name` ("refusal_prefix", "refusal_prefix_exact" or "strongreject"),
    built with `kwargs`."""
    if name not in JUDGES:
        raise ValueError(f"unknown judge {name!r}; choose one of {', '.join(JUDGES)}.")
    return JUDGES[name](**kwargs)


__all__ = ["JUDGES", "ExactRefusalPrefixJudge", "Judge", "JudgeError", "RefusalPrefixJudge", "StrongRejectJudge", "Verdict", "get_judge"]
