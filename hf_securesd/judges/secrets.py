"""Keeping secrets (API keys, tokens) out of results files, reports, logs and exception text.

Secrets live in environment variables (`SECRET_ENV_VARS`) and are read where they are used.
`redact` replaces every known secret value in a text, verbatim or escaped as JSON, Python's repr or
PHP (``\\/``) write it, `redact_value` in every string of a record (results files: a server may echo a
key in a model name or an answer); `api_key_problem` refuses, where a key is read, a key that
could not be sent or redacted safely (holding whitespace, control or non-ASCII characters: h11 would
quote it in its error), and `warn_if_unredacted` warns of one too short to redact; `redacted_excerpt` redacts
a server's text and only then clips it for an error message; `redact_command` redacts a command
line before it is recorded; `reject_secret_options` refuses option mappings (judge options, backend
settings) that carry a secret, since those are written to ``study.json`` and printed in reports.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

SECRET_ENV_VARS = ("SECURESD_JUDGE_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                   "ANTHROPIC_API_KEY")
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6
EXCERPT_CHARS = 200
# words that make an option or key name a secret's (`names_a_secret`); "tokens" (max_tokens) is a count
_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "authorization", "bearer", "credential",
                           "credentials"})
_API_KEY = re.compile(r"api[_-]?key", re.IGNORECASE)

# environment variables whose values are treated as secrets wherever they appear
_SECRET_ENV_NAME = re.compile(r"(_KEY|_TOKEN)$|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
# an option naming an environment variable holds a name, not a secret (--api-key-env NAME)
_NAMES_A_VARIABLE = re.compile(r"[-_]env$", re.IGNORECASE)
# a URL's userinfo: after "://", up to the last "@" before the path (greedy: "user:sec@ret@host")
_USERINFO = re.compile(r"(?<=://)[^/\s]+@")


def names_a_secret(name: str) -> bool:
    """Whether an option or key `name` names a secret: it holds an API key (``api_key``, ``--api-key``,
    ``apiKey``) or one of its words (split at non-alphanumerics and camelCase humps) is a secret's
    (``--token``, ``hf_token``, ``accessToken``, ``client_secret``, ``password``). Counts of tokens
    (``--max-new-tokens``, ``max_tokens``), tokenizers and token ids (``--token-ids``, ``pad_token_id``)
    are not secrets."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    words = re.split(r"[^a-z0-9]+", spaced.lower())
    return bool(_API_KEY.search(name)) or any(
        word in _SECRET_WORDS and not (word == "token" and words[index + 1 : index + 2] in (["id"], ["ids"]))
        for index, word in enumerate(words)
    )


def secret_env_values() -> list[str]:
    """Values of the environment variables named like secrets (``*_KEY``, ``*_TOKEN``,
    ``*SECRET*``, ``*PASSWORD*``) that are at least `MIN_SECRET_CHARS` long."""
    return [value for name, value in os.environ.items()
            if _SECRET_ENV_NAME.search(name) and len(value) >= MIN_SECRET_CHARS]


def api_key_problem(key: str, where: str) -> str | None:
    """Why the API key `key`, read from `where` (an environment variable and the option naming it),
    cannot be used, or None; the message never shows the key. A key must be printable ASCII without
    spaces: an HTTP header carries ASCII (httpx refuses other characters), and h11 refuses a header
    holding a carriage return or a line feed with an error that quotes the header, key included."""
    if not all("!" <= character <= "~" for character in key):
        return (f"{where}: the API key holds whitespace, a control character or a character outside ASCII "
                "(it is not shown here); remove it, e.g. the trailing carriage return of a .env file saved "
                "with Windows line endings (CRLF)")
    return None


def warn_if_unredacted(key: str, where: str) -> None:
    """Warn that the API key `key` (from `where`) is shorter than `MIN_SECRET_CHARS` and so is not
    redacted from answers and results (it cannot be told from ordinary text): right for a placeholder
    such as "EMPTY", what local OpenAI-compatible servers are conventionally given; a real secret should
    be longer."""
    if len(key) < MIN_SECRET_CHARS:
        warnings.warn(
            f"{where}: the API key is shorter than {MIN_SECRET_CHARS} characters, so it is not redacted from "
            "the results (it cannot be told from ordinary text); fine for a placeholder such as EMPTY, use "
            "a longer key if it is a secret",
            stacklevel=3,
        )


_PERCENT_ESCAPE = re.compile("%[0-9A-F]{2}")


def escaped_forms(secret: str) -> list[str]:
    """`secret` and the forms it takes once escaped where it may be echoed: in JSON (``\\uXXXX`` or
    not, with ``/`` escaped as PHP writes it or not), in Python's repr of it as text or as bytes
    (how h11 and httpx quote a header) and percent-encoded (a URL or form, escapes in upper or lower
    case); each form at most once, `secret` first."""
    forms = [secret]
    for escaped in (json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
                    repr(secret)[1:-1], repr(secret.encode(errors="surrogatepass"))[2:-1]):
        forms += [escaped, escaped.replace("/", "\\/")]
    for encoded in (quote(secret, safe=""), quote_plus(secret, safe="")):  # echoed in a URL or a form
        forms += [encoded, _PERCENT_ESCAPE.sub(lambda escape: escape.group(0).lower(), encoded)]
    return list(dict.fromkeys(forms))


def known_secrets(extra: Iterable[str | None] = ()) -> list[str]:
    """Secret values to redact, longest first: those of `SECRET_ENV_VARS` that are set, plus `extra`,
    each with its `escaped_forms`; values shorter than `MIN_SECRET_CHARS` are ignored (they would
    redact ordinary text; `warn_if_unredacted` says so where such a key is read)."""
    values = [os.environ.get(name) for name in SECRET_ENV_VARS] + list(extra)
    secrets = {value for value in values if value and len(value) >= MIN_SECRET_CHARS}
    return sorted({form for secret in secrets for form in escaped_forms(secret)}, key=len, reverse=True)


def redact(text: str, extra: Iterable[str | None] = ()) -> str:
    """`text` with every known secret (see `known_secrets`) and URL userinfo replaced by `REDACTED`."""
    return _redact_with(text, known_secrets(extra))


def redact_value(value: Any, extra: Iterable[str | None] = ()) -> Any:
    """`value` (JSON-like: dicts, lists, strings, numbers) with `redact` applied to every string in
    it, dictionary keys included; the known secrets are looked up once for the whole value."""
    secrets = known_secrets(extra)

    def scrub(item: Any) -> Any:
        if isinstance(item, str):
            return _redact_with(item, secrets)
        if isinstance(item, Mapping):
            return {scrub(key): scrub(entry) for key, entry in item.items()}
        if isinstance(item, (list, tuple)):
            return [scrub(entry) for entry in item]
        return item

    return scrub(value)


def _redact_with(text: str, secrets: Sequence[str]) -> str:
    """`text` with each of `secrets` (longest first) and URL userinfo replaced by `REDACTED`: all of
    the authority up to its last ``@`` (a password may hold an ``@``: ``user:sec@ret@host``)."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return _USERINFO.sub(f"{REDACTED}@", text)


def redacted_excerpt(text: str | bytes, extra: Iterable[str | None] = (), limit: int = EXCERPT_CHARS) -> str:
    """At most `limit` characters of `text` (bytes are decoded as UTF-8, bad bytes replaced) for an
    error message, redacted as `redact` does *before* it is clipped, so that a secret straddling
    the cut cannot leave all but its tail behind."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return redact(text, extra)[:limit]


def strip_userinfo(url: str) -> tuple[str, str | None]:
    """`url` without ``user:password@``, and the password (or the user when there is no password)
    that was there. The authority is split at its last ``@``, as `urlsplit` splits it; its host and
    port are kept as written (a port that is not a number is left for the URL's check to refuse)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), password or user


def url_before_query(url: str) -> str | None:
    """`url` cut where its query string or fragment starts (``?...``, ``#...``: a key passed as
    ``?api_key=...`` would be recorded with the URL), or None when it has neither."""
    cut = min((index for index in (url.find("?"), url.find("#")) if index >= 0), default=None)
    return None if cut is None else url[:cut]


def public_url(url: str) -> str:
    """`url` as it may be shown or recorded: without userinfo (`strip_userinfo`) and cut before a query
    string or fragment (`url_before_query`: a key passed as ``?api_key=...``), marked by ``?...``."""
    url = strip_userinfo(url)[0]
    before_query = url_before_query(url)
    return url if before_query is None else f"{before_query}?..."


def reject_secret_options(options: Mapping[str, Any], where: str = "judge option") -> None:
    """ValueError when a key of `options` (at any depth) names a secret, or a URL value carries
    userinfo: such options are written to study.json and reports. The message says to use the
    environment instead."""
    for key, value in options.items():
        if names_a_secret(str(key)):
            raise ValueError(
                f"{where} {key!r} looks like a secret; options are written to study.json and the report. "
                "Put the key in the environment instead (SECURESD_JUDGE_API_KEY for the judge endpoint).")
        if isinstance(value, Mapping):
            reject_secret_options(value, where)
        elif isinstance(value, str) and strip_userinfo(value)[1] is not None:
            raise ValueError(
                f"{where} {key!r} holds a URL with credentials; put the key in SECURESD_JUDGE_API_KEY "
                "and give the URL without user:password@.")


def redact_command(argv: Sequence[str], extra: Iterable[str | None] = ()) -> str:
    """The command line `argv`, shell-quoted, with secrets replaced by `REDACTED`: the value of an
    option named like a secret (``--api-key V``, ``--token=V``; not ``--api-key-env NAME``, which
    names a variable), the value of a ``KEY=VALUE`` word whose key is named like one
    (``--judge-option api_key=V``), URL userinfo, and every value of `known_secrets`,
    `secret_env_values` and `extra` wherever it appears."""
    words: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            words.append(REDACTED)
            hide_next = False
            continue
        option, equals, value = word.partition("=")
        secret_name = names_a_secret(option) and not _NAMES_A_VARIABLE.search(option)
        if equals and secret_name:
            words.append(f"{option}={REDACTED}")
        elif word.startswith("-") and secret_name:
            words.append(word)
            hide_next = True
        else:
            words.append(word)
    return redact(shlex.join(words), [*secret_env_values(), *extra])
