"""Study sizes. A profile fixes the default models, tasks, examples per task, verifier sweep,
schedules and generation length; every field can be overridden on the command line.

Models run in the dtype this machine runs fastest (`--dtype auto`, see
`hf_securesd.models.hardware`; fp32 on CPUs that emulate bf16) and in batches: the number of
prompts per generate call is 4 (smoke), 8 (cpu-small: one batch per cell) and 32 (paper, as the
paper). On a 2-core CPU batch 8 decodes speculatively 3.5x faster than one prompt at a time.

- `smoke`: tiny random models (`hf_securesd.tiny`), 3 examples of each task, two verifiers at two
  settings, 16 new tokens. Checks the whole pipeline in well under two minutes on 2 CPU cores;
  the numbers mean nothing.
- `cpu-small`: the default Qwen2.5-Coder 0.5B -> 1.5B pair, sized to finish in under two hours on
  2 dedicated CPU cores: 8 examples of each of four tasks, MARS and SpecCascade at two settings each,
  with and without Step(1), at most 96 new tokens (32 for safety tasks, which are decided in the
  first tokens). That is 11 configurations x at most 2,048 tokens, about 22,500 generated tokens at
  most; at the 3-4 tokens/s the pair decodes on two cores that is under 2 hours, and replies that
  stop early (refusals, one-word injection answers) make it shorter. The progress bar shows the ETA.
- `paper`: the full study for a GPU: every task at full size, the six relaxed verifiers over their
  verifiers' sweeps (`Verifier.sweep()`), without a schedule and with Step(1), the tasks' own generation lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# The six relaxed verifiers of the paper (README, *Verifiers*); the registry also holds vLLM 0.33's FLy rule.
PAPER_VERIFIERS = ("lossysd", "bild", "speccascade", "fsd", "fly", "mars")

TINY = "tiny"  # model name of the tiny random pair


@dataclass(frozen=True)
class Profile:
    """Defaults of one study size.

    `verifiers` are specs for `plan.parse_verifier` (``mars`` = the full sweep, ``mars:0.9,0.5`` =
    those knob values); `schedules` are specs for `plan.parse_schedule`; `limit` is the number of
    examples per task (None: all); `threads` sets torch's CPU threads (None: torch's default;
    1 is fastest for tiny models); `max_new_tokens` caps every task's own length (None: no cap) and
    `max_new_tokens_by_kind` caps it further for "safety" or "utility" tasks; `dtype` is a name
    for `hf_securesd.models.hardware.resolve_dtype` (``auto``: what this machine runs fastest);
    `batch_size` is the number of prompts per generate call."""

    name: str
    description: str
    target: str
    draft: str
    tasks: tuple[str, ...]
    verifiers: tuple[str, ...]
    schedules: tuple[str, ...]
    limit: int | None
    max_new_tokens: int | None
    max_new_tokens_by_kind: Mapping[str, int] = field(default_factory=dict)
    dtype: str = "auto"
    num_assistant_tokens: int = 5
    threads: int | None = None
    batch_size: int = 1

    def max_new_tokens_for(self, task_kind: str, task_default: int, override: int | None = None) -> int:
        """Generation length for a task: `override`, else the profile's caps on the task's own."""
        if override is not None:
            return override
        caps = [cap for cap in (self.max_new_tokens, self.max_new_tokens_by_kind.get(task_kind)) if cap]
        return min([task_default, *caps])


ALL_TASKS = ("humaneval", "gsm8k", "jailbreak", "prompt_injection", "prompt_injection_adaptive")

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            name="smoke",
            description="tiny random pair, 3 examples per task, 2 verifiers x 2 settings; pipeline check",
            target=TINY,
            draft=TINY,
            tasks=ALL_TASKS,
            verifiers=("mars:0.9,0.5", "speccascade:0.3,0.9"),
            schedules=("none", "step:1"),
            limit=3,
            max_new_tokens=16,
            dtype="fp32",
            threads=1,
            batch_size=4,
        ),
        Profile(
            name="cpu-small",
            description="Qwen2.5-Coder 0.5B -> 1.5B, 8 examples per task, 2 verifiers x 2 settings; "
            "under 2 hours on 2 CPU cores",
            target="qwen-1.5b",
            draft="qwen-0.5b",
            tasks=("humaneval", "gsm8k", "jailbreak", "prompt_injection"),
            verifiers=("mars:0.7,0.5", "speccascade:0.5,0.9"),
            schedules=("none", "step:1"),
            limit=8,
            max_new_tokens=96,
            max_new_tokens_by_kind={"safety": 32},
            batch_size=8,
        ),
        Profile(
            name="paper",
            description="the full study for a GPU: all tasks, the six relaxed verifiers over their sweeps, batch 32",
            target="qwen-1.5b",
            draft="qwen-0.5b",
            tasks=ALL_TASKS,
            verifiers=PAPER_VERIFIERS,
            schedules=("none", "step:1"),
            limit=None,
            max_new_tokens=None,
            batch_size=32,
        ),
    )
}


def get_profile(name: str) -> Profile:
    """The profile called `name`."""
    if name not in PROFILES:
        raise KeyError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}")
    return PROFILES[name]
