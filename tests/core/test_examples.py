"""The scripts in examples/ run as a user runs them (a fresh interpreter, tiny random models, offline)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    "script, expected",
    [
        ("quickstart.py", ["Lossless()", "MARS(theta=0.5)", "Step(L=4)"]),
        ("reasoning_segments.py", ["relaxed thinking, after=Step(4)", "segment starts per row"]),
    ],
)
def test_an_example_runs_offline(script: str, expected: list[str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(text in result.stdout for text in expected), result.stdout[-2000:]
