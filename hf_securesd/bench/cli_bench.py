"""``securesd bench``: run the safety/utility study for a draft/target pair into a results directory.

    securesd bench --profile smoke --out results/smoke
    securesd bench --profile cpu-small --out results/qwen-cpu
    securesd bench --profile paper --device cuda --out results/paper
    securesd bench --target qwen-1.5b --draft qwen-0.5b --tasks jailbreak gsm8k \\
        --verifiers mars:0.9,0.5 bild --schedules none step:1 step:4 --limit 50 --out results/mine
    securesd bench --engine openai --base-url http://127.0.0.1:8000/v1 --tokenizer qwen-1.5b ...

`--engine` picks how answers are generated (`bench/cli_engines.py`): `hf` (default), `vllm` or
`openai`; results and the report are the same for every engine.

A profile (`bench/profiles.py`) sets every default; the flags override it. Rerunning with the same
--out resumes: recorded cells and examples are not redone. The report is written at the end
(`securesd report` rewrites it).

Exit status: 0 every cell finished; 1 prompts got no answer (recorded in failures.jsonl; the same
command again retries them); 2 bad options or settings (nothing generated; also an --out holding
results of other settings or that cannot be created or written, or HumanEval without a usable
bubblewrap or --unsafe-no-isolation; after the study, a report that could not be written or read:
the cells stay recorded and `securesd report` writes it once the cause is fixed); 3 the
judge could not score a finished cell (`EXIT_JUDGE_FAILED`: its endpoint failed, or the run deadline
passed; the journaled generations are kept and the same command again scores them); 4 another run
holds --out (`EXIT_IN_USE`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hf_securesd.bench import json_input
from hf_securesd.bench.cli_engines import (
    add_engine_options,
    build_engine,
    endpoint_configs,
    engine_secrets,
    prompt_format,
    settle_engine_options,
    study_models,
)
from hf_securesd.bench.profiles import PROFILES, Profile, get_profile
from hf_securesd.bench.results import MANIFEST, REMOTE_ENGINES, ResultsDir
from hf_securesd.bench.sandbox import Isolation, SandboxUnavailableError
from hf_securesd.bench.terminal import print_error, printable
from hf_securesd.cli import (
    EXIT_IN_USE,
    EXIT_JUDGE_FAILED,
    Accumulate,
    non_empty_text,
    non_negative_int,
    positive_int,
    thread_count,
)
from hf_securesd.models.pypi_assembly import AssemblyError
from hf_securesd.paths import broken_link, broken_link_text, nearest_existing, path_kind, too_long_path

# what refuses options or a setup before anything is generated (exit 2): DeviceError and EngineError
# are ValueErrors; KeyError: an unknown task or profile; SandboxUnavailableError: HumanEval without
# bubblewrap or --unsafe-no-isolation; AssemblyError: an offline model copy that cannot be built
SETUP_ERRORS = (KeyError, ValueError, FileNotFoundError, SandboxUnavailableError, AssemblyError)
MODEL_FOLDER_ENGINES = ("hf", "vllm")  # the engines that load --target/--draft in this process


def add_common_options(parser: argparse.ArgumentParser, default_profile: str, *, engines: bool) -> None:
    """Options shared by `bench` and `calibrate`; without --profile, `default_profile`'s defaults fill in
    the options not given (`chosen_profile`), and no profile is recorded as named. `engines`: whether
    the command has --engine (`bench`; `calibrate` runs `hf` only), so the help names the engines only
    where the command takes them."""

    def engine_note(note: str) -> str:
        """`note` in the help of a command with --engine, else nothing."""
        return note if engines else ""

    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help=f"study size and defaults (default: none named, {default_profile}'s defaults)",
    )
    parser.set_defaults(default_profile=default_profile)
    parser.add_argument(
        "--target", type=non_empty_text, default=None, help="target model: registry name, Hub id, folder, or 'tiny'"
    )
    parser.add_argument("--draft", type=non_empty_text, default=None, help="draft model: registry name, Hub id, folder, or 'tiny'")
    parser.add_argument("--tasks", nargs="+", action=Accumulate, default=None,
                        help="benchmark tasks, the values of every --tasks together (default: the profile's)")
    parser.add_argument(
        "--limit",
        type=parse_limit,
        default=None,
        help="examples per task: a count (50), or a fraction of each task in (0, 1) (0.25); "
        "default: the profile's",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help="generation length for every task (default: the profile's caps on each task's own)",
    )
    parser.add_argument(
        "--num-assistant-tokens",
        type=positive_int,
        default=None,
        help="draft tokens per round k (default 5"
        + engine_note("; refused by --engine openai, whose servers choose it") + ")",
    )
    parser.add_argument(
        "--seed", type=non_negative_int, default=None, help="task sampling seed (default: each task's own, 0)"
    )
    parser.add_argument(
        "--data-dir", type=non_empty_text, default=None, help="local benchmark data (default: $SECURESD_DATA_DIR, else the Hub)"
    )
    parser.add_argument(
        "--out", type=out_path, required=True, help="results directory (created; reused to resume)"
    )
    parser.add_argument(
        "--device",
        type=non_empty_text,
        default="auto",
        help="auto (cuda, else mps, else cpu; the default), cpu, cuda, cuda:1, ..."
        + engine_note("; only auto is taken by --engine openai"),
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", "bf16", "fp16", "fp32"),
        default=None,
        help="model dtype; auto: bf16 on GPUs that support it, on CPUs only where bf16 is native and "
        f"faster in a timed matmul{engine_note(' (vllm: where it is native)')}, else fp32; resuming --out, the "
        f"dtype it records{engine_note('; only auto is taken by --engine openai')} (default: the profile's)",
    )
    parser.add_argument("--judge", default="refusal_prefix", help="jailbreak judge of hf_securesd.judges")
    add_isolation_option(parser)
    parser.add_argument(
        "--judge-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="judge constructor argument (repeatable); VALUE: a number, text, or a JSON list in brackets",
    )
    parser.add_argument(
        "--thinking-trace",
        choices=THINKING_CHOICES,
        default="auto",
        help="whether the target writes a thinking trace closed by </think>, so that the safety tasks judge "
        "only the text after it: yes, no (judge the whole reply), or auto (the default: yes when the target "
        "tokenizer has </think> as one token, as reasoning models do; else no, also when no tokenizer is at "
        "hand: give yes for a reasoning endpoint that returns its trace in the reply)",
    )
    parser.add_argument("--offline", action="store_true", default=None, help="use the offline model copies")
    parser.add_argument("--cache-dir", type=non_empty_text, default=None, help="folder of the offline model copies")
    parser.add_argument(
        "--batch-size", type=positive_int, default=None, help="prompts per generate call (default: the profile's)"
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        help="torch CPU threads (default: the profile's, else torch's"
        + engine_note("; with --engine openai, those of a local judge model") + ")",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    accept_underscores(parser)


THINKING_CHOICES = ("auto", "yes", "no")


def thinking_trace(choice: str, tokenizer: Any | None) -> str:
    """--thinking-trace as recorded: "yes" or "no"; "auto" reads the target's tokenizer (`writes_thinking`)."""
    from hf_securesd.judges.reasoning import writes_thinking

    if choice != "auto":
        return choice
    return "yes" if writes_thinking(tokenizer) else "no"


def chosen_profile(args: argparse.Namespace) -> Profile:
    """The profile whose defaults fill in the options not given: --profile, else the command's default."""
    return get_profile(args.profile or args.default_profile)


def add_isolation_option(parser: argparse.ArgumentParser) -> None:
    """``--unsafe-no-isolation`` (`bench`, `calibrate`, `rescore`); `requested_isolation` reads it."""
    parser.add_argument(
        "--unsafe-no-isolation",
        action="store_true",
        help="run generated code (HumanEval) WITHOUT bubblewrap isolation, with resource limits only; "
        "by default the run refuses when bubblewrap is unusable",
    )


def requested_isolation(args: argparse.Namespace) -> Isolation:
    """The sandbox isolation `args` ask for: ``unsafe-none`` with --unsafe-no-isolation, else ``auto``
    (bubblewrap, or a refusal naming the cause and the fix)."""
    return "unsafe-none" if args.unsafe_no_isolation else "auto"


def accept_underscores(parser: argparse.ArgumentParser) -> None:
    """Let every ``--two-words`` option also be spelled ``--two_words`` (lm-evaluation-harness
    style). The alias is registered for parsing only, so the help lists each option once."""
    for action in parser._actions:
        for option in list(action.option_strings):
            alias = "--" + option[2:].replace("-", "_")
            if option.startswith("--") and alias != option:
                parser._option_string_actions.setdefault(alias, action)


def out_path(text: str) -> Path:
    """``--out`` (an argparse type): an empty or blank path is refused (``Path('')`` is the current
    folder, which would receive the results); a leading ``~`` (left as it is by ``--out=~/dir``) is the
    home folder, as the results directory reads it."""
    return Path(non_empty_text(text)).expanduser()


def check_out_dir(out: Path) -> None:
    """Refuse, before any model is loaded, an --out that is a file, a folder that cannot be written, or
    cannot be created. Nothing is created or removed here: a missing --out needs its nearest existing
    folder to be a writable directory, no symbolic link that leads nowhere at or above it (dangling, or a
    loop of links: `broken_link`), and no ``..`` below it (it would step out of a folder the run would have
    to create)."""
    kind = path_kind(out)
    if kind == "too long":
        raise ValueError(too_long_path("--out", out))
    if kind == "file":
        raise ValueError(f"--out {out} is a file; give a directory (created if missing)")
    if kind == "folder":
        if not os.access(out, os.W_OK | os.X_OK):
            raise ValueError(f"--out {out} is a folder that cannot be written; give a writable directory")
        return
    link = broken_link(out)
    if link is not None:
        raise ValueError(broken_link_text("--out", out, link))
    existing = nearest_existing(out)
    missing = out.absolute().relative_to(existing).parts
    if ".." in missing:
        raise ValueError(f"--out {out} steps out ('..') of a folder that does not exist; give the path without '..'")
    if not existing.is_dir():
        raise ValueError(f"--out {out}: {existing} is a file; give a directory (created if missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} cannot be created ({existing} is not writable); give a writable directory")


def parse_limit(text: str) -> int | float:
    """``--limit``: a whole number of examples (>= 1), or a fraction of each task in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--limit takes a count or a fraction, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"--limit {text}: give a finite count >= 1 or a fraction in (0, 1)")
    if value >= 1:
        if value != int(value):
            raise argparse.ArgumentTypeError(f"--limit {text}: a count must be a whole number (or use 0 < f < 1)")
        return int(value)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--limit {text}: give a count >= 1 or a fraction in (0, 1)")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd bench``."""
    add_common_options(parser, default_profile="cpu-small", engines=True)
    parser.add_argument(
        "--verifiers",
        nargs="+",
        action=Accumulate,
        default=None,
        help="verifier specs: NAME (its sweep, Verifier.sweep()) or NAME:V1,V2 (those knob values)",
    )
    parser.add_argument(
        "--schedules",
        nargs="+",
        action=Accumulate,
        default=None,
        help="schedules: none, step:L, linear:L, power:L:GAMMA, or a JSON object such as "
        '\'{"schedule": "segments", "boundary": "</think>", "before": null, "after": "lossless"}\' '
        "(default: none step:1)",
    )
    parser.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    add_engine_options(parser)
    accept_underscores(parser)


def judge_options(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings -> dict; numbers are parsed, and a VALUE in brackets or braces that is JSON is
    that JSON list or object (``prefixes=["I cannot", "I won't"]``, ``backend_kwargs={"timeout": 5}``); any
    other VALUE is text (a custom ``rubric={forbidden_prompt} ...`` included: the judge refuses text where
    it needs a list or an object, naming the form)."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise ValueError(f"--judge-option takes KEY=VALUE, got {pair!r}")
        if key in options:
            raise ValueError(f"--judge-option {key!r} is given twice; give each judge option once")
        if value.lstrip()[:1] in ("[", "{"):
            options[key] = _json_value(key, value)
            continue
        try:
            options[key] = int(value)
        except ValueError:
            try:
                options[key] = float(value)
            except ValueError:
                options[key] = value
    return options


def _json_value(key: str, value: str) -> Any:
    """--judge-option KEY=[...] or KEY={...}: the JSON it holds, or the text itself when it is no JSON; a
    ValueError naming the option for JSON nested too deeply to read or whose object gives a key twice."""
    try:
        parsed = json_input.loads(value)
    except ValueError as error:
        if json_input.TOO_DEEP in str(error):
            raise ValueError(f"--judge-option {key}: the JSON value is {str(error).split(':')[0]}; give a "
                             "shallower list or object") from None
        return value
    repeated = _repeated_key(value)
    if repeated is not None:
        raise ValueError(f"--judge-option {key}={value}: the JSON gives the key {repeated!r} twice in one object "
                         "(only the last would be read); give each key once")
    return parsed


def _repeated_key(text: str) -> str | None:
    """The first key that an object of `text` (valid JSON) gives twice, or None."""
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        value = dict(items)
        if len(value) != len(items):
            names = [name for name, _ in items]
            repeated.append(next(name for index, name in enumerate(names) if name in names[:index]))
        return value

    json.loads(text, object_pairs_hook=pairs)
    return repeated[0] if repeated else None


def vllm_dtype(spec: str, device: str) -> tuple[str, str]:
    """(dtype, reason) for the vllm engine: ``auto`` on a CPU is bf16 where the CPU has native bf16,
    else fp32, without the timed matmul of the hf engine's rule (it times torch, not vLLM's kernels,
    and its noise would let the dtype, a binding setting, differ between sessions); everything else
    as `resolve_dtype` decides."""
    from hf_securesd.models.hardware import BF16_FLAGS, cpu_flags, resolve_dtype

    if (spec or "auto").strip().lower() != "auto" or not device.startswith("cpu"):
        return resolve_dtype(spec, device)
    if (cpu_flags() or set()) & set(BF16_FLAGS):
        return "bf16", "the CPU has native bf16 (vllm engine: no timed matmul)"
    return "fp32", "the CPU has no native bf16 (no avx512_bf16/amx_bf16)"


def recorded_dtype(out: Path, device: str) -> str | None:
    """The dtype the study.json of `out` records for `device` (None: no results there yet, or results
    of another device): what ``--dtype auto`` resumes with. Deciding again could flip a choice made by
    a timing, and with it the resume; the vllm engine's rule (`vllm_dtype`) times nothing, but resumes
    the same way."""
    if not (out / MANIFEST).is_file():
        return None
    manifest = ResultsDir(out).read_manifest()
    return manifest.get("dtype") if manifest.get("device") == device else None


def device_and_dtype(
    args: argparse.Namespace, profile: Profile, batch_size: int
) -> dict[str, tuple[Any, str]]:
    """The device and dtype the engine's models run at, each with the reason: ``auto`` resolved
    (`hf_securesd.models.hardware`; `vllm_dtype` for the vllm engine) or, resuming --out, the dtype
    it records (`recorded_dtype`), the profile's dtype unless --dtype is given. Neither is used
    (None) by an engine that generates on its servers, so nothing is resolved or timed for it."""
    from hf_securesd.models.hardware import resolve_device, resolve_dtype

    engine = getattr(args, "engine", "hf")
    if engine in REMOTE_ENGINES:
        unused = f"not used: the {engine} engine generates on its servers"
        return {"device": (None, unused), "dtype": (None, unused)}
    device = resolve_device(args.device)
    spec = args.dtype or profile.dtype
    recorded = recorded_dtype(args.out, device) if spec.strip().lower() == "auto" else None
    if recorded is not None:
        dtype, dtype_reason = recorded, f"--dtype auto: the dtype {args.out / MANIFEST} records, not decided again"
    elif engine == "vllm":
        dtype, dtype_reason = vllm_dtype(spec, device)
    else:
        dtype, dtype_reason = resolve_dtype(spec, device, rows=batch_size)
    if args.dtype is None and dtype_reason == "requested":
        dtype_reason = f"the {profile.name} profile's"
    return {
        "device": (device, "requested" if args.device not in (None, "auto") else "auto"),
        "dtype": (dtype, dtype_reason),
    }


def machine_settings(args: argparse.Namespace, profile: Profile) -> dict[str, Any]:
    """Device, dtype (`device_and_dtype`), threads and batch size for this machine: the flags,
    else the profile's defaults; each with the reason for it, printed before anything is loaded."""
    import torch

    batch_size = args.batch_size if args.batch_size is not None else profile.batch_size
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    chosen = device_and_dtype(args, profile, batch_size)
    threads = args.threads or profile.threads
    if threads:
        torch.set_num_threads(threads)
    threads_reason = "--threads" if args.threads else f"the {profile.name} profile's" if threads else "torch's default"
    chosen["threads"] = (torch.get_num_threads(), threads_reason)
    batch_reason = "--batch-size" if args.batch_size is not None else f"the {profile.name} profile's"
    chosen["batch_size"] = (batch_size, batch_reason)
    print("machine: " + "; ".join(f"{key} {'–' if value is None else value} ({why})"
                                  for key, (value, why) in chosen.items()), flush=True)
    return {key: value for key, (value, _) in chosen.items()}


def prepare(args: argparse.Namespace):
    """Settings, the engine (its models loaded) and prepared tasks for `args` (shared with
    `calibrate`, which has no --engine and runs `hf`)."""
    from hf_securesd.bench.data import resolve_data_dir
    from hf_securesd.bench.runner import StudySettings, prepare_tasks, with_prompts

    from hf_securesd.bench.loading import check_model_folders
    from hf_securesd.bench.plan import check_no_repeats
    from hf_securesd.bench.tasks import check_isolation

    profile = chosen_profile(args)
    check_no_repeats("--tasks", args.tasks or [], lambda task: (task,))
    check_isolation(args.tasks or profile.tasks, requested_isolation(args))
    models = {"--target": args.target or profile.target, "--draft": args.draft or profile.draft}
    if getattr(args, "engine", "hf") in MODEL_FOLDER_ENGINES:
        check_model_folders(models)
    local_data = resolve_data_dir(args.data_dir)  # also where the judge reads its data files (a rubric)
    machine = machine_settings(args, profile)
    target, draft = study_models(args, models["--target"], models["--draft"])
    settings = StudySettings(
        target=target,
        draft=draft,
        device=machine["device"],
        dtype=machine["dtype"],
        num_assistant_tokens=None if getattr(args, "engine", "hf") in REMOTE_ENGINES  # the servers' k
        else args.num_assistant_tokens or profile.num_assistant_tokens,
        batch_size=machine["batch_size"],
        seed=args.seed,
        judge=args.judge,
        judge_options=judge_options(args.judge_option),
        isolation=requested_isolation(args),
        profile=args.profile,
        defaults_profile=profile.name,
        prompt_format=prompt_format(args),
        data_dir=None if local_data is None else str(local_data),
    )
    # The examples before any model: a data problem (folder, file, --limit) is found in seconds
    tasks = prepare_tasks(
        args.tasks or profile.tasks,
        None,
        data_dir=args.data_dir,
        limit=args.limit if args.limit is not None else profile.limit,
        seed=args.seed,
        max_new_tokens=lambda task: profile.max_new_tokens_for(
            task.kind, task.max_new_tokens, args.max_new_tokens
        ),
    )
    engine = build_engine(args, settings)
    settings = replace(settings, thinking_trace=thinking_trace(args.thinking_trace, engine.tokenizer))
    return settings, engine, with_prompts(tasks, engine.tokenizer)


def write_report_if_any(out: Path) -> None:
    """Write the report of `out`, or say why there is none yet: no cell has finished (every cell
    still has prompts without an answer, recorded in failures.jsonl)."""
    from hf_securesd.bench.report import write_report

    if not ResultsDir(out).runs():
        print(f"no report: no configuration of {out} has finished yet (each has prompts without an answer, "
              "see failures.jsonl)", file=sys.stderr)
        return
    print(f"report: {write_report(out)}")


def setup_error(error: Exception) -> int:
    """Print an error of the options or the setup (one of `SETUP_ERRORS`) as one line and return 2
    (a KeyError's message without the quotes its str adds)."""
    print_error(error.args[0] if isinstance(error, KeyError) and error.args else error)
    return 2


def study_exit_code(error: Exception) -> int:
    """Print a `run_study` failure that ends the command as one line and return its exit code (see the
    module docstring): another run holds --out, the judge could not score a finished cell, or --out
    holds results for other settings (a ValueError, EngineError included), code to run that cannot be
    isolated, or the results cannot be written (an OSError: `unwritable_text`). Anything else is re-raised."""
    from hf_securesd.bench.results import ResultsDirInUseError
    from hf_securesd.bench.runner import JudgeFailedError

    codes = ((ResultsDirInUseError, EXIT_IN_USE), (JudgeFailedError, EXIT_JUDGE_FAILED), (ValueError, 2),
             (SandboxUnavailableError, 2), (OSError, 2))
    code = next((code for kind, code in codes if isinstance(error, kind)), None)
    if code is None:
        raise error
    print_error(unwritable_text(error) if isinstance(error, OSError) else error)
    return code


def unwritable_text(error: OSError) -> str:
    """An OS error met writing the results (an --out that cannot be created, a full disk) as one line:
    the path, the OS's reason and the fix."""
    where = error.filename if error.filename is not None else "the results directory"
    reason = error.strerror or str(error) or type(error).__name__
    return f"cannot write {where}: {reason}; give an --out directory that can be created and written"


def check_schedules_have_verifiers(args: argparse.Namespace) -> None:
    """Refuse --schedules without --verifiers for the openai engine: it runs no relaxed verifier
    unless asked, so the schedules would be dropped (the in-process engines use the profile's)."""
    if args.engine == "openai" and args.schedules and not args.verifiers:
        raise ValueError("--schedules with --engine openai needs --verifiers (e.g. --verifiers mars:0.5); "
                         "without it no schedule is run")


FIRST_ERROR_CHARS = 300  # of a failed prompt's error shown on the console


def first_error_line(error: str | None) -> str:
    """A failed prompt's error on one printable line (whitespace runs to one space; cut after
    FIRST_ERROR_CHARS characters, the whole error stays in failures.jsonl)."""
    text = " ".join(str(error).split())
    if len(text) > FIRST_ERROR_CHARS:
        text = text[:FIRST_ERROR_CHARS] + " ..."
    return printable(text)


def run(args: argparse.Namespace) -> int:
    from hf_securesd.bench.analysis import judge_agreement
    from hf_securesd.bench.plan import (
        check_no_repeats,
        parse_schedule,
        resolve_text_boundaries,
        schedule_key,
        sweep_configs,
        verifier_key,
    )
    from hf_securesd.bench.runner import run_study

    started = time.monotonic()  # the engine's run deadline counts from its build, a little later
    profile = chosen_profile(args)
    try:
        settle_engine_options(args)
        check_no_repeats("--verifiers", args.verifiers or [], verifier_key)
        check_no_repeats("--schedules", args.schedules or [], schedule_key)
        schedules = [parse_schedule(spec) for spec in (args.schedules or profile.schedules)]
        # the openai engine sends the plugin's request fields only when asked (an audited deployment
        # may not have the plugin); the in-process engines run the profile's sweep by default
        verifiers = args.verifiers if args.engine == "openai" else args.verifiers or profile.verifiers
        check_schedules_have_verifiers(args)
        sweep = sweep_configs(verifiers, schedules) if verifiers else []
        configs = [*endpoint_configs(args), *sweep]
        check_out_dir(args.out)
        settings, engine, tasks = prepare(args)
        configs = resolve_text_boundaries(configs, engine.tokenizer)
    except SETUP_ERRORS as error:
        return setup_error(error)
    notes = {}
    if any(task_run.task.name.startswith("jailbreak") for task_run in tasks):
        notes["judge_agreement"] = judge_agreement(settings.judge, dict(settings.judge_options), args.data_dir)
    deadline = None if args.run_deadline is None else started + args.run_deadline
    try:
        outcome = run_study(settings, engine, tasks, configs, args.out, progress=not args.no_progress,
                            notes=notes, secrets=engine_secrets(args), run_deadline=deadline)
    except Exception as error:  # noqa: BLE001 - study_exit_code re-raises what is not a one-line error
        return study_exit_code(error)
    finally:
        engine.close()
    print(
        f"{outcome.out_dir}: {outcome.cells_finished} cells finished, {outcome.cells_already_done} already "
        f"recorded, {outcome.generated} generations, {outcome.failed} failed prompts"
    )
    if not args.no_report:
        try:
            write_report_if_any(args.out)
        except ValueError as error:  # e.g. a results file damaged outside this run
            print_error(error)
            return 2
        except OSError as error:  # e.g. a full disk: the recorded cells are kept, the earlier report whole
            print_error(f"the report could not be written ({error.strerror or error}: "
                        f"{error.filename or args.out}); every finished cell is recorded in {args.out} and the "
                        f"earlier report (if any) is as it was: fix the cause, then run `securesd report {args.out}`")
            return 2
    if outcome.failed:
        report_failed_prompts(outcome)
        return 1
    return 0


def report_failed_prompts(outcome, consequence: str = "") -> None:
    """Say on stderr how many prompts of `outcome` (a `StudyOutcome` with failures) got no answer, the
    first one's error, `consequence` (a sentence, or nothing) and how to retry them."""
    print(f"{outcome.failed} prompts got no answer (each with its error in failures.jsonl); the first: "
          f"{first_error_line(outcome.first_error)}. {consequence}Once its cause is fixed (or "
          "for a passing fault such as a timeout), rerun the same command to retry them", file=sys.stderr)
