"""No side effects until asked: without SECURESD_VLLM=1 (or SECURESD_VLLM_DEFAULT) the plugin leaves
vLLM as it is (no patch, no runner selection, no log line) and only refuses a SecureSD request with how
to enable it; with the opt-in it logs exactly one WARNING saying what it changed.

The `register()` tests call the entry point in this process; one engine test compares a real engine
with the package installed but not enabled against one without the plugin at all."""

from __future__ import annotations

import logging

import pytest
from plugin_state import plugin_environment
from vllm_support import requires_vllm

from hf_securesd.vllm import DEFAULT_ENV, OPT_IN_ENV

pytestmark = requires_vllm()

ASKS = {"securesd": {"verifier": {"verifier": "mars", "theta": 0.5}}}


def patched_symbols() -> dict[str, object]:
    """The vLLM attributes the plugin replaces when it installs, by name."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return {
        "_sample": GPUModelRunner._sample,
        "propose_draft_token_ids": GPUModelRunner.propose_draft_token_ids,
        "_sample_draft_tokens": SpecDecodeBaseProposer._sample_draft_tokens,
        "rejection_sample": rejection_sampler.rejection_sample,
        "apply_sampling_constraints": rejection_sampler.apply_sampling_constraints,
        "_validate_params": InputProcessor._validate_params,
        "_verify_args": SamplingParams._verify_args,
    }


def plugin_records(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name.startswith("hf_securesd")]


def test_without_opt_in_only_securesd_requests_are_refused(caplog):
    import os

    from vllm.sampling_params import SamplingParams

    from hf_securesd.vllm import register

    with plugin_environment():
        original = patched_symbols()
        caplog.set_level(logging.DEBUG)
        register()
        after = patched_symbols()
        assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
        assert {name: after[name] is original[name] for name in original} == {
            **{name: True for name in original}, "_verify_args": False
        }
        assert not [record for record in plugin_records(caplog) if record.levelno >= logging.INFO]
        SamplingParams(max_tokens=4)
        SamplingParams(max_tokens=4, extra_args={"securesd": None})
        SamplingParams(max_tokens=4, extra_args={"other": 1})
        with pytest.raises(ValueError, match=r"off in this server: start vLLM with SECURESD_VLLM=1"):
            SamplingParams(max_tokens=4, extra_args=ASKS)
        with pytest.raises(ValueError, match="SECURESD_VLLM=1"):
            SamplingParams(max_tokens=4, extra_args={"securesd": "{not json"})
        for key in ("secure_sd", "SecureSD", "securesd_config"):  # securesd written otherwise asks too (it was
            with pytest.raises(ValueError, match="SECURESD_VLLM=1"):  # served plain)
                SamplingParams(max_tokens=4, extra_args={key: "lossless"})
        for key in ("secured", "secures", "secure_s"):  # other keys, however close, stay vLLM's own business
            SamplingParams(max_tokens=4, extra_args={key: "x"})


@pytest.mark.parametrize("variables", [{}, {OPT_IN_ENV: "0", DEFAULT_ENV: '{"verifier": "mars"}'}],
                         ids=["unset", "SECURESD_VLLM=0"])
def test_without_opt_in_beam_search_and_top_level_securesd_requests_are_refused(variables):
    """Beam search builds its own parameters without vllm_xargs, and the server drops a top-level field, so
    the SamplingParams refusal never sees either: the OpenAI request classes refuse them where they build
    a request's parameters."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.exceptions import VLLMValidationError

    from hf_securesd.vllm import register, uninstall

    def beam(cls, xargs):
        fields = dict(prompt="hi") if cls is CompletionRequest else dict(messages=[{"role": "user", "content": "hi"}])
        request = cls(model="m", max_tokens=4, use_beam_search=True, n=2, vllm_xargs=xargs, **fields)
        return request.to_beam_search_params(4, {})

    with plugin_environment(**variables):
        originals = {cls: cls.__dict__["to_beam_search_params"] for cls in (CompletionRequest, ChatCompletionRequest)}
        register()
        for cls in (CompletionRequest, ChatCompletionRequest):
            with pytest.raises(VLLMValidationError, match="plugin is off in this server") as refused:
                beam(cls, {"securesd": "lossless"})
            assert refused.value.parameter == "vllm_xargs.securesd"
            with pytest.raises(VLLMValidationError, match="plugin is off in this server"):
                beam(cls, {"securesd": "{not json"})
            assert beam(cls, None).beam_width == 2  # plain beam search, and an opt-out, run as in vLLM
            assert beam(cls, {"securesd": "null"}).beam_width == 2
            fields = dict(prompt="hi") if cls is CompletionRequest else dict(messages=[{"role": "user", "content": "hi"}])
            for key in ("securesd", "secure_sd"):  # a top-level field, or a misspelling, beam search or not
                with pytest.raises(VLLMValidationError, match="plugin is off in this server"):
                    cls(model="m", max_tokens=4, **{key: "lossless"}, **fields).to_sampling_params(4, {})
                with pytest.raises(VLLMValidationError, match="plugin is off in this server"):
                    cls(model="m", max_tokens=4, use_beam_search=True, n=2, **{key: "lossless"},
                        **fields).to_beam_search_params(4, {})
            assert cls(model="m", max_tokens=4, **fields).to_sampling_params(4, {}).max_tokens == 4
        uninstall(refuse=False)  # the refusals are undone with the rest
        assert all(cls.__dict__["to_beam_search_params"] is original for cls, original in originals.items())
        assert beam(CompletionRequest, {"securesd": "lossless"}).beam_width == 2  # vLLM's own method again


def test_explicit_off_keeps_the_default_from_applying():
    from vllm.sampling_params import SamplingParams

    from hf_securesd.vllm import register

    with plugin_environment(**{OPT_IN_ENV: "0", DEFAULT_ENV: '{"verifier": "mars"}'}):
        register()
        SamplingParams(max_tokens=4)  # would inherit the default if the plugin were on
        with pytest.raises(ValueError, match=r"\(SECURESD_VLLM=0\)") as refused:
            SamplingParams(max_tokens=4, extra_args=ASKS)
        # The default is set and ignored: the refusal must not offer it as the way in.
        assert "or a server-wide default" not in str(refused.value)
        assert "0 keeps it off even with SECURESD_VLLM_DEFAULT set" in str(refused.value)


def test_unknown_opt_in_value_is_refused_by_name():
    from vllm.sampling_params import SamplingParams

    from hf_securesd.vllm import register

    with plugin_environment(**{OPT_IN_ENV: "yes"}):
        register()
        assert patched_symbols()["_sample"].__qualname__ == "GPUModelRunner._sample"
        with pytest.raises(ValueError, match=r"SECURESD_VLLM='yes' is not understood"):
            SamplingParams(max_tokens=4, extra_args=ASKS)


@pytest.mark.parametrize("variables", [{OPT_IN_ENV: "1"}, {DEFAULT_ENV: '{"verifier": "lossless"}'}],
                         ids=["SECURESD_VLLM=1", "SECURESD_VLLM_DEFAULT"])
def test_opt_in_patches_selects_the_runner_and_logs_one_warning(caplog, variables):
    import os

    from hf_securesd.vllm import register, uninstall

    with plugin_environment(**variables):
        original = patched_symbols()
        caplog.set_level(logging.DEBUG)
        register()
        assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
        after = patched_symbols()
        assert all(after[name] is not original[name] for name in original if name != "_verify_args")
        warnings = [record for record in plugin_records(caplog) if record.levelno >= logging.WARNING]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        assert "VLLM_USE_V2_MODEL_RUNNER=0" in warnings[0].getMessage()
        assert "GPUModelRunner._sample" in warnings[0].getMessage()
        uninstall(refuse=False)
        assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
        assert patched_symbols() == original


def test_after_uninstall_securesd_requests_are_refused_until_registered_again():
    """uninstall() removes the patches; a SecureSD request must then be refused, not run as plain vLLM.
    register() serves them again; uninstall(refuse=False) leaves vLLM's own methods."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from hf_securesd.vllm import register, uninstall

    with plugin_environment(**{OPT_IN_ENV: "1"}):
        original = patched_symbols()
        uninstall()  # never enabled in this process: vLLM as it is, nothing to refuse
        assert patched_symbols() == original
        register()
        SamplingParams(max_tokens=4, extra_args=ASKS)
        uninstall()
        after = patched_symbols()
        assert {name: after[name] is original[name] for name in original} == {
            **{name: True for name in original}, "_verify_args": False
        }
        with pytest.raises(ValueError, match=r"was uninstalled in this process .*call hf_securesd.vllm.register\(\)"):
            SamplingParams(max_tokens=4, extra_args=ASKS)
        assert SamplingParams(max_tokens=4).max_tokens == 4  # plain requests run as in vLLM
        with pytest.raises(VLLMValidationError, match="was uninstalled in this process"):
            CompletionRequest(model="m", prompt="hi", max_tokens=4, securesd="lossless").to_sampling_params(4, {})
        uninstall()  # twice: the refusal stays, and register() lifts it at once
        with pytest.raises(ValueError, match="was uninstalled in this process"):
            SamplingParams(max_tokens=4, extra_args=ASKS)
        register()
        assert SamplingParams(max_tokens=4, extra_args=ASKS).extra_args == ASKS
        assert patched_symbols()["_sample"] is not original["_sample"]
        uninstall(refuse=False)
        assert patched_symbols() == original
        SamplingParams(max_tokens=4, extra_args=ASKS)  # vLLM's own: the key is not read


def test_after_uninstall_requests_that_only_inherit_the_default_run_plain():
    """The refusal after uninstall() is for requests that carry the key: with a server-wide default set,
    plain requests are not all refused."""
    from vllm.sampling_params import SamplingParams

    from hf_securesd.vllm import register, uninstall

    with plugin_environment(**{DEFAULT_ENV: '{"verifier": "mars"}'}):
        register()
        uninstall()
        assert SamplingParams(max_tokens=4).max_tokens == 4
        with pytest.raises(ValueError, match="was uninstalled in this process"):
            SamplingParams(max_tokens=4, extra_args=ASKS)


def test_opt_in_keeps_an_operators_runner_choice(caplog):
    import os

    from hf_securesd.vllm import register

    with plugin_environment(**{OPT_IN_ENV: "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}):
        caplog.set_level(logging.WARNING)
        register()
        assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"
        (warning,) = plugin_records(caplog)
        assert "kept VLLM_USE_V2_MODEL_RUNNER='1'" in warning.getMessage()


def test_engine_without_opt_in_is_vllm_without_the_plugin(pair_dir, probe_without_plugin):
    """Same tokens as an engine that never loads the plugin, VLLM_USE_V2_MODEL_RUNNER left unset, nothing
    patched, no line logged by the plugin; a SecureSD request is refused with how to enable it (the
    engine without the plugin silently serves it as a plain request)."""
    from conftest import run_engine_probe

    unset = {OPT_IN_ENV: None, DEFAULT_ENV: None, "VLLM_USE_V2_MODEL_RUNNER": None}
    installed = run_engine_probe(pair_dir, {**unset, "VLLM_PLUGINS": None})
    assert installed["tokens"] == probe_without_plugin["tokens"]
    assert all(len(sequence) > 1 for sequence in installed["tokens"])
    assert installed["runner_env"] is None and probe_without_plugin["runner_env"] is None
    assert not installed["patched"] and not probe_without_plugin["patched"]
    assert "start vLLM with SECURESD_VLLM=1" in (installed["refusal"] or "")
    assert probe_without_plugin["refusal"] is None
    assert "hf-securesd vLLM plugin enabled" not in installed["stderr"]


def test_after_a_failed_install_uninstall_keeps_securesd_requests_refused(monkeypatch):
    """The operator opted in, but the plugin could not patch this vLLM (a mismatch): SecureSD requests are
    refused, and uninstall() must not turn that into plain serving."""
    from vllm.sampling_params import SamplingParams

    from hf_securesd.vllm import features, register, uninstall

    with plugin_environment(**{OPT_IN_ENV: "1"}):
        with monkeypatch.context() as patch:  # undone before the plugin's state is restored on exit
            patch.setattr(features, "check_installed", lambda: ["GPUModelRunner._sample: a faked mismatch"])
            register()
            with pytest.raises(ValueError, match="cannot run SecureSD"):
                SamplingParams(max_tokens=4, extra_args=ASKS)
            uninstall()
            with pytest.raises(ValueError, match="was uninstalled in this process"):
                SamplingParams(max_tokens=4, extra_args=ASKS)
