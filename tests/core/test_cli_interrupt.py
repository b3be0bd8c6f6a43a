"""Ctrl-C during any `securesd` subcommand: one line, ``interrupted``, never a KeyboardInterrupt traceback;
`main` returns 130 (the shell's 128 + SIGINT), and the console script then ends by SIGINT itself, so that
a shell loop of `securesd` runs stops too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

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


@pytest.mark.skipif(os.name != "posix", reason="a process ends by a signal on POSIX only")
def test_the_console_script_ends_by_sigint_after_ctrl_c() -> None:
    """bash stops `for ...; do securesd ...; done` on Ctrl-C only when its child died by SIGINT; with exit
    status 130 it took the interrupt as handled and ran the next iteration. What the command printed
    before is not lost to the signal (stdout, a pipe here, is flushed first)."""
    child = textwrap.dedent("""
        import sys
        from hf_securesd import cli, demo

        def interrupted(args):
            print("partial output")
            raise KeyboardInterrupt

        demo.run = interrupted
        sys.argv = ["securesd", "demo"]
        cli.console_main()
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGINT, done.stderr
    assert done.stderr.splitlines()[-1] == "interrupted" and "Traceback" not in done.stderr
    assert done.stdout == "partial output\n"


@pytest.mark.parametrize("status", [0, 1, 2, cli.EXIT_JUDGE_FAILED])
def test_the_console_script_exits_with_the_status_of_main(status, monkeypatch) -> None:
    monkeypatch.setattr(cli, "main", lambda: status)
    with pytest.raises(SystemExit) as exited:
        cli.console_main()
    assert exited.value.code == status


def test_the_console_script_exits_130_where_sigint_cannot_end_it(monkeypatch) -> None:
    """Not POSIX (Windows: os.kill with SIGINT would end the process with status 2, "bad options")."""
    monkeypatch.setattr(cli, "main", lambda: cli.EXIT_INTERRUPTED)
    with monkeypatch.context() as patched:
        patched.setattr(cli.os, "name", "nt")
        with pytest.raises(SystemExit) as exited:
            cli.console_main()
    assert exited.value.code == cli.EXIT_INTERRUPTED


def test_ctrl_c_while_a_subcommand_imports_its_modules_is_one_line_and_exit_130(monkeypatch, capsys) -> None:
    """The heavy imports (torch, transformers) happen inside `main`, where Ctrl-C is reported in one line:
    `import hf_securesd` and the console script's own import load neither (tests/core/test_package.py)."""
    real_import = cli.importlib.import_module

    def importing(name, *args, **kwargs):
        if name == cli.SUBCOMMANDS["demo"][0]:
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(cli.importlib, "import_module", importing)
    assert cli.main(["demo", "--help"]) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"
