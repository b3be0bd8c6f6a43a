"""``securesd agentdojo``: its options (`configure`), the command (`run`: checks, model loading, the
run, the result JSON) and its helpers (`check_out_path`, `load_target`, `load_models`,
`write_result`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

import hf_securesd
from hf_securesd.bench.agentdojo.choices import DEFAULT_ATTACK, DEFAULT_SUITE, SUPPORTED_DEFENSES, plan_run
from hf_securesd.bench.agentdojo.runner import run_agentdojo
from hf_securesd.cli import positive_int, thread_count
from hf_securesd.schedules import Schedule
from hf_securesd.verifiers import Verifier


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd agentdojo``."""
    add = parser.add_argument
    add("--target", required=True, help="target model: registry name, Hub id, folder, or 'tiny'")
    add("--draft", default=None, help="draft model: registry name, Hub id, folder, or 'tiny' "
        "(required unless --target-only, which does not load it)")
    add("--target-only", action="store_true", help="decode with the target alone (the baseline; no draft)")
    add("--verifier", default=None, help="verifier spec with one knob value, e.g. mars:0.5 "
        "(default lossless; not with --target-only)")
    add("--schedule", default=None, help="none, step:L, linear:L, power:L:GAMMA (default none; "
        "not with --target-only)")
    add("--suite", default=DEFAULT_SUITE, help=f"AgentDojo suite (default {DEFAULT_SUITE})")
    add("--attack", default=DEFAULT_ATTACK, help=f"AgentDojo attack (default {DEFAULT_ATTACK})")
    add("--defense", default=None, help=f"AgentDojo defense: {', '.join(SUPPORTED_DEFENSES)} (default none)")
    add("--limit", type=positive_int, default=None, help="first N user tasks (default all)")
    add("--injection-limit", type=positive_int, default=None, help="first N injection tasks (default all)")
    add("--max-new-tokens", type=positive_int, default=512, help="tokens per model turn (default 512)")
    add("--num-assistant-tokens", type=positive_int, default=5, help="draft tokens per round k (default 5)")
    add("--device", default="cpu", help="cpu, cuda, cuda:1, ..., or auto")
    add("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="model dtype (default bf16)")
    add("--threads", type=thread_count, default=None, help="torch CPU threads")
    add("--offline", action="store_true", default=None, help="use the offline model copies")
    add("--cache-dir", default=None, help="folder of the offline model copies")
    add("--out", type=Path, default=None, help="also write the result JSON here (it is always printed)")
    add("--no-progress", action="store_true", help="no progress bar")


def check_out_path(path: Path | None) -> None:
    """Refuse an --out that could not be written, before anything is loaded: a folder, a path under
    a file, or one under a folder this process may not write in (missing folders are created)."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"--out {path} is a folder; give a file name, e.g. {path / 'agentdojo.json'}")
    existing = next(parent for parent in path.absolute().parents if parent.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {path}: {existing} is a file, not a folder; choose another path")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"--out {path}: the folder {existing} is not writable; choose another path")


def _decoding(args: argparse.Namespace) -> tuple[Verifier | None, Schedule | None]:
    """The verifier and schedule of the CLI options (None, None with --target-only)."""
    from hf_securesd.bench.plan import parse_schedule, parse_verifier

    if args.target_only:
        if args.verifier is not None or args.schedule is not None:
            raise ValueError("--verifier and --schedule apply to speculative decoding; drop them or --target-only")
        return None, None
    if args.draft is None:
        raise ValueError("--draft is required for speculative decoding (or pass --target-only for the target alone)")
    verifiers = parse_verifier(args.verifier or "lossless")
    if len(verifiers) != 1:
        raise ValueError(f"--verifier needs exactly one knob value (e.g. mars:0.5), got {args.verifier!r}")
    return verifiers[0], parse_schedule(args.schedule or "none")


def load_target(
    name: str, *, device: str, dtype: str, offline: bool | None, cache_dir: str | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any]]:
    """The wrapped target alone (no draft is loaded), its tokenizer, and what it is (for the report)."""
    from hf_securesd.bench.loading import DTYPES, _describe, load_study_models
    from hf_securesd.bench.profiles import TINY

    if name == TINY:
        models = load_study_models(TINY, TINY, device=device, dtype=dtype)
        return models.target, models.tokenizer, {"target": models.ids["target"]}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_securesd.models import resolve_model

    location = resolve_model(name, offline=offline, cache_dir=cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(location)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=DTYPES[dtype]).to(device).eval()
    return hf_securesd.wrap(model), tokenizer, {"target": _describe(name, location)}


def load_models(
    args: argparse.Namespace, device: str
) -> tuple[PreTrainedModel, PreTrainedModel | None, PreTrainedTokenizerBase, dict[str, Any]]:
    """(target, draft or None with --target-only, tokenizer, model ids) of the CLI options."""
    from hf_securesd.bench.loading import load_study_models

    where = dict(device=device, dtype=args.dtype, offline=args.offline, cache_dir=args.cache_dir)
    if args.target_only:
        target, tokenizer, ids = load_target(args.target, **where)
        return target, None, tokenizer, ids
    models = load_study_models(args.target, args.draft, **where)
    return models.target, models.draft, models.tokenizer, models.ids


def _one_line(error: BaseException) -> str:
    """The error's message on one line, without a final full stop."""
    return " ".join(str(error).split()).rstrip(".")


def _fail(message: str, code: int = 2) -> int:
    """Print ``error: message`` to stderr and return the exit code."""
    print(f"error: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """``securesd agentdojo``: one decoding configuration on one suite; prints the result JSON (and
    writes it to --out). Bad options are one ``error:`` line and exit 2, before any model loads;
    exit 1 when writing --out failed or no pair ran without an error."""
    from hf_securesd.models import AssemblyError, ModelResolutionError
    from hf_securesd.models.hardware import resolve_device

    try:
        verifier, schedule = _decoding(args)
        check_out_path(args.out)
        plan_run(suite=args.suite, attack=args.attack, defense=args.defense)
        device = resolve_device(args.device)
    except ValueError as error:  # DeviceError is a ValueError
        return _fail(_one_line(error))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    models = f"--target {args.target}" + ("" if args.target_only else f", --draft {args.draft}")
    try:
        target, draft, tokenizer, ids = load_models(args, device)
    except (AssemblyError, ModelResolutionError) as error:  # their messages say what to do
        return _fail(f"could not load the model(s) ({models}): {_one_line(error)}")
    except (OSError, ValueError) as error:  # transformers could not load a folder or reach a Hub id
        return _fail(
            f"could not load the model(s) ({models}): {_one_line(error)}. Give a folder holding a transformers "
            "model, a known name (`securesd models where` lists them), or a Hub id reachable from here"
        )
    try:
        result = run_agentdojo(
            target, draft, tokenizer, suite=args.suite, verifier=verifier, schedule=schedule,
            attack=args.attack, limit=args.limit, injection_limit=args.injection_limit, defense=args.defense,
            max_new_tokens=args.max_new_tokens, num_assistant_tokens=args.num_assistant_tokens,
            progress=not args.no_progress,
        )
    except ValueError as error:
        return _fail(_one_line(error))
    result["models"] = ids
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        try:
            write_result(args.out, text)
        except OSError as error:
            return _fail(f"could not write --out {args.out}: {_one_line(error)} (the result is printed above)", 1)
    return 0 if result["n_scored"] else 1


def write_result(path: Path, text: str) -> None:
    """Write the result JSON to `path`, creating missing folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
