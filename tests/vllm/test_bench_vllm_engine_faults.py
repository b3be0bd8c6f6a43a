"""The `vllm` bench engine when its engine core dies or is replaced, with a stand-in for
`vllm.LLM` (no engine is built): a dead engine fails the batch's prompts as recorded failures and is
rebuilt for the next batch; replacing an engine shuts the old one's processes down first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm_support import requires_vllm

from hf_securesd.bench.engines.base import Generation, GenerationFailure, Prompt
from hf_securesd.bench.engines.vllm import VLLMEngine
from hf_securesd.bench.plan import RunConfig

pytestmark = requires_vllm()


class FakeCore:
    def __init__(self) -> None:
        self.shutdowns = 0
        self.resources = SimpleNamespace(engine_dead=False)

    def shutdown(self) -> None:
        self.shutdowns += 1


class FakeLLM:
    """Answers with token 0 repeated, or raises `error` (marking the core dead when `dead`)."""

    def __init__(self, error: BaseException | None = None, dead: bool = True) -> None:
        self.core = FakeCore()
        self.llm_engine = SimpleNamespace(engine_core=self.core)
        self.error, self.dead = error, dead

    def generate(self, inputs, params, use_tqdm=False):
        if self.error is not None:
            self.core.resources.engine_dead = self.dead
            raise self.error
        completion = SimpleNamespace(token_ids=[0] * params.max_tokens)
        return [SimpleNamespace(outputs=[completion]) for _ in inputs]


class Tokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1, 2, 3]}

    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


@pytest.fixture
def engine(monkeypatch):
    built: list[FakeLLM] = []
    plan: list[FakeLLM] = []

    def build(kind):
        llm = plan.pop(0)
        built.append(llm)
        return llm

    vllm_engine = VLLMEngine("target-dir", "draft-dir", Tokenizer(), dtype="fp32")

    def engine_for(kind):
        if vllm_engine._llm_kind != kind:
            vllm_engine.close()
            vllm_engine._llm, vllm_engine._llm_kind = build(kind), kind
        return vllm_engine._llm

    monkeypatch.setattr(vllm_engine, "_engine_for", engine_for)
    return vllm_engine, plan, built


PROMPTS = [Prompt(text="a", messages=[]), Prompt(text="b", messages=[])]
TARGET = RunConfig(kind="target")


def test_a_dead_engine_fails_the_batch_and_is_rebuilt(engine):
    from vllm.v1.engine.exceptions import EngineDeadError

    vllm_engine, plan, built = engine
    plan += [FakeLLM(EngineDeadError()), FakeLLM()]
    failed = vllm_engine.generate(TARGET, PROMPTS, 4, 5)
    assert all(isinstance(answer, GenerationFailure) for answer in failed) and len(failed) == 2
    assert "died" in failed[0].error and built[0].core.shutdowns == 1
    answered = vllm_engine.generate(TARGET, PROMPTS, 4, 5)
    assert [answer.new_tokens for answer in answered if isinstance(answer, Generation)] == [4, 4]
    assert len(built) == 2


def test_an_executor_failure_of_a_dead_core_is_a_failure_not_a_crash(engine):
    vllm_engine, plan, _ = engine
    plan.append(FakeLLM(RuntimeError("Executor failed."), dead=True))
    assert all(isinstance(a, GenerationFailure) for a in vllm_engine.generate(TARGET, PROMPTS, 4, 5))


def test_other_errors_propagate(engine):
    vllm_engine, plan, _ = engine
    plan.append(FakeLLM(ValueError("bad request"), dead=False))
    with pytest.raises(ValueError, match="bad request"):
        vllm_engine.generate(TARGET, PROMPTS, 4, 5)


def test_replacing_an_engine_shuts_the_old_one_down(engine):
    vllm_engine, plan, built = engine
    plan += [FakeLLM(), FakeLLM()]
    vllm_engine.generate(TARGET, PROMPTS, 4, 5)
    vllm_engine.generate(RunConfig(kind="draft"), PROMPTS, 4, 5)
    assert built[0].core.shutdowns == 1 and built[1].core.shutdowns == 0
    vllm_engine.close()
    assert built[1].core.shutdowns == 1
