"""`securesd judge-validate`: how well a judge agrees with human labels.

Runs a judge over JailbreakBench's `classifier_comparison.csv` (100 responses to jailbreak prompts,
each labelled by three humans) and prints agreement, precision, recall and Cohen's kappa against
the human majority, with "jailbroken" as the positive class. The same figures are printed for the
reference judges whose labels ship in the file (GCG strings, Llama Guard, GPT-4, ...).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from hf_securesd.bench.data import parse_csv
from hf_securesd.judges import get_judge
from hf_securesd.judges.backends import JudgeBackendError
from hf_securesd.cli import positive_int
from hf_securesd.judges.data import DATA_DIR_ENV, data_file
from hf_securesd.judges.refusal_prefix import PREFIX_LISTS
from hf_securesd.judges.strongreject import DEFAULT_THRESHOLD

COMPARISON_FILE = "jailbreakbench/classifier_comparison.csv"
COMPARISON_FIELDS = ("goal", "target_response", "human_majority")  # the columns every row needs
COMPARISON_FIX = (f"point --data-dir (or ${DATA_DIR_ENV}) at a folder holding an intact copy of JailbreakBench's "
                  f"{COMPARISON_FILE} (see docs/metrics.md)")
REFERENCE_JUDGES = ("GCG", "TDC", "BERT", "llama_guard", "gpt_4_turbo", "gpt_4")
LABEL_COLUMNS = ("human_majority", *REFERENCE_JUDGES)  # 1 = jailbroken, 0 = not; reference columns may be absent
# the ways a label may be written: 0/1, and the same numbers as floats (a file saved by pandas after a missing
# value made the column float); anything else ("true", "2", "", a shifted column's text) is refused
LABEL_SPELLINGS = {"1": "1", "0": "0", "1.0": "1", "0.0": "0"}


def agreement_stats(predicted: Sequence[bool], human: Sequence[bool]) -> dict[str, float]:
    """Agreement (accuracy), precision, recall and Cohen's kappa of `predicted` against `human`,
    plus the confusion counts. Undefined ratios are NaN."""
    if len(predicted) != len(human) or not predicted:
        raise ValueError("need equally long, non-empty label lists.")
    n = len(human)
    tp = sum(p and h for p, h in zip(predicted, human))
    fp = sum(p and not h for p, h in zip(predicted, human))
    fn = sum(h and not p for p, h in zip(predicted, human))
    tn = n - tp - fp - fn
    observed = (tp + tn) / n
    expected = ((tp + fp) * (tp + fn) + (fn + tn) * (fp + tn)) / n**2
    return {
        "agreement": observed,
        "precision": tp / (tp + fp) if tp + fp else math.nan,
        "recall": tp / (tp + fn) if tp + fn else math.nan,
        "kappa": (observed - expected) / (1 - expected) if expected < 1 else math.nan,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
    }


def _labels_read(row: dict[str, str]) -> dict[str, str]:
    """`row` with each label column it holds (`LABEL_COLUMNS`) written "1" or "0"; a ValueError naming the
    column, the value and the allowed values for a label written otherwise (`LABEL_SPELLINGS`)."""
    for column in LABEL_COLUMNS:
        if column not in row:
            continue
        value = row[column]
        if value not in LABEL_SPELLINGS:
            shown = repr(value) if len(value) <= 40 else repr(value[:40]) + "..."
            raise ValueError(f"column {column!r} holds {shown}, not a label: the allowed values are 1 (jailbroken) "
                             "and 0 (not), also written 1.0 and 0.0")
        row[column] = LABEL_SPELLINGS[value]
    return row


def load_comparison(data_dir: str | None) -> list[dict[str, str]]:
    """The rows of `classifier_comparison.csv`, the labels (`LABEL_COLUMNS`) written "1" (jailbroken) or "0"
    whether the file writes them 1/0 or 1.0/0.0. A file that is not UTF-8 CSV, a row without a value for
    one of `COMPARISON_FIELDS` (a wrong file, or one cut short), or a label written any other way raises a
    ValueError naming the file, the row (and the column) and the fix."""
    path = data_file(COMPARISON_FILE, data_dir)
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            return parse_csv(path, handle, COMPARISON_FIELDS, _labels_read, fix=COMPARISON_FIX)
    except (UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"{path} could not be read as UTF-8 CSV: {error}") from None


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of `securesd judge-validate`."""
    parser.add_argument("--judge", choices=("refusal_prefix", "refusal_prefix_exact", "strongreject"),
                        default="refusal_prefix",
                        help="refusal_prefix: normalised text, refusal at the start (default); "
                             "refusal_prefix_exact: JailbreakBench's case-sensitive substring rule")
    parser.add_argument("--data-dir", help=f"folder holding {COMPARISON_FILE} (default: ${DATA_DIR_ENV})")
    parser.add_argument("--prefix-list", choices=tuple(PREFIX_LISTS), default=None,
                        help="refusal_prefix(_exact): which refusal-string list to use (default: jailbreakbench)")
    parser.add_argument("--backend", choices=("openai", "transformers"), default=None,
                        help="strongreject: OpenAI-compatible endpoint (SECURESD_JUDGE_* variables, the default) "
                             "or local model")
    parser.add_argument("--model", help="strongreject: judge model (Hub id or folder for transformers)")
    parser.add_argument("--threshold", type=float, default=None,
                        help=f"strongreject: attack succeeded when the score exceeds this (default {DEFAULT_THRESHOLD})")
    parser.add_argument("--max-new-tokens", type=positive_int, default=None,
                        help="strongreject with transformers (default 512)")
    parser.add_argument("--limit", type=positive_int, help="judge only the first N rows (N >= 1)")


# options given on the command line that only some judges (and backends) use: option -> (dest, who uses it)
_JUDGE_OPTIONS = {
    "--prefix-list": ("prefix_list", "refusal_prefix and refusal_prefix_exact"),
    "--backend": ("backend", "strongreject"),
    "--model": ("model", "strongreject"),
    "--threshold": ("threshold", "strongreject"),
    "--max-new-tokens": ("max_new_tokens", "strongreject with --backend transformers"),
}


def check_options(args: argparse.Namespace) -> None:
    """Refuse options the chosen judge (and backend) would ignore, and a threshold that is not a number."""
    strongreject = args.judge == "strongreject"
    unused = {"--prefix-list": strongreject, "--backend": not strongreject, "--model": not strongreject,
              "--threshold": not strongreject,
              "--max-new-tokens": not (strongreject and args.backend == "transformers")}
    for option, ignored in unused.items():
        dest, users = _JUDGE_OPTIONS[option]
        if ignored and getattr(args, dest) is not None:
            raise ValueError(f"{option} is used only by {users}, not by --judge {args.judge}"
                             f"{' --backend ' + (args.backend or 'openai') if strongreject else ''}; leave it out")
    if args.threshold is not None and not math.isfinite(args.threshold):
        raise ValueError(f"--threshold {args.threshold}: give a finite number (default {DEFAULT_THRESHOLD})")


def _build_judge(args: argparse.Namespace):
    """The judge the arguments ask for (the defaults of options left out filled in)."""
    if args.judge != "strongreject":
        return get_judge(args.judge, prefix_list=args.prefix_list or "jailbreakbench")
    backend = args.backend or "openai"
    backend_kwargs: dict[str, object] = {}
    if args.model:
        backend_kwargs["model"] = args.model
    if backend == "transformers":
        backend_kwargs["max_new_tokens"] = args.max_new_tokens or 512
    threshold = DEFAULT_THRESHOLD if args.threshold is None else args.threshold
    try:
        return get_judge("strongreject", backend=backend, threshold=threshold,
                         data_dir=args.data_dir, backend_kwargs=backend_kwargs)
    except FileNotFoundError:
        raise  # a data file securesd names, with its fix
    except OSError as error:  # transformers could not load the model (not a folder, Hub unreachable or no such id)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"--model {args.model or '(default)'}: the judge model could not be loaded ({first.rstrip('.')}); give a "
                         "folder holding a transformers model or a Hub id reachable from here") from None


def _row(name: str, stats: dict[str, float]) -> str:
    return (f"{name:<24}{stats['agreement']:>10.3f}{stats['precision']:>10.3f}{stats['recall']:>8.3f}"
            f"{stats['kappa']:>8.3f}{stats['tp']:>5}{stats['fp']:>4}{stats['fn']:>4}{stats['tn']:>4}")


def run(args: argparse.Namespace) -> int:
    """Judge the file, print the figures; 0 on success, 1 on a judge failure, 2 without data."""
    try:
        check_options(args)
        rows = load_comparison(args.data_dir)
        judge = _build_judge(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"judge-validate: {error}", file=sys.stderr)
        return 2
    rows = rows[: args.limit] if args.limit else rows
    try:
        verdicts = judge.judge([row["goal"] for row in rows], [row["target_response"] for row in rows])
    except JudgeBackendError as error:
        print(f"judge-validate: the judge backend failed: {error}", file=sys.stderr)
        return 1
    kept = [(row, verdict) for row, verdict in zip(rows, verdicts) if verdict.parsed]
    variant = (args.backend or "openai") if args.judge == "strongreject" else args.prefix_list
    label = f"{args.judge} ({variant or 'jailbreakbench'})"
    print(f"judge {label} vs human majority on {len(rows)} responses of {Path(COMPARISON_FILE).name}; "
          "positive class = jailbroken")
    print(f"unparsed judge replies (left out): {len(rows) - len(kept)}")
    if not kept:
        print("judge-validate: no judge reply could be parsed, so there is nothing to compare.",
              file=sys.stderr)
        return 1
    human = [row["human_majority"] == "1" for row, _ in kept]
    print(f"{'judge':<24}{'agreement':>10}{'precision':>10}{'recall':>8}{'kappa':>8}"
          f"{'TP':>5}{'FP':>4}{'FN':>4}{'TN':>4}")
    print(_row(args.judge, agreement_stats([verdict.attack_succeeded for _, verdict in kept], human)))
    print("reference judges (labels stored in the file, same rows):")
    for column in REFERENCE_JUDGES:
        if column in kept[0][0]:
            print(_row(column, agreement_stats([row[column] == "1" for row, _ in kept], human)))
    return 0
