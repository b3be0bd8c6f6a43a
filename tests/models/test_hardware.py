"""`checked_device`: a script's --device option checked against this machine, refused in one line."""

from __future__ import annotations

import argparse

import pytest
import torch

from hf_securesd.models.hardware import checked_device


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench_script")
    parser.add_argument("--device", default="cpu")
    return parser


def test_a_device_this_machine_has_is_returned_normalised():
    assert checked_device(_parser(), " CPU ") == "cpu"


@pytest.mark.parametrize(
    "spec, named",
    [("banana", "unknown device 'banana'"), ("cuda", "CUDA is not available here"), ("cuda:1", "CUDA is not available")],
)
def test_a_device_this_machine_lacks_ends_the_script_in_one_line(spec, named, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stopped:
        checked_device(_parser(), spec)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert named in error and "use " in error
    assert "Traceback" not in error
    assert error.strip().splitlines()[-1].startswith("bench_script: error: ")
