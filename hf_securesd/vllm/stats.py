"""Per-request SecureSD statistics from vLLM's own per-request speculative decoding metrics.

Start the engine with `per_request_spec_decode_metrics="detailed"` (`--per-request-spec-decode-metrics
detailed` for `vllm serve`): every finished sequence then carries, in order, the drafted and accepted
counts of each verification step (`CompletionOutput.spec_decode_metrics`, or `metrics.speculative_decoding`
in the HTTP response). vLLM's first response token comes from the prefill step, so the first step's
drafts start at response position 1 and each step's drafts start right after the tokens the previous
steps committed (its accepted drafts plus one). That gives acceptance by response position, in the
`SpeculativeStats` the `generate` path returns.

```python
>>> llm = LLM(model=target, speculative_config=..., per_request_spec_decode_metrics="detailed")
>>> out = llm.generate([prompt], SamplingParams(extra_args={"securesd": {"verifier": "mars"}}))
>>> stats = speculative_stats(out[0].outputs[0])
>>> stats.acceptance_rate, stats.position_acceptance_rate[:4]
```
"""

from __future__ import annotations

from typing import Any, Mapping

from ..stats import SpeculativeStats

FIRST_DRAFTED_POSITION = 1


def _per_step(metrics: Any, name: str) -> list[int]:
    value = metrics.get(name) if isinstance(metrics, Mapping) else getattr(metrics, name, None)
    return list(value or [])


def speculative_stats(output: Any, new_tokens: int | None = None) -> SpeculativeStats:
    """A finished sequence's statistics by response position.

    `output`: a `CompletionOutput` from `LLM.generate`, its `spec_decode_metrics`, or the HTTP
    response's `metrics.speculative_decoding` dict. `new_tokens`: the sequence's length, when `output`
    does not hold its token ids (the HTTP response's completion tokens). Raises ValueError when the
    per-step counts are missing (the engine was not started with detailed per-request metrics).

    vLLM records no entry for a step that drafted nothing (an n-gram proposer that found no match, a
    request near max_model_len); each such step commits one token. When the sequence holds more tokens
    than the recorded steps commit, the positions of the steps after the first unrecorded one are
    unknown: the statistics then keep each step's drafted and accepted counts (the acceptance rate)
    and no per-position lists. A gap is not seen when the sequence's last step was cut short (EOS, a
    stop string, max_tokens) by at least as many tokens as went unrecorded: vLLM counts a step's
    accepted drafts before it applies the stop."""
    metrics = getattr(output, "spec_decode_metrics", output)
    token_ids = getattr(output, "token_ids", None)
    if token_ids is not None:
        new_tokens = len(token_ids)
    if metrics is None:
        raise ValueError(
            "this output carries no speculative decoding metrics; start the engine with "
            "per_request_spec_decode_metrics='detailed' (vllm serve --per-request-spec-decode-metrics detailed)"
        )
    drafted, accepted = _per_step(metrics, "per_step_drafted"), _per_step(metrics, "per_step_accepted")
    total_drafted = metrics.get("num_draft_tokens") if isinstance(metrics, Mapping) else getattr(metrics, "num_draft_tokens", 0)
    if not drafted and total_drafted:
        raise ValueError(
            "the metrics hold totals only; per-position acceptance needs the per-step counts of "
            "per_request_spec_decode_metrics='detailed' (vllm serve --per-request-spec-decode-metrics detailed)"
        )
    stats = SpeculativeStats()
    committed = FIRST_DRAFTED_POSITION + sum(step_accepted + 1 for step_accepted in accepted)
    if new_tokens is not None and new_tokens > committed:  # steps without drafts went unrecorded
        stats.drafted_per_round += drafted
        stats.accepted_per_round += accepted
        stats.new_tokens = new_tokens
        return stats
    start = FIRST_DRAFTED_POSITION
    for step_drafted, step_accepted in zip(drafted, accepted):
        stats.record_round(start, step_drafted, step_accepted)
        start += step_accepted + 1
    stats.new_tokens = new_tokens if new_tokens is not None else start
    return stats
