"""AgentDojo (https://github.com/ethz-spylab/agentdojo): utility under attack for a Hugging Face chat
model decoded with or without SecureSD. Needs the optional extra: ``pip install "hf-securesd[agentdojo]"``.

`HFPromptingLLM` is an AgentDojo pipeline element that answers with `generate` on a local model
(target alone, or speculative with a draft, a verifier and a schedule). Tools are offered and called
in AgentDojo's own prompt-based format (its `PromptingLLM`): the tool schemas go into the system
message, and the model calls tools as a Python list inside tags, e.g.
``<function-call>[get_balance(), send_money(recipient="X", amount=1.0)]</function-call>``, or ends
with ``<function-call>[]</function-call><answer>...</answer>``. Tool results come back as user turns
``<function-call>...</function-call><function-result>...</function-result>``. Text inside the turns
cannot forge chat-template control tokens: the tokenizer's special and added token strings, and
their look-alikes that a normalising tokenizer reads as them (fullwidth forms, other case), are
broken with a zero-width space before the template is applied; text the tokenizer still reads as a
control token is refused.

`run_agentdojo` runs user tasks × injection tasks of one suite under one attack and returns the
utility under attack (UUA: the user task is solved although the environment carries the injection)
and the attack success rate (the injection task was carried out); `security` is 1 − that rate,
higher-is-better like the harness's AFR. A pair that fails with an error is recorded with the error
and left out of the figures; the run goes on.

    >>> from hf_securesd.bench.agentdojo import run_agentdojo
    >>> result = run_agentdojo(target, draft, tokenizer, suite="banking", verifier="mars",
    ...                        schedule=Step(L=1), limit=4, injection_limit=2)  # doctest: +SKIP
    >>> result["utility_under_attack"], result["attack_success_rate"]        # doctest: +SKIP

From the shell: ``securesd agentdojo --target qwen-1.5b --draft qwen-0.5b --verifier mars:0.5
--schedule step:1 --suite banking --limit 4 --injection-limit 2 --out agentdojo.json``.

The modules, one job each (this package re-exports their public names):

- `choices`: benchmark version, suite, attack, defense and task choices, their defaults, and
  `plan_run`, which checks them;
- `control_tokens`: breaking control-token strings in message text;
- `replies`: the tool-call tags and the checks on a reply before AgentDojo's parser reads it;
- `element`: `HFPromptingLLM`, the pipeline element (prompt rendering, `generate`, parsing);
- `runner`: `run_agentdojo`, the pairs and their figures;
- `cli`: ``securesd agentdojo`` (`configure`, `run`), its model loading and result writing.

The extra is checked here, before any of them loads: without it, importing this package or any of
its modules raises one ImportError naming the install command.
"""

from __future__ import annotations

INSTALL_HINT = 'pip install "hf-securesd[agentdojo]"'

try:
    from agentdojo.agent_pipeline import AgentPipeline, BasePipelineElement, PipelineConfig, PromptingLLM
    from agentdojo.agent_pipeline.agent_pipeline import DEFENSES
    from agentdojo.agent_pipeline.llms.prompting_llm import InvalidModelOutputError
    from agentdojo.ast_utils import ASTParsingError, create_python_function_from_tool_call
    from agentdojo.attacks import BaseAttack, load_attack
    from agentdojo.attacks.attack_registry import ATTACKS
    from agentdojo.functions_runtime import EmptyEnv, Env, FunctionCall, FunctionsRuntime
    from agentdojo.task_suite import load_suites
    from agentdojo.task_suite.task_suite import TaskSuite
    from agentdojo.types import (
        ChatAssistantMessage,
        ChatMessage,
        get_text_content_as_str,
        text_content_block_from_string,
    )
    from openai.types.chat import ChatCompletionMessage
except ImportError as error:  # the optional extra is not installed
    raise ImportError(f"AgentDojo support needs the agentdojo package: {INSTALL_HINT}") from error

from hf_securesd.bench.agentdojo.choices import (
    BENCHMARK_VERSION,
    DEFAULT_ATTACK,
    DEFAULT_SUITE,
    SUPPORTED_DEFENSES,
    UNSUPPORTED_DEFENSES,
    plan_run,
)
from hf_securesd.bench.agentdojo.cli import (
    check_out_path,
    configure,
    load_models,
    load_target,
    run,
    write_result,
)
from hf_securesd.bench.agentdojo.control_tokens import TOKEN_BREAK
from hf_securesd.bench.agentdojo.element import PIPELINE_NAME, HFPromptingLLM
from hf_securesd.bench.agentdojo.replies import CALL_CLOSE, CALL_OPEN, MAX_PARSED_REPLY_CHARS
from hf_securesd.bench.agentdojo.runner import run_agentdojo

__all__ = [
    # this package
    "BENCHMARK_VERSION",
    "CALL_CLOSE",
    "CALL_OPEN",
    "DEFAULT_ATTACK",
    "DEFAULT_SUITE",
    "HFPromptingLLM",
    "INSTALL_HINT",
    "MAX_PARSED_REPLY_CHARS",
    "PIPELINE_NAME",
    "SUPPORTED_DEFENSES",
    "TOKEN_BREAK",
    "UNSUPPORTED_DEFENSES",
    "check_out_path",
    "configure",
    "load_models",
    "load_target",
    "plan_run",
    "run",
    "run_agentdojo",
    "write_result",
    # AgentDojo's names, imported above to check the extra and available here as before the split
    "ASTParsingError",
    "ATTACKS",
    "AgentPipeline",
    "BaseAttack",
    "BasePipelineElement",
    "ChatAssistantMessage",
    "ChatCompletionMessage",
    "ChatMessage",
    "DEFENSES",
    "EmptyEnv",
    "Env",
    "FunctionCall",
    "FunctionsRuntime",
    "InvalidModelOutputError",
    "PipelineConfig",
    "PromptingLLM",
    "TaskSuite",
    "create_python_function_from_tool_call",
    "get_text_content_as_str",
    "load_attack",
    "load_suites",
    "text_content_block_from_string",
]
