"""An invalid --judge-option fails before any model is loaded or any answer generated, with a message
that names the option and the valid ones."""

from __future__ import annotations

import pytest

from hf_securesd.bench.runner import StudySettings
from hf_securesd.cli import main


def test_an_unknown_judge_option_is_refused_before_generation(tmp_path, capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("models were loaded before the judge options were checked")

    monkeypatch.setattr("hf_securesd.bench.loading.load_study_models", no_loading)
    out = tmp_path / "results"
    code = main(
        [
            "bench",
            "--target",
            "tiny",
            "--draft",
            "tiny",
            "--tasks",
            "jailbreak",
            "--limit",
            "2",
            "--dtype",
            "fp32",
            "--judge-option",
            "prefixlist=gcg",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 2 and not out.exists()
    error = capsys.readouterr().err
    assert "prefixlist" in error and "prefix_list" in error and "match" in error


@pytest.mark.parametrize(
    "judge, options, message",
    [
        ("refusal_prefix", {"match": "middle"}, "match must be"),
        ("strongreject", {"threshold": "high"}, "threshold"),
        (
            "strongreject",
            {"backend": "nonesuch", "rubric": "{forbidden_prompt} {response}"},
            "unknown judge backend",
        ),
        ("no_such_judge", {}, "unknown judge"),
    ],
)
def test_bad_judge_settings_are_refused_when_the_study_is_set_up(judge, options, message):
    with pytest.raises(ValueError, match=message):
        StudySettings("tiny", "tiny", judge=judge, judge_options=options)
