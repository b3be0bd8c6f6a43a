"""A user `ChatBackend` that returns something other than str replies (None, bytes, ...) is a programming
error: StrongRejectJudge raises a TypeError naming the backend's class, the reply's index and the expected
type, for the whole call, instead of failing deep inside the parser. A rubric that is not a str is refused
when the judge is built, naming the argument."""

from __future__ import annotations

import pytest

from hf_securesd.judges import StrongRejectJudge
from hf_securesd.judges.backends import ChatBackend, JudgeReply

RUBRIC = "Goal: {forbidden_prompt}\nResponse: {response}"
GOOD = "#scores\n1.b 0\n2.b 5\n3.b 5"


class Replies(ChatBackend):
    """Replies with the given objects, one per conversation, in order."""

    def __init__(self, *replies):
        self.replies = replies

    def complete(self, conversations):
        return list(self.replies[: len(conversations)])


class NotCalled(ChatBackend):
    def complete(self, conversations):
        raise AssertionError("the backend must not be called")


@pytest.mark.parametrize("bad, type_name", [(None, "NoneType"), (GOOD.encode(), "bytes"), (1, "int"),
                                            (["#scores"], "list")])
def test_a_reply_that_is_not_a_str_names_the_backend_the_index_and_str(bad, type_name) -> None:
    judge = StrongRejectJudge(backend=Replies(GOOD, bad), rubric=RUBRIC)
    with pytest.raises(TypeError) as raised:
        judge.judge(["a", "a"], ["b", "b"])
    message = str(raised.value)
    assert message.startswith(f"the judge backend Replies returned {type_name} as reply 1 (of 2); ")
    assert "must return one str per conversation" in message
    assert ("decode bytes to str" in message) == (type_name == "bytes")


def test_good_replies_still_give_verdicts() -> None:
    verdicts = StrongRejectJudge(backend=Replies(GOOD, GOOD), rubric=RUBRIC).judge(["a", "a"], ["b", "b"])
    assert [verdict.attack_succeeded for verdict in verdicts] == [True, True]


def test_complete_replies_that_are_not_judge_replies_are_refused() -> None:
    class Strings(ChatBackend):
        def complete(self, conversations):
            return [GOOD for _ in conversations]

        def complete_replies(self, conversations):
            return self.complete(conversations)

    with pytest.raises(TypeError, match=r"^the judge backend .*Strings returned a str as reply 0 \(of 1\) from "
                                        r"complete_replies; it must return one JudgeReply per conversation"):
        StrongRejectJudge(backend=Strings(), rubric=RUBRIC).judge(["a"], ["b"])


def test_a_problem_that_is_not_a_str_is_refused() -> None:
    class Flagged(ChatBackend):
        def complete(self, conversations):
            return [GOOD for _ in conversations]

        def complete_replies(self, conversations):
            return [JudgeReply(GOOD, True) for _ in conversations]

    with pytest.raises(TypeError, match=r"Flagged gave reply 0 \(of 1\) a problem of type bool; "
                                        r"JudgeReply.problem must be a str or None"):
        StrongRejectJudge(backend=Flagged(), rubric=RUBRIC).judge(["a"], ["b"])


@pytest.mark.parametrize("rubric, type_name", [(123, "int"), (RUBRIC.encode(), "bytes"), ([RUBRIC], "list")])
def test_a_rubric_that_is_not_a_str_is_refused_at_construction(rubric, type_name) -> None:
    with pytest.raises(TypeError, match=rf"^rubric must be a str \(the StrongREJECT rubric prompt, with the "
                                        rf"placeholders {{forbidden_prompt}} and {{response}}\) or None .*got {type_name}"):
        StrongRejectJudge(backend=NotCalled(), rubric=rubric)
