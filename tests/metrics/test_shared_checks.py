"""The three metric modules each carry their own copy of the argument checks: PRR and flips are Hub Spaces
that need only numpy, datasets and evaluate (importing them from hf_securesd would pull in torch and
transformers), and AFR keeps the same copy. The copies must not drift apart."""

from __future__ import annotations

import importlib.util
import inspect

import numpy as np

import pytest

import hf_securesd.metrics

SHARED = ("_is_whole", "_check_rows", "_confidence_level", "_accepted_arguments", "_check_arguments", "_check_inputs_given")
NUMERIC = ("prr", "flips")  # the modules whose inputs are numbers
NUMERIC_SHARED = ("_check_number", "_check_numbers", "_is_number", "_fits_float")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"metric_{name}", f"{hf_securesd.metrics.path(name)}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("helper", SHARED)
def test_the_argument_checks_are_the_same_in_every_metric(helper: str) -> None:
    sources = {name: inspect.getsource(getattr(_module(name), helper)) for name in ("prr", "afr", "flips")}
    assert len(set(sources.values())) == 1, f"{helper} differs between {sorted(sources)}"


@pytest.mark.parametrize("helper", NUMERIC_SHARED)
def test_the_number_checks_are_the_same_in_every_numeric_metric(helper: str) -> None:
    sources = {name: inspect.getsource(getattr(_module(name), helper)) for name in NUMERIC}
    assert len(set(sources.values())) == 1, f"{helper} differs between {sorted(sources)}"


@pytest.mark.parametrize("n", [1, 3, 1000, 5000])
def test_resample_blocks_are_the_rows_of_one_draw_and_bounded(n: int, monkeypatch) -> None:
    """Drawing the bootstrap's (n_resamples, n) indices block by block gives numpy's default generator
    the same draws in the same order as drawing them at once, and no block holds more than
    max(n, _BLOCK_INDICES) indices."""
    module = _module("prr")
    monkeypatch.setattr(module, "_BLOCK_INDICES", 4096)
    blocks = list(module._resample_blocks(n, 37, np.random.default_rng(8)))
    assert max(block.size for block in blocks) <= max(n, 4096)
    assert np.array_equal(np.concatenate(blocks), np.random.default_rng(8).integers(0, n, size=(37, n)))
