"""`--engine openai` took options it then left unused, without a word: a --profile's verifiers and
schedules (only the target ran, yet the report named the profile), a --base-url no cell was served by
(with --baseline and no --verifiers it got one GET /models and was recorded as audited), one endpoint
as both --baseline and --draft-baseline (the "draft" was the target again: PRR undefined), and
--offline / --cache-dir with --chat and no tokenizer to resolve. Each is refused with one line, status
2, before anything is sent or --out is created."""

from __future__ import annotations

import json

import pytest
from support import cli_refusal, recording_handler, send_reply as send, serve_locally, stop_servers

from hf_securesd.cli import main

ANSWER = json.dumps({"choices": [{"message": {"role": "assistant", "content": "I cannot."}}],
                     "usage": {"completion_tokens": 2}}).encode()


@pytest.fixture
def server():
    """A server answering every chat request; yields its URL and the headers of every request it got."""
    Handler, state = recording_handler(lambda handler, _: send(handler, 200, ANSWER))
    state["get"] = lambda handler, _: send(handler, 200, b'{"data": [{"id": "fake-model"}]}')
    running, url = serve_locally(Handler)
    yield url, state
    stop_servers([running])


def bench_argv(tmp_path, data_dir, *extra: str) -> list[str]:
    return ["bench", "--engine", "openai", "--chat", "--tasks", "jailbreak", "--limit", "2",
            "--max-new-tokens", "4", "--data-dir", str(data_dir), "--max-retries", "0", "--no-progress",
            "--no-report", "--out", str(tmp_path / "out"), *extra]


@pytest.mark.parametrize("profile, verifiers", [("smoke", "mars:0.9,0.5 speccascade:0.3,0.9"),
                                                ("cpu-small", "mars:0.7,0.5 speccascade:0.5,0.9")])
def test_a_profiles_sweep_the_openai_engine_would_drop_is_refused(
        capsys, tmp_path, data_dir, server, profile, verifiers):
    url, state = server
    error = cli_refusal(capsys, bench_argv(tmp_path, data_dir, "--base-url", url, "--profile", profile))
    assert error.startswith(f"error: --profile {profile} sweeps the verifiers {verifiers} under the "
                            "schedules none step:1, which --engine openai sends to --base-url only when "
                            "--verifiers names them")
    assert f"pass --verifiers {verifiers}" in error and "leave --profile out" in error
    assert state["headers"] == [] and not (tmp_path / "out").exists()


def test_a_profile_gives_an_endpoint_only_audit_its_sizes(tmp_path, data_dir, server):
    """Without --base-url no sweep could run: the profile sets the sizes (an audit directory written with
    --profile resumes with the same command)."""
    url, _ = server
    argv = bench_argv(tmp_path, data_dir, "--endpoint", f"twin={url}", "--baseline", "twin", "--profile", "smoke")
    assert main(argv) == 0
    assert main(argv) == 0


def test_a_base_url_no_cell_is_served_by_is_refused(capsys, tmp_path, data_dir, server):
    url, state = server
    endpoint_only = bench_argv(tmp_path, data_dir, "--endpoint", f"twin={url}", "--baseline", "twin")
    error = cli_refusal(capsys, [*endpoint_only, "--base-url", url])
    assert error.startswith("error: --base-url serves no cell: --baseline twin serves the target")
    assert "drop --base-url" in error and "--endpoint NAME=URL" in error and "--verifiers" in error
    assert state["headers"] == [] and not (tmp_path / "out").exists()
    assert main(endpoint_only) == 0  # without it the run goes on


def test_one_endpoint_as_target_and_draft_baseline_is_refused(capsys, tmp_path, data_dir, server):
    url, state = server
    argv = bench_argv(tmp_path, data_dir, "--endpoint", f"twin={url}", "--baseline", "twin",
                      "--draft-baseline", "twin")
    error = cli_refusal(capsys, argv)
    assert error.startswith("error: --baseline and --draft-baseline both name the endpoint 'twin'")
    assert "PRR" in error and "an --endpoint that serves the draft alone, or leave it out" in error
    assert state["headers"] == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", [["--offline"], ["--cache-dir", "/nonexistent"]])
def test_tokenizer_options_without_a_tokenizer_are_refused(capsys, tmp_path, data_dir, server, option):
    url, state = server
    error = cli_refusal(capsys, bench_argv(tmp_path, data_dir, "--base-url", url, *option))
    assert error.startswith(f"error: {option[0]} is not used by --engine openai --chat without --tokenizer")
    assert f"drop {option[0]}" in error and "give --tokenizer NAME" in error
    assert state["headers"] == [] and not (tmp_path / "out").exists()
    # with a tokenizer to resolve they are used: the run goes on
    assert main(bench_argv(tmp_path, data_dir, "--base-url", url, "--tokenizer", "tiny", *option)) == 0
