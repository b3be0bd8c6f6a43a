"""The ``--engine`` options of ``securesd bench`` and building the chosen engine from them.

    securesd bench --engine hf ...                                   # default: generate in this process
    securesd bench --engine vllm --target DIR --draft DIR ...        # in-process vllm.LLM + the plugin
    securesd bench --engine openai --base-url http://127.0.0.1:8000/v1 --tokenizer qwen-1.5b \\
        --verifiers mars:0.5 --schedules none step:1 ...             # the plugin's request fields
    securesd bench --engine openai --chat --endpoint twin=URL1 --endpoint prod=URL2 --baseline twin \\
        --endpoint-api-key-env prod=PROD_API_KEY ...                 # endpoints as configurations
    securesd bench --engine openai --chat --model M --endpoint draft=URL3 --draft-baseline draft \\
        --endpoint-model draft=D ...                                 # an endpoint serving another model

Only the ``openai`` options are new flags; every other flag means what it means for ``hf``.
Endpoint URLs with a query string or fragment are refused (a key there would be recorded with the
URL): keys go through environment variables only, and `engine_secrets` gives their values to the
results directory, which redacts them wherever a server echoes them.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Sequence

from hf_securesd.bench import json_input
from hf_securesd.bench.engines import Engine, EngineError, engine_names
from hf_securesd.bench.profiles import TINY, get_profile
from hf_securesd.bench.results import REMOTE_ENGINES
from hf_securesd.cli import (
    duration_seconds,
    environment_variable,
    non_empty_text,
    non_negative_int,
    positive_int,
)
from hf_securesd.bench.engines.client import MAX_RETRIES, MAX_WAIT_S
from hf_securesd.http_deadline import url_problem
from hf_securesd.judges.secrets import redact, url_before_query

DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_CONCURRENCY = 4
DEFAULT_MAX_RETRIES = 4
# option dest -> (flag, the engine it belongs to, its default): given with another engine, it is refused
ENGINE_OPTIONS: dict[str, tuple[str, str, Any]] = {
    "base_url": ("--base-url", "openai", None),
    "model": ("--model", "openai", None),
    "api_key_env": ("--api-key-env", "openai", None),
    "chat": ("--chat", "openai", False),
    "token_ids": ("--token-ids", "openai", False),
    "tokenizer": ("--tokenizer", "openai", None),
    "endpoint": ("--endpoint", "openai", []),
    "endpoint_api_key_env": ("--endpoint-api-key-env", "openai", []),
    "endpoint_model": ("--endpoint-model", "openai", []),
    "baseline": ("--baseline", "openai", None),
    "draft_baseline": ("--draft-baseline", "openai", None),
    "request_timeout": ("--request-timeout", "openai", DEFAULT_REQUEST_TIMEOUT_S),
    "run_deadline": ("--run-deadline", "openai", None),
    "concurrency": ("--concurrency", "openai", DEFAULT_CONCURRENCY),
    "max_retries": ("--max-retries", "openai", DEFAULT_MAX_RETRIES),
    "vllm_option": ("--vllm-option", "vllm", []),
}
# option dest -> (flag, the values that leave it to be chosen: not given, or auto): the settings of the
# models this process runs, refused with an engine that generates on its servers (`REMOTE_ENGINES`),
# which choose them
LOCAL_MODEL_OPTIONS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "device": ("--device", (None, "auto")),
    "dtype": ("--dtype", (None, "auto")),
    "num_assistant_tokens": ("--num-assistant-tokens", (None,)),
}


def retry_count(text: str) -> int:
    """--max-retries (an argparse type): a whole number from 0 to `MAX_RETRIES`, the judge's bound; each
    wait between attempts is at most `MAX_WAIT_S` (60 s), so a request waits at most 20 minutes in all."""
    count = non_negative_int(text)
    if count > MAX_RETRIES:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_RETRIES} retries (each wait up to {MAX_WAIT_S:g} s, as for the judge), "
            f"got {count}; bound a whole run with --run-deadline instead"
        )
    return count


def url_text(text: str) -> str:
    """An endpoint URL option (an argparse type): non-empty, without whitespace or control
    characters (a ``\\r\\n`` in it would split the request line)."""
    if any(character.isspace() or not character.isprintable() for character in non_empty_text(text)):
        raise argparse.ArgumentTypeError("expected a URL without spaces or control characters")
    return text


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Options of the engines (`securesd bench`)."""
    group = parser.add_argument_group("engines")
    group.add_argument(
        "--engine",
        choices=engine_names(),
        default="hf",
        help="hf: transformers generate in this process (default); vllm: in-process vllm.LLM "
        "with the plugin; openai: any OpenAI-compatible server",
    )
    group.add_argument(
        "--base-url",
        type=url_text,
        default=argparse.SUPPRESS,
        help="openai: the server (http://host:port/v1); --verifiers/--schedules go to it as "
        "the plugin's request fields, and without --baseline it serves the target baseline",
    )
    group.add_argument(
        "--model",
        type=non_empty_text,
        default=argparse.SUPPRESS,
        help="openai: the model name sent in requests to --base-url and to every --endpoint without "
             "--endpoint-model (default: the first each server lists); bound to --out: a later session "
             "that names another model there is refused",
    )
    group.add_argument(
        "--api-key-env",
        type=environment_variable,
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="openai: the API key of --base-url, read from this environment variable (never written "
        "anywhere); no --endpoint is sent it (see --endpoint-api-key-env)",
    )
    group.add_argument(
        "--chat",
        action="store_true",
        default=argparse.SUPPRESS,
        help="openai: /chat/completions with the task's messages (the server's chat template)",
    )
    group.add_argument(
        "--token-ids",
        action="store_true",
        default=argparse.SUPPRESS,
        help="openai, vLLM servers: send prompt token ids and decode the returned token ids "
        "locally (records equal to the hf and vllm engines')",
    )
    group.add_argument(
        "--tokenizer",
        type=non_empty_text,
        default=argparse.SUPPRESS,
        help="openai completions: the tokenizer whose chat template builds prompts (default: --target)",
    )
    group.add_argument(
        "--endpoint",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME=URL",
        help="openai: a deployment to audit, run as configuration endpoint:NAME (repeatable); it is "
        "sent no API key unless --endpoint-api-key-env names one for it",
    )
    group.add_argument(
        "--endpoint-api-key-env",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME=VARIABLE",
        help="openai: send --endpoint NAME the API key held by this environment variable (repeatable; "
        "never written anywhere)",
    )
    group.add_argument(
        "--endpoint-model",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME=MODEL",
        help="openai: the model name sent in requests to --endpoint NAME, in place of --model (repeatable; "
        "e.g. the draft alone served under its own name)",
    )
    group.add_argument(
        "--baseline",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="openai: the --endpoint serving the target alone (a lossless twin)",
    )
    group.add_argument(
        "--draft-baseline",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="openai: the --endpoint serving the draft alone (without it PRR is undefined)",
    )
    group.add_argument(
        "--request-timeout",
        type=duration_seconds,
        default=argparse.SUPPRESS,
        help="openai: seconds for one whole request, headers and body (default 300; at most 7 days)",
    )
    group.add_argument(
        "--run-deadline",
        type=duration_seconds,
        default=argparse.SUPPRESS,
        help="openai: seconds for the whole run (at most 7 days); requests still waiting then are recorded "
        "as failed (a rerun completes them), and the judge sends nothing more",
    )
    group.add_argument(
        "--concurrency",
        type=positive_int,
        default=argparse.SUPPRESS,
        help="openai: requests in flight at once (default 4; at most --batch-size are sent together)",
    )
    group.add_argument(
        "--max-retries",
        type=retry_count,
        default=argparse.SUPPRESS,
        help="openai: retries of a request after 429/5xx/connection errors/bad replies (default 4, at most "
        "20; each wait at most 60 s)",
    )
    group.add_argument(
        "--vllm-option",
        action="append",
        default=argparse.SUPPRESS,
        metavar="KEY=VALUE",
        help="vllm: an argument of vllm.LLM (repeatable; VALUE is read as JSON when it parses, "
        "e.g. enforce_eager=true max_model_len=4096, else as text)",
    )


def vllm_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> vllm.LLM keyword arguments; a VALUE that parses as JSON is taken as
    such. The engine sets ``model``, ``speculative_config``, ``dtype`` and ``seed`` itself."""
    reserved = {"model", "speculative_config", "dtype", "seed", "per_request_spec_decode_metrics"}
    options: dict[str, Any] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key.isidentifier():
            raise EngineError(f"--vllm-option takes KEY=VALUE with KEY a vllm.LLM argument, got {pair!r}")
        if key in reserved:
            raise EngineError(
                f"--vllm-option {key} is set by the engine (use --target/--draft/--dtype/--seed/"
                "--num-assistant-tokens)"
            )
        try:
            options[key] = json_input.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def study_models(args: argparse.Namespace, target: str, draft: str) -> tuple[str, str]:
    """The target and draft names study.json binds: the models for ``hf``/``vllm``; for
    ``openai`` the model the target's requests name (the --baseline endpoint's --endpoint-model, else
    --model), else the endpoints that serve them."""
    if getattr(args, "engine", "hf") != "openai":
        return target, draft
    from hf_securesd.bench.engines.openai import parse_endpoint_models

    model = parse_endpoint_models(args.endpoint_model).get(args.baseline, args.model)
    served = model or (f"endpoint:{args.baseline}" if args.baseline else args.base_url or "")
    return served, f"endpoint:{args.draft_baseline}" if args.draft_baseline else "none"


def prompt_format(args: argparse.Namespace) -> dict[str, Any]:
    """How the ``openai`` engine sends prompts, bound like the models (`results.RECORDED_BINDING_KEYS`):
    the tokenizer whose chat template builds them (None with --chat: the server's template) and
    whether they go as token ids; nothing for the other engines."""
    if getattr(args, "engine", "hf") != "openai":
        return {}
    return {"tokenizer": None if args.chat else args.tokenizer or args.target, "token_ids": args.token_ids}


def _tokenizer(name: str, offline: bool | None, cache_dir: str | None, flag: str = "--tokenizer") -> Any:
    """A tokenizer by registry name, Hub id, folder or ``tiny`` (the byte tokenizer); one that cannot
    be loaded is an EngineError naming `flag`."""
    if name == TINY:
        from hf_securesd.tiny import byte_tokenizer

        return byte_tokenizer()
    from transformers import AutoTokenizer

    from hf_securesd.models import resolve_model

    try:
        return AutoTokenizer.from_pretrained(resolve_model(name, offline=offline, cache_dir=cache_dir))
    except OSError as error:
        raise unloadable(f"{flag} {name}", error) from None


def unloadable(what: str, error: OSError) -> EngineError:
    """The one-line error for models or tokenizers (`what`: the options and names) that transformers
    could not load."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return EngineError(
        f"{what}: cannot be loaded ({reason}); give a registry name, Hub id or folder that exists, "
        "or --offline (with --cache-dir) for copies fetched with `securesd models`"
    )


def settle_engine_options(args: argparse.Namespace) -> None:
    """Refuse an option of one engine given with another (it would be silently ignored), then fill in the
    defaults of the options not given. The engine options are parsed without defaults, so "given" means
    on the command line, whatever its value (`--concurrency 4` with `--engine hf` is refused too); the
    options of local models (`check_local_model_options`) are refused when given a value, and so are the
    options ``--engine openai`` would take and leave unused (`check_openai_options_used`). An engine
    registered outside this package reads what it wants of `args` (`Engine.from_cli`), so nothing is
    refused for it. Idempotent."""
    given = [dest for dest in ENGINE_OPTIONS if dest in vars(args)]
    engine = getattr(args, "engine", "hf")
    if engine in {owner for _, owner, _ in ENGINE_OPTIONS.values()} | {"hf"}:
        for dest in given:
            flag, owner, _ = ENGINE_OPTIONS[dest]
            if owner != engine:
                raise EngineError(f"{flag} needs --engine {owner} (it is not used by --engine {engine}); "
                                  f"drop it or pass --engine {owner}")
    check_local_model_options(args, engine)
    for dest, (_, _, default) in ENGINE_OPTIONS.items():
        if dest not in given:
            setattr(args, dest, list(default) if isinstance(default, list) else default)
    if engine == "openai":
        check_openai_options_used(args)


def check_openai_options_used(args: argparse.Namespace) -> None:
    """Refuse what ``--engine openai`` would accept and then leave unused: a --profile's relaxed
    verifiers (sent only when named, as request fields), a --base-url no cell is served by, and
    --offline / --cache-dir with no tokenizer to resolve."""
    check_profile_sweep_is_named(args)
    check_base_url_serves_a_cell(args)
    check_tokenizer_options_used(args)


def check_profile_sweep_is_named(args: argparse.Namespace) -> None:
    """Refuse a --profile whose verifiers would be dropped: the openai engine sends relaxed verifiers to
    --base-url's plugin only when --verifiers names them (an audited deployment may not run the plugin),
    so with a --base-url and no --verifiers the profile's sweep would not run while the report names the
    profile. Without --base-url nothing could run a sweep, and the profile sets the sizes only.
    (--schedules without --verifiers is refused on its own.)"""
    profile = getattr(args, "profile", None)
    if profile is None or args.base_url is None or getattr(args, "verifiers", None) or getattr(args, "schedules", None):
        return  # (an audit of --endpoint servers alone has no sweep to run: the profile gives its sizes)
    named = get_profile(profile)
    if named.verifiers:
        verifiers, schedules = " ".join(named.verifiers), " ".join(named.schedules)
        raise EngineError(
            f"--profile {profile} sweeps the verifiers {verifiers} under the schedules {schedules}, "
            "which --engine openai sends to --base-url only when --verifiers names them; pass --verifiers "
            f"{verifiers} to run them there (a vLLM server with hf-securesd's plugin), or leave --profile "
            "out and give the sizes with --tasks, --limit and --max-new-tokens"
        )


def check_base_url_serves_a_cell(args: argparse.Namespace) -> None:
    """Refuse a --base-url that no cell is served by: with --baseline the target is an endpoint's, so
    --base-url serves only the --verifiers configurations; without them it would be bound to the results
    and recorded as audited while no answer of it is."""
    if args.base_url is not None and args.baseline is not None and not getattr(args, "verifiers", None):
        raise EngineError(
            f"--base-url serves no cell: --baseline {args.baseline} serves the target, and --base-url is "
            "sent only the --verifiers configurations, none given; drop --base-url (and its --api-key-env), "
            "audit that server as --endpoint NAME=URL, or give --verifiers to run them there"
        )


def check_tokenizer_options_used(args: argparse.Namespace) -> None:
    """Refuse --offline and --cache-dir where no tokenizer is loaded (--chat without --tokenizer or
    --target): with the openai engine they only resolve the tokenizer, as the servers run the models."""
    if not args.chat or args.tokenizer or getattr(args, "target", None):
        return
    for flag, dest in (("--offline", "offline"), ("--cache-dir", "cache_dir")):
        if getattr(args, dest, None):
            raise EngineError(
                f"{flag} is not used by --engine openai --chat without --tokenizer (it resolves the "
                "tokenizer, and none is loaded: the servers run the models and apply their chat templates); "
                f"drop {flag}, or give --tokenizer NAME"
            )


def check_local_model_options(args: argparse.Namespace, engine: str) -> None:
    """Refuse a `LOCAL_MODEL_OPTIONS` option given a value (other than auto) with an engine that
    generates on its servers: nothing of it would be used (the servers choose device, dtype and k, and
    no model runs in this process); so is ``--draft``, which no server is sent (an endpoint serves the
    draft alone: ``--draft-baseline``)."""
    if engine not in REMOTE_ENGINES:
        return
    if getattr(args, "draft", None) is not None:
        raise EngineError(f"--draft is not used by --engine {engine} (its servers run the models, and no "
                          "draft is loaded here); drop --draft, and measure the draft alone with --endpoint "
                          "NAME=URL --draft-baseline NAME")
    for dest, (flag, unset) in LOCAL_MODEL_OPTIONS.items():
        value = getattr(args, dest, None)
        if (value.strip().lower() if isinstance(value, str) else value) not in unset:
            raise EngineError(f"{flag} is not used by --engine {engine} (its servers run the models and choose "
                              f"it); drop {flag}")


def check_endpoint_urls(base_url: str | None, endpoints: dict[str, str]) -> None:
    """EngineError for an endpoint URL with a query string or fragment (``?api_key=...``): it
    would be recorded in study.json and the report, and request paths would follow it. The
    message shows the URL up to the ``?`` or ``#`` and names the option that carries a key."""
    urls = [("--base-url ", base_url, "--api-key-env NAME")] if base_url else []
    urls += [(f"--endpoint {name}=", url, f"--endpoint-api-key-env {name}=NAME")
             for name, url in endpoints.items()]
    for flag, url, key_option in urls:
        if not url.strip() or any(character.isspace() or not character.isprintable() for character in url):
            raise EngineError(f"{flag.strip()}: the URL is empty or has spaces or control characters; "
                              "give a URL such as http://host:port/v1")
        problem = url_problem(url)
        if problem is not None:  # the URL is not shown: one httpx cannot read may hold a password
            raise EngineError(f"{flag.strip()}: {problem}; give a URL such as http://host:port/v1")
        before_query = url_before_query(url)
        if before_query is not None:
            shown = f"{redact(before_query)}{url[len(before_query)]}..."
            raise EngineError(
                f"{flag}{shown} has a query string or fragment, which would be recorded with the results "
                f"(a key in it too); give the URL without it, and a key through the environment: {key_option}"
            )


def engine_secrets(args: argparse.Namespace) -> list[str]:
    """The API keys the ``openai`` engine sends (the values of the variables --api-key-env and
    --endpoint-api-key-env name), for the results directory to redact wherever a server echoes
    them; none for the other engines."""
    if getattr(args, "engine", "hf") != "openai":
        return []
    from hf_securesd.bench.engines.openai import parse_endpoint_key_envs

    variables = [args.api_key_env, *parse_endpoint_key_envs(args.endpoint_api_key_env).values()]
    return [os.environ[variable] for variable in variables if variable and os.environ.get(variable)]


def _client_settings(args: argparse.Namespace):
    from hf_securesd.bench.engines.client import ClientSettings

    try:
        return ClientSettings(
            request_timeout_s=args.request_timeout,
            run_deadline_s=args.run_deadline,
            max_retries=args.max_retries,
            concurrency=args.concurrency,
        )
    except ValueError as error:
        raise EngineError(str(error)) from None


def build_engine(args: argparse.Namespace, settings) -> Engine:
    """The engine `args` ask for, for `settings` (`StudySettings`)."""
    name = getattr(args, "engine", "hf")
    if name == "hf":
        from hf_securesd.bench.engines.hf import HFEngine
        from hf_securesd.bench.loading import load_study_models

        try:
            models = load_study_models(settings.target, settings.draft, device=settings.device,
                                       dtype=settings.dtype, offline=args.offline, cache_dir=args.cache_dir)
        except OSError as error:
            raise unloadable(f"--target {settings.target} / --draft {settings.draft}", error) from None
        return HFEngine(models)
    if name == "vllm":
        from hf_securesd.bench.engines.vllm import VLLMEngine
        from hf_securesd.bench.loading import _describe
        from hf_securesd.models import resolve_model

        if TINY in (settings.target, settings.draft):
            raise EngineError(
                "the vllm engine loads models from folders; save a pair with save_pretrained "
                "and pass the folders as --target/--draft"
            )
        try:
            target, draft = (
                resolve_model(role, offline=args.offline, cache_dir=args.cache_dir)
                for role in (settings.target, settings.draft)
            )
        except OSError as error:
            raise unloadable(f"--target {settings.target} / --draft {settings.draft}", error) from None
        options = vllm_options(args.vllm_option)
        return VLLMEngine(
            target,
            draft,
            _tokenizer(target, args.offline, args.cache_dir, flag="--target"),
            dtype=settings.dtype,
            num_assistant_tokens=settings.num_assistant_tokens,
            seed=settings.seed or 0,
            engine_options=options,
            ids={"target": _describe(settings.target, target), "draft": _describe(settings.draft, draft)},
        )
    if name == "openai":
        from hf_securesd.bench.engines.openai import (
            OpenAIEngine,
            OpenAISettings,
            parse_endpoint_key_envs,
            parse_endpoint_models,
            parse_endpoints,
        )

        endpoints = parse_endpoints(args.endpoint)
        check_endpoint_urls(args.base_url, endpoints)
        tokenizer_name = args.tokenizer or args.target
        if not args.chat and tokenizer_name is None:
            raise EngineError(
                "--engine openai without --chat builds prompts with a tokenizer's chat template: "
                "give --tokenizer NAME (or --target), or pass --chat"
            )
        flag = "--tokenizer" if args.tokenizer else "--target"
        tokenizer = (
            None if tokenizer_name is None else _tokenizer(tokenizer_name, args.offline, args.cache_dir, flag)
        )
        endpoint_settings = OpenAISettings(
            base_url=args.base_url,
            model=args.model,
            api_key_env=args.api_key_env,
            chat=args.chat,
            token_ids=args.token_ids,
            endpoints=endpoints,
            endpoint_key_envs=parse_endpoint_key_envs(args.endpoint_api_key_env),
            endpoint_models=parse_endpoint_models(args.endpoint_model),
            baseline=args.baseline,
            draft_baseline=args.draft_baseline,
            client=_client_settings(args),
        )
        return OpenAIEngine(endpoint_settings, tokenizer)
    from hf_securesd.bench.engines import engine_class

    return engine_class(name).from_cli(args, settings)


def endpoint_configs(args: argparse.Namespace) -> list:
    """One ``endpoint:NAME`` configuration per --endpoint that is not a baseline."""
    from hf_securesd.bench.engines.openai import parse_endpoints
    from hf_securesd.bench.plan import RunConfig

    if getattr(args, "engine", "hf") != "openai":
        return []
    baselines = {args.baseline, args.draft_baseline}
    return [
        RunConfig("endpoint", endpoint=name)
        for name in parse_endpoints(args.endpoint)
        if name not in baselines
    ]
