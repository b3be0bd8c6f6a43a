"""Ctrl-C during any `securesd` subcommand: one line, ``interrupted``, and exit status 130 (the shell's
128 + SIGINT), never a KeyboardInterrupt traceback."""

from __future__ import annotations

from hf_securesd import cli, demo
from hf_securesd.models import cli as models_cli


def interrupted(*args, **kwargs):
    """What Ctrl-C does to the call it lands in."""
    raise KeyboardInterrupt


def test_ctrl_c_in_a_subcommand_is_one_line_and_exit_130(monkeypatch, capsys) -> None:
    monkeypatch.setattr(demo, "run", interrupted)
    assert cli.main(["demo"]) == cli.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_during_a_model_fetch_is_one_line_and_exit_130(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(models_cli, "fetch", interrupted)
    assert cli.main(["models", "fetch", "qwen-0.5b", "--cache-dir", str(tmp_path)]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "interrupted"
