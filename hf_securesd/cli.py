"""The `securesd` command. Each subcommand lives in its own module, which exposes
`configure(parser: argparse.ArgumentParser) -> None` and `run(args: argparse.Namespace) -> int`;
modules are imported only when their subcommand runs, so `securesd --help` stays fast.

Exit statuses shared by the subcommands that write a results directory (`bench`, `rescore`): 0
done; 1 prompts left without an answer (`bench`; the same command again completes them); 2 bad
options or settings, nothing run; `EXIT_JUDGE_FAILED` the judge could not score (what was journaled
is kept); `EXIT_IN_USE` another run holds the results directory. Every subcommand interrupted by Ctrl-C
prints ``interrupted``; a results directory keeps what was journaled, and the same command again resumes
it. `main` then returns `EXIT_INTERRUPTED` (130, the shell's 128 + SIGINT); the console script
(`console_main`) ends by SIGINT itself, as Python does after an uncaught KeyboardInterrupt, so that the
shell sees the interrupt and a loop of `securesd` runs stops too."""

from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import signal
import sys
from typing import Any, NoReturn

DESCRIPTION = (
    "hf-securesd: safe lossy speculative decoding. Run the demo, fetch the models, and benchmark, report, "
    "rescore and calibrate the safety-utility trade-off of a draft/target pair; `securesd <command> --help` "
    "describes each command."
)
EXIT_JUDGE_FAILED = 3
EXIT_IN_USE = 4
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), the shell's 128 + 2
MAX_DURATION_S = 7 * 24 * 3600  # the longest timeout or deadline an option takes: 7 days
LONG_VALUE_CHARS = 200  # an echoed value longer than this is shown as its head … its tail (`shorten_long_values`)
_LONG_VALUE = re.compile(rf"\S{{{LONG_VALUE_CHARS + 1},}}")
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("hf_securesd.demo", "side-by-side answers: target-only, relaxed verifier, SecureSD"),
    "models": ("hf_securesd.models.cli", "resolve, fetch and cache the default draft/target pair"),
    "bench": ("hf_securesd.bench.cli_bench", "run the safety/utility benchmark study for a pair"),
    "report": ("hf_securesd.bench.cli_report", "tables and plots from a results directory"),
    "rescore": ("hf_securesd.bench.rescore", "score recorded responses again with the current scorers"),
    "calibrate": ("hf_securesd.bench.cli_calibrate", "sweep Step(L) and recommend the smallest safe L"),
    "agentdojo": ("hf_securesd.bench.agentdojo", "AgentDojo utility under attack (extra: hf-securesd[agentdojo])"),
    "judge-validate": ("hf_securesd.judges.validate", "agreement of a judge with human labels"),
}


def _whole_number(text: str, minimum: int) -> int:
    """`text` as an int >= `minimum`, else argparse's type error naming the bound."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An option's whole number >= 1 (an argparse type for every subcommand): 0 and negatives are
    refused, never replaced by a default."""
    return _whole_number(text, 1)


MAX_THREADS_PER_CORE = 4  # more torch threads than this per core only slows a run (and can exhaust memory)


def thread_count(text: str) -> int:
    """A --threads value: a whole number from 1 to `MAX_THREADS_PER_CORE` per core of this machine."""
    value = positive_int(text)
    cores = os.cpu_count() or 1
    if value > MAX_THREADS_PER_CORE * cores:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_THREADS_PER_CORE * cores} threads ({MAX_THREADS_PER_CORE} per core of this "
            f"machine's {cores}), got {value}"
        )
    return value


def non_negative_float(text: str) -> float:
    """An option's finite number >= 0 (an argparse type): NaN, infinities and negatives are refused (a NaN
    tolerance would make every comparison with it false)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """An option's finite number > 0 (an argparse type): 0, negatives, NaN and infinities are refused
    (an infinite timeout overflows the clocks it is added to)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An option's whole number >= 0 (an argparse type): negatives are refused at parse time."""
    return _whole_number(text, 0)


def duration_seconds(text: str) -> float:
    """An option's seconds: a finite number > 0 and at most `MAX_DURATION_S` (7 days), so that
    adding it to a clock or a timestamp cannot overflow."""
    value = positive_float(text)
    if value > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_DURATION_S} seconds (7 days), got {text}")
    return value


def non_empty_text(text: str) -> str:
    """An option's name, path or URL (an argparse type): an empty or blank value is refused, never
    taken as "not given"."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value, got an empty one")
    return text


def environment_variable(text: str) -> str:
    """An option naming an environment variable (an argparse type): letters, digits and ``_``, not
    starting with a digit. Anything else is refused without being shown: it may be the secret itself,
    typed in place of the variable's name."""
    if not (text.isascii() and text.isidentifier()):
        raise argparse.ArgumentTypeError(
            "takes the NAME of the environment variable that holds the key, not the key itself; what was "
            "given is not a variable name (letters, digits, '_'), so it is not shown here"
        )
    return text


def shorten_long_values(text: str) -> str:
    """`text` with each run of more than `LONG_VALUE_CHARS` non-space characters (an option value, a
    path or a list echoed back in an error) cut to its head … its tail and its length, so that an
    error line stays one readable line whatever was typed."""
    return _LONG_VALUE.sub(lambda match: _shortened(match.group()), text)


def _shortened(word: str) -> str:
    """`word` with the value in it as its first 120 and last 60 characters and its whole length between
    them, unless the value is at most `LONG_VALUE_CHARS` long: the quotes and punctuation around the value
    (up to 3 on each side, such as ``('`` and ``'):``) are kept as they are."""
    start = min(len(word) - len(word.lstrip("('\"")), 3)
    end = max(len(word.rstrip(":;,.)'\"")), len(word) - 3)
    value = word[start:end]
    if len(value) <= LONG_VALUE_CHARS:
        return word
    return f"{word[:start]}{value[:120]}…[{len(value):,} characters]…{value[-60:]}{word[end:]}"


class Accumulate(argparse.Action):
    """A list option (``nargs="+"``) that keeps the values of every occurrence: ``--L 1 --L 2`` is
    ``--L 1 2``, where argparse alone keeps only the last occurrence, and its ``action="extend"`` would add
    them to the default list. The first occurrence replaces the default."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = getattr(namespace, self.dest, None)
        earlier = [] if given is None or given is self.default else list(given)
        setattr(namespace, self.dest, [*earlier, *values])


class Parser(argparse.ArgumentParser):
    """The `securesd` parser: its usage errors shorten the long values they echo (`shorten_long_values`);
    its subcommands' parsers are Parsers too."""

    def error(self, message: str) -> NoReturn:
        super().error(shorten_long_values(message))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="securesd", description=DESCRIPTION)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        if name in sys.argv[1:2]:  # configure only the chosen subcommand (imports are lazy)
            try:
                importlib.import_module(module_name).configure(sub)
            except ImportError as error:  # an optional extra that is not installed
                if not _asks_for_help(sys.argv[2:]):
                    parser.exit(2, f"securesd {name}: {error}\n")
                sub.description = f"{help_text}\n\nNot available in this environment:\n  {error}"
                sub.formatter_class = argparse.RawDescriptionHelpFormatter  # the install command on one line
    return parser


def _asks_for_help(arguments: list[str]) -> bool:
    """Whether a subcommand's arguments ask for its help (argparse's -h / --help, before any `--`)."""
    for argument in arguments:
        if argument == "--":
            return False
        if argument in ("-h", "--help"):
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    """Run `securesd` with `argv` (default: the command line) and return its exit status; Ctrl-C prints one
    line, ``interrupted``, not a traceback, and returns `EXIT_INTERRUPTED`."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        args = build_parser().parse_args(sys.argv[1:])
        return int(importlib.import_module(args._module).run(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback; what was journaled is kept
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def console_main() -> NoReturn:
    """The `securesd` console script: `main` on the command line, its status the exit status, except
    after Ctrl-C. Then, once ``interrupted`` is printed, the process ends by SIGINT with the signal's
    default action, as Python ends after an uncaught KeyboardInterrupt: bash stops a loop (``for ...; do
    securesd ...; done``) only when its child died by the signal, and takes an exit status of 130 for an
    interrupt the child handled, running the next iteration. Where SIGINT cannot end a process so (not
    POSIX: os.kill with SIGINT would end it with status 2, "bad options"), the status is 130."""
    status = main()
    if status == EXIT_INTERRUPTED and os.name == "posix":
        sys.stdout.flush()  # the signal ends the process without Python's exit steps, which flush these
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(status)


if __name__ == "__main__":
    console_main()
