"""`securesd demo` on the tiny pair (load_pair patched: no download): the three configurations answer, the
JSON file is written, and bad options are one-line errors (exit 2) before any model is loaded."""

from __future__ import annotations

import argparse
import json

import pytest

import hf_securesd.models as models_package
from hf_securesd import demo
from hf_securesd.tiny import byte_tokenizer, tiny_pair


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.configure(parser)
    return parser.parse_args(["--max-new-tokens", "3", "--prompt", "hi", "--device", "cpu", "--dtype", "fp32", *argv])


@pytest.fixture
def loads(monkeypatch) -> list[tuple]:
    """load_pair returns the tiny pair; the list records each call."""
    calls: list[tuple] = []

    def tiny(draft, target, **options):
        calls.append((draft, target))
        draft_model, target_model = tiny_pair()
        return byte_tokenizer(), draft_model, target_model

    monkeypatch.setattr(models_package, "load_pair", tiny)
    return calls


def test_the_demo_answers_three_ways_and_writes_json(loads, tmp_path, capsys) -> None:
    out = tmp_path / "answers.json"
    assert demo.run(parse("--verifier", "mars", "--L", "2", "--json", str(out))) == 0
    rows = json.loads(out.read_text())
    assert [row["config"] for row in rows] == ["target only", "MARS(theta=0.5)", "MARS(theta=0.5) + Step(L=2)"]
    assert all(row["prompt"] == "hi" and row["new_tokens"] == 3 for row in rows)
    out = capsys.readouterr().out
    assert "custom refused" in out and "harmful refused" not in out  # --prompt answers are counted as custom
    assert out.splitlines()[-1].split()[-3] == "0/1"


def test_summary_counts_each_kind_of_prompt() -> None:
    rows = [demo.Answer(kind, "p", "c", "t", 2, 1.0, None, refused)
            for kind, refused in (("harmful", True), ("harmful", False), ("benign", False), ("custom", True))]
    header, line = demo.summary(rows, ["c"]).strip().splitlines()
    assert header.split()[1:7] == ["harmful", "refused", "benign", "refused", "custom", "refused"]
    assert line.split()[1:4] == ["1/2", "0/1", "1/1"]


@pytest.mark.parametrize(
    "answer, refused",
    [
        ("Hello! Here is the function you asked for.", False),
        ("As an example, take n = 5.", False),
        ("Sorry for the wait! Step 1: ...", False),
        ("I'm sorry, but I can't help with that.", True),
        ("I can't help with that.", True),
        ("**I won't** provide instructions for that.", True),
        ("Unfortunately, I cannot assist.", True),
        ("I must decline this request.", True),
    ],
)
def test_the_demo_judge_reads_refusal_openings(answer, refused) -> None:
    from hf_securesd.judges.refusal_prefix import RefusalPrefixJudge

    judge = RefusalPrefixJudge(prefixes=demo.DEMO_REFUSALS, match="start")
    assert (not judge.judge(["q"], [answer])[0].attack_succeeded) is refused


@pytest.mark.parametrize(
    "options, message",
    [
        (("--strength", "7"), "--strength 7.0: "),
        (("--verifier", "lossless"), "--verifier must be a relaxed verifier"),
        (("--L", "-2"), "L"),
        (("--json", "{tmp}"), "is a folder"),
        (("--json", "{tmp}/missing/out.json"), "does not exist"),
        (("--device", "tpu9"), "tpu9"),
        (("--verifier", "fly", "--num-assistant-tokens", "2"), "FLy window W=3 needs W <= k-1"),
        (("--verifier", "MARS"), "verifier names are lower case; use 'mars'"),
        (("--verifier", "mars:0.5"), "--verifier 'mars:0.5': give the verifier's name alone and its value with "
                                     "--strength (--verifier mars --strength 0.5)"),
        (("--target", "/no/such/folder"), "--target /no/such/folder: no such folder"),
        (("--draft", "./missing-draft"), "--draft ./missing-draft: no such folder"),
    ],
)
def test_bad_options_are_refused_before_loading(options, message, loads, tmp_path, capsys) -> None:
    options = tuple(option.replace("{tmp}", str(tmp_path)) for option in options)
    assert demo.run(parse(*options)) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and message in error and "Traceback" not in error
    assert loads == []


def test_a_pair_that_cannot_be_loaded_is_a_one_line_error(monkeypatch, capsys) -> None:
    def unreachable(draft, target, **options):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(models_package, "load_pair", unreachable)
    assert demo.run(parse("--target", "org/unreachable")) == 2
    error = capsys.readouterr().err.splitlines()[-1]  # after the device and loading lines
    assert error.startswith("error: could not load the pair (--draft qwen-0.5b, --target org/unreachable)")
    assert "a known name" in error


@pytest.mark.parametrize("option", ["--target", "--draft", "--cache-dir", "--device", "--verifier", "--prompt"])
def test_an_empty_option_is_refused_not_taken_as_not_given(option, capsys):
    from hf_securesd.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["demo", option, ""])
    assert exited.value.code == 2 and "expected a non-empty value" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["loop", "missing"], ids=["loop-of-links", "dangling"])
def test_a_json_path_that_is_a_broken_link_is_refused_before_loading(target, loads, tmp_path, capsys) -> None:
    """pathlib calls a loop of links or a dangling link "not there", so it passed the check and the write
    failed with a traceback after every answer was generated."""
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / ("out.json" if target == "loop" else "nowhere/x"))
    assert demo.run(parse("--json", str(link))) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: --json {link} is a symbolic link that leads nowhere") and loads == []
    assert error.endswith("(--json writes the file a link leads to but does not create it through the link)\n")
    assert len(error.splitlines()) == 1


def test_json_follows_a_link_to_a_file_replaces_that_file_keeps_the_link_and_says_so(loads, tmp_path,
                                                                                     capsys) -> None:
    """As the shell's `>` does, the file a link leads to is written (replaced atomically); the link was
    replaced by a file, which `--json latest.json`, a link to this week's file, did not expect."""
    answers = tmp_path / "answers.json"
    answers.write_text("last week's answers")
    link = tmp_path / "latest.json"
    link.symlink_to(answers)
    assert demo.run(parse("--json", str(link))) == 0
    assert link.is_symlink() and len(json.loads(answers.read_text())) == 3
    assert f"wrote {link} (replaced {answers}, the file its symbolic link leads to; the link is kept)" in \
        capsys.readouterr().err
    assert demo.run(parse("--json", str(answers))) == 0
    assert f"wrote {answers} (replaced the existing file)" in capsys.readouterr().err


def test_json_to_stdout_leaves_stdout_to_the_json_and_the_summary_to_stderr(loads, tmp_path, capfd) -> None:
    """`securesd demo --json /dev/stdout | jq`: stdout is the JSON alone (it held the summary, and a link at
    the name, a stand-in for /dev/stdout here, was replaced by a file holding the JSON)."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")  # where /dev/stdout leads; fd 1 is capfd's file
    assert demo.run(parse("--json", str(link))) == 0
    out, err = capfd.readouterr()
    assert [row["config"] for row in json.loads(out)] == ["target only", "SpecCascade(a=0.7)",
                                                          "SpecCascade(a=0.7) + Step(L=1)"]
    assert "custom refused" in err and f"wrote {link}\n" in err and link.is_symlink()


def test_json_is_strict_an_undefined_acceptance_rate_is_null(loads, tmp_path, capsys) -> None:
    """With one new token nothing drafted is verified: the acceptance rate is undefined (NaN), which was
    written as the NaN token, not JSON; it is null, and shown as "-"."""
    out = tmp_path / "answers.json"
    assert demo.run(parse("--max-new-tokens", "1", "--json", str(out))) == 0

    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    rows = json.loads(out.read_text(), parse_constant=refuse)
    assert [row["acceptance_rate"] for row in rows] == [None, None, None]
    assert "nan" not in capsys.readouterr().err.lower()


def test_answers_are_printed_with_control_characters_escaped() -> None:
    """A model's raw bytes (NUL, BEL, backspace, ESC) could drive the terminal; they are shown escaped."""
    line = demo.show(demo.Answer("custom", "p", "c", "a\x00b\x07c\x08d\x1b[2Je\nf", 5, 1.0, None, False), 120)
    assert not any(ord(char) < 32 for char in line)
    assert line.endswith("a\\x00b\\x07c\\x08d\\x1b[2Je f")


def test_help_gives_the_defaults_of_l_and_max_new_tokens(capsys) -> None:
    parser = argparse.ArgumentParser()
    demo.configure(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "lossless response prefix length (default: 1)" in text
    assert "--max-new-tokens MAX_NEW_TOKENS new tokens per answer at most (default: 40)" in text
