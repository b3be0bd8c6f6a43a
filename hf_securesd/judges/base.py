"""The judge interface: decide, for each (prompt, response) pair, whether the attack succeeded."""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["succeeded", "failed", "unparsed"]
UnparsedPolicy = Literal["fail", "exclude", "success"]
# What a benchmark does with a verdict the judge could not give: "fail" stops scoring with an
# error, "exclude" leaves the example out of the score (and counts it), "success" counts it as a
# successful attack (never as safe). The default keeps every example and errs on the unsafe side.
UNPARSED_POLICIES: tuple[str, ...] = ("fail", "exclude", "success")
DEFAULT_UNPARSED_POLICY: UnparsedPolicy = "success"


def check_unparsed_policy(policy: str) -> UnparsedPolicy:
    """`policy` when it is one of `UNPARSED_POLICIES`; else ValueError naming the choices."""
    if policy not in UNPARSED_POLICIES:
        raise ValueError(f"unparsed-verdict policy must be one of {', '.join(UNPARSED_POLICIES)}, "
                         f"not {policy!r} (judge option unparsed=...)")
    return policy  # type: ignore[return-value]


class JudgeError(RuntimeError):
    """A judge could not produce a verdict (unparsed judge output, failing backend)."""


@dataclass(frozen=True)
class Verdict:
    """One judgement.

    `outcome` is "succeeded" (the attack worked: the response complies), "failed" (refusal or
    harmless answer) or "unparsed" (the judge's output had no valid structured answer; `error`
    says why). An unparsed verdict is never read as safe: `attack_succeeded` raises on it.
    `score` lies in [0, 1], higher meaning more harmful (NaN exactly when unparsed; any other score is a
    ValueError when the verdict is built, so a judge's bad score cannot reach a rate); `raw` is the judge's
    raw text (for string judges, the matched refusal string); `fields` holds parsed rubric fields.
    """

    outcome: Outcome
    score: float
    raw: str
    error: str | None = None
    fields: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome not in ("succeeded", "failed", "unparsed"):
            raise ValueError(f"unknown verdict outcome {self.outcome!r}")
        if self.outcome == "unparsed" and not self.error:
            raise ValueError("an unparsed verdict must say why in `error`")
        problem = _score_problem(self.outcome, self.score)
        if problem is not None:
            raise ValueError(f"{problem}; fix the judge that built it.")

    @classmethod
    def unparsed(cls, raw: str, error: str) -> Verdict:
        """A verdict for judge output that could not be parsed."""
        return cls(outcome="unparsed", score=math.nan, raw=raw, error=error)

    @property
    def parsed(self) -> bool:
        """True when the judge produced a valid answer."""
        return self.outcome != "unparsed"

    @property
    def attack_succeeded(self) -> bool:
        """Whether the attack succeeded; raises `JudgeError` for an unparsed verdict."""
        if not self.parsed:
            raise JudgeError(f"the judge output could not be parsed ({self.error}); no verdict to read")
        return self.outcome == "succeeded"


def _score_problem(outcome: str, score: object) -> str | None:
    """Why `score` cannot be the score of a verdict with `outcome`, or None: a parsed verdict's score is
    a real number in [0, 1] (not a bool), an unparsed verdict's is NaN."""
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return (f"a Verdict's score must be a number (in [0, 1]; NaN when unparsed), got {score!r:.40} "
                f"({type(score).__name__})")
    if outcome == "unparsed":
        return None if math.isnan(score) else (f"an unparsed Verdict's score must be NaN (it has none), got "
                                               f"{score!r}; build it with Verdict.unparsed(raw, error)")
    if not 0.0 <= score <= 1.0:  # NaN fails this too
        return f"a {outcome!r} Verdict's score must lie in [0, 1] (higher: more harmful), got {score!r}"
    return None


class Judge(ABC):
    """Decides attack success for aligned lists of prompts (forbidden goals) and responses.
    `unparsed` is the benchmark's policy for verdicts the judge could not give (see
    `UNPARSED_POLICIES`); judges that always decide keep the default."""

    name: str = ""
    unparsed: UnparsedPolicy = DEFAULT_UNPARSED_POLICY

    def judge(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per (prompt, response) pair, in order."""
        if len(prompts) != len(responses):
            raise ValueError(
                f"got {len(prompts)} prompts and {len(responses)} responses; pass one prompt per response."
            )
        if not all(isinstance(text, str) for text in [*prompts, *responses]):
            raise TypeError("prompts and responses must be strings")
        return self._judge(list(prompts), list(responses))

    @abstractmethod
    def _judge(self, prompts: list[str], responses: list[str]) -> list[Verdict]:
        """Judge validated, equally long lists."""
