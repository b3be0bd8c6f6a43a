"""The OpenAI-compatible server (`vllm serve`) on 127.0.0.1 with the plugin: a request selecting a
verifier gets SecureSD (with per-request acceptance in the response), a bad one gets HTTP 400 and the
server keeps serving, a plain one is untouched; the engine's constraints (allowed token ids, bad words,
min_tokens) bind every verifier; SecureSD sent where vLLM would drop it is refused; and a bounded fuzz
run of malformed payloads never stops the engine. One server for the module."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from fuzz_payloads import payload
from vllm_support import openai_server, requires_vllm

from hf_securesd import SecureSDConfigError
from hf_securesd.vllm import parse_request, speculative_stats

pytestmark = requires_vllm()

PROMPT = list(b"def add(a, b):")
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def server(pair_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("server") / "vllm_serve.log"
    metrics = ("--enable-per-request-metrics", "--per-request-spec-decode-metrics", "detailed")
    with openai_server(pair_dir, log_path, {"SECURESD_VLLM": "1"}, metrics) as client:
        yield client


def complete(client, securesd=None, model=None, **fields):
    """POST /v1/completions; `securesd` travels as a JSON string in vllm_xargs, `fields` join the body."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": NEW_TOKENS, "temperature": 0, "return_token_ids": True}
    if securesd is not None:
        body["vllm_xargs"] = {"securesd": securesd if isinstance(securesd, str) else json.dumps(securesd)}
    return client.post("/v1/completions", json={**body, **fields})


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return server.get("/v1/models").json()["data"][0]["id"]


def choice_tokens(response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def spec_metrics(response) -> dict:
    body = response.json()
    metrics = body.get("metrics") or body["choices"][0].get("metrics")
    return metrics["speculative_decoding"]


def test_plain_request_is_target_greedy_and_untouched(server, model_name, hf_models):
    _, target = hf_models
    expected = target.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(PROMPT):].tolist()
    plain = choice_tokens(complete(server, model=model_name))
    assert plain == expected[: len(plain)] and len(plain) > 1


def test_securesd_request_is_verified_by_securesd(server, model_name):
    plain = choice_tokens(complete(server, model=model_name))
    lossless = complete(server, {"verifier": "lossless"}, model=model_name)
    assert choice_tokens(lossless) == plain
    accept_all_after_two = {"verifier": {"verifier": "lossysd", "epsilon": 1.0}, "secure_schedule": {"schedule": "step", "L": 2}}
    relaxed = complete(server, accept_all_after_two, model=model_name)
    tokens = choice_tokens(relaxed)
    assert tokens[:2] == plain[:2] and tokens != plain  # lossless for two positions, accept-all after
    metrics = spec_metrics(relaxed)  # per-request acceptance, in the response body
    stats = speculative_stats(metrics)
    assert stats.drafted_tokens == metrics["num_draft_tokens"] > 0
    assert sum(stats.position_accepted) == metrics["num_accepted_draft_tokens"]
    assert stats.acceptance_rate == pytest.approx(metrics["draft_acceptance_rate"])
    assert stats.position_drafted[0] == 0 and stats.position_drafted[1] == 1  # first draft: position 1


@pytest.mark.parametrize(
    "securesd, message",
    [
        ({"verifier": "nope"}, "unknown verifier"),
        ({"verifier": {"verifier": "mars", "theta": 0}}, "theta"),
        ({"secure_schedule": {"schedule": "step", "L": 1}}, "without a verifier"),
        ("{broken", "not valid JSON"),
    ],
    ids=["unknown-verifier", "bad-knob", "schedule-without-verifier", "bad-json"],
)
def test_bad_request_gets_http_400_and_the_server_keeps_serving(server, model_name, securesd, message):
    response = complete(server, securesd, model=model_name)
    assert response.status_code == 400, response.text
    assert message in response.text
    assert len(choice_tokens(complete(server, model=model_name))) > 1


def error_message(response) -> str:
    """The message of an HTTP 400 (asserting it is one)."""
    assert response.status_code == 400, response.text
    return response.json()["error"]["message"]


def alive(client, model_name) -> bool:
    return len(choice_tokens(complete(client, model=model_name, max_tokens=4))) == 4


ACCEPT_ALL = {"verifier": "lossysd", "epsilon": 1.0}
HUGE_SCHEDULES = {
    "step-1e30": {"schedule": "step", "L": 10**30},
    "step-2^64+5": {"schedule": "step", "L": 2**64 + 5},
    "step-2^63": {"schedule": "step", "L": 2**63},
    "power-1e30": {"schedule": "power", "L": 10**30, "gamma": 1.0},
}


def test_huge_schedule_lengths_are_lossless_and_spare_a_running_request(server, model_name):
    """A length beyond any response verifies losslessly for ever (accept-everything relaxed rule or not),
    with no overflow in the engine: a long plain request running alongside completes untouched."""
    plain = choice_tokens(complete(server, model=model_name))
    long_body = {"model": model_name, "prompt": PROMPT, "max_tokens": 200, "temperature": 0,
                 "ignore_eos": True, "return_token_ids": True}
    with ThreadPoolExecutor(max_workers=len(HUGE_SCHEDULES) + 1) as pool:
        running = pool.submit(server.post, "/v1/completions", json=long_body)
        time.sleep(0.5)
        huge = {
            name: pool.submit(
                complete, server, {"verifier": ACCEPT_ALL, "secure_schedule": schedule}, model_name
            )
            for name, schedule in HUGE_SCHEDULES.items()
        }
        long_tokens = choice_tokens(running.result())
        for name, response in huge.items():
            assert choice_tokens(response.result()) == plain, name
    assert len(long_tokens) == 200 and long_tokens[: len(plain)] == plain
    assert alive(server, model_name)


LETTERS = list(range(ord("a"), ord("z") + 1))
CONSTRAINED = {
    "mars": ({"verifier": "mars", "theta": 0.5}, None, 0.0),
    "mars-step4": ({"verifier": "mars", "theta": 0.5}, {"schedule": "step", "L": 4}, 0.0),
    "mars-T1": ({"verifier": "mars", "theta": 0.5}, None, 1.0),
    "fsd": ({"verifier": "fsd", "tau": 0.69}, None, 0.0),
    "bild": ({"verifier": "bild", "tau_rb": 8.0}, None, 0.0),
    "speccascade": ({"verifier": "speccascade", "a": 0.9}, None, 0.0),
    "lossysd": (ACCEPT_ALL, None, 0.0),
    "lossysd-T1": (ACCEPT_ALL, None, 1.0),
}


@pytest.mark.parametrize(
    "verifier, schedule, temperature", list(CONSTRAINED.values()), ids=list(CONSTRAINED)
)
def test_allowed_token_ids_bind_every_verifier(server, model_name, verifier, schedule, temperature):
    """Only a-z may be emitted: no relaxed rule may accept (or recover) a drafted token outside the set,
    although the unconstrained draft proposes mostly others."""
    securesd = {"verifier": verifier, "secure_schedule": schedule}
    free = choice_tokens(complete(server, securesd, model_name, max_tokens=48, temperature=temperature))
    assert any(token not in LETTERS for token in free)  # the drafts do leave the set
    constrained = choice_tokens(
        complete(server, securesd, model_name, max_tokens=48, temperature=temperature,
                 allowed_token_ids=LETTERS)
    )
    assert len(constrained) == 48 and [t for t in constrained if t not in LETTERS] == []


@pytest.mark.parametrize(
    "verifier, temperature",
    [
        ({"verifier": "speccascade", "a": 0.5}, 0.0),
        ({"verifier": "bild", "tau_rb": 8.0}, 1.0),
        (ACCEPT_ALL, 0.0),
    ],
    ids=["speccascade-T0", "bild-T1", "lossysd-T0"],
)
def test_bad_words_and_min_tokens_bind_every_verifier(server, model_name, verifier, temperature):
    """The most frequent tokens of an unconstrained relaxed reply, banned as bad words, never appear; as
    stop ids with min_tokens = max_tokens (vLLM suppresses them until then), neither."""
    securesd = {"verifier": verifier}
    free = choice_tokens(complete(server, securesd, model_name, max_tokens=48, temperature=temperature))
    # A bad word bans one token only when it is one: an ASCII byte (the tokenizer splits the others).
    banned = [token for token, _ in Counter(t for t in free if 32 < t < 127).most_common(2)]
    assert banned, free
    reply = choice_tokens(complete(server, securesd, model_name, max_tokens=48, temperature=temperature,
                                   bad_words=[chr(token) for token in banned]))
    assert len(reply) > 8 and not set(reply) & set(banned)
    frequent = [token for token, _ in Counter(free).most_common(2)]
    stopped = choice_tokens(complete(server, securesd, model_name, max_tokens=48, temperature=temperature,
                                     stop_token_ids=frequent, min_tokens=48))
    assert len(stopped) == 48 and not set(stopped) & set(frequent)


@pytest.mark.parametrize(
    "securesd, message",
    [
        ({"verifier": {"verifier": {"verifier": "mars"}}}, '["verifier"]["verifier"] must be a verifier'),
        ({"verifier": "mars", "secure_schedule": {"schedule": {"a": 1}}}, '["schedule"] must be a schedule'),
        ({"verifier": {"theta": 0.5}}, 'names no rule: add "verifier": "<name>"'),
        ("[" * 1000 + "]" * 1000, "nested more than 5 levels deep"),
        ('{"verifier": ' * 1000 + '"mars"' + "}" * 1000, "characters long"),
    ],
    ids=["verifier-nested", "schedule-name-object", "verifier-without-name", "json-1000-deep",
         "json-long"],
)
def test_malformed_payloads_get_a_400_naming_the_field(server, model_name, securesd, message):
    text = error_message(complete(server, securesd, model=model_name))
    assert message in text and 'extra_args["securesd"]' in text
    assert alive(server, model_name)


def test_securesd_where_vllm_would_drop_it_is_refused(server, model_name):
    """A misspelled vllm_xargs key, a top-level "securesd" field and beam search with SecureSD would all
    be served as plain vLLM: each gets a 400 that says what to do instead."""
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    misspelled_xargs = {"secure_sd": '{"verifier": "mars"}'}
    misspelled = server.post("/v1/completions", json={**body, "vllm_xargs": misspelled_xargs})
    assert 'did you mean "securesd"' in error_message(misspelled)
    top_level = server.post("/v1/completions", json={**body, "securesd": '{"verifier": "mars"}'})
    assert "top-level field 'securesd'" in error_message(top_level)
    chat_body = {"model": model_name, "max_tokens": 4, "securesd": "mars",
                 "messages": [{"role": "user", "content": "hi"}]}
    chat = server.post("/v1/chat/completions", json=chat_body)
    assert "top-level field 'securesd'" in error_message(chat)
    # the Anthropic-style messages route drops unknown fields before any request class sees them
    plain_messages = {key: value for key, value in chat_body.items() if key != "securesd"}
    for key in ("securesd", "secure_sd"):
        messages = server.post("/v1/messages", json={**plain_messages, key: "mars"})
        assert messages.status_code == 400 and f"top-level field '{key}'" in messages.text
    assert server.post("/v1/messages", json=plain_messages).status_code == 200
    # nested in a field the server ignores: an OpenAI client's extra_body written into the JSON, the
    # SamplingParams name; on the messages route a declared vllm_xargs is where SecureSD belongs
    for nested, shown in (({"extra_body": {"vllm_xargs": {"securesd": "mars"}}}, "extra_body.vllm_xargs.securesd"),
                          ({"extra_args": {"securesd": {"verifier": "mars"}}}, "extra_args.securesd")):
        for route, fields in (("/v1/completions", body), ("/v1/chat/completions", plain_messages),
                              ("/v1/messages", plain_messages)):
            refused = server.post(route, json={**fields, **nested})
            assert refused.status_code == 400 and f"field {shown} is not read" in refused.text, (route, refused.text)
    served = server.post("/v1/messages", json={**plain_messages, "vllm_xargs": {"securesd": "lossless"}})
    assert served.status_code == 200, served.text
    beam = {**body, "use_beam_search": True, "n": 1, "max_tokens": 2}
    refused = server.post("/v1/completions", json={**beam, "vllm_xargs": {"securesd": "mars"}})
    assert "use_beam_search cannot run with SecureSD" in error_message(refused)
    assert server.post("/v1/completions", json=beam).status_code == 200  # plain beam search is untouched
    flat = server.post("/v1/completions", json={**body, "vllm_xargs": {
        "securesd": "mars", "secure_schedule": '{"schedule": "step", "L": 16}'}})
    assert '"secure_schedule" goes inside "securesd"' in error_message(flat)
    assert alive(server, model_name)


def test_constraints_that_allow_no_token_are_refused(server, model_name):
    """allowed_token_ids that bad_words or min_tokens ban entirely leave no token to verify: a 400 for a
    SecureSD request (never an emitted forbidden token), the engine still serving."""
    eos = 258  # the byte tokenizer's end-of-sequence id
    for fields, message in (
        ({"allowed_token_ids": [97], "bad_words": ["a"]}, "all banned by bad_words"),
        ({"allowed_token_ids": [eos], "min_tokens": 5}, "min_tokens=5 bans"),
        ({"allowed_token_ids": [eos], "min_tokens": 3, "ignore_eos": True}, "min_tokens=3 bans"),
        ({"allowed_token_ids": [97], "bad_words": ["aa"]}, "leave no token after the response tokens [97]"),
    ):
        refused = complete(server, {"verifier": "mars"}, model_name, temperature=1.0, **fields)
        assert message in error_message(refused)
    assert alive(server, model_name)


def test_best_of_on_a_securesd_request_is_refused(server, model_name):
    """vLLM 0.32 accepts best_of and returns one completion: a 400 for a SecureSD request, plain untouched."""
    refused = complete(server, {"verifier": "mars"}, model_name, temperature=1.0, best_of=3, max_tokens=2)
    assert "best_of=3 cannot run with SecureSD" in error_message(refused)
    assert complete(server, None, model_name, temperature=1.0, best_of=3, max_tokens=2).status_code == 200
    assert complete(server, {"verifier": "mars"}, model_name, best_of=1, max_tokens=2).status_code == 200
    for best_of in ("3", [2]):  # vLLM ignores best_of in any JSON form
        refused = complete(server, {"verifier": "mars"}, model_name, best_of=best_of, max_tokens=2)
        assert "best_of is a number of completions" in error_message(refused)


def parses(value: object) -> bool:
    try:
        parse_request(value)
    except SecureSDConfigError:
        return False
    return True


FUZZ_PAYLOADS = 520
REFERENCE_EVERY = 10


def test_fuzzed_payloads_never_stop_the_engine(server, model_name):
    """Hundreds of random and malformed securesd payloads, four at a time, interleaved with plain and
    lossless requests: no 5xx, every refusal a 400 naming extra_args["securesd"] (and agreeing with the
    engine-free parser), every accepted one served, every plain and lossless reply unchanged."""
    plain = choice_tokens(complete(server, model=model_name))
    rng = random.Random(20261201)
    jobs: list[tuple[str, object]] = []
    for index in range(FUZZ_PAYLOADS):
        jobs.append(("fuzz", payload(rng)))
        if index % REFERENCE_EVERY == 0:
            jobs.append((rng.choice(["plain", "lossless"]), None))
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
            "return_token_ids": True}

    def send(job: tuple[str, object]):
        kind, value = job
        if kind == "fuzz":
            return server.post("/v1/completions", json={**body, "vllm_xargs": {"securesd": value}})
        return complete(server, None if kind == "plain" else {"verifier": "lossless"}, model_name)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        responses = list(pool.map(send, jobs))
    statuses = Counter()
    for (kind, value), response in zip(jobs, responses):
        assert response.status_code < 500, (value, response.text)
        statuses[response.status_code] += 1
        if kind != "fuzz":
            assert choice_tokens(response) == plain, kind
            continue
        if response.status_code == 400:
            error = response.json()["error"]
            # vLLM's own bound on extra_args integers (|x| < 2**64) refuses some bare numbers first
            assert "securesd" in error["message"] or error["param"] == "extra_args", (value, error)
            # the engine-free parser refuses it too, or admission does (a rule that cannot run with k)
            admission = "num_speculative_tokens" in error["message"] and '["verifier"]' in error["message"]
            assert not parses(value) or admission, (value, error)
        else:
            assert response.status_code == 200 and parses(value), (value, response.text)
    assert statuses[400] > FUZZ_PAYLOADS // 2 and statuses[200] > 20, statuses
    assert alive(server, model_name)
    assert time.monotonic() - started < 150
