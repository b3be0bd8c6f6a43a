"""The `securesd` entry point: its help lists every subcommand with a complete description, also a
subcommand whose optional extra is not installed."""

from __future__ import annotations

import sys

import pytest

from hf_securesd import cli


def test_top_level_help_describes_the_command_in_whole_sentences(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert cli.DESCRIPTION.split(";")[0] in text and text.count("describes each command.") == 1
    for name in cli.SUBCOMMANDS:
        assert name in text


def test_long_values_in_an_error_are_cut_to_their_head_and_tail_with_their_length() -> None:
    value = "mars:0.5" + ",0.5" * 20_000
    line = cli.shorten_long_values(f"--verifiers names the same setting twice (in {value!r}); give each once")
    assert len(line) < 300 and f"[{len(value):,} characters]" in line
    assert line.startswith("--verifiers names the same setting twice (in 'mars:0.5,0.5")
    assert line.endswith(",0.5'); give each once")
    short = "a" * cli.LONG_VALUE_CHARS
    assert cli.shorten_long_values(f"got {short!r}; fix") == f"got {short!r}; fix"


def test_usage_errors_shorten_the_values_they_echo(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "--out", "o", "--limit", "x" * 80_000])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "[80,000 characters]" in err and len(err.splitlines()[-1]) < 400


def _without_module(monkeypatch, module_name: str) -> None:
    """Importing `module_name` raises ImportError, as a subcommand whose optional extra is not installed."""
    monkeypatch.setitem(sys.modules, module_name, None)


def test_help_of_a_subcommand_without_its_extra_describes_it_and_names_the_install(capsys, monkeypatch) -> None:
    name, (module_name, help_text) = "agentdojo", cli.SUBCOMMANDS["agentdojo"]
    _without_module(monkeypatch, module_name)
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert help_text in out and "Not available in this environment:" in out and module_name in out


def test_a_subcommand_without_its_extra_is_refused_in_one_line(capsys, monkeypatch) -> None:
    module_name = cli.SUBCOMMANDS["agentdojo"][0]
    _without_module(monkeypatch, module_name)
    for arguments in (["agentdojo"], ["agentdojo", "--limit", "2"], ["agentdojo", "--", "--help"]):
        with pytest.raises(SystemExit) as exited:
            cli.main(arguments)
        err = capsys.readouterr().err
        assert exited.value.code == 2
        assert err.startswith("securesd agentdojo: ") and len(err.strip().splitlines()) == 1
