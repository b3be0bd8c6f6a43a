"""Engine-free tests of what the plugin accepts and refuses: request parsing (the dicts GenerationConfig
serialises, their JSON string, a bare name), the server-wide default, admission checks against the
engine's configuration, the vLLM version guard, and statistics from vLLM's per-request metrics."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from vllm_support import requires_vllm

from hf_securesd import MARS, SecureSDConfigError, Step
from hf_securesd.vllm import DEFAULT_ENV, SUPPORTED_VLLM, parse_request, speculative_stats
from hf_securesd.vllm.admission import check_request
from hf_securesd.vllm.compat import patch_refusal, unsupported_version_message
from hf_securesd.vllm.request import request_for

CONFIG = {"verifier": {"verifier": "mars", "theta": 0.5}, "secure_schedule": {"schedule": "step", "L": 1}}


def test_generation_config_dicts_round_trip() -> None:
    request = parse_request(CONFIG)
    assert request.verifier == MARS(theta=0.5) and request.schedule == Step(L=1)
    assert request.to_dict() == {"verifier": MARS(theta=0.5).to_dict(), "secure_schedule": Step(L=1).to_dict()}
    assert parse_request(json.dumps(CONFIG)) == request  # the HTTP form (vllm_xargs carries strings)
    assert parse_request("mars").verifier == MARS()
    assert parse_request({"verifier": "lossless"}).schedule is None
    assert parse_request(None) is None and parse_request(False) is None and parse_request("null") is None


@pytest.mark.parametrize(
    "value, message",
    [
        ({"verifier": "nope"}, "unknown verifier 'nope'; valid names"),
        ({"verifier": {"verifier": "mars", "theta": 2.0}}, "MARS theta must be in"),
        ({"verifier": {"verifier": "mars", "tehta": 0.5}}, "has no option"),
        ({"secure_schedule": {"schedule": "step", "L": 1}}, "secure_schedule without a verifier"),
        ({"verifier": "mars", "secure_schedule": {"schedule": "cosine"}}, "unknown schedule 'cosine'"),
        ({"verifier": "mars", "schedule": "step"}, "unknown key"),
        ("{\"verifier\": ", "not valid JSON"),
        (3, "must be an object"),
    ],
)
def test_bad_input_names_the_problem(value, message) -> None:
    with pytest.raises(SecureSDConfigError, match=message):
        parse_request(value)


def test_server_wide_default_and_opt_out(monkeypatch) -> None:
    assert request_for(None) is None
    monkeypatch.setenv(DEFAULT_ENV, json.dumps(CONFIG))
    assert request_for(None) == parse_request(CONFIG)
    assert request_for({"other": 1}) == parse_request(CONFIG)
    assert request_for({"securesd": None}) is None
    assert request_for({"securesd": "lossless"}).verifier.name == "lossless"
    monkeypatch.setenv(DEFAULT_ENV, "{\"verifier\": \"nope\"}")
    with pytest.raises(SecureSDConfigError, match=DEFAULT_ENV):
        request_for(None)


def engine_config(speculative=True, method="draft_model", k=3, v2=False):
    spec = None
    if speculative:
        spec = SimpleNamespace(
            method=method, num_speculative_tokens=k, use_heterogeneous_vocab=False, rejection_sample_method="standard",
            uses_draft_model=lambda: method == "draft_model",
        )
    return SimpleNamespace(speculative_config=spec, use_v2_model_runner=v2)


def params(extra_args):
    return SimpleNamespace(extra_args=extra_args)


def test_admission_accepts_runnable_requests_and_plain_ones() -> None:
    check_request(params({"securesd": CONFIG}), engine_config())
    check_request(params(None), engine_config(speculative=False))


@pytest.mark.parametrize(
    "config, message",
    [
        (engine_config(speculative=False), "without speculative decoding"),
        (engine_config(method="ngram"), "drafts with method 'ngram'"),
        (engine_config(v2=True), "Model Runner V2"),
        (engine_config(k=2), "FLy window W=3 needs W <= k-1"),
    ],
    ids=["no-speculative-decoding", "ngram", "v2-runner", "fly-window"],
)
def test_admission_refuses_what_the_engine_cannot_run(config, message) -> None:
    request = {"securesd": {"verifier": {"verifier": "fly", "window": 3}}} if "FLy" in message else {"securesd": CONFIG}
    with pytest.raises(SecureSDConfigError, match=message):
        check_request(params(request), config)


def test_version_guard() -> None:
    assert unsupported_version_message("0.32.0") is None
    assert unsupported_version_message("0.32.3.dev1+cpu") is None
    for version in ("0.31.9", "0.33.0", "1.0.0", "unknown"):
        message = unsupported_version_message(version)
        assert SUPPORTED_VLLM in message and version in message


def test_unsupported_version_refuses_securesd_requests_only() -> None:
    class FakeSamplingParams:
        def __init__(self, extra_args=None):
            self.extra_args = extra_args
            self._verify_args()

        def _verify_args(self):
            return None

    undo = patch_refusal(FakeSamplingParams, unsupported_version_message("0.31.0"))
    try:
        FakeSamplingParams()
        FakeSamplingParams({"securesd": None})
        with pytest.raises(SecureSDConfigError, match=r"supports vllm >=0\.32\.0,<0\.33 but this server runs vllm 0\.31\.0"):
            FakeSamplingParams({"securesd": CONFIG})
    finally:
        undo()
    FakeSamplingParams({"securesd": CONFIG})


def test_statistics_by_response_position_from_vllm_metrics() -> None:
    """vLLM's first drafted token is at response position 1; each step starts after the previous
    step's accepted drafts and its one extra token."""
    metrics = {"num_draft_tokens": 9, "per_step_drafted": [3, 3, 3], "per_step_accepted": [2, 0, 3]}
    stats = speculative_stats(metrics)
    assert stats.drafted_per_round == [3, 3, 3] and stats.accepted_per_round == [2, 0, 3]
    assert stats.acceptance_rate == 5 / 9
    # rounds start at 1, then 1 + 2 + 1 = 4, then 4 + 0 + 1 = 5
    assert stats.position_drafted == [0, 1, 1, 1, 1, 2, 2, 1]
    assert stats.position_accepted == [0, 1, 1, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="detailed"):
        speculative_stats({"num_draft_tokens": 9, "acceptance_histogram": [1, 1, 1, 0]})
    with pytest.raises(ValueError, match="detailed"):
        speculative_stats(SimpleNamespace(spec_decode_metrics=None, token_ids=[1, 2]))


@requires_vllm()
def test_unsupported_version_refusal_on_vllms_own_sampling_params() -> None:
    from vllm import SamplingParams

    undo = patch_refusal(SamplingParams, unsupported_version_message("0.34.0"))
    try:
        SamplingParams(max_tokens=4)
        with pytest.raises(ValueError, match="but this server runs vllm 0.34.0"):
            SamplingParams(max_tokens=4, extra_args={"securesd": CONFIG})
    finally:
        undo()
    SamplingParams(max_tokens=4, extra_args={"securesd": CONFIG})
