"""How many tokens the draft proposes per round: Hugging Face's draft-length controls, per batch row.

Fields (the names of `GenerationConfig`), each taken from the first place that sets it:
`generate(...)` keyword > a `GenerationConfig` passed to `generate` > the draft model's own
`generation_config` > our default.

* `num_assistant_tokens` (k, default 5; HF's own default is 20).
* `num_assistant_tokens_schedule`: `"constant"` (default) keeps k; `"heuristic"` adds 2 to k after a
  round whose drafts were all accepted and subtracts 1 (never below 1) otherwise, and writes the
  final k back to the draft's `generation_config.num_assistant_tokens` so the next call starts there;
  `"heuristic_transient"` does the same without writing back.
* `assistant_confidence_threshold` (default 0 = off; HF's own default is 0.4): a row stops drafting
  after a token whose draft probability p(x) falls below the threshold (that token is still
  proposed). After each round the threshold is re-tuned as HF does: over the row's history of
  (p(x), accepted?) pairs — each round's accepted drafts and its first rejected one — the threshold
  minimising FPR + 3 FNR on the ROC curve, once more than 5 pairs hold both outcomes (HF needs
  scikit-learn for this step and skips it without; here it is built in).

Each batch row keeps its own k and threshold, exactly as if it were decoded alone. The draft length
changes only how many tokens are proposed, never how they are verified.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from transformers import GenerationConfig

from .schedules import as_real, is_integer, short_repr
from .validation import SecureSDConfigError

DEFAULT_NUM_DRAFT_TOKENS = 5
DEFAULT_MAX_MATCHING_NGRAM_SIZE = 2  # HF's prompt lookup default
SCHEDULES = ("constant", "heuristic", "heuristic_transient")
_UNSUPPORTED = {
    "assistant_lookbehind": "it re-encodes between two tokenizers (universal assisted decoding), and a verifier "
    "needs a draft that shares the target's tokenizer",
    "target_lookbehind": "it re-encodes between two tokenizers (universal assisted decoding), and a verifier "
    "needs a draft that shares the target's tokenizer",
    "assistant_early_exit": "early-exit self-speculation drafts from the target's own layers, not from a draft model",
}


class DraftLengthError(SecureSDConfigError):
    """A draft-length setting that speculative decoding with a verifier cannot honour."""


@dataclass(frozen=True)
class DraftLength:
    """Resolved draft-length controls of one `generate` call."""

    num_tokens: int = DEFAULT_NUM_DRAFT_TOKENS
    schedule: str = "constant"
    confidence_threshold: float = 0.0
    # k comes from a draft generation_config whose k a heuristic schedule rewrites (`DraftLengthController.finish`
    # stored it, or that config's own schedule is "heuristic", which transformers' assisted decoding rewrites
    # after every call): a starting point the call may raise to its verifier's smallest k (`at_least`)
    written_back: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_tokens", _checked_k(self.num_tokens))
        if self.schedule not in SCHEDULES:
            raise DraftLengthError(
                f"num_assistant_tokens_schedule={self.schedule!r} is not supported; use one of {', '.join(map(repr, SCHEDULES))}"
            )
        object.__setattr__(self, "confidence_threshold", checked_threshold(self.confidence_threshold))

    def at_least(self, smallest_k: int) -> "DraftLength":
        """This setting with a written-back k raised to `smallest_k` (a verifier's `Needs.min_draft_tokens`:
        a heuristic call with another verifier may have stored less); a k a user set is kept as it is."""
        if not self.written_back or self.num_tokens >= smallest_k:
            return self
        return dataclasses.replace(self, num_tokens=smallest_k)

    def generation_fields(self) -> dict[str, Any]:
        """The `GenerationConfig` fields that carry this setting into the decoding loop."""
        return {
            "num_assistant_tokens": self.num_tokens,
            "num_assistant_tokens_schedule": self.schedule,
            "assistant_confidence_threshold": float(self.confidence_threshold),
        }

    @classmethod
    def from_generation_config(cls, config: GenerationConfig) -> "DraftLength":
        """Read back what `generation_fields` stored (missing fields take our defaults)."""
        threshold = getattr(config, "assistant_confidence_threshold", None)
        return cls(
            num_tokens=getattr(config, "num_assistant_tokens", None) or DEFAULT_NUM_DRAFT_TOKENS,
            schedule=getattr(config, "num_assistant_tokens_schedule", None) or "constant",
            confidence_threshold=0.0 if threshold is None else float(threshold),
        )


# where a value of the call's GenerationConfig comes from (for a callable `custom_generate`, transformers
# merges the model's own generation_config into the one it passes)
PASSED_CONFIG = (" (in the call's GenerationConfig: one passed to generate, or the model's own generation_config "
                 "that transformers passes to custom_generate=securesd_generate)")


DRAFT_CONFIG = " (in the draft model's generation_config)"  # where a value of the draft's own config comes from


def resolve_draft_length(
    explicit: Mapping[str, Any],
    passed_config: GenerationConfig | None,
    draft_config: GenerationConfig | None,
    target_config: GenerationConfig | None = None,
) -> DraftLength:
    """Apply the precedence explicit kwarg > passed GenerationConfig > draft's generation_config > default.
    The fields that select another kind of drafting (`_UNSUPPORTED`) are refused from any of them and from
    the target's generation_config too, which transformers reads for them.

    In a config object, a field equal to transformers' global default counts as unset: some callers
    (pipelines on transformers 5.17) pass configs with every default filled in, which would otherwise
    read as an explicit k = 20 and an explicit lookbehind. Pass such a value as a keyword to force it."""
    places = [(explicit, "")]
    if passed_config is not None:
        places.append((_explicit_fields(passed_config), PASSED_CONFIG))
    if draft_config is not None:
        places.append((_draft_fields(draft_config), DRAFT_CONFIG))
    sources = [source for source, _ in places]

    def pick(name: str) -> tuple[Any, str]:
        return next(((source[name], where) for source, where in places if source.get(name) is not None), (None, ""))

    _refuse_unsupported(sources + ([_explicit_fields(target_config)] if target_config is not None else []))
    saved_ngram = getattr(target_config, "max_matching_ngram_size", None)
    for index, (source, where) in enumerate(places[: 1 + (passed_config is not None)]):  # call, its config
        ngram = source.get("max_matching_ngram_size")
        if ngram is not None and (index == 0 or ngram != saved_ngram):  # (a copy of the model's config)
            raise DraftLengthError(
                f"max_matching_ngram_size={ngram!r}{where} does not apply to a draft model: it sets the "
                "n-gram size of prompt lookup (prompt_lookup_num_tokens=N without assistant_model=). Remove "
                "it, or draft by prompt lookup instead"
            )
    defaults = DraftLength()
    k, where = pick("num_assistant_tokens")
    if k is not None:
        k = _checked_k(_whole_number(k, where), where)
    values = {
        "num_tokens": k,
        "schedule": pick("num_assistant_tokens_schedule")[0],
        "confidence_threshold": pick("assistant_confidence_threshold")[0],
    }
    setting = DraftLength(**{key: getattr(defaults, key) if value is None else value for key, value in values.items()})
    if k is not None and where == DRAFT_CONFIG and (
        _is_written_back(draft_config) or getattr(draft_config, "num_assistant_tokens_schedule", None) == "heuristic"
    ):
        setting = dataclasses.replace(setting, written_back=True)
    return setting


def _checked_k(k: Any, where: str = "") -> int:
    """The draft length k as an int; DraftLengthError naming where it was set (`where`) unless it is an
    integer >= 1."""
    if not is_integer(k) or int(k) < 1:
        raise DraftLengthError(f"num_assistant_tokens{where} (the draft length k) must be an integer >= 1, got {k!r}")
    return int(k)


def _whole_number(k: Any, where: str) -> Any:
    """A draft length given as a float with a whole value (6.0, as some configs store it) as that integer;
    any other value unchanged (DraftLength checks it). A float with a fraction is refused with its place."""
    value = as_real(k)
    if is_integer(k) or value is None or not math.isfinite(value):
        return k
    if value != int(value):
        raise DraftLengthError(
            f"num_assistant_tokens{where} (the draft length k) must be a whole number >= 1, got {k!r}; set it to "
            "an integer"
        )
    return int(value)


def resolve_prompt_lookup(
    explicit: Mapping[str, Any],
    passed_config: GenerationConfig | None,
    draft: Any,
    max_matching_ngram_size: Any,
    target_config: GenerationConfig | None = None,
) -> DraftLength:
    """Draft length of prompt lookup: k = `prompt_lookup_num_tokens` (HF's field: the call, else a passed
    GenerationConfig, else the target's generation_config, as in transformers), the dynamic schedule as
    for a draft model; a draft model, `num_assistant_tokens` or a confidence threshold in the call (or its
    GenerationConfig), or a field of another kind of drafting (`_UNSUPPORTED`) anywhere, alongside it would
    be ignored or change the drafting, so they are refused. `num_assistant_tokens` and the threshold saved
    in the target's own generation_config configure draft-model drafting and are ignored, as in HF."""
    places = [(explicit, "in the call")] + [
        (_explicit_fields(config), where) for config, where in (
            (passed_config, "in the GenerationConfig passed to generate"),
            (target_config, "saved in the model's own generation_config"),
        ) if config is not None
    ]
    sources = [fields for fields, _ in places]
    if draft is not None:
        value, where = next((fields["prompt_lookup_num_tokens"], where) for fields, where in places
                            if fields.get("prompt_lookup_num_tokens") is not None)
        raise DraftLengthError(
            f"prompt_lookup_num_tokens={value!r} ({where}) selects prompt lookup drafting, but a draft model "
            "(assistant_model= or draft=) was given too; transformers would silently use prompt lookup only. "
            "Pass one of them: to draft with the model, pass prompt_lookup_num_tokens=None in the call (or remove "
            "it from where it is set); to use prompt lookup, drop the draft model"
        )

    def pick(name: str) -> Any:
        return next((source[name] for source in sources if source.get(name) is not None), None)

    _refuse_unsupported(sources)
    k = pick("prompt_lookup_num_tokens")
    if not is_integer(k) or int(k) < 1:
        raise DraftLengthError(f"prompt_lookup_num_tokens (the draft length k) must be an integer >= 1, got {k!r}")
    ngram = DEFAULT_MAX_MATCHING_NGRAM_SIZE if max_matching_ngram_size is None else max_matching_ngram_size
    if not is_integer(ngram) or int(ngram) < 1:
        raise DraftLengthError(f"max_matching_ngram_size must be an integer >= 1, got {ngram!r}")
    # Asked for in this call (or its GenerationConfig) they would be ignored, so they are refused; saved in
    # the model's own generation_config they configure draft-model drafting, and are ignored as HF does.
    # Any num_assistant_tokens is refused (0 is no draft length either); a threshold of 0 is the early stop off.
    asked = sources[: 2 if passed_config is not None else 1]

    def asked_for(name: str) -> Any:
        return next((source[name] for source in asked if source.get(name) is not None), None)

    if (value := asked_for("num_assistant_tokens")) is not None:
        raise DraftLengthError(
            f"num_assistant_tokens={value!r} does not apply to prompt lookup: prompt lookup drafts "
            "prompt_lookup_num_tokens tokens; set that instead"
        )
    if (value := asked_for("assistant_confidence_threshold")) is not None and checked_threshold(value) != 0:
        raise DraftLengthError(
            f"assistant_confidence_threshold={value!r} does not apply to prompt lookup: prompt lookup has no draft "
            "probabilities to stop on"
        )
    return DraftLength(num_tokens=int(k), schedule=pick("num_assistant_tokens_schedule") or "constant")


def checked_threshold(value: Any) -> float:
    """`assistant_confidence_threshold` as a float; DraftLengthError unless it is a probability in [0, 1]
    (a Python, NumPy or 0-d tensor real number, not a bool)."""
    threshold = as_real(value)
    if threshold is None or not 0.0 <= threshold <= 1.0:
        raise DraftLengthError(
            "assistant_confidence_threshold must be a probability in [0, 1] (a Python, NumPy or 0-d tensor "
            f"real number; 0 switches the early stop off), got {short_repr(value)}"
        )
    return float(threshold)


def _refuse_unsupported(sources: list[Mapping[str, Any]]) -> None:
    """Raise DraftLengthError when any source sets a field of another kind of drafting (`_UNSUPPORTED`)."""
    for name, reason in _UNSUPPORTED.items():
        value = next((source[name] for source in sources if source.get(name) is not None), None)
        if value is not None and value is not False:
            raise DraftLengthError(
                f"{name}={value!r} is not supported with verifier=: {reason}. Remove it from the generate call, the "
                "GenerationConfig and the target's and the draft model's generation_config"
            )


# id(draft generation_config) -> (a weak reference to it, the k the "heuristic" schedule wrote back)
_WRITTEN_BACK: dict[int, tuple[weakref.ref, int]] = {}


def _draft_fields(config: GenerationConfig) -> dict[str, Any]:
    """`_explicit_fields` of the draft's config, where a k this module wrote back ("heuristic") counts as
    set even when it equals transformers' global default (20): the next call starts from it, as in HF."""
    fields = _explicit_fields(config)
    if _is_written_back(config):
        fields["num_assistant_tokens"] = config.num_assistant_tokens
    return fields


def _is_written_back(config: GenerationConfig) -> bool:
    """Whether the draft config's num_assistant_tokens is the k this module stored there last."""
    reference, written = _WRITTEN_BACK.get(id(config), (None, None))
    return reference is not None and reference() is config and config.num_assistant_tokens == written


def _remember_written_back(config: GenerationConfig, k: int) -> None:
    key = id(config)
    _WRITTEN_BACK[key] = (weakref.ref(config, lambda _: _WRITTEN_BACK.pop(key, None)), k)


def _explicit_fields(config: GenerationConfig) -> dict[str, Any]:
    """The config's fields, less those that merely repeat transformers' global defaults."""
    defaults = GenerationConfig._get_default_generation_params()
    return {name: value for name, value in vars(config).items() if name not in defaults or value != defaults[name]}


def tuned_thresholds(confidence: torch.Tensor, outcome: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """HF's ROC re-tuning of the confidence threshold, for every row at once.

    confidence: [B, H] draft probabilities of past drafts; outcome: [B, H] 1 accepted, 0 rejected,
    -1 no entry; current: [B] thresholds. Returns [B]: per row with more than 5 entries of both
    outcomes and a non-zero threshold, the threshold of scikit-learn's `roc_curve` (as HF calls it)
    minimising FPR + 3 FNR, computed in float64 as there: the distinct scores from high to low after a
    leading +inf, without the points `drop_intermediate` drops (a point whose false- and true-positive
    counts both lie on a straight line between its neighbours'), the first minimum winning."""
    if confidence.device.type == "mps":  # no float64 there: the same rule on the CPU
        return tuned_thresholds(confidence.cpu(), outcome.cpu(), current.cpu()).to(current.device)
    valid = outcome >= 0
    key = torch.where(valid, confidence, -1.0)
    key, order = key.sort(dim=-1, descending=True, stable=True)
    labels = outcome.gather(1, order)
    valid = key >= 0
    true_positives = ((labels == 1) & valid).cumsum(dim=-1)
    false_positives = ((labels == 0) & valid).cumsum(dim=-1)
    positives, negatives = true_positives[:, -1:], false_positives[:, -1:]
    following = torch.cat([key[:, 1:], key.new_full((key.shape[0], 1), -1.0)], dim=-1)
    run_end = valid & (following != key)  # [B, H] the last entry of each distinct score: a ROC point
    kept = run_end & ~_intermediate(run_end, false_positives, true_positives)
    fpr = false_positives.double() / negatives.clamp_min(1)
    tpr = true_positives.double() / positives.clamp_min(1)
    cost = torch.where(kept, fpr + 3 * (1 - tpr), torch.inf)
    best_cost, best = cost.min(dim=-1)
    # The leading point (+inf: no draft kept) costs 3 and comes first, so it wins unless a point costs less.
    chosen = torch.where(best_cost < 3.0, key.gather(1, best[:, None])[:, 0], torch.inf)
    eligible = (valid.sum(dim=-1) > 5) & (positives[:, 0] > 0) & (negatives[:, 0] > 0) & (current > 0)
    return torch.where(eligible, chosen.to(current.dtype), current)


def _intermediate(points: torch.Tensor, false_positives: torch.Tensor, true_positives: torch.Tensor) -> torch.Tensor:
    """[B, H] bool: the ROC points (True in points [B, H]) that `roc_curve(drop_intermediate=True)` drops:
    those with a point before and after them whose false- and true-positive counts ([B, H], cumulative)
    both have a zero second difference with theirs."""
    rows, width = points.shape
    index = torch.arange(width, device=points.device).expand(rows, width)
    # The nearest point strictly before / after each entry (-1 / width where there is none).
    before = torch.where(points, index, -1).cummax(dim=-1).values
    before = torch.cat([before.new_full((rows, 1), -1), before[:, :-1]], dim=-1)
    after = torch.where(points, index, width).flip(-1).cummin(dim=-1).values.flip(-1)
    after = torch.cat([after[:, 1:], after.new_full((rows, 1), width)], dim=-1)
    inner = points & (before >= 0) & (after < width)
    previous, following = before.clamp_min(0), after.clamp_max(width - 1)

    def straight(counts: torch.Tensor) -> torch.Tensor:
        return counts.gather(1, following) - 2 * counts + counts.gather(1, previous) == 0

    return inner & straight(false_positives) & straight(true_positives)


class DraftLengthController:
    """Per-row draft lengths and confidence thresholds during one `generate` call.

    `limits(rows, budgets)` gives each active row's cap for the next round; `record(...)` updates the
    schedule and the threshold history from the round's outcome."""

    def __init__(
        self, setting: DraftLength, batch: int, device: torch.device, empty_rounds_grow: bool = True,
        smallest_k: int = 1,
    ) -> None:
        """empty_rounds_grow: whether a round in which a row drafted nothing counts as all accepted under a
        heuristic schedule (HF's rule for a draft model, whose rows draft nothing only once their token
        budget is spent). False for prompt lookup: there an empty round means the lookup found no match,
        which says nothing of the drafts, so k stays. smallest_k: the smallest k the call's verifier is
        defined for (`Needs.min_draft_tokens`): the k a heuristic schedule stores for the next call is
        never below it, so that call's check accepts it (within a call k may shrink further, as in HF)."""
        self.setting = setting
        self.empty_rounds_grow = empty_rounds_grow
        self.smallest_k = smallest_k
        self.k = [setting.num_tokens] * batch
        self.thresholds = torch.full((batch,), float(setting.confidence_threshold), device=device)
        self.early_stop = setting.confidence_threshold > 0
        self._confidence: list[torch.Tensor] = []  # [B, k] per round
        self._outcome: list[torch.Tensor] = []

    def limits(self, host_rows: list[int], budgets: list[int]) -> list[int]:
        return [min(self.k[row], budget) for row, budget in zip(host_rows, budgets)]

    def record(
        self,
        rows: torch.Tensor,
        host_rows: list[int],
        drafted: list[int],
        accepted: list[int],
        confidence: torch.Tensor | None,
        accepted_device: torch.Tensor,
        drafted_device: torch.Tensor,
    ) -> None:
        """One round's outcome for rows [A]: drafted/accepted counts (host), confidence [A, k] of the
        drafted tokens (None when the early stop is off), and the same counts on the device."""
        if self.setting.schedule != "constant":
            for row, d, n in zip(host_rows, drafted, accepted):
                if d or self.empty_rounds_grow:
                    self.k[row] = self.k[row] + 2 if n == d else max(1, self.k[row] - 1)
        if confidence is None:
            return
        batch, k = self.thresholds.shape[0], confidence.shape[1]
        steps = torch.arange(k, device=confidence.device)[None]
        entry = steps < torch.minimum(accepted_device + 1, drafted_device)[:, None]
        outcome = torch.full((batch, k), -1, dtype=torch.long, device=confidence.device)
        outcome[rows] = torch.where(entry, (steps < accepted_device[:, None]).long(), -1)
        full = confidence.new_zeros(batch, k)
        full[rows] = confidence
        self._confidence.append(full)
        self._outcome.append(outcome)
        self.thresholds = tuned_thresholds(torch.cat(self._confidence, 1), torch.cat(self._outcome, 1), self.thresholds)

    def finish(self, draft_config: GenerationConfig) -> None:
        """`"heuristic"`: store the final k for the next call (the rounded mean over the batch's rows, at
        least `smallest_k`)."""
        if self.setting.schedule == "heuristic":
            draft_config.num_assistant_tokens = max(self.smallest_k, round(sum(self.k) / len(self.k)))
            _remember_written_back(draft_config, draft_config.num_assistant_tokens)
