"""Resuming compares settings by what they amount to, and a refusal says how to resolve it:
`--seed 0` is the default seed and `--judge-option match=start` the judge's default (both were
refused against a directory run without them); the fix names each flag with its recorded value
(`--dtype bf16`). `--dtype auto` resumes with the dtype study.json records (a timing near the 1.2x
line flipped it, and an identical rerun was refused), saying so on the machine line."""

from __future__ import annotations

import pytest

from hf_securesd.bench.results import binding_clashes, clash_fixes
from hf_securesd.cli import main

MANIFEST = {"target": "t", "draft": "d", "device": "cpu", "dtype": "bf16", "num_assistant_tokens": 5,
            "batch_size": 1, "seed": None, "judge": "refusal_prefix", "judge_options": {}, "decoding": "greedy",
            "engine": "hf"}


@pytest.mark.parametrize("changes", [{"seed": 0}, {"judge_options": {"match": "start"}},
                                     {"judge_options": {"prefix_list": "jailbreakbench"}}])
def test_a_default_spelled_out_is_the_same_setting(changes):
    assert binding_clashes(MANIFEST, {**MANIFEST, **changes}) == {}
    assert binding_clashes({**MANIFEST, **changes}, MANIFEST) == {}


def test_another_value_still_clashes_and_the_fix_names_the_flag(tmp_path):
    new = {**MANIFEST, "seed": 3, "dtype": "fp32", "judge_options": {"match": "anywhere"}}
    clashes = binding_clashes(MANIFEST, new)
    assert set(clashes) == {"seed", "dtype", "judge_options"}
    fixes = "; ".join(clash_fixes(clashes, MANIFEST, tmp_path))
    assert "give the recorded settings again (--dtype bf16, --seed left out, --judge-option left out)" in fixes
    assert "or use a new --out directory" in fixes


def test_a_judge_change_is_one_clash_not_also_its_unchanged_options():
    from hf_securesd.judges import JUDGES

    other = next(name for name in JUDGES if name.startswith("refusal_prefix") and name != "refusal_prefix")
    clashes = binding_clashes(MANIFEST, {**MANIFEST, "judge": other})
    assert set(clashes) == {"judge"}


def run_argv(out, data_dir, *extra: str) -> list[str]:
    return ["bench", "--profile", "smoke", "--tasks", "jailbreak", "--limit", "1", "--max-new-tokens", "2",
            "--data-dir", str(data_dir), "--verifiers", "mars:0.5", "--schedules", "none", "--no-progress",
            "--no-report", "--out", str(out), *extra]


def test_resume_with_the_default_seed_and_judge_option(tmp_path, data_dir, capsys):
    out = tmp_path / "out"
    assert main(run_argv(out, data_dir)) == 0
    assert main(run_argv(out, data_dir, "--seed", "0", "--judge-option", "match=start")) == 0


def test_dtype_auto_resumes_with_the_recorded_dtype(tmp_path, data_dir, capsys, monkeypatch):
    decided = iter([("bf16", "bf16 timed faster"), ("fp32", "bf16 timed slower")])
    monkeypatch.setattr("hf_securesd.models.hardware.resolve_dtype", lambda *args, **kwargs: next(decided))
    out = tmp_path / "out"
    assert main(run_argv(out, data_dir, "--dtype", "auto")) == 0
    capsys.readouterr()
    assert main(run_argv(out, data_dir, "--dtype", "auto")) == 0  # the timing would say fp32 now
    machine = [line for line in capsys.readouterr().out.splitlines() if line.startswith("machine:")]
    assert machine and "dtype bf16 (--dtype auto: the dtype" in machine[0] and "not decided again" in machine[0]
    assert main(run_argv(out, data_dir, "--dtype", "fp32")) == 2
    err = capsys.readouterr().err
    assert "dtype: 'bf16' there, 'fp32' now" in err and "(--dtype bf16)" in err


def test_a_tilde_in_out_is_the_home_folder_for_every_reader(monkeypatch, tmp_path):
    """`--out=~/dir` reaches the program with its `~`: the dtype a resume reads and the checks of --out
    must look where the results directory writes."""
    from hf_securesd.bench.cli_bench import out_path

    monkeypatch.setenv("HOME", str(tmp_path))
    assert out_path("~/study") == tmp_path / "study"


REMOTE = {**MANIFEST, "target": "http://127.0.0.1:8000/v1/", "draft": "none", "device": None, "dtype": None,
          "num_assistant_tokens": None, "engine": "openai"}


def test_an_openai_study_binds_its_server_with_or_without_a_trailing_slash():
    assert binding_clashes(REMOTE, {**REMOTE, "target": "http://127.0.0.1:8000/v1"}) == {}


def test_an_openai_target_clash_names_the_server_options_not_target(tmp_path):
    clashes = binding_clashes(REMOTE, {**REMOTE, "target": "endpoint:prod"})
    fixes = "; ".join(clash_fixes(clashes, REMOTE, tmp_path))
    assert "--target" not in fixes and ("set by the --baseline endpoint's --endpoint-model, else --model, else --baseline NAME as endpoint:NAME, "
                                        "else --base-url") in fixes
