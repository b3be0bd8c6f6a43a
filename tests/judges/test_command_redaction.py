"""Secrets typed on a command line are redacted before the line is recorded (study.json)."""

from __future__ import annotations

import pytest

from hf_securesd.bench.runner import provenance
from hf_securesd.judges.secrets import REDACTED, names_a_secret, redact_command

SECRET = "sk-typed-0a1b2c3d4e5f"


@pytest.mark.parametrize(
    "words",
    [
        ["--api-key", SECRET],
        [f"--api-key={SECRET}"],
        ["--token", SECRET],
        ["--judge-option", f"api_key={SECRET}"],
        ["--judge-option", f"password={SECRET}"],
        ["--base-url", f"http://user:{SECRET}@127.0.0.1:8000/v1"],
    ],
)
def test_a_secret_typed_on_the_command_line_is_not_recorded(words):
    recorded = provenance(["securesd", "bench", *words, "--out", "results"])["command"]
    assert SECRET not in recorded and REDACTED in recorded
    assert recorded.endswith("--out results")


@pytest.mark.parametrize("name", ["MY_SERVICE_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "CLIENT_SECRET_VALUE"])
def test_the_value_of_a_secret_variable_is_redacted_wherever_it_appears(monkeypatch, name):
    monkeypatch.setenv(name, SECRET)
    recorded = provenance(["securesd", "bench", "--data-dir", f"/data/{SECRET}/x", "--note", SECRET])[
        "command"
    ]
    assert SECRET not in recorded
    assert recorded == f"securesd bench --data-dir /data/{REDACTED}/x --note {REDACTED}"


def test_ordinary_words_and_variable_names_are_kept(monkeypatch):
    monkeypatch.setenv("SHORT_KEY", "abc")  # too short to be redacted safely
    argv = ["securesd", "bench", "--api-key-env", "OPENAI_API_KEY", "--limit", "abc", "--tasks", "jailbreak"]
    assert redact_command(argv) == "securesd bench --api-key-env OPENAI_API_KEY --limit abc --tasks jailbreak"


def test_token_counts_are_not_secrets():
    """Options that count tokens are recorded as typed; only a token itself is hidden."""
    argv = ["securesd", "bench", "--max-new-tokens", "256", "--judge-option", "max_tokens=64", "--hf-token", SECRET]
    assert redact_command(argv) == (
        f"securesd bench --max-new-tokens 256 --judge-option max_tokens=64 --hf-token '{REDACTED}'"
    )


@pytest.mark.parametrize("name", ["api_key", "apiKey", "X-Api-Key", "hf_token", "accessToken", "client_secret",
                                  "DB_PASSWORD", "bearer", "credentials"])
def test_secret_names(name):
    assert names_a_secret(name)


@pytest.mark.parametrize("name", ["max_tokens", "maxTokens", "--max-new-tokens", "num_tokens", "tokenizer",
                                  "threshold", "base_url", "--token-ids", "pad_token_id", "tokenId"])
def test_names_that_are_not_secrets(name):
    assert not names_a_secret(name)


def test_a_switch_named_for_token_ids_does_not_hide_the_next_option():
    """`--token-ids` takes no value: the word after it (here `--tasks`) was recorded as [redacted], so the
    recorded command could not be run again."""
    argv = ["securesd", "bench", "--token-ids", "--tasks", "jailbreak", "--hf-token", "hf_x"]
    assert redact_command(argv) == f"securesd bench --token-ids --tasks jailbreak --hf-token '{REDACTED}'"
