"""The interface every generation engine of the harness implements, and what it returns.

An engine turns a batch of prompts into greedy answers for one decoding configuration
(`hf_securesd.bench.plan.RunConfig`: target alone, draft alone, a speculative configuration, or a
named endpoint). The runner, the results files and the report never know which engine ran: they see
`Generation`s (an answer) and `GenerationFailure`s (no answer: recorded as failed, never scored,
retried by the next run into the same results directory).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.stats import SpeculativeStats


@dataclass(frozen=True)
class Prompt:
    """One prompt in the two forms engines take: `text`, the chat messages through the target
    tokenizer's chat template (None where no tokenizer is at hand), and the `messages` themselves."""

    text: str | None
    messages: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Generation:
    """One answer: the response text, its new tokens, the wall and process CPU seconds charged to
    it (a batch's times split evenly over its rows) and, where the engine reports them, its
    speculative statistics and why generation stopped (`finish_reason`: "stop", "length", ... as
    the server said it; None where the engine does not say). An engine that retries requests says
    how often it tried (`attempts`) and how long it slept between this request's tries
    (`retry_wait_seconds`: the batch's time, and so `seconds`, holds the sleeps of all its requests, so
    this row's own cannot be subtracted from its share); None where it does not say. An engine that
    reads a server's replies records the model the reply named (`reply_model`, at most
    `REPLY_MODEL_CHARS` characters; None where the reply named none or the engine runs the model itself)."""

    response: str
    new_tokens: int
    seconds: float
    stats: SpeculativeStats | None
    cpu_seconds: float | None = None
    finish_reason: str | None = None
    attempts: int | None = None
    retry_wait_seconds: float | None = None
    reply_model: str | None = None


REPLY_MODEL_CHARS = 200  # of a reply's model name, as recorded


@dataclass(frozen=True)
class GenerationFailure:
    """No answer for a prompt after the engine's retries: `error` says why, `attempts` how often
    it was tried."""

    error: str
    attempts: int = 1


Answer = Generation | GenerationFailure


class EngineError(ValueError):
    """An engine cannot run as asked (bad settings, an unsupported configuration, a server that
    cannot be reached at all); the message names the setting and the fix."""


class Engine(ABC):
    """Generates the study's answers. Subclasses set `name` and register themselves with
    `hf_securesd.bench.engines.register_engine`."""

    name: ClassVar[str] = ""
    # whether the runner may time one short batch per kind to estimate the run's duration
    probes_rates: ClassVar[bool] = True

    @classmethod
    def from_cli(cls, args: Any, settings: Any) -> "Engine":
        """The engine for parsed `securesd bench` arguments and `StudySettings` (the built-in
        engines are built by `hf_securesd.bench.cli_engines`; another engine overrides this)."""
        raise EngineError(f"the {cls.name} engine cannot be built from the command line")

    @property
    def tokenizer(self) -> Any | None:
        """The target tokenizer that builds `Prompt.text` from chat messages (None: none here)."""
        return None

    def baseline_configs(self) -> list[RunConfig]:
        """The baselines this engine runs for every task: target alone and draft alone (an engine
        that cannot reach a draft-alone deployment runs the target only; PRR is then undefined)."""
        return [TARGET, DRAFT]

    def check_configs(self, configs: Sequence[RunConfig]) -> None:
        """EngineError for a configuration this engine cannot run (before anything is generated)."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Manifest entries (study.json): ``engine``, ``engine_version``, ``models`` (role -> what
        it is) and, for remote engines, ``endpoints`` (URLs without credentials) and
        ``server_models`` (names the servers report)."""

    @abstractmethod
    def generate(
        self, config: RunConfig, prompts: Sequence[Prompt], max_new_tokens: int, num_assistant_tokens: int
    ) -> list[Answer]:
        """Greedy answers to `prompts` under `config`, one per prompt, in order."""

    def warm_up(self, prompt: Prompt, configs: Sequence[RunConfig], num_assistant_tokens: int) -> None:
        """One short untimed generation per configuration kind, so first-call costs stay out of the
        timings (default: nothing)."""

    def close(self) -> None:
        """Release what the engine holds (models, connections)."""
