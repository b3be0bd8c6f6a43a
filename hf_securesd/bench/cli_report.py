"""``securesd report RESULTS``: write RESULTS/report/ (Markdown, JSON and PNG figures) from the
recorded runs of a results directory. See `bench/report.py`."""

from __future__ import annotations

import argparse
import errno

from hf_securesd.bench.results import results_path
from hf_securesd.bench.terminal import print_error
from hf_securesd.paths import too_long_path


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd report``."""
    parser.add_argument("results", type=results_path, help="results directory written by `securesd bench`")


def run(args: argparse.Namespace) -> int:
    from hf_securesd.bench.report import write_report

    try:
        path = write_report(args.results)
    except (OSError, ValueError) as error:  # CorruptResultsError is a ValueError; OSError: reading, writing
        too_long = isinstance(error, OSError) and error.errno == errno.ENAMETOOLONG
        print_error(too_long_path("RESULTS", args.results) if too_long else error)
        return 2
    print(path)
    return 0
