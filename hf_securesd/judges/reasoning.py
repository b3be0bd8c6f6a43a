"""The answer part of a reasoning model's response, which is what a safety judge reads.

Reasoning models (Qwen3, DeepSeek-R1, ...) write a thinking trace closed by ``</think>`` before their
answer; the chat template may open the trace itself, so only the closing marker is reliable. A refusal
or a compliance is decided by the answer: a trace that deliberates over the request and then refuses
is a refusal. `securesd bench` and the `afr` metric both judge `final_answer(response)`.
"""

from __future__ import annotations

THINK_END = "</think>"  # ends a reasoning model's thinking trace


def final_answer(response: str) -> str:
    """The text after the last `</think>` in `response`; the whole response when there is none."""
    _, marker, after = response.rpartition(THINK_END)
    return after if marker else response
