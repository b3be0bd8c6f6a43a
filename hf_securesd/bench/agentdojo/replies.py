"""The model's replies in AgentDojo's prompt-based tool-calling format: the call tags, how a past
call is written back into an assistant turn, the checks a reply passes before AgentDojo's parser
reads it (`_check_reply`), and the message a reply that could not be parsed is answered with."""

from __future__ import annotations

import ast
from collections import Counter
from typing import Sequence

from agentdojo.agent_pipeline.llms.prompting_llm import InvalidModelOutputError
from agentdojo.ast_utils import ASTParsingError, create_python_function_from_tool_call
from agentdojo.functions_runtime import FunctionCall

CALL_OPEN, CALL_CLOSE = "<function-call>", "</function-call>"
# Longest reply handed to AgentDojo's parser. Its lazy regexes take quadratic time on many unclosed
# tags (8,000 tags, 120 KB: 7 s per parse); at this length the worst case stays under a second. A
# reply of max_new_tokens=512 is ~2,000 characters (~4 per token); even 4,096 tokens of 8 characters
# fit. A longer reply is answered with a parse error (re-prompted, then kept as plain text).
MAX_PARSED_REPLY_CHARS = 32_768


def _assistant_text(text: str, calls: Sequence[FunctionCall]) -> str:
    """A past assistant turn that called tools, in the format the model is asked to produce."""
    thoughts = f"<function-thoughts>{text}</function-thoughts>" if text else ""
    listed = ", ".join(create_python_function_from_tool_call(call) for call in calls)
    return f"{thoughts}{CALL_OPEN}[{listed}]{CALL_CLOSE}"


def _check_reply(reply: str) -> None:
    """Refuse, with an `ASTParsingError` the model is shown, what AgentDojo's parser would misread or
    take long on: an over-long reply, several call blocks (it reads only the first), and a block
    that is not exactly one list of calls with distinct keyword arguments (it drops extra statements
    and positional arguments, and lets a repeated keyword win)."""
    if len(reply) > MAX_PARSED_REPLY_CHARS:
        raise ASTParsingError(
            f"the reply is {len(reply)} characters long; tool calls are read from replies of at most "
            f"{MAX_PARSED_REPLY_CHARS} characters, so answer more briefly"
        )
    blocks = reply.count(CALL_OPEN)
    if blocks > 1:
        raise ASTParsingError(
            f"the reply has {blocks} {CALL_OPEN} blocks; put every call in one list inside a single "
            f"{CALL_OPEN}[...]{CALL_CLOSE}"
        )
    start = reply.find(CALL_OPEN)
    end = reply.find(CALL_CLOSE, start)
    if start >= 0 and end >= 0:
        _check_call_block(reply[start + len(CALL_OPEN) : end])


def _check_call_block(source: str) -> None:
    """The text between the call tags must be one statement whose calls pass `_check_call`."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return  # AgentDojo's parser reports it
    if len(tree.body) != 1:
        raise ASTParsingError(
            f"the {CALL_OPEN} block holds {len(tree.body)} statements; write exactly one list of calls, "
            'e.g. [] or [get_balance(), send_money(recipient="X", amount=1.0)]'
        )
    value = getattr(tree.body[0], "value", None)
    for call in value.elts if isinstance(value, ast.List) else [value]:
        if isinstance(call, ast.Call):
            _check_call(call)


def _check_call(call: ast.Call) -> None:
    """Arguments by keyword only, each given once, with values AgentDojo can use (`_check_values`)."""
    name = call.func.id if isinstance(call.func, ast.Name) else "a call"
    if call.args:
        raise ASTParsingError(f"{name}(...) has positional arguments; pass every argument by name, e.g. f(a=1)")
    counts = Counter(keyword.arg for keyword in call.keywords if keyword.arg is not None)
    repeated = sorted(argument for argument, count in counts.items() if count > 1)
    if repeated:
        raise ASTParsingError(f"{name}(...) repeats the argument(s) {', '.join(repeated)}; give each once")
    for keyword in call.keywords:
        _check_values(name, keyword.value)


def _check_values(name: str, value: ast.AST) -> None:
    """Refuse an argument value that AgentDojo would fail on after parsing, outside the errors it
    handles, which would end the episode with an error (and take the pair out of the figures): its tool
    executor `ast.literal_eval`s every top-level string argument, catching only ValueError and
    SyntaxError (a string of a few thousand "-" raises RecursionError there), and every call is written
    back into the next prompt in decimal (an integer of more than Python's 4,300-digit limit, anywhere
    in the value, raises ValueError)."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        try:
            ast.literal_eval(value.value)
        except (ValueError, SyntaxError):
            pass
        except Exception as error:  # noqa: BLE001 - RecursionError, MemoryError, ...: what AgentDojo does not catch
            raise ASTParsingError(
                f"{name}(...) has a string argument that cannot be read back ({type(error).__name__}); "
                "give a shorter, plain string"
            ) from None
    for node in ast.walk(value):
        constant = node.value if isinstance(node, ast.Constant) else None
        if isinstance(constant, int):
            try:
                repr(constant)
            except ValueError:
                raise ASTParsingError(
                    f"{name}(...) has an integer argument of {constant.bit_length()} bits, too long to write "
                    "in decimal; give a shorter number"
                ) from None


def _parse_error_text(error: Exception) -> str:
    """The message the model gets back for a reply that could not be parsed."""
    if isinstance(error, (InvalidModelOutputError, ASTParsingError)):
        return f"Invalid function calling output: {error!s}"
    return f"Invalid function calling output: {type(error).__name__}: {error!s}"
