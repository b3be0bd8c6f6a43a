"""``securesd report RESULTS``: write RESULTS/report/ (Markdown, JSON and PNG figures) from the
recorded runs of a results directory. See `bench/report.py`."""

from __future__ import annotations

import argparse
import sys

from hf_securesd.bench.results import results_path
from hf_securesd.bench.terminal import printable


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd report``."""
    parser.add_argument("results", type=results_path, help="results directory written by `securesd bench`")


def run(args: argparse.Namespace) -> int:
    from hf_securesd.bench.report import write_report

    try:
        path = write_report(args.results)
    except (OSError, ValueError) as error:  # CorruptResultsError is a ValueError; OSError: reading, writing
        print(f"error: {printable(str(error))}", file=sys.stderr)
        return 2
    print(path)
    return 0
