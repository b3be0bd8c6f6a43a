"""Generation engines of the benchmark harness, registered by name (as lm-evaluation-harness
registers its models): ``hf`` (in-process transformers `generate`), ``vllm`` (an in-process
`vllm.LLM` with this package's plugin) and ``openai`` (any OpenAI-compatible server).

A new engine is one module with an `Engine` subclass decorated with `register_engine`, plus its
module path in `ENGINE_MODULES` (modules are imported only when their engine is asked for, so the
``hf`` engine never imports vLLM and ``openai`` never loads a model).

    >>> from hf_securesd.bench.engines import engine_class, engine_names
    >>> engine_names()
    ['hf', 'openai', 'vllm']
    >>> engine_class("hf").__name__
    'HFEngine'
"""

from __future__ import annotations

import importlib
from typing import Callable, TypeVar

from hf_securesd.bench.engines.base import (
    Answer,
    Engine,
    EngineError,
    Generation,
    GenerationFailure,
    Prompt,
)

ENGINE_MODULES: dict[str, str] = {
    "hf": "hf_securesd.bench.engines.hf",
    "vllm": "hf_securesd.bench.engines.vllm",
    "openai": "hf_securesd.bench.engines.openai",
}
_REGISTRY: dict[str, type[Engine]] = {}
EngineType = TypeVar("EngineType", bound=type[Engine])


def register_engine(name: str) -> Callable[[EngineType], EngineType]:
    """Class decorator: register an `Engine` subclass under `name` (sets its `name`)."""

    def register(cls: EngineType) -> EngineType:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"an engine named {name!r} is registered already ({_REGISTRY[name].__name__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return register


def engine_names() -> list[str]:
    """Every engine name: the built-in ones and any registered since."""
    return sorted({*ENGINE_MODULES, *_REGISTRY})


def engine_class(name: str) -> type[Engine]:
    """The engine registered as `name`, importing its module first when needed."""
    if name not in _REGISTRY and name in ENGINE_MODULES:
        importlib.import_module(ENGINE_MODULES[name])
    if name not in _REGISTRY:
        raise EngineError(f"unknown engine {name!r}; choose one of {', '.join(engine_names())}")
    return _REGISTRY[name]


__all__ = [
    "Answer",
    "ENGINE_MODULES",
    "Engine",
    "EngineError",
    "Generation",
    "GenerationFailure",
    "Prompt",
    "engine_class",
    "engine_names",
    "register_engine",
]
