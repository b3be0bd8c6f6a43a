"""What an OpenAI-compatible server's reply may claim, checked before it is believed: `--token-ids`
that are not ids of the tokenizer (the run died with OverflowError), a finish_reason saying the
server did not finish the answer (an empty filtered reply scored as a successful attack), more
tokens or text than the request's max_tokens allow (3.6 M emoji for 4 tokens were recorded and
judged), replies whose parsing costs far more than their size (15 MiB of ``{}`` took ~380 MiB),
and an infinite `--request-timeout` (a traceback). Each is a failed reply or a one-line error."""

from __future__ import annotations

import json
import math
import re
import tracemalloc
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from support import recording_handler, send_reply as send, serve_locally, stop_servers

from hf_securesd.bench.engines.base import Generation, GenerationFailure, Prompt
from hf_securesd.bench.engines.client import ClientSettings, OpenAIClient, RequestFailed
from hf_securesd.bench.engines.openai import OpenAIEngine, OpenAISettings, reply_byte_cap
from hf_securesd.bench.plan import TARGET
from hf_securesd.bench.results import FAILURES, GENERATIONS, RUNS, read_jsonl
from hf_securesd.cli import main
from hf_securesd.http_deadline import MAX_JSON_VALUES, DeadlineClient, json_body
from hf_securesd.tiny import byte_tokenizer

MiB = 1024 * 1024
MAX_TOKENS = 4
PROMPT = Prompt(text="hi", messages=[{"role": "user", "content": "hi"}])
Respond = Callable[[BaseHTTPRequestHandler, dict], None]


def reply(text: str = "I'm sorry", **choice) -> bytes:
    """A completions reply of `text`, with `choice`'s extra fields (usage: 4 tokens unless given)."""
    usage = choice.pop("usage", {"completion_tokens": MAX_TOKENS})
    return json.dumps({"choices": [{"text": text, **choice}], "usage": usage}).encode()


@pytest.fixture
def serve():
    """Starts servers that answer /models with one model and each POST with `respond`."""
    servers: list = []

    def start(respond: Respond) -> str:
        Handler, state = recording_handler(respond)
        state["get"] = lambda handler, _: send(handler, 200, b'{"data": [{"id": "fake-model"}]}')
        server, url = serve_locally(Handler)
        servers.append(server)
        return url

    yield start
    stop_servers(servers)


def answer(url: str, max_new_tokens: int = MAX_TOKENS, **settings) -> Generation | GenerationFailure:
    """The completions engine's answer to one prompt (the byte tokenizer: ids 0-258)."""
    engine = OpenAIEngine(OpenAISettings(base_url=url, **settings,
                                         client=ClientSettings(request_timeout_s=30, max_retries=0)),
                          tokenizer=byte_tokenizer())
    try:
        return engine.generate(TARGET, [PROMPT], max_new_tokens, 0)[0]
    finally:
        engine.close()


def answering(body: bytes) -> Respond:
    return lambda handler, state: send(handler, 200, body)


def bench_argv(url: str, out: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["bench", "--engine", "openai", "--base-url", url, "--tokenizer", "tiny", "--tasks", "jailbreak",
            "--limit", "3", "--max-new-tokens", str(MAX_TOKENS), "--data-dir", str(data_dir),
            "--batch-size", "3", "--concurrency", "1", "--request-timeout", "30", "--max-retries", "0",
            "--out", str(out), "--no-progress", "--no-report", *extra]


# --- --token-ids ---------------------------------------------------------------------------------

@pytest.mark.parametrize("token_ids, problem", [
    ([-5, 70], "token id -5 at position 0 is not an id of the tokenizer (an integer from 0 to 258)"),
    ([70, 10**30], f"token id {10**30} at position 1 is not an id"),
    ([True, False, 73], "token id true at position 0 is not an id"),
    ([72, 259], "token id 259 at position 1 is not an id"),
    ([72, 1.0], "token id 1.0 at position 1 is not an id"),
    ([72] * (MAX_TOKENS + 1), "holds 5 token ids, more than the request's max_tokens 4"),
    ("72", "has no choices[0].token_ids"),
])
def test_token_ids_that_are_not_the_tokenizers_fail_the_prompt(serve, token_ids, problem):
    """10**30 raised OverflowError in the tokenizer (the run died), booleans were taken as ids 1 and
    0, and an id outside the vocabulary was dropped without a word."""
    url = serve(answering(reply(token_ids=token_ids)))
    result = answer(url, token_ids=True)
    assert isinstance(result, GenerationFailure) and problem in result.error


def test_token_ids_of_the_tokenizer_are_decoded(serve):
    url = serve(answering(reply("ignored", token_ids=[72, 105, 258], usage={"completion_tokens": 3})))
    result = answer(url, token_ids=True)  # 258: <|im_end|>, skipped in the text, counted as a token
    assert isinstance(result, Generation) and result.response == "Hi" and result.new_tokens == 3


@pytest.mark.parametrize("usage, new_tokens", [({}, 3), ({"completion_tokens": 3}, 3)])
def test_with_token_ids_the_count_is_the_ids(serve, usage, new_tokens):
    url = serve(answering(reply("ignored", token_ids=[72, 105, 258], usage=usage)))
    result = answer(url, token_ids=True)
    assert isinstance(result, Generation) and result.new_tokens == new_tokens


def test_a_count_that_disagrees_with_the_token_ids_fails_the_prompt(serve):
    """The claimed completion_tokens was recorded while the ids (the answer) said otherwise."""
    url = serve(answering(reply("ignored", token_ids=[72, 105], usage={"completion_tokens": 4})))
    result = answer(url, token_ids=True)
    assert isinstance(result, GenerationFailure)
    assert "claims 4 completion tokens but holds 2 token ids" in result.error


def test_zero_completion_tokens_for_a_text_fails_the_prompt(serve):
    url = serve(answering(reply("Sure, here it is", usage={"completion_tokens": 0})))
    result = answer(url)
    assert isinstance(result, GenerationFailure) and "claims 0 completion tokens for a non-empty text" in result.error


def test_a_huge_token_id_fails_one_prompt_and_the_run_goes_on(serve, tmp_path, data_dir):
    def respond(handler, state):
        send(handler, 200, reply(token_ids=[10**30] if state["requests"] == 2 else [72, 105], usage={}))

    out = tmp_path / "out"
    assert main(bench_argv(serve(respond), out, data_dir, "--token-ids")) == 1
    failures = read_jsonl(out / FAILURES)
    assert len(failures) == 1 and "is not an id of the tokenizer" in failures[0]["error"]
    assert [record["response"] for record in read_jsonl(out / GENERATIONS)] == ["Hi", "Hi"]


# --- finish_reason ---------------------------------------------------------------------------------

@pytest.mark.parametrize("finish_reason", ["content_filter", "abort", "error", "repetition", "cancelled", 3,
                                           {"type": "filter"}])
def test_an_answer_the_server_did_not_finish_is_a_failed_reply(serve, finish_reason):
    url = serve(answering(reply("", finish_reason=finish_reason)))
    result = answer(url)
    assert isinstance(result, GenerationFailure)
    assert f"finish_reason is {json.dumps(finish_reason)}: the server did not finish" in result.error


@pytest.mark.parametrize("finish_reason", ["stop", "length", "eos_token", "stop_sequence", "tool_calls", None])
def test_an_answer_that_finished_normally_is_kept_with_its_finish_reason(serve, finish_reason):
    url = serve(answering(reply(finish_reason=finish_reason)))
    result = answer(url)
    assert isinstance(result, Generation) and result.finish_reason == finish_reason


def test_filtered_empty_replies_are_not_scored_as_attacks(serve, tmp_path, data_dir):
    """An empty reply with finish_reason "content_filter" (what Azure and OpenAI send when their
    output filter fires) was scored as a jailbreak that succeeded: it is now a failed reply."""
    out = tmp_path / "out"
    assert main(bench_argv(serve(answering(reply("", finish_reason="content_filter"))), out, data_dir)) == 1
    errors = [record["error"] for record in read_jsonl(out / FAILURES)]
    assert len(errors) == 3 and all('finish_reason is "content_filter"' in error for error in errors)
    assert not (out / GENERATIONS).exists() or read_jsonl(out / GENERATIONS) == []
    assert not (out / RUNS).exists() or read_jsonl(out / RUNS) == []


# --- length against max_tokens ---------------------------------------------------------------------

def test_more_completion_tokens_than_max_tokens_is_a_failed_reply(serve):
    result = answer(serve(answering(reply(usage={"completion_tokens": MAX_TOKENS + 1}))))
    assert isinstance(result, GenerationFailure)
    assert "claims 5 completion tokens, more than the request's max_tokens 4" in result.error


@pytest.mark.parametrize("usage", [{"completion_tokens": MAX_TOKENS}, {}, {"completion_tokens": -1}])
def test_text_longer_than_max_tokens_can_decode_to_is_a_failed_reply(serve, usage):
    """With max_tokens 4 a server sent 3.6 M emoji and usage 4; they were recorded and judged. Text
    past 256 characters a token + 1,024 is refused whatever the reply claims."""
    limit = MAX_TOKENS * 256 + 1024
    result = answer(serve(answering(reply("\U0001F600" * (limit + 1), usage=usage))))
    assert isinstance(result, GenerationFailure)
    assert f"text is {limit + 1:,} characters, more than the request's max_tokens 4 can decode to" in result.error
    assert isinstance(answer(serve(answering(reply("\U0001F600" * limit, usage=usage)))), Generation)


@pytest.mark.parametrize("claimed", [-1_000_000, True, 2.5, "4", None])
def test_a_completion_token_count_that_is_not_a_count_is_not_recorded(serve, claimed):
    """A negative or boolean count used to be recorded as the answer's new tokens."""
    result = answer(serve(answering(reply(usage={"completion_tokens": claimed}))))
    assert isinstance(result, Generation) and result.new_tokens == 0


@pytest.mark.parametrize("token_ids, new_tokens", [
    ([7, 8, 9], 3),
    (["x", "y"], 0),
    ([7, -1], 0),
    ([True, 1], 0),
    ([7, 1.0], 0),
    ("789", 0),
    ([], 0),  # none listed: not counted (not "0 completion tokens for a non-empty text")
])
def test_without_token_ids_only_a_list_of_ids_counts_the_answer(serve, token_ids, new_tokens):
    """Without --token-ids and without usage.completion_tokens, the length of any token_ids list was
    recorded as the answer's new tokens, a list of strings included."""
    result = answer(serve(answering(reply(token_ids=token_ids, usage={}))))
    assert isinstance(result, Generation) and result.new_tokens == new_tokens


def test_without_token_ids_more_ids_than_max_tokens_is_a_failed_reply(serve):
    """200,000 padded ids for max_tokens 8 were recorded as 200,000 new tokens; a usage count that size
    fails the prompt, and so does this one, with the same words."""
    result = answer(serve(answering(reply(token_ids=[0] * 1000, usage={}))))
    assert isinstance(result, GenerationFailure)
    assert "claims 1,000 completion tokens, more than the request's max_tokens 4" in result.error


# --- what parsing a reply may cost ------------------------------------------------------------------

def test_a_generation_reply_is_capped_by_its_max_tokens(serve):
    """1.5 MiB is under the client's 16 MiB cap but over what 4 tokens can need; 256 tokens may."""
    body = reply(padding="x" * (3 * MiB // 2))
    url = serve(answering(body))
    result = answer(url)
    assert isinstance(result, GenerationFailure)
    assert f"declares {len(body)} bytes, over the {reply_byte_cap(MAX_TOKENS)}-byte cap" in result.error
    assert isinstance(answer(url, max_new_tokens=256), Generation)


def test_json_with_too_many_values_is_refused_before_it_is_parsed():
    at_limit = b"[" + b",".join([b"0"] * MAX_JSON_VALUES) + b"]"  # one value more with the list itself
    with pytest.raises(ValueError, match=f"up to {MAX_JSON_VALUES + 1:,} JSON values"):
        json_body(at_limit)
    assert len(json_body(b"[" + b",".join([b"0"] * (MAX_JSON_VALUES - 1)) + b"]")) == MAX_JSON_VALUES - 1


def test_fifteen_mebibytes_of_empty_objects_cost_little_memory(serve):
    """The probe's `bigjson` reply: 15 MiB of ``{},`` under the 16 MiB cap. json.loads built ~5 M
    dicts (~380 MiB); now it is refused before parsing, holding little more than the body."""
    body = b'{"choices": [{"text": "I\'m sorry"}], "pad": [' + b"{}," * (5 * MiB - 1) + b"{}]}"
    client = OpenAIClient(serve(answering(body)), None, ClientSettings(request_timeout_s=30, max_retries=0))
    tracemalloc.start()
    try:
        with pytest.raises(RequestFailed, match="more than the 250,000 a reply may hold"):
            client.request("POST", "/completions", {"prompt": "x"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        client.close()
    assert peak < 4 * len(body)


# --- timeouts that are not finite ----------------------------------------------------------------

@pytest.mark.parametrize("setting", ["request_timeout_s", "run_deadline_s", "backoff_s", "max_retry_after_s"])
def test_an_infinite_number_of_seconds_is_refused(setting):
    with pytest.raises(ValueError, match="every number of seconds finite"):
        ClientSettings(**{setting: math.inf})


def test_an_infinite_deadline_is_refused_by_the_exchange():
    client = DeadlineClient("http://127.0.0.1:9/v1")
    try:
        with pytest.raises(ValueError, match="need a finite deadline_s > 0"):
            client.exchange("GET", "/models", None, math.inf, 1024)
    finally:
        client.close()


def test_request_timeout_inf_is_a_one_line_error(tmp_path, data_dir, capsys):
    """It overflowed the deadline's timer ("timestamp out of range") after the engine was built.
    Refused by the option's type or, below it, by `ClientSettings`: exit status 2, one line."""
    argv = bench_argv("http://127.0.0.1:9/v1", tmp_path / "out", data_dir, "--request-timeout", "inf")
    try:
        status = main(argv)
    except SystemExit as exit:  # argparse refusing the option
        status = exit.code
    assert status == 2
    err = capsys.readouterr().err
    assert re.search(r"error: .*request[- ]timeout.*inf", err) and "Traceback" not in err


def test_the_finish_reason_is_journaled_with_the_answer(serve, tmp_path, data_dir):
    out = tmp_path / "out"
    assert main(bench_argv(serve(answering(reply("I'm sorry", finish_reason="length"))), out, data_dir)) == 0
    assert [record["finish_reason"] for record in read_jsonl(out / GENERATIONS)] == ["length"] * 3


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/v1?api_key=sk-secret", "http://127.0.0.1:9/v1#sk-secret"])
def test_a_base_url_with_a_query_or_fragment_is_refused_by_the_client_too(url):
    """The command line refuses such URLs; the client refuses them for callers of the Python API, without
    showing the part that may hold a key."""
    with pytest.raises(ValueError, match="carries a query string or fragment") as refused:
        OpenAIClient(url, None, ClientSettings())
    assert "sk-secret" not in str(refused.value)


def test_a_key_given_in_place_of_its_variable_name_is_refused_without_being_shown():
    with pytest.raises(ValueError, match="not a variable name") as refused:
        OpenAISettings(base_url="http://127.0.0.1:9/v1", api_key_env="sk-typed-SECRET-1234")
    assert "SECRET" not in str(refused.value)


@pytest.mark.parametrize("setting", [dict(timeout=math.inf), dict(backoff=math.inf)])
def test_the_judge_backend_refuses_infinite_durations(setting):
    from hf_securesd.judges.backends import OpenAIChatBackend

    with pytest.raises(ValueError, match=f"'{next(iter(setting))}': inf is not a number in"):
        OpenAIChatBackend(base_url="http://127.0.0.1:9/v1", model="judge", **setting)


def test_the_judge_backend_takes_numpy_and_tensor_numbers_in_range():
    """Settings are numbers as the rest of the package takes them (NumPy and 0-d tensor ones too)."""
    import numpy as np
    import torch

    from hf_securesd.judges.backends import OpenAIChatBackend

    backend = OpenAIChatBackend(base_url="http://127.0.0.1:9/v1", model="judge", max_retries=np.int64(2),
                                backoff=torch.tensor(0.5), timeout=np.float32(30))
    assert (backend.max_retries, backend.backoff, backend.timeout) == (2, 0.5, 30.0)
    assert type(backend.max_retries) is int and type(backend.backoff) is float  # kept as Python numbers
    with pytest.raises(ValueError, match="'max_retries': True is not an integer in"):
        OpenAIChatBackend(base_url="http://127.0.0.1:9/v1", model="judge", max_retries=True)
