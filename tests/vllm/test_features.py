"""Feature detection (hf_securesd/vllm/features.py): the declared symbols against signatures and
source trees, the installed vLLM, and what a mismatch does: SecureSD requests fail naming the symbol
and the supported releases, nothing is patched, plain requests are served.

The engine-free tests build small fake source trees; the rest need vLLM (.ci/vllm.sh)."""

from __future__ import annotations

import inspect
import os
import textwrap
from pathlib import Path

import pytest
from plugin_state import plugin_environment
from vllm_support import requires_vllm

from hf_securesd.vllm.features import (
    REQUIRED,
    SUPPORTED_RELEASES,
    Param,
    Symbol,
    check_source_tree,
    mismatch_message,
    signature_problem,
)

SAMPLE = Symbol("m", "Runner._sample", "callable", ("logits", "spec_decode_metadata"), "none")
CALLED = Symbol("m", "apply_top_k_top_p", "callable", ("logits", "k", "p"), "defaulted")
WRAPPED = Symbol("m", "rejection_sample", "callable", ("draft_token_ids", "num_draft_tokens"))


def params(*names: str) -> list[Param]:
    """'x' positional, 'x=' with a default, '*x', '**x', 'kw:x' keyword-only."""
    out = []
    for name in names:
        if name.startswith("**"):
            out.append(Param(name[2:], "var_keyword", False))
        elif name.startswith("*"):
            out.append(Param(name[1:], "var_positional", False))
        elif name.startswith("kw:"):
            out.append(Param(name[3:].rstrip("="), "keyword", name.endswith("=")))
        else:
            out.append(Param(name.rstrip("="), "positional", name.endswith("=")))
    return out


@pytest.mark.parametrize(
    "symbol, signature, is_method, problem",
    [
        (SAMPLE, params("self", "logits", "spec_decode_metadata"), True, None),
        (SAMPLE, params("self", "logits", "metadata"), True, "needs (logits, spec_decode_metadata) first"),
        (SAMPLE, params("self", "logits", "spec_decode_metadata", "state="), True, "would drop state=..."),
        (CALLED, params("logits", "k", "p", "has_topp_only_rows="), False, None),  # vLLM 0.33
        (CALLED, params("logits", "k", "p", "mode"), False, "without mode, which has no default"),
        (CALLED, params("logits", "p", "k"), False, "needs (logits, k, p) first"),
        (WRAPPED, params("draft_token_ids", "num_draft_tokens", "kw:fly_window_size="), False, None),  # 0.33
        (WRAPPED, params("draft_token_ids", "num_draft_tokens", "fly_window_size", "*rest"), False, None),
        (WRAPPED, params("num_draft_tokens", "draft_token_ids"), False,
         "needs (draft_token_ids, num_draft_tokens)"),
        (Symbol("m", "E.__init__", "callable", ("message",), "defaulted", keywords=("parameter",)),
         params("self", "message", "kw:value="), True, "passes parameter by name"),
        (Symbol("m", "E.__init__", "callable", ("message",), "defaulted", keywords=("parameter",)),
         params("self", "message", "**kwargs"), True, None),
    ],
)
def test_signature_rules(symbol, signature, is_method, problem):
    found = signature_problem(symbol, signature, is_method)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


FAKE_SYMBOLS = (
    Symbol("vllm.sample", "rejection_sample", "callable", ("draft_token_ids", "num_draft_tokens")),
    Symbol("vllm.sample", "PLACEHOLDER_TOKEN_ID", "constant"),
    Symbol("vllm.sample", "Sampler.forward", "callable", uses=("rejection_sample",)),
    Symbol("vllm.batch", "InputBatch", "class", fields=("req_ids", "num_computed_tokens_cpu", "extra_args")),
    Symbol("vllm.ops", "apply_top_k_top_p", "callable", ("logits", "k", "p"), "defaulted"),
)
GOOD_TREE = {
    "vllm/__init__.py": "",
    "vllm/base.py": """
        class Base:
            extra_args: dict | None = None
    """,
    "vllm/batch.py": """
        from vllm.base import Base

        class InputBatch(Base):
            def __init__(self):
                self.num_computed_tokens_cpu = None

            @property
            def req_ids(self):
                return []
    """,
    "vllm/sample.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            pass
        PLACEHOLDER_TOKEN_ID: int = -1

        def rejection_sample(draft_token_ids, num_draft_tokens, *, fly_window_size=None, fly_entropy_top_k=3):
            return None

        class Sampler:
            def forward(self, x):
                return rejection_sample(x, 1)
    """,
    "vllm/ops.py": """
        def apply_top_k_top_p(logits, k, p, has_topp_only_rows=True):
            return logits
    """,
}


def test_source_tree_with_the_additions_of_a_newer_release_matches(tmp_path):
    assert check_source_tree(write_tree(tmp_path, GOOD_TREE), FAKE_SYMBOLS) == []


@pytest.mark.parametrize(
    "file, old, new, symbol, problem",
    [
        ("vllm/ops.py", "has_topp_only_rows=True", "has_topp_only_rows", "apply_top_k_top_p", "no default"),
        ("vllm/sample.py", "return rejection_sample(x, 1)", "return None", "Sampler.forward",
         "no longer calls rejection_sample"),
        ("vllm/sample.py", "PLACEHOLDER_TOKEN_ID: int = -1", "PLACEHOLDER = -1", "PLACEHOLDER_TOKEN_ID",
         "not found"),
        ("vllm/batch.py", "self.num_computed_tokens_cpu = None", "self.computed = None", "InputBatch",
         "has no num_computed_tokens_cpu"),
        ("vllm/base.py", "extra_args: dict | None = None", "other: int = 0", "InputBatch",
         "has no extra_args"),
        ("vllm/sample.py", "def rejection_sample(draft_token_ids,", "def rejection_sample(token_ids,",
         "rejection_sample", "needs (draft_token_ids, num_draft_tokens) first"),
    ],
    ids=["new-required-parameter", "no-longer-called", "constant-renamed", "field-renamed", "base-field",
         "parameter-renamed"],
)
def test_source_tree_mismatches_name_the_symbol(tmp_path, file, old, new, symbol, problem):
    files = dict(GOOD_TREE)
    assert old in files[file]
    files[file] = files[file].replace(old, new)
    mismatches = check_source_tree(write_tree(tmp_path, files), FAKE_SYMBOLS)
    assert [m.symbol.path for m in mismatches] == [symbol]
    assert problem in str(mismatches[0])


def test_missing_module_is_a_mismatch(tmp_path):
    (mismatch,) = check_source_tree(write_tree(tmp_path, {"vllm/__init__.py": ""}), FAKE_SYMBOLS[:1])
    assert "module vllm.sample not found" in str(mismatch)


def test_mismatch_message_names_the_symbol_and_the_releases(tmp_path):
    mismatches = check_source_tree(write_tree(tmp_path, {"vllm/__init__.py": ""}), FAKE_SYMBOLS[:2])
    message = mismatch_message("0.40.0", mismatches)
    assert "vllm.sample.rejection_sample" in message
    assert "(and 1 more: vllm.sample.PLACEHOLDER_TOKEN_ID" in message
    assert SUPPORTED_RELEASES in message and "0.40.0" in message and 'without "securesd"' in message


@requires_vllm()
def test_installed_vllm_and_its_source_match_every_required_symbol():
    import vllm

    from hf_securesd.vllm.features import check_installed

    assert check_installed() == []
    assert check_source_tree(Path(vllm.__file__).parent.parent) == []


def fake_extra_parameter(monkeypatch) -> str:
    """Give GPUModelRunner._sample the signature a release with one more parameter would have (its
    code is unchanged); returns the symbol's name."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sample = GPUModelRunner._sample
    extra = inspect.Parameter("sampling_state", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    signature = inspect.signature(sample)
    changed = signature.replace(parameters=[*signature.parameters.values(), extra])
    monkeypatch.setattr(sample, "__signature__", changed, raising=False)
    return "vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample"


@requires_vllm()
def test_faked_signature_mismatch_is_detected():
    from hf_securesd.vllm.features import check_installed

    # vLLM's own methods, not the plugin's wrappers; the fake is undone before the plugin comes back
    with plugin_environment(), pytest.MonkeyPatch.context() as patch:
        name = fake_extra_parameter(patch)
        (mismatch,) = check_installed()
    assert mismatch.symbol.name == name and "would drop sampling_state" in mismatch.problem


@requires_vllm()
def test_mismatch_refuses_securesd_requests_and_patches_nothing():
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from hf_securesd.vllm import register

    with plugin_environment(SECURESD_VLLM="1"), pytest.MonkeyPatch.context() as patch:
        name = fake_extra_parameter(patch)
        original = GPUModelRunner._sample
        register()
        assert GPUModelRunner._sample is original
        assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
        SamplingParams(max_tokens=4)
        with pytest.raises(ValueError, match="cannot run SecureSD") as refused:
            SamplingParams(max_tokens=4, extra_args={"securesd": {"verifier": "lossless"}})
        assert name in str(refused.value) and SUPPORTED_RELEASES in str(refused.value)


@requires_vllm()
def test_engine_with_a_mismatch_serves_plain_requests_and_refuses_securesd(pair_dir, probe_without_plugin):
    from conftest import run_engine_probe

    environment = {"SECURESD_VLLM": "1", "VLLM_USE_V2_MODEL_RUNNER": None}
    probe = run_engine_probe(pair_dir, environment, "fake-mismatch")
    assert probe["tokens"] == probe_without_plugin["tokens"]
    assert not probe["patched"] and probe["runner_env"] is None
    refusal = probe["refusal"] or ""
    assert "GPUModelRunner._sample" in refusal and "would drop sampling_state" in refusal
    assert SUPPORTED_RELEASES in refusal


def test_required_symbols_are_unique_and_named():
    names = [symbol.name for symbol in REQUIRED]
    assert len(names) == len(set(names))
    assert {"vllm.v1.sample.rejection_sampler.rejection_sample",
            "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p",
            "vllm.v1.sample.rejection_sampler.PLACEHOLDER_TOKEN_ID"} <= set(names)
