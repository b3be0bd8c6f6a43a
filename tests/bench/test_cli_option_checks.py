"""`securesd bench` (and `calibrate`) options that used to be accepted and ignored, taken as "not given",
or end in a traceback: each is now refused with one line naming the option and exit status 2, before any
model is loaded or anything generated or written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import run_cli

from hf_securesd.bench.plan import parse_verifier

SMOKE = ("--profile", "smoke", "--tasks", "gsm8k", "--limit", "1", "--max-new-tokens", "2",
         "--verifiers", "mars:0.5", "--schedules", "none", "--no-progress", "--no-report")
OPENAI = ("--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--tokenizer", "tiny")


def refused(capsys, *argv: str) -> str:
    """Run the CLI in-process; assert exit status 2 with one error line (no traceback) and return it."""
    code, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith(("error:", "securesd ")) or "error:" in line]
    assert code == 2 and "Traceback" not in err and lines, err
    return lines[-1]


def bench(tmp_path: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["bench", *SMOKE, "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), *extra]


@pytest.mark.parametrize("out", ["", "  "])
def test_1_an_empty_out_is_refused(capsys, tmp_path, data_dir, monkeypatch, out) -> None:
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, "bench", *SMOKE, "--data-dir", str(data_dir), "--out", out)
    assert "--out" in line and "non-empty" in line
    assert not os.listdir(tmp_path)


def test_2_out_through_a_missing_folder_is_refused_and_nothing_is_created(capsys, tmp_path, data_dir,
                                                                           monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    line = refused(capsys, "bench", *SMOKE, "--data-dir", str(data_dir), "--out", "r_dd/../r_dd2")
    assert line.startswith("error: --out r_dd/../r_dd2") and "'..'" in line
    assert not os.listdir(tmp_path)


def test_2_a_missing_out_is_not_created_by_the_check(tmp_path) -> None:
    from hf_securesd.bench.cli_bench import check_out_dir

    check_out_dir(tmp_path / "a" / "b")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("command", ["bench", "calibrate"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_3_a_non_finite_limit_is_refused_at_parse_time(capsys, tmp_path, command, value) -> None:
    line = refused(capsys, command, "--profile", "smoke", f"--limit={value}", "--out", str(tmp_path / "o"))
    assert "--limit" in line and "finite" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, named", [
    (("--base-url", ""), "--base-url"),
    (("--base-url", "http://127.0.0.1:9/v1\r\nX: y"), "--base-url"),
    (("--request-timeout", "1e10"), "--request-timeout"),
    (("--run-deadline", "1e10"), "--run-deadline"),
])
def test_4_bad_openai_urls_and_huge_durations_are_refused(capsys, tmp_path, data_dir, extra, named) -> None:
    line = refused(capsys, *bench(tmp_path, data_dir, *OPENAI, *extra))
    assert named in line
    assert not (tmp_path / "out").exists()


def test_5_an_unloadable_tokenizer_is_one_line_naming_it(capsys, tmp_path, data_dir, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = bench(tmp_path, data_dir, "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1",
                 "--tokenizer", "nosuch-org/nosuchmodel")
    line = refused(capsys, *argv)
    assert line.startswith("error: --tokenizer nosuch-org/nosuchmodel: cannot be loaded")
    assert not (tmp_path / "out").exists()


def test_5_unloadable_models_are_one_line_naming_them(capsys, tmp_path, data_dir, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = bench(tmp_path, data_dir, "--target", "nosuch-org/nosuch-a", "--draft", "nosuch-org/nosuch-b")
    line = refused(capsys, *argv)
    assert line.startswith("error: --target nosuch-org/nosuch-a / --draft nosuch-org/nosuch-b: cannot be loaded")
    assert not (tmp_path / "out").exists()


def test_6_a_negative_seed_is_refused_at_parse_time(capsys, tmp_path, data_dir) -> None:
    line = refused(capsys, *bench(tmp_path, data_dir, "--seed", "-1"))
    assert "--seed" in line and ">= 0" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra", [
    ("--base-url", "http://127.0.0.1:9/v1"), ("--chat",), ("--token-ids",), ("--model", "m"),
    ("--tokenizer", "tiny"), ("--api-key-env", "KEY"), ("--baseline", "a"), ("--draft-baseline", "b"),
    ("--request-timeout", "5"), ("--run-deadline", "5"), ("--concurrency", "2"), ("--max-retries", "0"),
    ("--endpoint-api-key-env", "a=KEY"), ("--endpoint", "a=http://127.0.0.1:9/v1"),
    ("--vllm-option", "enforce_eager=true"),
])
def test_7_engine_specific_options_with_another_engine_are_refused(capsys, tmp_path, data_dir, extra) -> None:
    line = refused(capsys, *bench(tmp_path, data_dir, *extra))
    owner = "vllm" if extra[0] == "--vllm-option" else "openai"
    assert line.startswith(f"error: {extra[0]} needs --engine {owner}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra", [
    ("--concurrency", "4"), ("--request-timeout", "300"), ("--max-retries", "4"), ("--endpoint", "a=http://x/v1"),
])
def test_7_engine_options_typed_at_their_default_are_refused_too(capsys, tmp_path, data_dir, extra) -> None:
    """Given on the command line is given, whatever the value: the user believes it does something."""
    line = refused(capsys, *bench(tmp_path, data_dir, *extra))
    assert line.startswith(f"error: {extra[0]} needs --engine openai")


def test_7_vllm_option_with_the_openai_engine_is_refused(capsys, tmp_path, data_dir) -> None:
    line = refused(capsys, *bench(tmp_path, data_dir, *OPENAI, "--vllm-option", "enforce_eager=true"))
    assert line.startswith("error: --vllm-option needs --engine vllm")


def test_8_openai_schedules_without_verifiers_are_refused(capsys, tmp_path, data_dir) -> None:
    argv = ["bench", "--profile", "smoke", "--tasks", "gsm8k", "--limit", "1", "--data-dir", str(data_dir),
            "--schedules", "step:4", "--out", str(tmp_path / "out"), *OPENAI]
    line = refused(capsys, *argv)
    assert line.startswith("error: --schedules with --engine openai needs --verifiers")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spec", ["lossless:0.5", "mars:", "mars:,", "mars:0.5,,0.7", "mars:0.5,"])
def test_9_odd_verifier_specs_are_refused(capsys, tmp_path, data_dir, spec) -> None:
    with pytest.raises(ValueError, match=f"verifier {spec!r}"):
        parse_verifier(spec)
    argv = ["bench", "--profile", "smoke", "--tasks", "gsm8k", "--limit", "1", "--data-dir", str(data_dir),
            "--verifiers", spec, "--out", str(tmp_path / "out"), "--no-progress"]
    line = refused(capsys, *argv)
    assert line.startswith(f"error: verifier {spec!r}")
    assert not (tmp_path / "out").exists()


def test_9_plain_specs_still_parse() -> None:
    assert [v.theta for v in parse_verifier("mars:0.5,0.7")] == [0.5, 0.7]
    assert parse_verifier("mars")
    assert parse_verifier("lossless")[0].name == "lossless"


@pytest.mark.parametrize("option", ["--target", "--draft", "--data-dir", "--cache-dir", "--device", "--model"])
@pytest.mark.parametrize("value", ["", " "])
def test_10_empty_names_are_refused(capsys, tmp_path, data_dir, option, value) -> None:
    extra = OPENAI if option == "--model" else ()
    line = refused(capsys, *bench(tmp_path, data_dir, *extra, option, value))
    assert option in line and "non-empty" in line
    assert not (tmp_path / "out").exists()


def test_4_an_endpoint_url_with_control_characters_is_refused(capsys, tmp_path, data_dir) -> None:
    line = refused(capsys, *bench(tmp_path, data_dir, *OPENAI, "--endpoint", "a=http://127.0.0.1:9/v1\r\nX: y"))
    assert line.startswith("error: --endpoint a=: the URL") and "control characters" in line
    assert not (tmp_path / "out").exists()


def test_a_judge_option_in_brackets_is_a_json_list():
    from hf_securesd.bench.cli_bench import judge_options
    from hf_securesd.judges import check_judge_options

    assert judge_options(['prefixes=["I cannot", "Sorry"]', "match=start"]) == {
        "prefixes": ["I cannot", "Sorry"], "match": "start"}
    # no JSON: text, which the judge refuses where it needs a list, naming the form
    options = judge_options(["prefixes=[oops"])
    assert options == {"prefixes": "[oops"}
    with pytest.raises(ValueError, match=r"`prefixes` must be a list of strings, not the one string '\[oops'.*"
                                         r"give a JSON list"):
        check_judge_options("refusal_prefix", options)


def test_a_judge_option_in_braces_is_a_json_object():
    """backend_kwargs={"timeout": 5} reached the judge as text (a dict update error)."""
    from hf_securesd.bench.cli_bench import judge_options
    from hf_securesd.judges import check_judge_options

    options = judge_options(['backend_kwargs={"timeout": 5}'])
    assert options == {"backend_kwargs": {"timeout": 5}}
    check_judge_options("strongreject", options)
    options = judge_options(["backend_kwargs={timeout: 5}"])  # no JSON: text, refused by the judge
    assert options == {"backend_kwargs": "{timeout: 5}"}
    with pytest.raises(ValueError, match=r"backend_kwargs must be a dict of judge backend settings"):
        check_judge_options("strongreject", options)


def test_a_judge_option_in_braces_that_is_no_json_is_text(data_dir):
    """A custom StrongREJECT rubric's placeholders are in braces: `rubric={forbidden_prompt} ...` was
    refused as "a value in braces must be a JSON object"."""
    from hf_securesd.bench.cli_bench import judge_options
    from hf_securesd.judges import check_judge_options

    rubric = "{forbidden_prompt} was asked; the answer was {response}. Score it."
    options = judge_options([f"rubric={rubric}", "data_dir={HOME}/x"])
    assert options == {"rubric": rubric, "data_dir": "{HOME}/x"}
    check_judge_options("strongreject", {"rubric": rubric, "backend": "openai"})


@pytest.mark.parametrize("value", ['backend_kwargs={"timeout": 5, "timeout": 500}',
                                   'backend_kwargs={"headers": {"a": 1, "a": 2}}',
                                   'prefixes=[{"x": 1, "x": 1}]'])
def test_a_judge_option_whose_json_gives_a_key_twice_is_refused(value):
    """Python's JSON reader keeps the last of two equal keys: {"timeout": 5, "timeout": 500} ran with 500."""
    from hf_securesd.bench.cli_bench import judge_options

    with pytest.raises(ValueError, match=r"the JSON gives the key '(timeout|a|x)' twice in one object \(only the "
                                         r"last would be read\); give each key once"):
        judge_options([value])


def test_a_single_string_of_prefixes_is_refused_not_read_letter_by_letter():
    from hf_securesd.judges.refusal_prefix import ExactRefusalPrefixJudge, RefusalPrefixJudge

    for judge in (RefusalPrefixJudge, ExactRefusalPrefixJudge):
        with pytest.raises(ValueError, match="not the one string 'I cannot' .* give a JSON list"):
            judge(prefixes="I cannot")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where no folder can be created")
@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_2_an_out_the_os_refuses_to_create_is_one_line(capsys, data_dir, command) -> None:
    """`--out /proc/x` passes the up-front checks (/proc is writable for root) and mkdir then fails:
    that ended in a FileNotFoundError traceback."""
    argv = [*SMOKE, "--data-dir", str(data_dir), "--out", "/proc/securesd-x"]
    if command == "calibrate":
        argv = [arg for arg in argv if arg not in ("--verifiers", "mars:0.5", "--schedules", "none", "--no-report")]
        argv += ["--verifier", "mars:0.5", "--L", "1"]
    line = refused(capsys, command, *argv)
    assert line == ("error: cannot write /proc/securesd-x: No such file or directory; give an --out directory "
                    "that can be created and written")


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_10_an_offline_copy_that_cannot_be_built_is_one_line(capsys, tmp_path, data_dir, monkeypatch, command) -> None:
    from hf_securesd.models import AssemblyError

    def fail(*_, **__):
        raise AssemblyError("qwen-0.5b", "write", "[Errno 2] No such file or directory", "give a writable --cache-dir")

    monkeypatch.setattr("hf_securesd.models.load_pair", fail)
    argv = [command, "--profile", "smoke", "--tasks", "gsm8k", "--limit", "1", "--max-new-tokens", "2",
            "--target", "qwen-1.5b", "--draft", "qwen-0.5b", "--offline", "--no-progress",
            "--data-dir", str(data_dir), "--out", str(tmp_path / "out")]
    line = refused(capsys, *argv)
    assert "qwen-0.5b: write failed" in line and "--cache-dir" in line


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_11_more_threads_than_four_per_core_are_refused(capsys, tmp_path, data_dir, command) -> None:
    too_many = str(4 * (os.cpu_count() or 1) + 1)
    line = refused(capsys, command, *SMOKE[:8], "--threads", too_many, "--data-dir", str(data_dir),
                   "--out", str(tmp_path / "out"))
    assert f"--threads: expected at most {4 * (os.cpu_count() or 1)} threads" in line and too_many in line
    assert not (tmp_path / "out").exists()


def test_12_a_judge_option_given_twice_is_refused(capsys, tmp_path, data_dir) -> None:
    line = refused(capsys, *bench(tmp_path, data_dir, "--judge-option", "match=start", "--judge-option",
                                  "match=anywhere"))
    assert "--judge-option 'match' is given twice" in line and not (tmp_path / "out").exists()
