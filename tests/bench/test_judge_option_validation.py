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


TRANSFORMERS_JUDGE = {"backend": "transformers", "backend_kwargs": {"model": "some/judge"}}


def test_the_studys_data_folder_is_where_the_judge_reads_its_rubric(data_dir, monkeypatch):
    """`bench --data-dir` did not reach the StrongREJECT judge: with SECURESD_DATA_DIR unset the run was
    refused with "pass data_dir=... (or --data-dir)" although --data-dir was given."""
    monkeypatch.delenv("SECURESD_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=r"pass data_dir=\.\.\. \(or --data-dir\)"):
        StudySettings("tiny", "tiny", judge="strongreject", judge_options=TRANSFORMERS_JUDGE)
    settings = StudySettings("tiny", "tiny", judge="strongreject", judge_options=TRANSFORMERS_JUDGE,
                             data_dir=str(data_dir))
    assert settings.score_options().judge_options == {**TRANSFORMERS_JUDGE, "data_dir": str(data_dir)}
    own = StudySettings("tiny", "tiny", judge="strongreject", judge_options={**TRANSFORMERS_JUDGE,
                        "data_dir": str(data_dir)}, data_dir="/elsewhere")
    assert own.score_options().judge_options["data_dir"] == str(data_dir)  # the judge's own option wins
    prefix = StudySettings("tiny", "tiny", judge="refusal_prefix", data_dir=str(data_dir))
    assert prefix.score_options().judge_options == {}  # a judge that reads no data file gets none


def test_bench_hands_its_data_folder_to_the_judge_and_records_none(tmp_path, data_dir, monkeypatch):
    monkeypatch.delenv("SECURESD_DATA_DIR", raising=False)
    built = {}

    def build_engine(args, settings):
        built["settings"] = settings
        raise KeyboardInterrupt  # stop before loading any model

    monkeypatch.setattr("hf_securesd.bench.cli_bench.build_engine", build_engine)
    argv = ["bench", "--profile", "smoke", "--tasks", "jailbreak", "--limit", "1", "--judge", "strongreject",
            "--judge-option", "backend=transformers", "--judge-option", 'backend_kwargs={"model": "some/judge"}',
            "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 130
    settings = built["settings"]
    assert settings.score_options().judge_options["data_dir"] == str(data_dir.resolve())

    class Engine:
        def describe(self):
            return {}

    assert "data_dir" not in settings.manifest(Engine())["judge_options"]
