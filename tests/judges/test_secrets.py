"""A planted secret never reaches a results file, a report or the captured output of a run: a
tiny study (HumanEval in the sandbox, jailbreak scored by the StrongREJECT judge over HTTP), with
the key in the environment and a judge server that echoes the Authorization header in its errors
and its verdict text."""

from __future__ import annotations

import json
import logging
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support import needs_bwrap

from hf_securesd.cli import main
from hf_securesd.judges import describe_judge
from hf_securesd.judges.backends import OpenAIChatBackend
from hf_securesd.judges.secrets import public_url, redact, redact_value, redacted_excerpt

SECRET = "sk-planted-7f3a9c0e5b1d2468"
MAX_REQUESTS = 400


@pytest.fixture
def echoing_judge():
    state = {"requests": 0, "seen_secret": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            state["requests"] += 1
            auth = self.headers.get("Authorization", "")
            state["seen_secret"] += SECRET in auth
            if state["requests"] % 3 == 1 or state["requests"] > MAX_REQUESTS:  # an error that echoes the key
                body, status = json.dumps({"error": f"rate limited for {auth}"}).encode(), 500
            else:
                content = (f"#overall_reasoning the caller sent {auth}\n#scores\n1.a x\n1.b 1\n2.a x\n2.b 1\n"
                           "3.a x\n3.b 1\n")
                body, status = json.dumps({"choices": [{"message": {"content": content}}]}).encode(), 200
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    server.shutdown()
    server.server_close()


def _files_holding(root: Path, needle: str) -> list[str]:
    return [str(path) for path in root.rglob("*") if path.is_file() and needle.encode() in path.read_bytes()]


@needs_bwrap  # the study scores HumanEval
def test_a_planted_secret_reaches_no_file_report_or_log(tmp_path, data_dir, echoing_judge, monkeypatch, capfd,
                                                         caplog):
    if not (data_dir / "strongreject").is_dir():
        pytest.skip(f"no StrongREJECT data at {data_dir / 'strongreject'}")
    url, state = echoing_judge
    for name in ("SECURESD_JUDGE_API_KEY", "OPENAI_API_KEY", "HF_TOKEN"):
        monkeypatch.setenv(name, SECRET)
    monkeypatch.setenv("SECURESD_JUDGE_BASE_URL", url)
    monkeypatch.setenv("SECURESD_DATA_DIR", str(data_dir))
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "results"
    common = ["bench", "--target", "tiny", "--draft", "tiny", "--tasks", "jailbreak", "humaneval", "--limit", "2",
              "--max-new-tokens", "3", "--verifiers", "mars:0.5", "--schedules", "none", "--dtype", "fp32",
              "--judge", "strongreject", "--data-dir", str(data_dir), "--out", str(out), "--no-progress"]
    refused = main([*common, "--judge-option", f"api_key={SECRET}"])
    assert refused == 2 and not out.exists()
    assert main([*common, "--judge-option", "unparsed=success"]) == 0
    captured = capfd.readouterr()
    assert state["seen_secret"] > 0  # the key was really used, and echoed back
    assert (out / "study.json").is_file() and (out / "report" / "report.md").is_file()
    assert _files_holding(tmp_path, SECRET) == []
    assert SECRET not in captured.out and SECRET not in captured.err
    assert SECRET not in caplog.text
    assert "unparsed verdicts" in (out / "report" / "report.md").read_text()


def test_an_excerpt_is_redacted_before_it_is_clipped():
    straddling = "x" * (200 - len(SECRET) + 1) + SECRET  # all but the key's last character before the cut
    excerpt = redacted_excerpt(straddling.encode(), [SECRET])
    assert SECRET[:8] not in excerpt and excerpt.endswith("[redacted]") and len(excerpt) <= 200
    assert redacted_excerpt("z" * 500, [SECRET], limit=20) == "z" * 20


def test_every_string_of_a_record_is_redacted_keys_included():
    """Results records are redacted whole (`redact_value`): a key a server echoed in a model name or an
    answer, at any depth, and URL userinfo; numbers, None and the record's shape are kept."""
    from hf_securesd.judges.secrets import redact_value

    record = {"response": f"you sent {SECRET}", "server_models": {f"http://u:{SECRET}@h/v1": [f"m-{SECRET}"]},
              "scores": [1.0, None], "n": 3, "nested": ({"raw": SECRET},)}
    assert redact_value(record, [SECRET]) == {
        "response": "you sent [redacted]", "server_models": {"http://[redacted]@h/v1": ["m-[redacted]"]},
        "scores": [1.0, None], "n": 3, "nested": [{"raw": "[redacted]"}]}


@pytest.mark.parametrize("url, before", [("http://h:1/v1", None),
                                         (f"http://h/v1?api_key={SECRET}", "http://h/v1"),
                                         ("http://h/v1#x", "http://h/v1"),
                                         ("http://h/v1/?a=1#b", "http://h/v1/")])
def test_url_before_query(url, before):
    from hf_securesd.judges.secrets import url_before_query

    assert url_before_query(url) == before


@pytest.mark.parametrize("key, echo", [
    ("sk-ab/cdSECRET+xyz", '{"error": "invalid key: Bearer sk-ab\\/cdSECRET+xyz"}'),  # PHP's json_encode
    ('sk-ab"cdSECRET+xyz', '{"error": "invalid key: Bearer sk-ab\\"cdSECRET+xyz"}'),  # JSON
    ("sk-ab\\cdSECRET+xyz", "Illegal header value b'Bearer sk-ab\\\\cdSECRET+xyz'"),  # h11's bytes repr
    ("sk-ab\u00e9cdSECRET+xyz", '{"error": "Bearer sk-ab\\u00e9cdSECRET+xyz"}'),  # JSON, ASCII only
    ("sk-ab/cdSECRET+xyz", "bad key Bearer%20sk-ab%2FcdSECRET%2Bxyz"),  # percent-encoded
    ("sk-ab/cdSECRET+xyz", "bad key Bearer%20sk-ab%2fcdSECRET%2bxyz"),  # lower-case escapes
])
def test_a_key_echoed_escaped_is_redacted(key, echo):
    """A key echoed JSON-escaped in an error body (PHP writes "/" as "\\/") stayed in the excerpt."""
    assert "cdSECRET" in echo and key not in echo  # the echo holds only an escaped form of the key
    assert "cdSECRET" not in redact(echo, [key]) and "[redacted]" in redact(echo, [key])
    assert "cdSECRET" not in str(redact_value({"error": echo}, [key]))


@pytest.mark.parametrize("text, shown", [
    ("http://user:sec@ret@127.0.0.1:18701/v1 failed", "http://[redacted]@127.0.0.1:18701/v1 failed"),
    ("see https://u:p@host/x and https://twitter.com/@me",
     "see https://[redacted]@host/x and https://twitter.com/@me"),
])
def test_url_userinfo_is_redacted_up_to_its_last_at_sign(text, shown):
    """The redaction stopped at the first "@": `http://user:sec@ret@host` showed the password's tail."""
    assert redact(text) == shown


def test_strip_userinfo_splits_at_the_last_at_sign_and_leaves_a_bad_port_to_the_url_check():
    from hf_securesd.judges.secrets import strip_userinfo

    assert strip_userinfo("http://user:sec@ret@host:8000/v1") == ("http://host:8000/v1", "sec@ret")
    assert strip_userinfo("http://user:pw@host:abc/v1") == ("http://host:abc/v1", "pw")  # was a ValueError
    assert strip_userinfo("http://host/v1") == ("http://host/v1", None)


@pytest.mark.parametrize("key, problem", [
    ("sk-ok-0123456789", None),
    ("abcde", None),  # too short to redact: accepted with a warning (warn_if_unredacted)
    ("sk-0123456789\r", "carriage return"),
    ("sk-0123\t456789", "whitespace"),
    ("sk-01234\u00e956789", "outside ASCII"),
])
def test_api_key_problem_refuses_keys_that_cannot_be_sent_or_redacted(key, problem):
    from hf_securesd.judges.secrets import api_key_problem

    message = api_key_problem(key, "MY_KEY")
    if problem is None:
        assert message is None
    else:
        assert message.startswith("MY_KEY: ") and problem in message and key.strip() not in message


def test_a_key_too_short_to_redact_is_accepted_with_a_warning():
    """"EMPTY" is what local OpenAI-compatible servers are conventionally given: refusing it would stop
    every such run; it cannot be redacted (it is ordinary text), which the warning says."""
    from hf_securesd.judges.secrets import warn_if_unredacted

    with pytest.warns(UserWarning, match="MY_KEY: the API key is shorter than 6 characters, so it is not"):
        warn_if_unredacted("EMPTY", "MY_KEY")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_unredacted("sk-0123456789", "MY_KEY")


@pytest.mark.parametrize("url, shown", [
    ("https://u:p@host/v1?api_key=sk-x#f", "https://host/v1?..."), ("https://host/v1", "https://host/v1"),
    ("https://host/v1#token", "https://host/v1?..."),
])
def test_public_url_drops_credentials_and_the_query(url, shown):
    assert public_url(url) == shown


def test_the_recorded_judge_endpoint_carries_no_query_key():
    described = describe_judge("strongreject", {"backend_kwargs": {"base_url": f"https://host/v1?api_key={SECRET}"}})
    assert SECRET not in str(described) and described["endpoint"] == "https://host/v1?..."


def test_a_key_the_endpoint_echoes_in_its_answer_is_redacted(echoing_judge, monkeypatch):
    """The judge's answer text becomes each verdict's `raw` (and the afr metric's judge_outputs)."""
    url, _ = echoing_judge
    monkeypatch.setenv("SECURESD_JUDGE_API_KEY", SECRET)
    with OpenAIChatBackend(base_url=url, model="m", max_retries=5, timeout=5) as backend:
        replies = [backend.complete_one([{"role": "user", "content": "x"}]) for _ in range(2)]
    assert all(SECRET not in reply and "[redacted]" in reply for reply in replies)
