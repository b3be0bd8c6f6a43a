"""Keeping secrets (API keys, tokens) out of results files, reports, logs and exception text.

Secrets live in environment variables (`SECRET_ENV_VARS`) and are read where they are used.
`redact` replaces every known secret value in a text; `reject_secret_options` refuses option
mappings (judge options, backend settings) that carry a secret, since those are written to
``study.json`` and printed in reports.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SECRET_ENV_VARS = ("SECURESD_JUDGE_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                   "ANTHROPIC_API_KEY")
REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6
_SECRET_NAME = re.compile(r"(api[_-]?key|token|secret|password|passwd|authorization|bearer|credential)",
                          re.IGNORECASE)


def known_secrets(extra: Iterable[str | None] = ()) -> list[str]:
    """Secret values to redact: those of `SECRET_ENV_VARS` that are set, plus `extra`; values
    shorter than `MIN_SECRET_CHARS` are ignored (they would redact ordinary text)."""
    values = [os.environ.get(name) for name in SECRET_ENV_VARS] + list(extra)
    return sorted({value for value in values if value and len(value) >= MIN_SECRET_CHARS}, key=len, reverse=True)


def redact(text: str, extra: Iterable[str | None] = ()) -> str:
    """`text` with every known secret (see `known_secrets`) and URL userinfo replaced by `REDACTED`."""
    for secret in known_secrets(extra):
        text = text.replace(secret, REDACTED)
    return re.sub(r"(?<=://)[^/\s@]+@", f"{REDACTED}@", text)


def strip_userinfo(url: str) -> tuple[str, str | None]:
    """`url` without ``user:password@``, and the password (or the user when there is no password)
    that was there."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=host)), parts.password or parts.username


def reject_secret_options(options: Mapping[str, Any], where: str = "judge option") -> None:
    """ValueError when a key of `options` (at any depth) names a secret, or a URL value carries
    userinfo: such options are written to study.json and reports. The message says to use the
    environment instead."""
    for key, value in options.items():
        if _SECRET_NAME.search(str(key)):
            raise ValueError(
                f"{where} {key!r} looks like a secret; options are written to study.json and the report. "
                "Put the key in the environment instead (SECURESD_JUDGE_API_KEY for the judge endpoint).")
        if isinstance(value, Mapping):
            reject_secret_options(value, where)
        elif isinstance(value, str) and strip_userinfo(value)[1] is not None:
            raise ValueError(
                f"{where} {key!r} holds a URL with credentials; put the key in SECURESD_JUDGE_API_KEY "
                "and give the URL without user:password@.")
