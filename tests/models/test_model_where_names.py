"""`securesd models where` prints the names it is given only as escapes (a name cannot drive the
terminal) and refuses an empty name (it resolved to the current folder)."""

from __future__ import annotations

from support import run_cli

from hf_securesd.cli import main


def test_a_name_with_control_characters_is_printed_escaped(capsys, tmp_path):
    assert main(["models", "where", "--offline", "--cache-dir", str(tmp_path), "a\x1b[31mred\x07"]) == 0
    out = capsys.readouterr().out
    assert "a\\x1b[31mred\\x07  (not in the registry)" in out and "\x1b" not in out and "\x07" not in out


def test_an_empty_name_is_refused(capsys, tmp_path):
    code, err = run_cli(capsys, "models", "where", "--offline", "--cache-dir", str(tmp_path), "")
    assert code == 2 and "NAME: expected a non-empty value" in err
