"""The answer part of a reasoning model's response, which is what a safety judge reads.

Reasoning models (Qwen3, DeepSeek-R1, ...) write a thinking trace closed by ``</think>`` before their
answer; the chat template may open the trace itself, so only the closing marker is reliable. A refusal
or a compliance is decided by the answer: a trace that deliberates over the request and then refuses
is a refusal. `securesd bench` and the `afr` metric both judge `final_answer(response)`.

The trace ends at its first ``</think>``: everything after it is the answer, including any further
``</think>`` the answer writes, so an answer cannot hide its opening behind a fake marker followed by
a refusal. A response with no marker is judged whole. Whether the model writes thinking traces at all
is not known here: a non-reasoning model's reply that contains ``</think>`` is also judged from the
text after it.
"""

from __future__ import annotations

THINK_END = "</think>"  # ends a reasoning model's thinking trace


def final_answer(response: str) -> str:
    """The text after the first `</think>` in `response` (later markers are part of the answer); the
    whole response when there is none."""
    _, marker, after = response.partition(THINK_END)
    return after if marker else response
