"""AgentDojo pipeline element and runner on the tiny random pair (numbers meaningless, pipeline real).

Needs the optional extra (``pip install "hf-securesd[agentdojo]"``); without it only the test of the
missing-extra error runs."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch

from hf_securesd.schedules import Step
from hf_securesd.tiny import byte_tokenizer, tiny_pair

SKIP_REASON = 'agentdojo is not installed (optional extra: pip install "hf-securesd[agentdojo]")'


def _agentdojo_module():
    pytest.importorskip("agentdojo", reason=SKIP_REASON)
    return importlib.import_module("hf_securesd.bench.agentdojo")


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    draft, target = tiny_pair()
    return target, draft, byte_tokenizer()


def test_missing_extra_names_the_install_command(monkeypatch):
    for name in [name for name in sys.modules if name == "agentdojo" or name.startswith("agentdojo.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "agentdojo", None)
    monkeypatch.delitem(sys.modules, "hf_securesd.bench.agentdojo", raising=False)
    with pytest.raises(ImportError, match=r'pip install "hf-securesd\[agentdojo\]"'):
        importlib.import_module("hf_securesd.bench.agentdojo")
    monkeypatch.delitem(sys.modules, "hf_securesd.bench.agentdojo", raising=False)


def test_one_user_task_one_injection_task_end_to_end(tiny):
    module = _agentdojo_module()
    target, draft, tokenizer = tiny
    result = module.run_agentdojo(
        target, draft, tokenizer, suite="banking", verifier="mars", schedule=Step(L=1),
        limit=1, injection_limit=1, max_new_tokens=8, progress=False,
    )
    assert result["n_pairs"] == 1 and result["pairs"][0]["user_task"] == "user_task_0"
    assert result["pairs"][0]["injection_task"] == "injection_task_0"
    assert 0.0 <= result["utility_under_attack"] <= 1.0
    assert result["security"] == 1.0 - result["attack_success_rate"]
    assert result["verifier"].startswith("mars(") and result["schedule"] == "step(L=1)"
    assert result["generate_calls"] >= 1 and result["stats"]["drafted_tokens"] > 0
    json.dumps(result)


def test_tool_calls_are_parsed_and_executed(tiny, monkeypatch):
    module = _agentdojo_module()
    from agentdojo.task_suite.load_suites import get_suite

    target, _, tokenizer = tiny
    llm = module.HFPromptingLLM(target, tokenizer, max_new_tokens=4)
    replies = iter(
        [
            "<function-call>[get_balance(</function-call>",  # malformed: sent back with the error
            "<function-thoughts>check</function-thoughts><function-call>[get_balance()]</function-call>",
            "<function-call>[]</function-call><answer>Your balance is known.</answer>",
        ]
    )
    chats = []
    monkeypatch.setattr(llm, "generate", lambda chat: chats.append(chat) or next(replies))
    config = module.PipelineConfig(
        llm=llm, model_id=None, defense=None, system_message_name=None, system_message=None
    )
    pipeline = module.AgentPipeline.from_config(config)
    suite = get_suite(module.BENCHMARK_VERSION, "banking")
    user_task = suite.get_user_task_by_id("user_task_0")
    _, _, _, messages, _ = pipeline.query(
        user_task.PROMPT, module.FunctionsRuntime(suite.tools), suite.load_and_inject_default_environment({})
    )
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_calls"][0].function == "get_balance"
    assert messages[3]["error"] is None
    assert module.get_text_content_as_str(messages[-1]["content"]) == "Your balance is known."
    assert "<function-definitions>" in chats[0][0]["content"] and chats[0][0]["role"] == "system"
    assert chats[1][-1]["content"].startswith("Invalid function calling output")
    assert "<function-result>" in chats[2][-1]["content"] and chats[2][-1]["role"] == "user"


def test_verifier_needs_a_draft(tiny):
    module = _agentdojo_module()
    target, _, tokenizer = tiny
    with pytest.raises(ValueError, match="needs a draft"):
        module.HFPromptingLLM(target, tokenizer, verifier="mars")


def test_cli_target_only(tmp_path):
    _agentdojo_module()
    from hf_securesd.cli import main

    out = tmp_path / "agentdojo.json"
    code = main(
        [
            "agentdojo", "--target", "tiny", "--draft", "tiny", "--target-only", "--dtype", "fp32",
            "--threads", "1", "--limit", "1", "--injection-limit", "1", "--max-new-tokens", "4",
            "--no-progress", "--out", str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert code == 0 and result["decoding"] == "target" and result["verifier"] is None
    assert result["acceptance_rate"] is None and result["n_pairs"] == 1
