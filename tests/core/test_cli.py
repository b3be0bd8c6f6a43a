"""The `securesd` entry point: its help lists every subcommand with a complete description."""

from __future__ import annotations

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
