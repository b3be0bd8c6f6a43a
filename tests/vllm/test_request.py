"""Engine-free tests of what the plugin accepts and refuses: request parsing (the dicts GenerationConfig
serialises, their JSON string, a bare name), hostile and malformed payloads (each refused naming its
field), misspelled keys, the HTTP body checks, the server-wide default, admission checks against the
engine's configuration, the refusal of SecureSD requests, and statistics from vLLM's per-request metrics."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from vllm_support import requires_vllm

from hf_securesd import MARS, SecureSDConfigError, Step
from hf_securesd.schedules import Schedule
from hf_securesd.vllm import DEFAULT_ENV, parse_request, speculative_stats
from hf_securesd.vllm.admission import check_beam_search, check_http_body, check_request, resolve_text_boundaries
from hf_securesd.vllm.compat import patch_refusal
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


def engine_config(speculative=True, method="draft_model", k=3, v2=False, async_scheduling=False):
    spec = None
    if speculative:
        spec = SimpleNamespace(
            method=method, num_speculative_tokens=k, use_heterogeneous_vocab=False, rejection_sample_method="standard",
            uses_draft_model=lambda: method == "draft_model",
        )
    model = SimpleNamespace(get_vocab_size=lambda: 259)
    return SimpleNamespace(speculative_config=spec, use_v2_model_runner=v2, model_config=model,
                           scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))


def params(extra_args):
    return SimpleNamespace(extra_args=extra_args)


def test_admission_accepts_runnable_requests_and_plain_ones() -> None:
    check_request(params({"securesd": CONFIG}), engine_config())
    check_request(params(None), engine_config(speculative=False))


@pytest.mark.parametrize(
    "config, message",
    [
        (engine_config(speculative=False), "without speculative decoding"),
        (engine_config(method="mtp"), "MTP drafting has not been run with the plugin"),
        (engine_config(method="suffix"), r"suffix decoding needs the arctic-inference package.*not been run"),
        (engine_config(method="medusa"), "Medusa drafts from several heads"),
        (engine_config(method="dflash"), "parallel drafting"),
        (engine_config(v2=True), "Model Runner V2"),
        (engine_config(k=2), r'\["verifier"\]: fly needs at least 4 drafted tokens a step, and this engine drafts '
                             r'k = 2 \(num_speculative_tokens\); send "window": 1 or less'),
    ],
    ids=["no-speculative-decoding", "mtp", "suffix", "medusa", "dflash", "v2-runner", "fly-window"],
)
def test_admission_refuses_what_the_engine_cannot_run(config, message) -> None:
    request = {"securesd": {"verifier": {"verifier": "fly", "window": 3}}} if "fly" in message else {"securesd": CONFIG}
    with pytest.raises(SecureSDConfigError, match=message):
        check_request(params(request), config)


def test_logprob_token_ids_are_refused_before_they_reach_the_rejection_sampler() -> None:
    """vLLM's rejection sampler fails on them under speculative decoding, and the engine then hangs."""
    request = SimpleNamespace(extra_args={"securesd": CONFIG}, logprob_token_ids=[97, 98])
    with pytest.raises(SecureSDConfigError, match="logprob_token_ids cannot be combined with SecureSD"):
        check_request(request, engine_config())
    check_request(SimpleNamespace(extra_args={"securesd": CONFIG}, logprob_token_ids=None), engine_config())


def test_a_segments_schedule_is_refused_under_async_scheduling() -> None:
    """Async scheduling leaves the last committed tokens as placeholders when a step is verified, so a
    schedule that reads the response cannot run there; position schedules can."""
    segments = {"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": [100]}}
    with pytest.raises(SecureSDConfigError, match=r"segments reads each request's committed response.*"
                                                   r"--no-async-scheduling"):
        check_request(params({"securesd": segments}), engine_config(async_scheduling=True))
    check_request(params({"securesd": segments}), engine_config(async_scheduling=False))
    check_request(params({"securesd": CONFIG}), engine_config(async_scheduling=True))


def test_a_row_whose_response_holds_placeholders_is_verified_lossless() -> None:
    """The runtime guard behind that refusal: a placeholder (-1) in the committed response makes the row's
    schedule unreadable, so the row is verified with the lossless rule that step."""
    import numpy as np

    from hf_securesd.vllm.verification import LOSSLESS_REQUEST, _row_plans

    request = request_for({"securesd": {"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": [5]}}})
    states = {
        "a": SimpleNamespace(output_token_ids=[1, 2, 5], _securesd_request=request),
        "b": SimpleNamespace(output_token_ids=[1, -1, -1], _securesd_request=request),
    }
    batch = SimpleNamespace(
        req_ids=["a", "b"], num_computed_tokens_cpu=np.array([12, 12]), num_prompt_tokens=np.array([10, 10]),
        sampling_metadata=SimpleNamespace(generators={}, all_greedy=True, all_random=False, temperature=None),
    )
    runner = SimpleNamespace(input_batch=batch, requests=states, drafter=SimpleNamespace(), device=torch.device("cpu"),
                              query_start_loc=SimpleNamespace(np=np.array([0, 3, 6])))  # 1 + 2 drafts each
    plans = _row_plans(runner, [request, request], None, [2, 2])
    assert [plan.position for plan in plans] == [3, 3]
    assert plans[0].request is request and plans[0].response == [1, 2, 5]
    assert plans[1].request is LOSSLESS_REQUEST and plans[1].response is None


def test_first_positions_count_the_tokens_fed_this_step() -> None:
    """cached + fed - drafts - prompt: a decoding row (fed its last token and its drafts), a row that
    drafted nothing, a preempted request's recomputation (fed its uncached tokens, no drafts), and a
    prefill chunk that emits nothing yet (0)."""
    import numpy as np

    from hf_securesd.vllm.verification import first_positions

    batch = SimpleNamespace(num_computed_tokens_cpu=np.array([37, 37, 96, 0]), num_prompt_tokens=np.array([28] * 4))
    fed = [1 + 3, 1, 123 - 96, 16]
    runner = SimpleNamespace(input_batch=batch, query_start_loc=SimpleNamespace(np=np.cumsum([0, *fed])))
    assert first_positions(runner, [3, 0, 0, 0]) == [10, 10, 95, 0]


@pytest.mark.parametrize(("default", "engine", "field"), [
    ({"verifier": {"verifier": "vllm_fly", "window": 9}}, engine_config(k=5), '["verifier"]'),
    ({"verifier": "fsd"}, engine_config(method="ngram"), ""),
    ({"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": [151668]}}, engine_config(),
     '["secure_schedule"]'),
    ({"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": [7]}},
     engine_config(async_scheduling=True), '["secure_schedule"]'),
])
def test_a_default_the_engine_cannot_run_is_named_as_the_servers(monkeypatch, default, engine, field) -> None:
    """A request that sends no "securesd" was told to change a field it never sent."""
    monkeypatch.setenv(DEFAULT_ENV, json.dumps(default))
    with pytest.raises(SecureSDConfigError) as refused:
        check_request(params(None), engine)
    message = str(refused.value)
    assert 'extra_args["securesd"]' not in message
    assert f"This request sent no \"securesd\" and inherits the server-wide default {DEFAULT_ENV}" in message
    if field:
        assert f"the server-wide default {DEFAULT_ENV}{field}: " in message
    with pytest.raises(SecureSDConfigError) as own:  # the same settings sent by the client: its own field
        check_request(params({"securesd": default}), engine)
    assert "server-wide" not in str(own.value)


def test_a_requests_own_option_is_not_blamed_on_the_default(monkeypatch) -> None:
    monkeypatch.setenv(DEFAULT_ENV, json.dumps({"verifier": "mars"}))
    with pytest.raises(SecureSDConfigError) as refused:
        check_request(SimpleNamespace(extra_args=None, logprob_token_ids=[1, 2]), engine_config())
    assert str(refused.value).startswith("logprob_token_ids cannot be combined") and "server-wide" not in str(refused.value)
    with pytest.raises(SecureSDConfigError, match=r"^the server-wide default SECURESD_VLLM_DEFAULT asks for SecureSD "
                                                  r"verification but the engine runs without speculative decoding; "
                                                  r"start it with [^(]*\(or ngram, eagle, eagle3\)\. This request"):
        check_request(params(None), engine_config(speculative=False))


def test_segment_boundary_ids_outside_the_model_vocabulary_are_refused() -> None:
    """Qwen3's `</think>` id sent to a model of 259 tokens would never occur: refused, not ignored."""
    request = {"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": [151668]}}
    with pytest.raises(SecureSDConfigError, match="token id 151668, outside this model's vocabulary"):
        check_request(params({"securesd": request}), engine_config())
    request["secure_schedule"]["boundary"] = [258]
    check_request(params({"securesd": request}), engine_config())


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3", "ngram"])
def test_admission_accepts_every_proposer_for_rules_that_read_only_the_target(method) -> None:
    for verifier in ("lossless", "lossysd", "bild", "speccascade", "fly", "mars"):
        check_request(params({"securesd": {"verifier": verifier}}), engine_config(method=method, k=5))


@pytest.mark.parametrize("method", ["ngram"])
@pytest.mark.parametrize(
    "verifier, reason",
    [
        ("fsd", "FSD compares the draft's distribution"),
        ({"verifier": "bild", "tau_fb": 0.5}, "BiLD's fallback"),
        ({"verifier": "speccascade", "rule": "chow"}, "rule='chow'"),
    ],
    ids=["fsd", "bild-fallback", "speccascade-chow"],
)
def test_one_hot_proposers_refuse_rules_that_read_the_draft_distribution(method, verifier, reason) -> None:
    """The refusal names the rule's reason, the proposer and the fix; a proposer with a distribution
    (draft model, EAGLE) runs the same rules."""
    no_distribution = rf"{reason}.*vLLM's {method} proposer has no draft distribution. Use an engine started with a draft model"
    with pytest.raises(SecureSDConfigError, match=no_distribution) as error:
        check_request(params({"securesd": {"verifier": verifier}}), engine_config(method=method))
    assert "assistant_model" not in str(error.value)  # transformers' argument, not vLLM's
    if isinstance(verifier, dict):  # BiLD / SpecCascade: their defaults need no draft distribution
        assert f"({verifier['verifier']} too, without that setting" in str(error.value)
    for other in ("draft_model", "eagle"):
        check_request(params({"securesd": {"verifier": verifier}}), engine_config(method=other))


def test_parallel_drafting_is_refused() -> None:
    config = engine_config(method="eagle")
    config.speculative_config.parallel_drafting = True
    with pytest.raises(SecureSDConfigError, match="parallel drafting"):
        check_request(params({"securesd": CONFIG}), config)


REFUSAL = "hf-securesd's vLLM plugin cannot run SecureSD on this vllm 0.31.0: a symbol does not match"


def test_refusal_refuses_securesd_requests_only() -> None:
    class FakeSamplingParams:
        def __init__(self, extra_args=None):
            self.extra_args = extra_args
            self._verify_args()

        def _verify_args(self):
            return None

    undo = patch_refusal(FakeSamplingParams, REFUSAL)
    try:
        FakeSamplingParams()
        FakeSamplingParams({"securesd": None})
        with pytest.raises(SecureSDConfigError, match="cannot run SecureSD on this vllm 0.31.0"):
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


def test_steps_that_drafted_nothing_leave_positions_unknown() -> None:
    """vLLM records no entry for a step without drafts (an n-gram proposer without a match), which commits
    one token: when the sequence is longer than the recorded steps commit, the statistics keep the counts
    and no per-position lists rather than place later steps too early."""
    metrics = {"num_draft_tokens": 6, "per_step_drafted": [3, 3], "per_step_accepted": [2, 1]}
    whole = speculative_stats(SimpleNamespace(spec_decode_metrics=metrics, token_ids=list(range(6))))
    assert whole.position_drafted == [0, 1, 1, 1, 1, 1, 1]  # 1 + 3 + 2 = 6 tokens: every step recorded
    gaps = speculative_stats(SimpleNamespace(spec_decode_metrics=metrics, token_ids=list(range(9))))
    assert gaps.acceptance_rate == 0.5 and gaps.new_tokens == 9
    assert gaps.position_drafted == [] and gaps.position_acceptance_rate == []
    assert speculative_stats(metrics, new_tokens=9).position_drafted == []  # an HTTP metrics dict
    assert speculative_stats(metrics, new_tokens=5).position_drafted == whole.position_drafted  # cut by a stop


@requires_vllm()
def test_refusal_on_vllms_own_sampling_params() -> None:
    from vllm import SamplingParams

    undo = patch_refusal(SamplingParams, REFUSAL)
    try:
        SamplingParams(max_tokens=4)
        with pytest.raises(ValueError, match="cannot run SecureSD on this vllm 0.31.0"):
            SamplingParams(max_tokens=4, extra_args={"securesd": CONFIG})
    finally:
        undo()
    SamplingParams(max_tokens=4, extra_args={"securesd": CONFIG})


HUGE_LENGTHS = [10**30, 2**64 + 5, 2**63]


@pytest.mark.parametrize(
    "schedule",
    [{"schedule": "step", "L": L} for L in HUGE_LENGTHS] + [{"schedule": "power", "L": 10**30, "gamma": 1.0}],
    ids=["step-1e30", "step-2^64+5", "step-2^63", "power-1e30"],
)
def test_huge_schedule_lengths_are_admitted_and_lossless_everywhere(schedule) -> None:
    """A length beyond any response is (all but) lossless everywhere, never an overflow in the engine."""
    text = json.dumps({"verifier": {"verifier": "lossysd", "epsilon": 1.0}, "secure_schedule": schedule})
    request = parse_request(text)
    eta = request.schedule.eta(torch.tensor([[0, 1, 2], [2**62, 2**62 + 1, 2**62 + 2]]))
    if schedule["schedule"] == "step":
        assert eta.tolist() == [[0.0] * 3] * 2
    else:  # j / L: below 1e-11 at every position a response can have
        assert bool((eta >= 0).all()) and float(eta.max()) < 1e-11


class ExplodingSchedule(Schedule):
    """A custom schedule that fails far into a response, as an overflow would."""

    name = "exploding"

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        if bool((positions > 2**40).any()):
            raise OverflowError("int too big to convert")
        return torch.zeros(positions.shape)


class OutOfRangeSchedule(Schedule):
    name = "out-of-range"

    def eta(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.full(positions.shape, float("nan"))


@pytest.mark.parametrize(
    "schedule, message",
    [(ExplodingSchedule(), "OverflowError: int too big"), (OutOfRangeSchedule(), "eta = nan")],
    ids=["raises-late", "nan"],
)
def test_a_schedule_is_evaluated_once_on_admission(schedule, message) -> None:
    """Admission evaluates the schedule at positions up to 2^62: what fails there fails here, not later."""
    with pytest.raises(SecureSDConfigError, match=rf'\["secure_schedule"\]: .*{message}'):
        parse_request({"verifier": "mars", "secure_schedule": schedule})


NESTED = r'\["verifier"\]\["verifier"\] must be a verifier name'
MALFORMED = {
    "verifier-nested-thrice": ({"verifier": {"verifier": {"verifier": "mars"}}}, NESTED),
    "schedule-name-object": (
        {"verifier": "mars", "secure_schedule": {"schedule": {"a": 1}}},
        r'\["schedule"\] must be a schedule name',
    ),
    "verifier-without-name": (
        {"verifier": {"theta": 0.5}},
        r'\["verifier"\] names no rule: add "verifier": "<name>".*lossless, lossysd',
    ),
    "verifier-list": ({"verifier": ["mars"]}, r'\["verifier"\] must be a verifier name'),
    "schedule-string": ({"verifier": "mars", "secure_schedule": "step"}, r'\["secure_schedule"\]: secure_'),
    "misspelled-field": (
        {"verifier": "mars", "schedule": {"schedule": "step"}},
        r"'schedule' \(did you mean 'secure_schedule'\?\)",
    ),
    "huge-theta": ({"verifier": {"verifier": "mars", "theta": 10**400}}, r"\['theta'\] is too large for a"),
    "huge-gamma": (
        {"verifier": "mars", "secure_schedule": {"schedule": "power", "gamma": 10**400}},
        r"\['gamma'\] is too large",
    ),
    "nan-theta": (json.dumps({"verifier": {"verifier": "mars", "theta": float("nan")}}), "theta must be in"),
    "json-1000-deep": ("[" * 1000 + "]" * 1000, "nested more than 5 levels deep"),
    "json-too-long": ('{"verifier": ' * 300 + '"mars"' + "}" * 300, "characters long"),
    "whitespace-padded": ('"mars"' + " " * 5000, "characters long"),
    "name-too-long": ("x" * 300, "a string of 300 characters"),
    "text-too-long": ("x" * 5000, "5000 characters long"),
    "json-true": ("true", "must be an object"),
}


@pytest.mark.parametrize("value, message", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_requests_name_the_field(value, message) -> None:
    with pytest.raises(SecureSDConfigError, match=message) as raised:
        parse_request(value)
    assert 'extra_args["securesd"]' in str(raised.value)


def test_a_segments_schedule_over_several_multi_token_boundaries_fits() -> None:
    request = parse_request(json.dumps({"verifier": "mars", "secure_schedule": {
        "schedule": "segments", "boundary": [[104, 105], [106]], "before": None,
        "after": {"schedule": "step", "L": 2}}}))
    assert request.schedule.boundary == ((104, 105), (106,))


def test_deeply_nested_python_objects_are_refused_without_recursion() -> None:
    nested: dict = {"verifier": "mars"}
    for _ in range(5000):
        nested = {"verifier": nested}
    with pytest.raises(SecureSDConfigError, match="nested more than 5 levels"):
        parse_request(nested)
    cyclic: dict = {"verifier": "mars"}
    cyclic["secure_schedule"] = {"schedule": "step", "L": 1, "self": cyclic}
    with pytest.raises(SecureSDConfigError, match="nested more than|more than 64 values"):
        parse_request(cyclic)


@pytest.mark.parametrize(
    "key", ["secure_sd", "SecureSD", "secure-sd", "securesd_", "secursd", "securesdd", "s - e - c - u - r - e - s - d - - -",
            "securesd_config", "securesd.verifier", "\uff53\uff45\uff43\uff55\uff52\uff45\uff53\uff44",
            "s\u0435cur\u0435sd", "\u0455\u0435\u0441ur\u0435\u0455\u0501", "sec\u03c5resd"]  # Cyrillic, Greek look-alikes
)
def test_a_misspelled_securesd_key_is_refused_with_a_suggestion(key) -> None:
    with pytest.raises(SecureSDConfigError, match=rf"'{key}', which SecureSD does not read; did you mean"):
        request_for({key: json.dumps({"verifier": "mars"})})


def test_other_extra_args_keys_are_left_alone() -> None:
    for key in ("session_id", "kv_transfer_params", "seed", "secure", "sd", "xsecuresd" * 3, "x" * 100_000):
        assert request_for({key: "x"}) is None


def test_http_body_checks() -> None:
    """A top-level securesd field, and beam search asking for SecureSD, are refused (vLLM drops both)."""
    check_http_body(SimpleNamespace(model_extra={"other": 1}))
    for key in ("securesd", "secure_sd"):
        with pytest.raises(SecureSDConfigError, match=rf"top-level field '{key}'.*inside vllm_xargs"):
            check_http_body(SimpleNamespace(model_extra={key: "mars"}))
    for extra, shown in (({"extra_body": {"vllm_xargs": {"securesd": "mars"}}}, "extra_body.vllm_xargs.securesd"),
                         ({"extra_args": {"Secure_SD": "mars"}}, "extra_args.Secure_SD"),
                         ({"sampling_params": {"extra_args": {"securesd": {}}}}, "sampling_params.extra_args.securesd"),
                         ({"x\x1b": {"securesd": 1}}, "'x\\x1b'.securesd")):
        with pytest.raises(SecureSDConfigError, match=rf"^the request body's field {re.escape(shown)} is not read"):
            check_http_body(SimpleNamespace(model_extra=extra))
    deep = {"securesd": "mars"}
    for level in range(4):
        deep = {f"level{level}": deep}  # deeper than the search goes, and lists, are left to vLLM
    for extra in (deep, {"x": [{"securesd": "mars"}]}, {"other": {"secure": 1, "sd": 2}}):
        check_http_body(SimpleNamespace(model_extra=extra))
    check_beam_search(SimpleNamespace(model_extra={}, vllm_xargs=None))
    check_beam_search(SimpleNamespace(model_extra={}, vllm_xargs={"securesd": "null"}))
    with pytest.raises(SecureSDConfigError, match="use_beam_search cannot run with SecureSD"):
        check_beam_search(SimpleNamespace(model_extra={}, vllm_xargs={"securesd": "mars"}))
    text_boundary = json.dumps({"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": "</think>"}})
    with pytest.raises(SecureSDConfigError, match="use_beam_search cannot run with SecureSD"):  # not "no tokenizer"
        check_beam_search(SimpleNamespace(model_extra={}, vllm_xargs={"securesd": text_boundary}))


def test_beam_search_under_a_server_wide_default_is_refused(monkeypatch) -> None:
    monkeypatch.setenv(DEFAULT_ENV, json.dumps({"verifier": "mars"}))
    with pytest.raises(SecureSDConfigError, match="use_beam_search cannot run with SecureSD"):
        check_beam_search(SimpleNamespace(model_extra={}, vllm_xargs=None))
    check_beam_search(SimpleNamespace(model_extra={}, vllm_xargs={"securesd": "null"}))


def test_best_of_on_a_securesd_request_is_refused(monkeypatch) -> None:
    """vLLM 0.32 has no best_of in SamplingParams: /v1/completions keeps it as an unknown body field, the
    batch chat request declares and ignores it, and one completion comes back. A SecureSD request (its
    own vllm_xargs or the server-wide default) with best_of > 1 is refused, and so is a best_of that is no
    number (vLLM ignores "3", [2] and true alike); best_of <= 1 and plain requests are left alone."""
    from hf_securesd.vllm.admission import check_http_request

    securesd = {"securesd": "mars"}
    for body in (SimpleNamespace(model_extra={"best_of": 3}, vllm_xargs=securesd),
                 SimpleNamespace(model_extra={}, best_of=1_000_000, vllm_xargs=securesd)):
        with pytest.raises(SecureSDConfigError, match=r"best_of=\d+ cannot run with SecureSD.*drop best_of"):
            check_http_request(body)
    for best_of in (None, 1, 0, 1.0, -2):
        check_http_request(SimpleNamespace(model_extra={"best_of": best_of}, vllm_xargs=securesd))
    not_a_number = "cannot run with SecureSD: best_of is a number of completions"
    for best_of, start in ((True, f"best_of=True {not_a_number}"), ("3", f"best_of='3' {not_a_number}"),
                           ([2], f"best_of=[2] {not_a_number}"),
                           ("x" * 10**5, f"best_of='{'x' * 59}... (100000 characters) {not_a_number}"),
                           (float("nan"), "best_of=nan cannot run with SecureSD: vLLM 0.32 accepts best_of and ignores")):
        with pytest.raises(SecureSDConfigError) as refused:
            check_http_request(SimpleNamespace(model_extra={"best_of": best_of}, vllm_xargs=securesd))
        assert str(refused.value).startswith(start)
        check_http_request(SimpleNamespace(model_extra={"best_of": best_of}, vllm_xargs=None))  # plain: vLLM's
    check_http_request(SimpleNamespace(model_extra={"best_of": 3}, vllm_xargs=None))  # plain: vLLM's business
    monkeypatch.setenv(DEFAULT_ENV, json.dumps({"verifier": "mars"}))
    with pytest.raises(SecureSDConfigError, match="best_of=3 cannot run with SecureSD"):
        check_http_request(SimpleNamespace(model_extra={"best_of": 3}, vllm_xargs=None))
    check_http_request(SimpleNamespace(model_extra={"best_of": 3}, vllm_xargs={"securesd": "null"}))


def test_a_misspelled_key_beside_securesd_is_refused_too() -> None:
    """The misspelled key would carry a configuration the plugin silently drops."""
    with pytest.raises(SecureSDConfigError, match="'secure_sd', which SecureSD does not read"):
        request_for({"securesd": "lossless", "secure_sd": {"verifier": {"verifier": "lossysd", "epsilon": 1.0}}})


def _segments_params(boundary: str) -> SimpleNamespace:
    return SimpleNamespace(extra_args={"securesd": {"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": boundary}}})


def test_text_boundaries_are_written_as_ids_or_refused_with_their_token_count() -> None:
    """Admission writes a text boundary as the model's token ids for the workers; a boundary whose ids make
    the request exceed a request's bounds is refused with its token count, not a bounds message alone."""
    from hf_securesd.tiny import byte_tokenizer

    tokenizer = byte_tokenizer()
    short = _segments_params("</think>")
    resolve_text_boundaries(short, tokenizer)
    written = json.loads(short.extra_args["securesd"])["secure_schedule"]["boundary"]
    assert written == tokenizer.encode("</think>", add_special_tokens=False)
    with pytest.raises(SecureSDConfigError, match=r"resolves to \[60\] token\(s\) with this model's tokenizer.*shorter"):
        resolve_text_boundaries(_segments_params("x" * 60), tokenizer)
    with pytest.raises(SecureSDConfigError, match="is not valid Unicode text"):
        resolve_text_boundaries(_segments_params("\ud800"), tokenizer)


def test_a_text_boundary_in_an_engine_without_a_tokenizer_asks_for_token_ids(monkeypatch, caplog) -> None:
    """An engine started with skip_tokenizer_init has no tokenizer to resolve a text boundary on admission:
    the refusal tells the client what it can send (token ids), not the generate-side tokenizer= fix. A
    server-wide default with a text boundary is resolved per request, so it logs no error at start."""
    import logging

    from hf_securesd.vllm import _check_server_default
    from hf_securesd.vllm.request import TextBoundaryNeedsTokenizer

    params = _segments_params("</think>")
    resolve_text_boundaries(params, None)
    message = r'\["secure_schedule"\]: the segments boundary \'</think>\' is text.*skip_tokenizer_init.*"boundary": \[id'
    with pytest.raises(TextBoundaryNeedsTokenizer, match=message):
        request_for(params.extra_args)
    assert "tokenizer=" not in str(pytest.raises(SecureSDConfigError, request_for, params.extra_args).value)
    monkeypatch.setenv(DEFAULT_ENV, json.dumps(params.extra_args["securesd"]))
    caplog.set_level(logging.INFO)
    _check_server_default()
    records = [record for record in caplog.records if record.name.startswith("hf_securesd")]
    assert [record.levelno for record in records] == [logging.INFO]
    assert "resolved with the model's tokenizer as each request is admitted" in records[0].getMessage()


@pytest.mark.parametrize(
    "extra_args, field",
    [
        ({"securesd": "mars", "secure_schedule": json.dumps({"schedule": "step", "L": 16})}, "secure_schedule"),
        ({"securesd": "lossless", "verifier": "mars"}, "verifier"),
        ({"verifier": "mars"}, "verifier"),
        ({"secure_schedule": {"schedule": "step", "L": 1}}, "secure_schedule"),
        ({"secureschedule": "x"}, "secure_schedule"),
        ({"verifer": "mars"}, "verifier"),
    ],
)
def test_request_fields_beside_securesd_are_refused(extra_args, field) -> None:
    """Fields sent flat in vllm_xargs would be dropped: the schedule the client believes protects the
    first tokens would not run."""
    with pytest.raises(SecureSDConfigError, match=rf'beside "securesd".*"{field}" goes inside "securesd"'):
        request_for(extra_args)


@pytest.mark.parametrize("key, field", [("schedule", "secure_schedule"), ("sched", "secure_schedule"),
                                        ("eta", "secure_schedule"), ("Step", "secure_schedule"),
                                        ("segments", "secure_schedule"), ("mars", "verifier"), ("fsd", "verifier")])
def test_a_schedule_or_verifier_named_in_other_words_beside_securesd_is_refused(key, field) -> None:
    """{"securesd": rule, "schedule": ...} ran the rule without its schedule: the first tokens the client
    believed protected were relaxed. Without "securesd" the key is another plugin's, left alone."""
    schedule = json.dumps({"schedule": "step", "L": 100})
    with pytest.raises(SecureSDConfigError, match=rf"'{key}' beside \"securesd\".*\"{field}\" goes inside \"securesd\""):
        request_for({"securesd": "mars", key: schedule})
    assert request_for({key: schedule}) is None


def test_rule_options_beside_securesd_are_refused_when_securesd_is_asked_for(monkeypatch) -> None:
    for key in ("theta", "L", "tau", "epsilon", "boundary"):
        with pytest.raises(SecureSDConfigError, match=rf"'{key}' beside .*goes inside its object"):
            request_for({"securesd": "mars", key: 1})
        assert request_for({key: 1}) is None  # plain vLLM: another plugin's key, left alone
    monkeypatch.setenv(DEFAULT_ENV, json.dumps({"verifier": "mars"}))
    with pytest.raises(SecureSDConfigError, match="'theta' beside"):
        request_for({"theta": 0.9})
    assert request_for({"securesd": "null", "theta": 0.9}) is None


@pytest.mark.parametrize("number", [0, 1, 0.0, 1.0])
def test_json_booleans_turned_into_numbers_get_the_http_fix(number) -> None:
    with pytest.raises(SecureSDConfigError, match=r'turns a JSON true/false in vllm_xargs into 1/0.*the string "null"'):
        parse_request(number)


def test_a_key_repeated_in_the_json_is_refused() -> None:
    with pytest.raises(SecureSDConfigError, match="gives the key 'verifier' more than once"):
        parse_request('{"verifier": "lossless", "verifier": "mars"}')
    with pytest.raises(SecureSDConfigError, match="gives the key 'L' more than once"):
        parse_request('{"verifier": "mars", "secure_schedule": {"schedule": "step", "L": 1, "L": 99}}')


def test_a_boundary_outside_the_vocabulary_names_the_field_and_the_http_fix() -> None:
    request = {"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": [300]}}
    with pytest.raises(SecureSDConfigError) as refusal:
        check_request(params({"securesd": request}), engine_config())
    message = str(refusal.value)
    assert message.startswith('extra_args["securesd"]["secure_schedule"]: ') and "tokenizer=" not in message
    assert "the server resolves it with this model's tokenizer" in message


def _constrained(extra_args, **fields) -> SimpleNamespace:
    defaults = dict(allowed_token_ids=None, bad_words=None, min_tokens=0, stop_token_ids=None, ignore_eos=False)
    return SimpleNamespace(extra_args=extra_args, **{**defaults, **fields})


def test_constraints_that_allow_no_token_are_refused_for_securesd_requests() -> None:
    """allowed_token_ids all banned (by one-token bad words, or by min_tokens on stop ids) leave the target
    an empty distribution: refused at admission for SecureSD requests, plain requests left to vLLM. vLLM's
    min-tokens processing bans the engine's EOS ids whatever ignore_eos (they join all_stop_token_ids)."""
    from hf_securesd.tiny import byte_tokenizer
    from hf_securesd.vllm.admission import check_some_token_allowed

    tokenizer = byte_tokenizer()
    a, eos = tokenizer.encode("a", add_special_tokens=False)[0], tokenizer.eos_token_id
    securesd = {"securesd": "mars"}
    with pytest.raises(SecureSDConfigError, match="all banned by bad_words"):
        check_some_token_allowed(_constrained(securesd, allowed_token_ids=[a], bad_words=["a"]), tokenizer, [eos])
    for ignore_eos in (False, True):
        with pytest.raises(SecureSDConfigError, match="min_tokens=5 bans"):
            check_some_token_allowed(
                _constrained(securesd, allowed_token_ids=[eos], min_tokens=5, ignore_eos=ignore_eos), tokenizer, [eos]
            )
    with pytest.raises(SecureSDConfigError, match="min_tokens=2 bans"):
        check_some_token_allowed(_constrained(securesd, allowed_token_ids=[7], stop_token_ids=[7], min_tokens=2), None)
    for fine in (
        _constrained(securesd, allowed_token_ids=[a, a + 1], bad_words=["a"]),
        _constrained(securesd, allowed_token_ids=[a, a + 1], bad_words=["ab"]),  # "a" then "a" again
        _constrained(securesd, allowed_token_ids=[eos, a], min_tokens=5, ignore_eos=True),
        _constrained(securesd, allowed_token_ids=[eos]),
        _constrained(None, allowed_token_ids=[a], bad_words=["a"]),  # plain vLLM: untouched
        _constrained(None, allowed_token_ids=[eos], min_tokens=5),
    ):
        check_some_token_allowed(fine, tokenizer, [eos])


def test_every_eos_id_of_the_engine_counts_as_a_stop_id_under_min_tokens() -> None:
    """vLLM adds the generation config's eos_token_id ids (an int or a list) and the renderer's EOS to
    every request's stop set after admission; the check reads them from the InputProcessor
    (`engine_stop_ids`) and refuses allowed_token_ids that hold only those under min_tokens."""
    from hf_securesd.vllm.admission import check_some_token_allowed, engine_stop_ids

    renderer = SimpleNamespace(get_eos_token_id=lambda: 258)
    processor = SimpleNamespace(renderer=renderer, generation_config_fields={"eos_token_id": [258, 257]})
    assert engine_stop_ids(processor) == {257, 258}
    assert engine_stop_ids(SimpleNamespace(renderer=renderer, generation_config_fields={"eos_token_id": 5})) == {5, 258}
    assert engine_stop_ids(SimpleNamespace(renderer=None, generation_config_fields={})) == set()

    def no_tokenizer():
        raise RuntimeError("no tokenizer")

    assert engine_stop_ids(SimpleNamespace(renderer=SimpleNamespace(get_eos_token_id=no_tokenizer))) == set()
    securesd = {"securesd": "mars"}
    for allowed in ([257], [257, 258]):
        for ignore_eos in (False, True):
            params = _constrained(securesd, allowed_token_ids=allowed, min_tokens=3, ignore_eos=ignore_eos)
            with pytest.raises(SecureSDConfigError, match=r"EOS ids \[257, 258\].*min_tokens=3 bans"):
                check_some_token_allowed(params, None, engine_stop_ids(processor))
    check_some_token_allowed(_constrained(securesd, allowed_token_ids=[257, 7], min_tokens=3), None, [257, 258])
    check_some_token_allowed(_constrained(securesd, allowed_token_ids=[257]), None, [257, 258])


@pytest.mark.parametrize(
    "fields, tail",
    [
        (dict(allowed_token_ids=[97], bad_words=["aa"]), r"\[97\] \('a'\), the start of bad word 'aa': bad_words ban"),
        (dict(allowed_token_ids=[97, 98], bad_words=["aa", "ab"]), r"\[97\] \('a'\)"),
        (dict(allowed_token_ids=[97, 98], bad_words=["aba", "abb"]), r"\[97, 98\] \('ab'\).*bad word 'aba'"),
        (dict(allowed_token_ids=[97, 258], bad_words=["aa"], min_tokens=4), r"\[97\] .*bad_words and min_tokens=4 .*ban"),
        (dict(allowed_token_ids=[97, 98], bad_words=["aa"], stop_token_ids=[98], min_tokens=2),
         r"\[97\] \('a'\).*min_tokens=2"),
        (dict(allowed_token_ids=[97], bad_words=["aaaa"], max_tokens=4), r"\[97, 97, 97\] \('aaa'\)"),
        (dict(allowed_token_ids=[97], bad_words=["a" * 300]),
         r"\[97, 97, 97, 97, 97, 97, 97, 97, \.\.\.\] \(299 tokens\) \('aaaa.*\.\.\. \(299 characters\)\)"),
    ],
    ids=["aa", "aa-ab", "aba-abb", "aa-min-tokens", "stop-min-tokens", "max-tokens", "long-word"],
)
def test_multi_token_bad_words_that_leave_no_token_after_their_start_are_refused(fields, tail) -> None:
    """A bad word of several tokens bans its last token once the response ends with its other tokens
    (vLLM's apply_bad_words): allowed_token_ids=[a] with bad_words=["aa"] has no token after the first
    "a", and vLLM would emit a forbidden token 0 there. Refused, naming the bad word's start."""
    from hf_securesd.tiny import byte_tokenizer
    from hf_securesd.vllm.admission import check_some_token_allowed

    with pytest.raises(SecureSDConfigError, match=r"leave no token after the response tokens " + tail):
        check_some_token_allowed(_constrained({"securesd": "mars"}, **fields), byte_tokenizer(), [258])
    check_some_token_allowed(_constrained(None, **fields), byte_tokenizer(), [258])  # plain vLLM: untouched


@pytest.mark.parametrize(
    "fields",
    [
        dict(allowed_token_ids=[97, 98], bad_words=["aa"]),  # "b" follows "a"
        dict(allowed_token_ids=[97], bad_words=["ab", "ba"]),  # "aaa..." never starts either
        dict(allowed_token_ids=[97, 98], bad_words=["aa", "aab"]),  # "aa" is never emitted: "aab" cannot start
        dict(allowed_token_ids=[97, 258], bad_words=["aa"], min_tokens=1),  # EOS allowed after the first "a"
        dict(allowed_token_ids=[97, 98], bad_words=["ab"], stop_token_ids=[97], min_tokens=3),  # "a" ends it
        dict(allowed_token_ids=[98], bad_words=["ab"]),  # "a" is not allowed: "ab" never starts
        dict(allowed_token_ids=[97], bad_words=["aaaa"], max_tokens=3),  # ends before a fourth token
    ],
)
def test_bad_words_that_always_leave_a_token_are_admitted(fields) -> None:
    from hf_securesd.tiny import byte_tokenizer
    from hf_securesd.vllm.admission import check_some_token_allowed

    check_some_token_allowed(_constrained({"securesd": "mars"}, **fields), byte_tokenizer(), [258])


def test_bad_words_are_tokenized_as_vllm_does() -> None:
    """vLLM keeps a bad word's space-prefixed form only when its first token differs from the plain form's
    and it has the same length; a form it keeps takes part in the check."""
    from hf_securesd.vllm.admission import _bad_words_token_ids, check_some_token_allowed

    class Words:  # " x" is one other token; " yz" two, as "yz"; " w" two, against "w" one: vLLM drops it
        table = {"x": [1], " x": [10], "yz": [2, 3], " yz": [20, 20], "w": [4], " w": [30, 30]}

        def encode(self, text, add_special_tokens=False):
            return self.table[text]

        def decode(self, ids):
            return "?"

    assert _bad_words_token_ids(["  x", "yz", "w"], Words()) == [
        ("  x", [1]), ("  x", [10]), ("yz", [2, 3]), ("yz", [20, 20]), ("w", [4]),
    ]
    securesd = {"securesd": "mars"}
    with pytest.raises(SecureSDConfigError, match="all banned by bad_words"):
        check_some_token_allowed(_constrained(securesd, allowed_token_ids=[1, 10], bad_words=["x"]), Words())
    with pytest.raises(SecureSDConfigError, match=r"after the response tokens \[20\]"):
        check_some_token_allowed(_constrained(securesd, allowed_token_ids=[20], bad_words=["yz"]), Words())
    check_some_token_allowed(_constrained(securesd, allowed_token_ids=[30], bad_words=["w"]), Words())


def test_generate_route_bodies_with_securesd_where_the_route_drops_it_are_refused() -> None:
    """/inference/v1/generate reads SecureSD from sampling_params.extra_args only: a securesd (or a
    vllm_xargs holding one) at the top of the body or directly in sampling_params is refused instead of
    served as plain vLLM; other fields are the route's own business."""
    from hf_securesd.vllm.admission import check_generate_body

    check_generate_body({"token_ids": [1], "sampling_params": {"extra_args": {"securesd": "mars"}}})
    check_generate_body({"vllm_xargs": {"other_plugin": 1}, "sampling_params": {"vllm_xargs": {"x": 1}}})
    check_generate_body(None)
    for body, place in (
        ({"securesd": '{"verifier": "mars"}'}, "the request body has the field 'securesd'"),
        ({"vllm_xargs": {"securesd": "mars"}}, "the request body has the field 'vllm_xargs'"),
        ({"secure_sd": "mars"}, "the request body has the field 'secure_sd'"),
        ({"sampling_params": {"max_tokens": 4, "securesd": "mars"}}, "sampling_params has the field 'securesd'"),
        ({"sampling_params": {"vllm_xargs": {"SecureSD": "mars"}}}, "sampling_params has the field 'vllm_xargs'"),
    ):
        with pytest.raises(SecureSDConfigError, match=rf"{place}.*sampling_params.extra_args"):
            check_generate_body(body)


def test_the_generate_route_handler_answers_400_and_passes_plain_bodies_on() -> None:
    """The wrapped handler reads the raw JSON body."""
    import asyncio

    from hf_securesd.vllm.admission import patch_generate_route

    class Handler:
        async def serve_tokens(self, request, raw_request=None):
            return "served"

        def create_error_response(self, message, param=None):
            return ("400", message, param)

    class Raw:
        def __init__(self, body):
            self.body = body

        async def json(self):
            return self.body

    request = SimpleNamespace()
    undo = patch_generate_route([Handler])
    try:
        assert asyncio.run(Handler().serve_tokens(request, Raw({"token_ids": [1]}))) == "served"
        refused = asyncio.run(Handler().serve_tokens(request, Raw({"securesd": "mars"})))
        assert refused[0] == "400" and "drops" in refused[1]
        inner = Raw({"sampling_params": {"securesd": "mars"}})
        assert asyncio.run(Handler().serve_tokens(request, inner))[0] == "400"
    finally:
        undo()
    assert asyncio.run(Handler().serve_tokens(request, Raw({"securesd": "mars"}))) == "served"


@pytest.mark.parametrize("verifier, k, fix", [
    ({"verifier": "fly"}, 1, 'start the engine with num_speculative_tokens >= 4 (>= 2 with a smaller "window")'),
    ({"verifier": "vllm_fly"}, 1, "start the engine with num_speculative_tokens >= 2"),
    ({"verifier": "vllm_fly", "window": 3}, 3, 'send "window": 2 or less'),
])
def test_window_refusals_speak_of_the_request_and_the_server(verifier, k, fix) -> None:
    with pytest.raises(SecureSDConfigError) as refusal:
        check_request(params({"securesd": {"verifier": verifier}}), engine_config(k=k))
    message = str(refusal.value)
    assert message.startswith('extra_args["securesd"]["verifier"]: ') and fix in message
    assert "num_assistant_tokens" not in message and "FLy(" not in message


def test_stop_ids_count_as_banned_until_min_tokens_plus_the_drafts_of_a_step() -> None:
    """At the position after a step's last draft, vLLM bans the stop ids while the committed response, drafts
    not counted, is shorter than min_tokens: after a committed "a" and a drafted "b", "ab" leaves neither
    a/b (bad words "aba", "abb") nor EOS there, although "ab" already holds min_tokens=2 tokens."""
    from hf_securesd.tiny import byte_tokenizer
    from hf_securesd.vllm.admission import check_some_token_allowed

    fields = dict(allowed_token_ids=[97, 98, 258], bad_words=["aba", "abb"], min_tokens=2)
    check_some_token_allowed(_constrained({"securesd": "mars"}, **fields), byte_tokenizer(), [258], draft_tokens=0)
    with pytest.raises(SecureSDConfigError, match=r"\[97, 98\] \('ab'\).*bad_words and min_tokens=2 .*ban"):
        check_some_token_allowed(_constrained({"securesd": "mars"}, **fields), byte_tokenizer(), [258], draft_tokens=3)


def test_a_boundary_list_over_the_value_bound_is_refused_naming_what_counts():
    """A long segments boundary list is refused by the size bound; its message says token ids count (it
    named only extra_args with a step example)."""
    request = {"verifier": "mars", "secure_schedule": {"schedule": "segments", "boundary": [[i] for i in range(40)]}}
    with pytest.raises(SecureSDConfigError, match="each token id of a segments boundary too"):
        parse_request(request)
