"""`import hf_securesd` is light: its public names load on first use (PEP 562), so the `securesd` command's
help does not wait for torch and transformers, and every name in `__all__` still resolves."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

import hf_securesd


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_importing_the_package_or_the_command_loads_neither_torch_nor_transformers() -> None:
    out = _run("""
        import sys
        import hf_securesd, hf_securesd.cli
        from hf_securesd import cli
        try:
            cli.main(["--help"])
        except SystemExit:
            pass
        print("torch" in sys.modules, "transformers" in sys.modules)
    """)
    assert out.splitlines()[-1] == "False False"


@pytest.mark.parametrize("name", hf_securesd.__all__)
def test_every_public_name_resolves_to_the_object_its_module_defines(name) -> None:
    value = getattr(hf_securesd, name)
    if name == "hub":
        assert value is importlib.import_module("hf_securesd.hub")
    else:
        assert value is getattr(importlib.import_module(hf_securesd._EXPORTS[name], "hf_securesd"), name)


def test_from_imports_and_submodules_resolve_and_unknown_names_raise_attribute_error() -> None:
    from hf_securesd import MARS, Step, wrap  # noqa: F401  (from-imports go through __getattr__)

    assert hf_securesd.verifiers.MARS is MARS and hf_securesd.schedules.Step is Step
    assert {"wrap", "Step", "hub"} <= set(dir(hf_securesd))
    with pytest.raises(AttributeError, match="has no attribute 'not_a_name'"):
        hf_securesd.not_a_name


def test_a_submodule_whose_dependency_is_missing_shows_that_error() -> None:
    """A missing dependency inside a submodule is reported as the missing dependency, not as a missing
    attribute of the package."""
    out = _run("""
        import sys
        sys.modules["torch"] = None  # torch cannot be imported
        import hf_securesd
        for name in ("decoding", "wrap"):
            try:
                getattr(hf_securesd, name)
            except ModuleNotFoundError as error:
                print(name, error.name)
    """)
    assert out.splitlines() == ["decoding torch", "wrap torch"]
