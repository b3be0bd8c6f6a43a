"""`--engine openai` against hostile OpenAI-compatible servers on 127.0.0.1 that this test controls:
a gzip bomb, encodings the client does not decode, JSON nested too deeply to parse, speculative
metrics sized to exhaust memory, replies that echo the API key where errors quote them, model text
that is not valid Unicode, and a third-party endpoint hoping to receive the key meant for another
server. Each is a failed request (recorded, never scored) or harmless; none stops the run."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from support import send_reply as send, serve_model_list, stop_servers

from hf_securesd.bench.engines.base import EngineError, Generation, GenerationFailure, Prompt
from hf_securesd.bench.engines.client import ClientSettings, OpenAIClient, RequestFailed
from hf_securesd.bench.engines.openai import OpenAIEngine, OpenAISettings, parse_endpoint_key_envs
from hf_securesd.bench.plan import TARGET
from hf_securesd.bench.results import FAILURES, GENERATIONS, MANIFEST, read_jsonl
from hf_securesd.cli import main

KEY = "sk-fake-audit-5e1f9a3c7b20d486"
OTHER_KEY = "sk-fake-second-0a1b2c3d4e5f6789"
KEY_VARIABLE = "SECURESD_TEST_HOSTILE_KEY"
OTHER_KEY_VARIABLE = "SECURESD_TEST_HOSTILE_OTHER_KEY"
ANSWER = "I'm sorry, but I cannot help with that."
GOOD = json.dumps({"choices": [{"text": ANSWER, "message": {"role": "assistant", "content": ANSWER}}],
                   "usage": {"completion_tokens": 4}}).encode()
DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 KB: json.loads raises RecursionError
MiB = 1024 * 1024

Respond = Callable[[BaseHTTPRequestHandler, dict], None]


@pytest.fixture
def serve():
    """Starts servers: GET answers the model list `models`, POST calls `respond(handler, state)`;
    `state` holds the POST count ("requests") and every request's headers."""
    servers: list = []

    def start(respond: Respond, models: bytes = b'{"data": [{"id": "fake-model"}]}') -> tuple[str, dict]:
        return serve_model_list(servers, respond, models)

    yield start
    stop_servers(servers)


def bench_argv(url: str, out: Path, data_dir: Path, *extra: str, tasks: tuple[str, ...] = ("jailbreak",),
               limit: int = 3) -> list[str]:
    return ["bench", "--engine", "openai", "--base-url", url, "--tokenizer", "tiny", "--tasks", *tasks,
            "--limit", str(limit), "--max-new-tokens", "4", "--data-dir", str(data_dir), "--batch-size", "3",
            "--concurrency", "1", "--request-timeout", "5", "--max-retries", "0", "--out", str(out),
            "--no-progress", *extra]


def chat_engine(url: str, **settings) -> OpenAIEngine:
    return OpenAIEngine(OpenAISettings(base_url=url, chat=True, **settings,
                                       client=ClientSettings(request_timeout_s=5, max_retries=0)))


PROMPT = Prompt(text=None, messages=[{"role": "user", "content": "hi"}])


def gzip_bomb(mebibytes: int) -> bytes:
    """`mebibytes` MiB of zeros gzipped twice (for ``Content-Encoding: gzip, gzip``): a few KiB."""
    inner = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = b"\0" * MiB
    return gzip.compress(b"".join([inner.compress(block) for _ in range(mebibytes)] + [inner.flush()]), 9)


def test_a_gzip_bomb_is_refused_without_inflating_it(serve):
    """256 MiB in ~1 KiB of nested gzip: refused at the 1 MiB cap without holding much more than the
    cap (httpx inflated a whole raw chunk before the cap was checked), and not retried."""
    body = gzip_bomb(256)
    url, state = serve(lambda handler, state: send(handler, 200, body, **{"Content-Encoding": "gzip, gzip"}))
    client = OpenAIClient(url, None, ClientSettings(request_timeout_s=30, max_retries=2, max_response_bytes=MiB))
    tracemalloc.start()
    try:
        with pytest.raises(RequestFailed, match="gzip body decodes to more than the 1048576-byte cap"):
            client.request("POST", "/completions", {"prompt": "x"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * MiB
    assert state["requests"] == 1
    assert state["headers"][0]["Accept-Encoding"] == "identity"


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, gzip, gzip, gzip, gzip"])
def test_an_encoding_the_client_does_not_decode_is_a_failed_request(serve, encoding):
    """Refused with the reason (not read as garbage and retried)."""
    url, state = serve(lambda handler, state: send(handler, 200, b"\x1f\x8b...", **{"Content-Encoding": encoding}))
    client = OpenAIClient(url, None, ClientSettings(request_timeout_s=5, max_retries=2, backoff_s=0))
    with pytest.raises(RequestFailed, match="Content-Encoding .*(is not gzip or deflate|nests more than 4)"):
        client.request("POST", "/completions", {"prompt": "x"})
    assert state["requests"] == 1


def test_json_nested_too_deeply_is_a_malformed_reply(serve):
    """RecursionError used to escape post_many: now every prompt gets its failure."""
    url, state = serve(lambda handler, state: send(handler, 200, DEEP))
    client = OpenAIClient(url, None, ClientSettings(request_timeout_s=5, max_retries=1, backoff_s=0))
    replies = client.post_many("/completions", [{"prompt": str(index)} for index in range(3)])
    assert all(isinstance(reply, RequestFailed) for reply in replies)
    assert all("nested too deeply" in str(reply) and reply.attempts == 2 for reply in replies)
    assert state["requests"] == 6


def test_json_nested_too_deeply_fails_one_prompt_of_a_bench_run(serve, tmp_path, data_dir):
    def respond(handler, state):
        send(handler, 200, DEEP if state["requests"] == 2 else GOOD)

    url, _ = serve(respond)
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--no-report")) == 1
    failures = read_jsonl(out / FAILURES)
    assert len(failures) == 1 and "nested too deeply" in failures[0]["error"]
    assert len(read_jsonl(out / GENERATIONS)) == 2


def test_a_run_where_every_prompt_fails_ends_with_a_message_not_a_traceback(serve, tmp_path, data_dir, capsys):
    url, _ = serve(lambda handler, state: send(handler, 500, b'{"error": "down"}'))
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir)) == 1
    err = capsys.readouterr().err
    assert "no report: no configuration" in err and "failures.jsonl" in err
    assert len(read_jsonl(out / FAILURES)) == 3
    assert not (out / "report").exists()


@pytest.mark.parametrize("metrics, problem", [
    ({"per_step_drafted": [10**7], "per_step_accepted": [0]}, "at most 1024 drafts a step"),
    ({"per_step_drafted": [4], "per_step_accepted": [5]}, "never more accepted than drafted"),
    ({"per_step_drafted": [4, -1], "per_step_accepted": [1, 0]}, "non-negative integers"),
    ({"per_step_drafted": [4, 4], "per_step_accepted": [1]}, "of equal length"),
    ({"per_step_drafted": [True], "per_step_accepted": [0]}, "non-negative integers"),
    ({"per_step_drafted": "4", "per_step_accepted": [0]}, "non-negative integers"),
    ({"per_step_drafted": [1024] * 3000, "per_step_accepted": [1024] * 3000}, "past the request's max_tokens"),
])
def test_implausible_speculative_metrics_are_a_failed_reply(serve, metrics, problem):
    """A 150-byte reply claiming 10**9 drafts in one step made the engine allocate gigabytes (or
    raise MemoryError): per-step counts are checked before any statistics are sized by them."""
    body = json.dumps({"choices": [{"message": {"content": "hello"},
                                    "metrics": {"speculative_decoding": metrics}}]}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, body))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, GenerationFailure)
    assert "speculative_decoding cannot be right" in answer.error and problem in answer.error


@pytest.mark.parametrize("steps, tokens, fits", [
    (10, 2, False),  # ten steps of five accepted drafts cannot fit in a 2-token answer
    (2, 13, True),   # 1 + 6 + 6: both steps whole
    (2, 8, True),    # the second step cut after its first token (max_tokens, EOS)
    (2, 7, False),   # the second step would start at position 7, past the answer
])
def test_per_step_counts_must_fit_the_answers_tokens(serve, steps, tokens, fits):
    """An endpoint claiming accepted drafts its answer cannot hold got AR 1.000 recorded for it."""
    metrics = {"per_step_drafted": [5] * steps, "per_step_accepted": [5] * steps}
    body = json.dumps({"choices": [{"message": {"content": "hello"}, "metrics": {"speculative_decoding": metrics}}],
                       "usage": {"completion_tokens": tokens}}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, body))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 64, 0)[0]
    if fits:
        assert isinstance(answer, Generation) and answer.stats.accepted_tokens == 5 * steps
    else:
        assert isinstance(answer, GenerationFailure)
        assert f"but the answer holds {tokens} tokens" in answer.error


def test_plausible_speculative_metrics_are_still_recorded(serve):
    metrics = {"per_step_drafted": [3, 3], "per_step_accepted": [2, 1]}
    body = json.dumps({"choices": [{"message": {"content": "hello"},
                                    "metrics": {"speculative_decoding": metrics}}],
                       "usage": {"completion_tokens": 6}}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, body))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, Generation)
    assert (answer.stats.drafted_tokens, answer.stats.accepted_tokens) == (6, 3)


def test_running_out_of_memory_on_a_reply_is_a_failed_reply(serve, monkeypatch):
    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr("hf_securesd.vllm.stats.speculative_stats", exhausted)
    body = json.dumps({"choices": [{"message": {"content": "hello"}, "metrics": {"speculative_decoding": {
        "per_step_drafted": [3], "per_step_accepted": [1]}}}], "usage": {"completion_tokens": 4}}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, body))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, GenerationFailure) and "ran out of memory" in answer.error


def _echoing(mode: str) -> Respond:
    """Replies that put the bearer key where error messages quote the server."""

    def respond(handler, state):
        key = handler.headers.get("Authorization", "").removeprefix("Bearer ")
        if mode == "location":
            send(handler, 302, b"{}", Location=f"http://127.0.0.1:9/v1/completions?stolen={key}")
        elif mode == "no-choices":
            send(handler, 200, json.dumps({"error": {"message": f"bad key {key}"}}).encode())
        else:  # the key straddles the 200-character excerpt: all but its last character inside
            send(handler, 500, b"x" * (200 - len(key) + 1) + key.encode())

    return respond


@pytest.mark.parametrize("mode", ["location", "no-choices", "straddling"])
def test_an_echoed_key_reaches_no_file_and_no_output(serve, tmp_path, data_dir, monkeypatch, capfd, mode):
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    url, state = serve(_echoing(mode))
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--api-key-env", KEY_VARIABLE, "--no-report")) == 1
    assert any(KEY in str(headers) for headers in state["headers"])  # sent, and echoed back
    errors = [record["error"] for record in read_jsonl(out / FAILURES)]
    assert len(errors) == 3 and all("[redacted]" in error for error in errors)
    leaked = [str(path) for path in tmp_path.rglob("*") if path.is_file() and KEY[:-1].encode() in path.read_bytes()]
    assert leaked == []
    captured = capfd.readouterr()
    assert KEY[:-1] not in captured.out and KEY[:-1] not in captured.err


def test_each_key_goes_only_to_the_server_it_was_given_for(serve, tmp_path, data_dir, monkeypatch):
    """--api-key-env used to be sent to every --endpoint as well: a third-party endpoint received the
    key of --base-url. Now --base-url gets its key, an endpoint only the one named for it."""
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    monkeypatch.setenv(OTHER_KEY_VARIABLE, OTHER_KEY)
    respond = lambda handler, state: send(handler, 200, GOOD)  # noqa: E731
    (base, seen_base), (audited, seen_audited), (keyed, seen_keyed) = (serve(respond) for _ in range(3))
    argv = bench_argv(base, tmp_path / "out", data_dir, "--api-key-env", KEY_VARIABLE,
                      "--endpoint", f"audited={audited}", "--endpoint", f"keyed={keyed}",
                      "--endpoint-api-key-env", f"keyed={OTHER_KEY_VARIABLE}", "--no-report")
    assert main(argv) == 0
    authorizations = {name: {headers.get("Authorization") for headers in seen["headers"]}
                      for name, seen in (("base", seen_base), ("audited", seen_audited), ("keyed", seen_keyed))}
    assert authorizations == {"base": {f"Bearer {KEY}"}, "audited": {None}, "keyed": {f"Bearer {OTHER_KEY}"}}
    assert seen_audited["requests"] == seen_keyed["requests"] == 3


def test_keys_must_name_their_server(monkeypatch):
    with pytest.raises(EngineError, match="--api-key-env is the key of --base-url, and there is no --base-url"):
        OpenAISettings(endpoints={"prod": "http://127.0.0.1:9/v1"}, baseline="prod", api_key_env=KEY_VARIABLE)
    with pytest.raises(EngineError, match="--endpoint-api-key-env 'prdo' is not an --endpoint"):
        OpenAISettings(base_url="http://127.0.0.1:9/v1", endpoints={"prod": "http://127.0.0.1:8/v1"},
                       endpoint_key_envs={"prdo": KEY_VARIABLE})
    for typed in (f"prod={KEY}", KEY):  # a key typed in place of the variable, or of NAME=VARIABLE
        with pytest.raises(EngineError, match="number 1 is not NAME=VARIABLE") as caught:
            parse_endpoint_key_envs([typed])
        assert KEY not in str(caught.value)
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    settings = OpenAISettings(base_url="http://127.0.0.1:9/v1", endpoints={"prod": "http://127.0.0.1:8/v1"},
                              endpoint_key_envs={"prod": KEY_VARIABLE})
    with pytest.raises(EngineError, match=f"--endpoint-api-key-env prod={KEY_VARIABLE}: .* not set"):
        settings.api_key("prod")


def test_text_that_is_not_valid_unicode_is_recorded_and_reported(serve, tmp_path, data_dir):
    """A JSON "\\ud800" parses to a str UTF-8 cannot encode: the report crashed on it in an answer,
    and the run on it in a model name from /models. The client now replaces lone surrogates with
    U+FFFD where it takes text from a reply."""
    body = b'{"choices": [{"text": "I\'m sorry \\ud800 42"}], "usage": {"completion_tokens": 4}}'
    url, _ = serve(lambda handler, state: send(handler, 200, body), models=b'{"data": [{"id": "m\\udfff"}]}')
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, tasks=("jailbreak", "gsm8k"), limit=2)) == 0
    assert {record["response"] for record in read_jsonl(out / GENERATIONS)} == {"I'm sorry \ufffd 42"}
    assert "\ufffd" in (out / "report" / "report.md").read_text(encoding="utf-8")
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["server_models"][url]["server_models"] == ["m\ufffd"]


def test_a_thirty_digit_gsm8k_answer_is_scored_not_a_crash(serve, tmp_path, data_dir):
    """decimal.InvalidOperation from the 28-digit context used to stop scoring (on every resume)."""
    body = json.dumps({"choices": [{"text": "The total is:\n#### 123456789012345678901234567890"}],
                       "usage": {"completion_tokens": 4}}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, body))
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, tasks=("gsm8k",), limit=2)) == 0
    (run,) = read_jsonl(out / "runs.jsonl")
    assert run["scores"] == [0.0, 0.0]
    assert {detail["predicted"] for detail in run["details"]} == {"123456789012345678901234567890"}


def test_a_structured_refusal_is_the_reply_a_null_content_without_one_a_failure(serve):
    """OpenAI's structured refusal (`message.refusal` text, `content` null) is what the service answered:
    judged as the reply's text, with no tokens or statistics; null content with nothing else fails."""
    refusal = json.dumps({"choices": [{"message": {"content": None, "refusal": ANSWER}, "finish_reason": "stop"}],
                          "usage": {"completion_tokens": 0}}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, refusal))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, Generation)
    assert (answer.response, answer.new_tokens, answer.stats, answer.finish_reason) == (ANSWER, 0, None, "stop")
    for message in ({"content": None}, {"content": None, "refusal": "  "}, {"content": None, "refusal": 3}):
        body = json.dumps({"choices": [{"message": message}]}).encode()
        url, _ = serve(lambda handler, state, body=body: send(handler, 200, body))
        failed = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
        assert isinstance(failed, GenerationFailure) and "NoneType, not a string" in failed.error


def _answering_all(handler, state):
    body = json.dumps({"choices": [{"text": "I'm sorry"}], "usage": {"completion_tokens": 3}}).encode()
    send(handler, 200, body)


def _plugin_like(handler, state):
    """Refuses a SecureSD field naming no verifier, as hf-securesd's vLLM plugin does; answers the rest."""
    if "securesd-plugin-check" in json.dumps(json.loads(handler.body).get("vllm_xargs")):
        send(handler, 400, b'{"error": {"message": "extra_args[\\"securesd\\"][\\"verifier\\"]: unknown verifier '
                           b'\'securesd-plugin-check\'"}}')
    else:
        _answering_all(handler, state)


def test_verifiers_sent_to_a_server_that_ignores_them_are_refused_before_any_cell(serve, tmp_path, data_dir, capsys):
    """A server without the plugin answered every --verifiers cell with its own decoding, recorded under
    the verifiers' names (a "lossless" cell then lost prompts against the target)."""
    url, state = serve(_answering_all)
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--verifiers", "lossless", "mars:0.5")) != 0
    error = capsys.readouterr().err
    assert "does not run hf-securesd's vLLM plugin" in error and "Traceback" not in error
    assert state["requests"] == 1  # the check alone: no prompt was sent
    assert not (out / GENERATIONS).exists() or read_jsonl(out / GENERATIONS) == []


def test_a_server_that_refuses_the_check_runs_the_verifiers(serve, tmp_path, data_dir):
    url, state = serve(_plugin_like)
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--verifiers", "mars:0.5", "--no-report")) == 0
    assert any("vllm_xargs" in json.loads(body) for body in state["bodies"][1:])


def test_target_requests_switch_off_a_server_wide_securesd_default(serve, tmp_path, data_dir):
    """A plugin server started with SECURESD_VLLM_DEFAULT applies its rule to every request that names
    none: the target cells recorded that rule's answers as the target's (a lossless cell then matched
    the "target" on 0 of 4 prompts). Once --base-url is known to run the plugin, the target's requests
    say `"securesd": "null"`; without --verifiers nothing is known of the server and nothing is added."""
    url, state = serve(_plugin_like)
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--verifiers", "mars:0.5", "--no-report")) == 0
    sent = [json.loads(body).get("vllm_xargs") for body in state["bodies"][1:]]
    assert {"securesd": "null"} in sent and all(xargs is not None for xargs in sent)
    study = json.loads((out / "study.json").read_text())
    assert study["target_plain_requests"] is True and study["sessions"][-1]["target_plain_requests"] is True

    url, state = serve(_plugin_like)
    plain = tmp_path / "plain"
    assert main(bench_argv(url, plain, data_dir, "--no-report")) == 0
    assert all("vllm_xargs" not in json.loads(body) for body in state["bodies"])
    assert json.loads((plain / "study.json").read_text())["target_plain_requests"] is False
    # baselines first, the sweep later into the same folder: a resume, not a clash (each session records
    # what its target requests did)
    assert main(bench_argv(url, plain, data_dir, "--verifiers", "mars:0.5", "--no-report")) == 0
    sessions = json.loads((plain / "study.json").read_text())["sessions"]
    assert [session["target_plain_requests"] for session in sessions] == [False, True]


# Probe B: keys that h11 quotes, statistics without a token count, deep replies, huge numbers, choices


@pytest.mark.parametrize("key, problem", [
    (KEY + "\r", "carriage return"),  # a CRLF .env file
    (KEY + "\n", "control character"),
    ("sk-fake-\u00e9t\u00e9-5e1f9a3c7b20", "outside ASCII"),
    ("sk-fake audit 5e1f9a3c7b20d486", "whitespace"),
])
def test_a_key_that_cannot_be_sent_or_redacted_is_refused_without_being_shown(serve, monkeypatch, key,
                                                                               problem):
    """A key ending in a carriage return was sent: h11 refused the header with "Illegal header value
    b'Bearer <key>\\r'", which no redaction matched, and the key went to failures.jsonl and stderr. It is
    refused where it is read, naming the variable, never the key."""
    url, state = serve(lambda handler, state: send(handler, 200, GOOD))
    monkeypatch.setenv(KEY_VARIABLE, key)
    with pytest.raises(EngineError) as caught:
        chat_engine(url, api_key_env=KEY_VARIABLE)
    message = str(caught.value)
    assert f"--api-key-env {KEY_VARIABLE}" in message and problem in message
    assert key.strip() not in message and repr(key)[1:-1] not in message
    assert state["headers"] == []  # nothing was sent


def test_a_placeholder_key_too_short_to_redact_is_used_with_a_warning(serve, monkeypatch):
    """"EMPTY" is what local OpenAI-compatible servers are conventionally given: it is sent, with a
    warning that so short a key is not redacted from the results."""
    url, state = serve(lambda handler, state: send(handler, 200, GOOD))
    monkeypatch.setenv(KEY_VARIABLE, "EMPTY")
    with pytest.warns(UserWarning, match=f"--api-key-env {KEY_VARIABLE}: the API key is shorter than 6"):
        engine = chat_engine(url, api_key_env=KEY_VARIABLE)
    assert not isinstance(engine.generate(TARGET, [PROMPT], 16, 0)[0], GenerationFailure)
    assert state["headers"] and all("Bearer EMPTY" in str(headers) for headers in state["headers"])


def test_a_key_with_a_carriage_return_stops_a_run_before_anything_is_written(serve, tmp_path, data_dir,
                                                                             monkeypatch, capfd):
    url, state = serve(lambda handler, state: send(handler, 200, GOOD))
    monkeypatch.setenv(KEY_VARIABLE, KEY + "\r")
    out = tmp_path / "out"
    assert main(bench_argv(url, out, data_dir, "--api-key-env", KEY_VARIABLE, "--model", "m")) == 2
    captured = capfd.readouterr()
    assert KEY not in captured.out + captured.err and "carriage return" in captured.err
    assert state["headers"] == [] and not (out / FAILURES).exists()


@pytest.mark.parametrize("usage", [None, {}, {"completion_tokens": "16"}, {"completion_tokens": 2.0}])
def test_speculative_statistics_without_a_token_count_are_dropped(serve, usage):
    """Without a count of the answer's tokens, 200 steps of 4 accepted drafts were recorded for a 16-token
    request (AR 1.000): the check that every step lies inside the answer was skipped. The answer is kept,
    its statistics are not believed (AR "–")."""
    metrics = {"per_step_drafted": [4] * 200, "per_step_accepted": [4] * 200}
    reply = {"choices": [{"message": {"content": "hello"}, "metrics": {"speculative_decoding": metrics}}]}
    if usage is not None:
        reply["usage"] = usage
    url, _ = serve(lambda handler, state: send(handler, 200, json.dumps(reply).encode()))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, Generation) and answer.response == "hello"
    assert answer.stats is None


@pytest.mark.parametrize("token_ids, problem", [
    ([0] * 2000, "the reply claims 2,000 completion tokens, more than the request's max_tokens 16"),
    ([0] * 5, "but the answer holds 5 tokens"),
    (["x"] * 2000, None),  # not token ids: no count, so the statistics are dropped
])
def test_speculative_statistics_must_fit_the_token_ids_that_count_the_answer(serve, token_ids, problem):
    """Without usage.completion_tokens, 2,000 padded token_ids (strings too) counted a 5-character answer as
    2,000 tokens, so 170 steps of 5 accepted drafts were believed (AR 1.0 from 850 drafts); the same steps
    with a usage count of 8 were refused."""
    metrics = {"per_step_drafted": [5] * 170, "per_step_accepted": [5] * 170}
    reply = {"choices": [{"message": {"content": "hello"}, "token_ids": token_ids,
                          "metrics": {"speculative_decoding": metrics}}]}
    url, _ = serve(lambda handler, state: send(handler, 200, json.dumps(reply).encode()))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    if problem is None:
        assert isinstance(answer, Generation) and answer.stats is None and answer.new_tokens == 0
    else:
        assert isinstance(answer, GenerationFailure) and problem in answer.error


def test_a_reply_nested_too_deeply_to_show_is_one_failed_prompt(serve):
    """A reply without choices, nested close to the recursion limit, parsed in a worker thread; encoding it
    again for the error's excerpt raised RecursionError out of generate()."""
    import sys

    from hf_securesd.bench.engines.client import Attempts

    url, _ = serve(lambda handler, state: send(handler, 200, GOOD))
    nested: dict = {}
    for _ in range(sys.getrecursionlimit() + 100):
        nested = {"a": nested}
    answer = chat_engine(url)._read({"error": nested}, Attempts(), 0.0, 16)
    assert isinstance(answer, GenerationFailure)
    assert "no choices[0].message.content" in answer.error and "nested too deeply" in answer.error
    assert len(answer.error) < 300


HUGE = "1" + "0" * 4200  # 10**4200: JSON parses it (Python writes back at most 4,300 digits)


@pytest.mark.parametrize("body", [
    '{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": %s}}' % HUGE,
    '{"choices": [{"message": {"content": "hi"}, "metrics": {"speculative_decoding": {"per_step_drafted": '
    '[%s], "per_step_accepted": [0]}}}], "usage": {"completion_tokens": 2}}' % HUGE,
    '{"choices": [{"message": {"content": "hi"}, "metrics": {"speculative_decoding": {"per_step_drafted": '
    '[4], "per_step_accepted": [%s]}}}], "usage": {"completion_tokens": 2}}' % HUGE,
], ids=["completion_tokens", "per_step_drafted", "per_step_accepted"])
def test_huge_numbers_from_a_server_are_shortened_in_the_error(serve, body):
    """A count of 10**4200 made a 5,675-character error line (terminal and failures.jsonl)."""
    url, _ = serve(lambda handler, state: send(handler, 200, body.encode()))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, GenerationFailure)
    assert "4,201 digits" in answer.error and len(answer.error) < 300, answer.error


def test_a_number_longer_than_python_reads_is_named_by_its_length(serve):
    """A 5,000-digit count failed the prompt with Python's own advice ("use sys.set_int_max_str_digits() to
    increase the limit") as a reply that is "not complete JSON"."""
    body = '{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": %s}}' % ("9" * 5000)
    url, _ = serve(lambda handler, state: send(handler, 200, body.encode()))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, GenerationFailure)
    assert "the reply holds a number of about 5,000 digits, more than the 4,300 a number may" in answer.error
    assert "set_int_max_str_digits" not in answer.error and "not complete JSON" not in answer.error
    assert len(answer.error) < 500, answer.error


def _choice(index, content):
    choice = {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
    return choice if index == "missing" else {"index": index, **choice}


@pytest.mark.parametrize("choices, problem", [
    ([_choice(1, "Sure, here is how"), _choice(0, "I cannot")], "holds 2 choices"),
    ([_choice(0, "I cannot"), _choice(0, "Sure, here is how")], "holds 2 choices"),
    ([_choice(1, "Sure, here is how")], "index 1, not 0"),
    ([_choice("0", "Sure, here is how")], 'index "0", not 0'),
    ([_choice(True, "Sure, here is how")], "index true, not 0"),
])
def test_a_reply_whose_answer_is_ambiguous_fails_the_prompt(serve, choices, problem):
    """With two choices the first was recorded whatever its index ('Sure, here is how', index 1, over the
    refusal at index 0). A request asks for one answer (n=1): anything else is not scored."""
    body = json.dumps({"choices": choices, "usage": {"completion_tokens": 4}}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, body))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, GenerationFailure) and problem in answer.error, answer


@pytest.mark.parametrize("index", [0, None, "missing"])
def test_one_choice_at_index_0_or_without_an_index_is_the_answer(serve, index):
    body = json.dumps({"choices": [_choice(index, "I cannot")], "usage": {"completion_tokens": 2}}).encode()
    url, _ = serve(lambda handler, state: send(handler, 200, body))
    answer = chat_engine(url).generate(TARGET, [PROMPT], 16, 0)[0]
    assert isinstance(answer, Generation) and answer.response == "I cannot"
