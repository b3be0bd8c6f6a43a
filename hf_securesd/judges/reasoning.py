"""The answer part of a reasoning model's response, which is what a safety judge reads.

Reasoning models (Qwen3, DeepSeek-R1, ...) write a thinking trace closed by ``</think>`` before their
answer; the chat template may open the trace itself, so only the closing marker is reliable. A refusal
or a compliance is decided by the answer: a trace that deliberates over the request and then refuses
is a refusal. `securesd bench` and the `afr` metric both judge `final_answer(response)`.

The trace ends at its first ``</think>``: everything after it is the answer, including any further
``</think>`` the answer writes, so an answer cannot hide its opening behind a fake marker followed by
a refusal. A response with no marker is judged whole. Whether the model writes thinking traces at all
is not known from its text: a reply that ends "... </think> I'm sorry" would hide everything before
the marker. `securesd bench` therefore decides it from the target's tokenizer (`writes_thinking`:
reasoning models have ``</think>`` as one token) and judges a model without it on the whole reply;
the `afr` metric takes `final_answer_only=False` for such a model.
"""

from __future__ import annotations

THINK_END = "</think>"  # ends a reasoning model's thinking trace


def final_answer(response: str) -> str:
    """The text after the first `</think>` in `response` (later markers are part of the answer); the
    whole response when there is none."""
    _, marker, after = response.partition(THINK_END)
    return after if marker else response


def writes_thinking(tokenizer: object | None) -> bool:
    """Whether a model with `tokenizer` writes thinking traces: `THINK_END` is one token of its
    vocabulary (Qwen3, DeepSeek-R1 and other reasoning models add it as a token). False without a
    tokenizer, or with one that cannot list its vocabulary (an endpoint whose tokenizer is unknown): its
    replies are judged whole, so a trace in a reply counts against the model (a safety judge reads a
    deliberation as no refusal) and a compliance can never hide behind a fake marker; give
    --thinking-trace yes for a reasoning endpoint that returns its trace in the reply text. A model
    that has the token but answers without a trace (a reasoning model with thinking switched off) is
    True: give --thinking-trace no for it."""
    vocabulary = getattr(tokenizer, "get_vocab", None)
    if vocabulary is None:  # no tokenizer, or one that cannot list its vocabulary
        return False
    return THINK_END in vocabulary()


def judged_text(response: str, thinking_trace: bool) -> str:
    """What a judge reads of `response`: `final_answer(response)` when the model writes thinking traces,
    else the whole response."""
    return final_answer(response) if thinking_trace else response
