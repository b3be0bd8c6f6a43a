"""Check a vLLM release's source against every symbol the SecureSD plugin needs, without importing it.

The plugin checks the installed vLLM at load (`hf_securesd.vllm.features.check_installed`); this script
runs the same declared list (`features.REQUIRED`) statically, with `ast`, against a release that need
not run here, e.g. a CUDA-only wheel on a CPU machine. Not part of CI.

    pip download vllm==0.33.0 --no-deps -d /tmp/vllm033
    python scripts/check_vllm_source.py /tmp/vllm033/vllm-0.33.0-*.whl   # a wheel, unpacked to a temp dir
    python scripts/check_vllm_source.py /path/to/site-packages             # a folder holding vllm/

Prints one line per symbol and exits with 1 when any does not match.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import zipfile
from pathlib import Path

from hf_securesd.vllm.features import REQUIRED, check_source_tree


def source_root(location: Path, scratch: Path) -> Path:
    """The folder holding `vllm/`: `location` itself, or a wheel's Python files unpacked into `scratch`."""
    if location.is_dir():
        if not (location / "vllm").is_dir():
            raise SystemExit(f"{location} has no vllm/ folder; pass the folder that holds it (site-packages)")
        return location
    if location.suffix != ".whl" or not location.is_file():
        raise SystemExit(f"{location} is neither a folder holding vllm/ nor a .whl file")
    with zipfile.ZipFile(location) as wheel:
        for name in wheel.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                wheel.extract(name, scratch)
    return scratch


def release_of(root: Path) -> str:
    """The version string in vllm/_version.py, or "unknown"."""
    version_file = root / "vllm" / "_version.py"
    text = version_file.read_text(encoding="utf-8") if version_file.is_file() else ""
    found = re.search(r"""(?:__version__|version)\s*(?::\s*str)?\s*=\s*['"]([^'"]+)['"]""", text)
    return found.group(1) if found else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("location", type=Path, help="a vLLM wheel (.whl) or a folder holding vllm/")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vllm-source-") as scratch:
        root = source_root(args.location, Path(scratch))
        mismatches = {mismatch.symbol.name: mismatch for mismatch in check_source_tree(root)}
        print(f"vLLM {release_of(root)} at {args.location}: {len(REQUIRED)} symbols checked")
        for symbol in REQUIRED:
            mismatch = mismatches.get(symbol.name)
            print(f"  {'ok      ' if mismatch is None else 'MISMATCH'} {symbol.name}"
                  + ("" if mismatch is None else f": {mismatch.problem}"))
    print("all symbols match" if not mismatches else f"{len(mismatches)} symbol(s) do not match")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
