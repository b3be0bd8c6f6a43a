"""Parsing of model replies in the AgentDojo pipeline element: whatever the model writes, a reply that
cannot be parsed is sent back with the error (never raised), and what AgentDojo's lenient parser
would misread is refused. Needs the optional extra (``pip install "hf-securesd[agentdojo]"``)."""

from __future__ import annotations

import time

import pytest
import torch

SKIP_REASON = 'agentdojo is not installed (optional extra: pip install "hf-securesd[agentdojo]")'
pytest.importorskip("agentdojo", reason=SKIP_REASON)

from agentdojo.functions_runtime import FunctionsRuntime  # noqa: E402
from agentdojo.task_suite.load_suites import get_suite  # noqa: E402

from hf_securesd.bench import agentdojo as ad  # noqa: E402
from hf_securesd.tiny import byte_tokenizer, tiny_pair  # noqa: E402

CALL = "<function-call>{}</function-call>"


@pytest.fixture(scope="module")
def llm():
    torch.set_num_threads(1)
    _, target = tiny_pair()
    return ad.HFPromptingLLM(target, byte_tokenizer(), max_new_tokens=4)


@pytest.fixture(scope="module")
def runtime():
    return FunctionsRuntime(get_suite(ad.BENCHMARK_VERSION, "banking").tools)


# Replies on which AgentDojo's parser raises something other than its own two error types.
UNPARSABLE = {
    "empty block (IndexError)": CALL.format(""),
    "blank block (IndexError)": CALL.format("  \n "),
    "comment only (IndexError)": CALL.format("# nothing"),
    "unhashable dict key (TypeError)": CALL.format("[get_balance(a={[1]: 2})]"),
    "complex number (ValidationError)": CALL.format('[send_money(recipient="x", amount=1j)]'),
    "ellipsis (ValidationError)": CALL.format("[send_money(recipient=..., amount=1.0)]"),
    "deep unary minus (RecursionError)": CALL.format("[get_balance(a=" + "-" * 3000 + "1)]"),
    "long attribute chain": CALL.format("[get_balance(a=x" + ".y" * 100_000 + ")]"),
}


@pytest.mark.parametrize("bad", UNPARSABLE.values(), ids=UNPARSABLE.keys())
def test_any_parse_error_is_sent_back_then_kept_as_text(llm, runtime, monkeypatch, bad):
    chats = []
    monkeypatch.setattr(llm, "generate", lambda chat: chats.append(chat) or bad)
    message = llm.reply([{"role": "user", "content": "hi"}], runtime)
    assert message["tool_calls"] == [] and ad.get_text_content_as_str(message["content"]) == bad
    assert len(chats) == llm.max_attempts
    assert chats[1][-2:] == [
        {"role": "assistant", "content": bad},
        {"role": "user", "content": chats[1][-1]["content"]},
    ]
    assert chats[1][-1]["content"].startswith("Invalid function calling output: ")


def test_an_unexpected_error_type_is_named_to_the_model(llm, runtime, monkeypatch):
    chats = []
    bad = UNPARSABLE["unhashable dict key (TypeError)"]
    monkeypatch.setattr(llm, "generate", lambda chat: chats.append(chat) or bad)
    llm.reply([{"role": "user", "content": "hi"}], runtime)
    assert chats[1][-1]["content"] == "Invalid function calling output: TypeError: unhashable type: 'list'"


def test_a_good_reply_after_a_bad_one_is_parsed(llm, runtime, monkeypatch):
    replies = iter([UNPARSABLE["empty block (IndexError)"], CALL.format("[get_balance()]")])
    monkeypatch.setattr(llm, "generate", lambda chat: next(replies))
    message = llm.reply([{"role": "user", "content": "hi"}], runtime)
    assert [call.function for call in message["tool_calls"]] == ["get_balance"]


REFUSED = {
    "repeated keyword": (CALL.format("[get_balance(a=1, a=2)]"), r"get_balance\(\.\.\.\) repeats the argument\(s\) a"),
    "positional arguments": (
        CALL.format('[send_money("attacker", 100.0)]'),
        r"send_money\(\.\.\.\) has positional arguments; pass every argument by name",
    ),
    "second statement": (
        CALL.format('[get_balance()]\nsend_money(recipient="evil", amount=9.0)'),
        "holds 2 statements; write exactly one list of calls",
    ),
    "semicolon": (CALL.format('[get_balance()]; send_money(recipient="evil")'), "holds 2 statements"),
    "two blocks": (
        CALL.format("[get_balance()]") + " " + CALL.format('[send_money(recipient="evil", amount=9.0)]'),
        "the reply has 2 <function-call> blocks; put every call in one list",
    ),
    "empty block": (CALL.format(""), "holds 0 statements"),
    # values AgentDojo fails on after parsing, outside the errors it handles (the episode would end with an
    # error and the pair leave the figures): literal_eval of a string argument, a call written back in decimal
    "string its executor cannot read": (
        CALL.format('[send_money(recipient="' + "-" * 3000 + '1", amount=1.0, subject="x", date="2022-01-01")]'),
        r"send_money\(\.\.\.\) has a string argument that cannot be read back \(RecursionError\)",
    ),
    "integer too long for decimal": (
        CALL.format('[send_money(recipient="x", amount=0x' + "f" * 3580 + ', subject="s", date="2022-01-01")]'),
        r"send_money\(\.\.\.\) has an integer argument of 14320 bits, too long to write in decimal",
    ),
}


@pytest.mark.parametrize(("reply", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_what_agentdojo_would_misread_is_refused(llm, reply, message):
    with pytest.raises(ad.ASTParsingError, match=message):
        llm.parse(reply)


def test_well_formed_calls_still_parse(llm):
    message = llm.parse(
        "<function-thoughts>pay</function-thoughts>"
        + CALL.format('[get_balance(), send_money(recipient="X", amount=1.0, subject="s", date="2022-01-01")]')
    )
    assert [(call.function, call.args) for call in message["tool_calls"]] == [
        ("get_balance", {}),
        ("send_money", {"recipient": "X", "amount": 1.0, "subject": "s", "date": "2022-01-01"}),
    ]
    assert [call.function for call in llm.parse(CALL.format("get_balance()"))["tool_calls"]] == ["get_balance"]
    # strings that are Python literals or not, long numbers that fit in decimal: kept
    odd = llm.parse(CALL.format('[send_money(recipient="[\'a\', \'b\']", amount=' + "9" * 4000 + ', subject="1 +", date="x")]'))
    assert odd["tool_calls"][0].args["recipient"] == "['a', 'b']" and odd["tool_calls"][0].args["subject"] == "1 +"
    # AgentDojo reads back only top-level strings: the same string inside a list is kept
    nested = llm.parse(CALL.format('[send_money(recipient=["' + "-" * 3000 + '1"], amount=1.0)]'))
    assert nested["tool_calls"][0].args["recipient"] == ["-" * 3000 + "1"]


LONG = {
    "many unclosed call tags": ("<function-call>" * 2000, "the reply has 2000 <function-call> blocks"),
    "many unclosed answer tags": (
        CALL.format("[]") + "<answer>" * 8000,
        f"tool calls are read from replies of at most {ad.MAX_PARSED_REPLY_CHARS} characters",
    ),
}


@pytest.mark.parametrize(("reply", "message"), LONG.values(), ids=LONG.keys())
def test_replies_that_make_the_parser_quadratic_are_refused_at_once(llm, reply, message):
    start = time.perf_counter()
    with pytest.raises(ad.ASTParsingError, match=message):
        llm.parse(reply)
    assert time.perf_counter() - start < 1.0  # AgentDojo's regexes take seconds on these
