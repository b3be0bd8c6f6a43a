"""The three metric modules each carry their own copy of the argument checks: PRR and flips are Hub Spaces
that need only numpy, datasets and evaluate (importing them from hf_securesd would pull in torch and
transformers), and AFR keeps the same copy. The copies must not drift apart."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

import hf_securesd.metrics

SHARED = ("_is_whole", "_check_rows", "_resample_count", "_confidence_level", "_seed")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"metric_{name}", f"{hf_securesd.metrics.path(name)}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("helper", SHARED)
def test_the_argument_checks_are_the_same_in_every_metric(helper: str) -> None:
    sources = {name: inspect.getsource(getattr(_module(name), helper)) for name in ("prr", "afr", "flips")}
    assert len(set(sources.values())) == 1, f"{helper} differs between {sorted(sources)}"
