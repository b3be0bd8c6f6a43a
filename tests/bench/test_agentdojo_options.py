"""Options of `run_agentdojo` and ``securesd agentdojo``: bad values are refused up front with a message
naming the problem and the valid choices (one ``error:`` line and exit 2 from the CLI, before any model
loads). Needs the optional extra (``pip install "hf-securesd[agentdojo]"``)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

SKIP_REASON = 'agentdojo is not installed (optional extra: pip install "hf-securesd[agentdojo]")'
pytest.importorskip("agentdojo", reason=SKIP_REASON)

from hf_securesd.bench import agentdojo as ad  # noqa: E402
from hf_securesd.bench.agentdojo import cli as ad_cli  # noqa: E402
from hf_securesd.cli import main  # noqa: E402
from hf_securesd.models import AssemblyError, ModelNotCachedError  # noqa: E402
from hf_securesd.tiny import byte_tokenizer, tiny_pair  # noqa: E402

ONE_PAIR = dict(limit=1, injection_limit=1)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    _, target = tiny_pair()
    return target, byte_tokenizer()


@pytest.fixture
def no_generate(monkeypatch):
    """Fail the test if a model turn is generated."""

    def generate(self, chat):
        raise AssertionError("a model turn was generated")

    monkeypatch.setattr(ad.HFPromptingLLM, "generate", generate)


BAD_RUNS = {
    "fractional limit": (dict(limit=2.5, injection_limit=1), r"limit must be a whole number >= 1, got 2\.5"),
    "zero limit": (dict(limit=0, injection_limit=1), "limit must be a whole number >= 1, got 0"),
    "negative limit": (dict(limit=-1, injection_limit=1), "limit must be a whole number >= 1, got -1"),
    "bool limit": (dict(limit=True, injection_limit=1), "limit must be a whole number >= 1, got True"),
    "zero injection limit": (dict(limit=1, injection_limit=0), "injection_limit must be a whole number >= 1"),
    "user task string": (
        dict(user_tasks="user_task_0", injection_limit=1),
        r"user_tasks must be a list of task ids, not a string: use \['user_task_0'\]",
    ),
    "injection task string": (
        dict(limit=1, injection_tasks="injection_task_0"),
        "injection_tasks must be a list of task ids, not a string",
    ),
    "empty user tasks": (dict(user_tasks=[], injection_limit=1), "user_tasks is empty"),
    "ids and limit": (
        dict(user_tasks=["user_task_0"], limit=1, injection_limit=1), "give user_tasks or limit, not both"
    ),
    "repeated id": (
        dict(user_tasks=["user_task_0", "user_task_0"], injection_limit=1), "user_tasks repeats user_task_0"
    ),
    "unknown user task": (
        dict(user_tasks=["user_task_999"], injection_limit=1),
        "unknown user_tasks 'user_task_999'; choose from user_task_0, ",
    ),
    "unknown injection task": (
        dict(limit=1, injection_tasks=["injection_task_99"]),
        "unknown injection_tasks 'injection_task_99'; choose from injection_task_0, ",
    ),
    "unknown suite": (dict(suite="bankin", **ONE_PAIR), "unknown AgentDojo suite 'bankin'; choose from .*banking"),
    "unknown version": (
        dict(benchmark_version="v9", **ONE_PAIR),
        r"unknown AgentDojo benchmark version 'v9'; choose from .*v1\.2\.2",
    ),
    "unknown attack": (
        dict(attack="nope", **ONE_PAIR), "unknown AgentDojo attack 'nope'; choose from .*important_instructions"
    ),
    "unknown defense": (
        dict(defense="nope", **ONE_PAIR), "defense 'nope' is not supported here; choose none or one of "
    ),
    "defense needing OpenAI": (
        dict(defense="tool_filter", **ONE_PAIR), r"not supported here \(needs an OpenAI client\)"
    ),
    "defense needing the Hub": (
        dict(defense="transformers_pi_detector", **ONE_PAIR), "detector model from the Hugging Face Hub"
    ),
    "zero max_new_tokens": (
        dict(max_new_tokens=0, **ONE_PAIR), "max_new_tokens must be a whole number >= 1, got 0"
    ),
    "zero num_assistant_tokens": (
        dict(num_assistant_tokens=0, **ONE_PAIR), "num_assistant_tokens must be a whole number >= 1, got 0"
    ),
}


@pytest.mark.parametrize(("options", "message"), BAD_RUNS.values(), ids=BAD_RUNS.keys())
def test_bad_run_options_are_refused_before_any_turn(tiny, no_generate, options, message):
    target, tokenizer = tiny
    with pytest.raises(ValueError, match=message):
        ad.run_agentdojo(target, None, tokenizer, progress=False, **options)


def test_max_attempts_must_be_a_positive_whole_number(tiny):
    target, tokenizer = tiny
    with pytest.raises(ValueError, match="max_attempts must be a whole number >= 1, got 0"):
        ad.HFPromptingLLM(target, tokenizer, max_attempts=0)


def test_the_supported_defenses_are_those_that_need_no_client_or_hub():
    assert set(ad.SUPPORTED_DEFENSES) == {"repeat_user_prompt", "spotlighting_with_delimiting"}
    assert set(ad.SUPPORTED_DEFENSES) | set(ad.UNSUPPORTED_DEFENSES) == set(ad.DEFENSES)


@pytest.mark.parametrize("defense", ["repeat_user_prompt", "spotlighting_with_delimiting"])
def test_supported_defenses_run(tiny, monkeypatch, defense):
    target, tokenizer = tiny
    monkeypatch.setattr(
        ad.HFPromptingLLM, "generate", lambda self, chat: "<function-call>[]</function-call><answer>done</answer>"
    )
    result = ad.run_agentdojo(target, None, tokenizer, defense=defense, progress=False, **ONE_PAIR)
    assert result["defense"] == defense and result["n_scored"] == 1


def _cli(monkeypatch, *args: str) -> int:
    """Run ``securesd agentdojo`` (sys.argv restored afterwards)."""
    monkeypatch.setattr(sys, "argv", sys.argv[:])
    return main(["agentdojo", *args])


@pytest.mark.parametrize(
    "option",
    [
        ["--limit", "-1"],
        ["--limit", "0"],
        ["--injection-limit", "0"],
        ["--max-new-tokens", "0"],
        ["--max-new-tokens", "-5"],
        ["--num-assistant-tokens", "0"],
        ["--threads", "0"],
        ["--threads", "-1"],
    ],
    ids=" ".join,
)
def test_cli_counts_must_be_positive(monkeypatch, capsys, option):
    with pytest.raises(SystemExit) as exit_info:
        _cli(monkeypatch, "--target", "tiny", "--draft", "tiny", *option)
    assert exit_info.value.code == 2
    assert f"argument {option[0]}: expected a whole number >= 1" in capsys.readouterr().err


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if the CLI loads a model."""

    def load_models(args, device):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ad_cli, "load_models", load_models)


SPECULATIVE = ["--target", "tiny", "--draft", "tiny", "--no-progress"]
BAD_CLI = {
    "suite": (SPECULATIVE + ["--suite", "bankin"], "unknown AgentDojo suite 'bankin'; choose from"),
    "attack": (SPECULATIVE + ["--attack", "nope"], "unknown AgentDojo attack 'nope'; choose from"),
    "defense": (SPECULATIVE + ["--defense", "nope"], "AgentDojo defense 'nope' is not supported here"),
    "defense tool_filter": (SPECULATIVE + ["--defense", "tool_filter"], "needs an OpenAI client"),
    "defense pi detector": (SPECULATIVE + ["--defense", "transformers_pi_detector"], "from the Hugging Face Hub"),
    "device": (SPECULATIVE + ["--device", "nope"], "unknown device 'nope'"),
    "out folder": (SPECULATIVE + ["--out", "{tmp}"], "--out {tmp} is a folder; give a file name"),
    "out under a file": (SPECULATIVE + ["--out", "{tmp}/file/x.json"], "{tmp}/file is a file, not a folder"),
    "verifier with target-only": (
        ["--target", "tiny", "--target-only", "--verifier", "mars:0.5"],
        "--verifier and --schedule apply to speculative decoding",
    ),
    "schedule with target-only": (
        ["--target", "tiny", "--target-only", "--schedule", "step:1"],
        "--verifier and --schedule apply to speculative decoding",
    ),
    "no draft": (["--target", "tiny"], "--draft is required for speculative decoding (or pass --target-only"),
    "verifier sweep": (SPECULATIVE + ["--verifier", "mars"], "--verifier needs exactly one knob value"),
}


@pytest.mark.parametrize(("args", "message"), BAD_CLI.values(), ids=BAD_CLI.keys())
def test_cli_bad_options_are_one_error_line_before_loading(monkeypatch, capsys, tmp_path, no_loading, args, message):
    (tmp_path / "file").write_text("")
    code = _cli(monkeypatch, *[arg.replace("{tmp}", str(tmp_path)) for arg in args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert message.replace("{tmp}", str(tmp_path)) in err


@pytest.mark.parametrize(
    "failure",
    [
        AssemblyError("qwen-1.5b", "download", "no network", "run `securesd models fetch qwen-1.5b` online"),
        ModelNotCachedError("qwen-1.5b: no bf16 copy in /cache; run `securesd models fetch qwen-1.5b`"),
        OSError("We couldn't connect to 'https://huggingface.co'.\nCheck your connection."),
    ],
    ids=lambda error: type(error).__name__,
)
def test_cli_load_failures_are_one_error_line(monkeypatch, capsys, failure):
    def load_models(args, device):
        raise failure

    monkeypatch.setattr(ad_cli, "load_models", load_models)
    code = _cli(monkeypatch, "--target", "qwen-1.5b", "--target-only")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("error: could not load the model(s) (--target qwen-1.5b): ")
    assert " ".join(str(failure).split()).rstrip(".") in err


def test_cli_missing_model_folder_is_one_error_line(monkeypatch, capsys, tmp_path):
    code = _cli(monkeypatch, "--target", str(tmp_path / "missing"), "--target-only")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: could not load the model(s)") and err.count("\n") == 1


def test_target_only_loads_a_folder_without_a_draft(tmp_path):
    _, target = tiny_pair()
    target.save_pretrained(tmp_path)
    byte_tokenizer().save_pretrained(tmp_path)
    model, tokenizer, ids = ad.load_target(str(tmp_path), device="cpu", dtype="fp32", offline=None, cache_dir=None)
    assert list(ids) == ["target"] and ids["target"]["location"] == str(tmp_path)
    assert model.dtype == torch.float32 and tokenizer.chat_template == byte_tokenizer().chat_template


def test_cli_prints_the_result_before_writing_it(monkeypatch, capsys, tmp_path):
    def write_result(path, text):
        raise OSError("No space left on device")

    monkeypatch.setattr(ad_cli, "write_result", write_result)
    monkeypatch.setattr(
        ad.HFPromptingLLM, "generate", lambda self, chat: "<function-call>[]</function-call><answer>done</answer>"
    )
    code = _cli(
        monkeypatch, "--target", "tiny", "--target-only", "--dtype", "fp32", "--limit", "1",
        "--injection-limit", "1", "--no-progress", "--out", str(tmp_path / "agentdojo.json"),
    )
    out, err = capsys.readouterr()
    assert code == 1 and json.loads(out)["n_pairs"] == 1
    out_path = tmp_path / "agentdojo.json"
    assert err == f"error: could not write --out {out_path}: No space left on device (the result is printed above)\n"
