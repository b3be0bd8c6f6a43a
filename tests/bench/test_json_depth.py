"""JSON read from outside nested more than `json_input.MAX_DEPTH` levels is refused like unreadable
JSON. Python's reader takes about 990 levels, but a 600-level list in a field no check reads (study.json
"notes", a run's config) overflowed the recursion of the code that redacts and writes records again:
`securesd rescore` and a resumed `securesd bench` ended in a RecursionError traceback."""

from __future__ import annotations

import json

import pytest
from support import jailbreak_study

from hf_securesd.bench import json_input
from hf_securesd.bench.json_input import MAX_DEPTH, loads
from hf_securesd.bench.plan import DRAFT, TARGET
from hf_securesd.bench.results import MANIFEST, RUNS, ResultsDir, read_jsonl
from hf_securesd.cli import main


def nested(levels: int) -> str:
    """JSON text of `levels` arrays nested in one another, the innermost holding an empty object."""
    return "[" * (levels - 1) + "{}" + "]" * (levels - 1)


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 600])
def test_deeper_than_the_limit_is_a_json_decode_error(levels):
    for text in (nested(levels), nested(levels).encode(), f'{{"notes": {nested(levels - 1)}}}'):
        with pytest.raises(json.JSONDecodeError, match=f"too deeply to read \\(more than {MAX_DEPTH} "):
            loads(text)


def test_the_limit_itself_is_read():
    assert loads(nested(MAX_DEPTH)) == json.loads(nested(MAX_DEPTH))
    assert loads(f'{{"a": 1, "b": [{nested(MAX_DEPTH - 2)}, 2]}}')["a"] == 1
    assert loads('"[[[[[[["') == "[[[[[[["  # brackets in text are not nesting


@pytest.fixture
def study(tmp_path, data_dir):
    return jailbreak_study(tmp_path / "results", data_dir,
                           [(TARGET, ["I cannot.", "Sure"]), (DRAFT, ["Sure", "Sure"])]).path


def _plant(study, levels: int, in_manifest: bool) -> None:
    """A value `levels` deep counted from the file's top (study.json "notes", or the first run's config)."""
    if in_manifest:
        manifest = json.loads((study / MANIFEST).read_text(encoding="utf-8"))
        text = json.dumps(manifest)[:-1] + f', "notes": {nested(levels - 1)}}}'
        (study / MANIFEST).write_text(text, encoding="utf-8")
        return
    lines = (study / RUNS).read_text(encoding="utf-8").splitlines()
    lines[0] = lines[0].replace('"config": {', f'"config": {{"x": {nested(levels - 2)}, ', 1)
    (study / RUNS).write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_the_files_a_study_writes_nest_far_less_than_the_limit(study, monkeypatch):
    monkeypatch.setattr(json_input, "MAX_DEPTH", 8)
    results = ResultsDir(study)
    assert results.read_manifest() and len(results.runs()) == 2


@pytest.mark.parametrize("in_manifest, named", [(True, MANIFEST), (False, f"{RUNS}, line 1")])
@pytest.mark.parametrize("command", ["rescore", "report"])
def test_a_deep_value_in_an_unchecked_field_is_one_error_line(study, data_dir, capsys, command, in_manifest,
                                                              named):
    _plant(study, 600, in_manifest)
    rescore_options = ["--tasks", "jailbreak", "--data-dir", str(data_dir)]
    argv = [command, str(study)] + (rescore_options if command == "rescore" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {study / named}: not valid JSON (or nested too deeply to read)")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_rescore_reads_and_rewrites_a_value_at_the_limit(study, data_dir, capsys):
    _plant(study, MAX_DEPTH, in_manifest=False)
    _plant(study, MAX_DEPTH, in_manifest=True)
    assert main(["rescore", str(study), "--tasks", "jailbreak", "--data-dir", str(data_dir)]) == 0
    assert read_jsonl(study / RUNS)[0]["config"]["x"] == json.loads(nested(MAX_DEPTH - 2))


@pytest.mark.parametrize("content", ["[" * 600 + "]" * 600, "{not json"])
def test_a_model_folders_recorded_source_too_deep_or_unreadable_is_one_error(tmp_path, content) -> None:
    # securesd_source.json (written by `securesd models fetch`) goes into study.json: 600 levels there
    # overflowed the code that redacts and writes the manifest; unreadable JSON was a traceback
    from hf_securesd.bench.loading import _describe

    (tmp_path / "securesd_source.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match="securesd_source.json is not readable JSON .*models fetch"):
        _describe("local", str(tmp_path))
