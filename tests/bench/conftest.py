"""Fixtures of the harness's command tests."""

from __future__ import annotations

import pytest

from hf_securesd.bench import cli_bench


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a command (`bench`, `calibrate`) builds its engine, loading models."""
    def build_engine(args, settings):
        raise AssertionError("models were loaded before the refusal")

    monkeypatch.setattr(cli_bench, "build_engine", build_engine)
