"""Which model each request of `--engine openai` names, against vLLM-like servers on 127.0.0.1 that this
test controls (each lists one model and answers a request for another HTTP 404, as vLLM does).

The one `--model` went to every endpoint, so the documented audit (a draft served as Qwen3-0.6B next to a
Qwen3-8B target) failed every draft prompt and a rerun could not fix it; study.json and the report named
the draft as the target's model. Now `--endpoint-model NAME=MODEL` names an endpoint's own model, a model a
server does not list is refused before anything is generated, the model requested at each route is
recorded and bound to the results directory, and a reply that names another model than its request is
warned about once per endpoint (and scored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import send_reply as send, serve_model_list, stop_servers

from hf_securesd.bench.cli_engines import study_models
from hf_securesd.bench.engines.base import EngineError, Generation, Prompt
from hf_securesd.bench.engines.client import ClientSettings
from hf_securesd.bench.engines.openai import BASE_ROUTE, OpenAIEngine, OpenAISettings, parse_endpoint_models
from hf_securesd.bench.plan import DRAFT, TARGET, RunConfig
from hf_securesd.bench.results import FAILURES, GENERATIONS, MANIFEST, ResultsDir, read_jsonl
from hf_securesd.cli import main

TARGET_MODEL = "Qwen/Qwen3-8B"
DRAFT_MODEL = "Qwen/Qwen3-0.6B"
REFUSAL = "I'm sorry, but I cannot help with that."
PROMPT = Prompt(text=None, messages=[{"role": "user", "content": "hi"}])


def vllm_like(models: list[str], replied_model: str | None = "requested"):
    """A handler answering like vLLM serving `models`: a chat reply for a request naming one of them, HTTP
    404 for any other. The reply names `replied_model` ("requested": the request's model; None: none)."""
    def respond(handler, state):
        requested = json.loads(handler.body)["model"]
        if requested not in models:
            message = f"The model `{requested}` does not exist."
            send(handler, 404, json.dumps({"object": "error", "message": message, "code": 404}).encode())
            return
        reply = {"choices": [{"message": {"role": "assistant", "content": REFUSAL}, "finish_reason": "stop"}],
                 "usage": {"completion_tokens": 4}}
        if replied_model is not None:
            reply["model"] = requested if replied_model == "requested" else replied_model
        send(handler, 200, json.dumps(reply).encode())

    return respond


@pytest.fixture
def serve():
    """Starts vLLM-like servers (`vllm_like`); returns (URL, state: its requests' headers and bodies)."""
    servers: list = []

    def start(models: list[str], replied_model: str | None = "requested") -> tuple[str, dict]:
        listed = json.dumps({"object": "list", "data": [{"id": name} for name in models]}).encode()
        return serve_model_list(servers, vllm_like(models, replied_model), listed)

    yield start
    stop_servers(servers)


def audit_argv(urls: dict[str, str], out: Path, data_dir: Path, *extra: str) -> list[str]:
    """The documented audit (docs/benchmarks.md, "Auditing a deployment"), small."""
    return ["bench", "--engine", "openai", "--chat", "--endpoint", f"prod={urls['prod']}",
            "--endpoint", f"twin={urls['twin']}", "--endpoint", f"draft={urls['draft']}",
            "--baseline", "twin", "--draft-baseline", "draft", "--model", TARGET_MODEL,
            "--tasks", "jailbreak", "--limit", "2", "--max-new-tokens", "4", "--data-dir", str(data_dir),
            "--request-timeout", "5", "--max-retries", "0", "--no-progress", "--out", str(out), *extra]


def requested_models(state: dict) -> set[str]:
    return {json.loads(body)["model"] for body in state["bodies"]}


def test_the_documented_audit_names_the_drafts_own_model(serve, tmp_path, data_dir):
    (prod, seen_prod), (twin, seen_twin), (draft, seen_draft) = (
        serve([TARGET_MODEL]), serve([TARGET_MODEL]), serve([DRAFT_MODEL]))
    out = tmp_path / "audit"
    argv = audit_argv({"prod": prod, "twin": twin, "draft": draft}, out, data_dir,
                      "--endpoint-model", f"draft={DRAFT_MODEL}")
    assert main(argv) == 0
    assert read_jsonl(out / FAILURES) == []
    assert {run["config_key"] for run in ResultsDir(out).runs()} == {"target", "draft", "endpoint:prod"}
    assert requested_models(seen_draft) == {DRAFT_MODEL}
    assert requested_models(seen_prod) == requested_models(seen_twin) == {TARGET_MODEL}
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["resolved_models"] == {"prod": TARGET_MODEL, "twin": TARGET_MODEL, "draft": DRAFT_MODEL}
    assert manifest["models"]["draft"]["name"] == DRAFT_MODEL
    assert manifest["models"]["target"]["name"] == TARGET_MODEL
    report = (out / "report" / "report.md").read_text()
    assert f"- **draft**: `{DRAFT_MODEL}`" in report and f"- **target**: `{TARGET_MODEL}`" in report
    assert {row["reply_model"] for row in read_jsonl(out / GENERATIONS)} == {TARGET_MODEL, DRAFT_MODEL}
    assert main(argv) == 0  # the same command resumes: nothing is sent again
    assert len(seen_draft["bodies"]) == 2


def test_a_model_an_endpoint_does_not_list_is_warned_about_before_anything_is_generated(serve, tmp_path, data_dir):
    """The draft server lists only its own model: warned about first, naming both fixes; a vLLM-like server
    then answers every request for the unlisted model HTTP 404, recorded as failed prompts."""
    servers = {name: serve(models) for name, models in
               (("prod", [TARGET_MODEL]), ("twin", [TARGET_MODEL]), ("draft", [DRAFT_MODEL]))}
    out = tmp_path / "audit"
    with pytest.warns(UserWarning, match="does not list") as caught:
        assert main(audit_argv({name: url for name, (url, _) in servers.items()}, out, data_dir)) == 1
    (warning,) = [str(item.message) for item in caught if "does not list" in str(item.message)]
    assert warning.startswith(f"endpoint 'draft' ({servers['draft'][0]}) does not list '{TARGET_MODEL}'")
    assert f'its /models lists "{DRAFT_MODEL}"' in warning and "(--model)" in warning
    assert "--endpoint-model draft=MODEL" in warning and f"--served-model-name {TARGET_MODEL}" in warning
    failed = read_jsonl(out / FAILURES)
    assert failed and {row["cell"].split("|")[0] for row in failed} == {"draft"}


def test_a_base_url_that_does_not_list_the_model_is_warned_about(serve):
    """Servers that accept names they do not list (aliases, tags, gateways) are still sent the model."""
    url, state = serve([TARGET_MODEL, *(f"other-{index}" for index in range(12))])
    settings = OpenAISettings(base_url=url, model=DRAFT_MODEL, chat=True)
    with pytest.warns(UserWarning, match=r"--base-url .* does not list 'Qwen/Qwen3-0.6B'.* and 3 more\. A server "
                                         r"that serves only what it lists \(vLLM\) fails every such request; name "
                                         r"one of those with --model MODEL, or start that server with "
                                         r"--served-model-name Qwen/Qwen3-0.6B"):
        engine = OpenAIEngine(settings)
    assert engine._models[BASE_ROUTE]["request_model"] == DRAFT_MODEL


def test_a_server_without_a_model_list_is_sent_the_model_asked_for(serve):
    """An empty list lists nothing to check the model against: the requests name it, as without /models."""
    url, _ = serve([])
    engine = OpenAIEngine(OpenAISettings(base_url=url, model="served-anyway", chat=True))
    assert engine.describe()["resolved_models"] == {"--base-url": "served-anyway"}


def test_endpoint_model_is_checked_like_the_other_per_endpoint_options(capsys, tmp_path):
    assert parse_endpoint_models(["draft=Qwen/Qwen3-0.6B", "prod=gpt-4o"]) == {
        "draft": DRAFT_MODEL, "prod": "gpt-4o"}
    with pytest.raises(EngineError, match="--endpoint-model 'draft' is given twice"):
        parse_endpoint_models(["draft=a", "draft=b"])
    for malformed in ("draft", "=model", "draft= "):
        with pytest.raises(EngineError, match="--endpoint-model takes NAME=MODEL"):
            parse_endpoint_models([malformed])
    with pytest.raises(EngineError, match=r"--endpoint-model 'drfat' is not an --endpoint NAME=URL "
                                          r"\(given: draft\)"):
        OpenAISettings(base_url="http://127.0.0.1:9/v1", endpoints={"draft": "http://127.0.0.1:8/v1"},
                       endpoint_models={"drfat": DRAFT_MODEL})
    argv = ["bench", "--endpoint-model", "draft=m", "--tasks", "jailbreak", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error: --endpoint-model needs --engine openai")


def test_the_target_is_recorded_as_the_model_its_endpoint_is_sent():
    from argparse import Namespace

    args = Namespace(engine="openai", model="gpt-4o", baseline="twin", base_url=None, draft_baseline="draft",
                     endpoint_model=[f"twin={TARGET_MODEL}", f"draft={DRAFT_MODEL}"])
    assert study_models(args, "unused", "unused") == (TARGET_MODEL, "endpoint:draft")


def _bind_argv(url: str, out: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["bench", "--engine", "openai", "--chat", "--base-url", url, "--model", "model-A", "--endpoint",
            f"alt={url}", "--tasks", "jailbreak", "--limit", "2", "--max-new-tokens", "4", "--data-dir",
            str(data_dir), "--max-retries", "0", "--no-progress", "--no-report", "--out", str(out), *extra]


def test_an_endpoints_model_is_bound_to_the_results_directory(serve, tmp_path, data_dir, capsys):
    """Changing the model an endpoint's requests name under the same --out is refused, as giving it another
    URL is: its cells would hold two models' answers."""
    url, state = serve(["model-A", "model-B"])
    out = tmp_path / "out"
    assert main(_bind_argv(url, out, data_dir, "--endpoint-model", "alt=model-B")) == 0
    recorded = json.loads((out / MANIFEST).read_text())["resolved_models"]
    assert recorded == {"--base-url": "model-A", "alt": "model-B"}
    sent = len(state["bodies"])
    assert main(_bind_argv(url, out, data_dir, "--endpoint-model", "alt=model-B")) == 0  # the same: resumed
    assert len(state["bodies"]) == sent
    capsys.readouterr()
    for change in (["--endpoint-model", "alt=model-A"], []):  # another model, or --model's in its place
        assert main(_bind_argv(url, out, data_dir, *change)) == 2
        error = capsys.readouterr().err
        assert "alt 'model-B' there, 'model-A' now" in error and "use a new --out directory" in error, error
    assert len(state["bodies"]) == sent


def _engine(url: str, **settings) -> OpenAIEngine:
    return OpenAIEngine(OpenAISettings(base_url=url, chat=True, **settings,
                                       client=ClientSettings(request_timeout_s=5, max_retries=0)))


def test_a_reply_naming_another_model_is_warned_about_once_per_endpoint_and_scored(serve):
    """Replies naming the requested model, or none, say nothing; each endpoint whose replies name another
    model is warned about once (a hosted API's dated name included), its answers scored."""
    url, _ = serve([TARGET_MODEL])
    unnamed, _ = serve([TARGET_MODEL], replied_model=None)
    swapped, _ = serve([TARGET_MODEL], replied_model="totally-different-model")
    hostile, _ = serve([DRAFT_MODEL], replied_model="\x1b[2Jswapped")
    engine = _engine(url, endpoints={"unnamed": unnamed, "swapped": swapped, "draft": hostile},
                     draft_baseline="draft")
    configs = [TARGET, RunConfig("endpoint", endpoint="unnamed"), RunConfig("endpoint", endpoint="swapped"),
               RunConfig("endpoint", endpoint="swapped"), DRAFT]
    with pytest.warns(UserWarning) as caught:
        answers = [answer for config in configs for answer in engine.generate(config, [PROMPT] * 2, 8, 0)]
    assert len(answers) == 10
    assert all(isinstance(answer, Generation) and answer.response == REFUSAL for answer in answers)
    messages = [str(warning.message) for warning in caught]
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"endpoint 'swapped' ({swapped}) answered a request for '{TARGET_MODEL}' "
                                  'with a reply naming the model "totally-different-model"')
    assert messages[1].startswith(f"endpoint 'draft' ({hostile}) answered a request for '{DRAFT_MODEL}'")
    assert '"\\u001b[2Jswapped"' in messages[1] and "\x1b" not in messages[1]
    # every generation records the model its reply named (none: None)
    assert [answer.reply_model for answer in answers[:6]] == [TARGET_MODEL] * 2 + [None] * 2 + ["totally-different-model"] * 2
    assert answers[-1].reply_model == "\x1b[2Jswapped"  # recorded as JSON by the results writer


def test_a_reply_model_name_is_cut_and_redacted_when_recorded(serve, monkeypatch):
    monkeypatch.setenv("SECURESD_TEST_KEY", "sk-secret-key-123456")
    url, _ = serve([TARGET_MODEL], replied_model="x" * 300 + "sk-secret-key-123456")
    engine = OpenAIEngine(OpenAISettings(base_url=url, chat=True, api_key_env="SECURESD_TEST_KEY",
                                         client=ClientSettings(request_timeout_s=5, max_retries=0)))
    with pytest.warns(UserWarning):
        (answer,) = engine.generate(TARGET, [PROMPT], 8, 0)
    assert answer.reply_model == "x" * 200
    url, _ = serve([TARGET_MODEL], replied_model="model-sk-secret-key-123456")
    engine = OpenAIEngine(OpenAISettings(base_url=url, chat=True, api_key_env="SECURESD_TEST_KEY",
                                         client=ClientSettings(request_timeout_s=5, max_retries=0)))
    with pytest.warns(UserWarning):
        (answer,) = engine.generate(TARGET, [PROMPT], 8, 0)
    assert "sk-secret-key-123456" not in answer.reply_model
    url, _ = serve([TARGET_MODEL], replied_model="x" * 190 + "sk-secret-key-123456")  # a key across the cut
    engine = OpenAIEngine(OpenAISettings(base_url=url, chat=True, api_key_env="SECURESD_TEST_KEY",
                                         client=ClientSettings(request_timeout_s=5, max_retries=0)))
    with pytest.warns(UserWarning):
        (answer,) = engine.generate(TARGET, [PROMPT], 8, 0)
    assert answer.reply_model.startswith("x" * 190) and "sk-secr" not in answer.reply_model
