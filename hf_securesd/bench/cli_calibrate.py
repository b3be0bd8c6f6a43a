"""``securesd calibrate``: sweep SecureSD's Step(L) on a small calibration set and recommend the
smallest L whose safety PRR is within a tolerance of lossless while keeping the speed-up (paper
§7.3). See `bench/calibrate.py` for the rule.

    securesd calibrate --profile smoke --out results/calib-smoke
    securesd calibrate --verifier mars:0.5 --L 1 2 4 8 --tasks jailbreak prompt_injection humaneval \\
        --limit 20 --out results/calib
    securesd calibrate --segment-boundary '</think>' --segment-before none --L 1 2 4 8 \\
        --out results/calib-answer

With `--segment-boundary` (a reasoning model) the swept schedule is the answer segment's:
Segments(boundary, before=--segment-before, after=Step(L)); a boundary written `ids:151668` (or
`ids:1,2` for several tokens) is token ids, any other value is text resolved with the target tokenizer.

Runs are recorded like `securesd bench` (resumable); the recommendation is printed and written to
RESULTS/calibration.json and RESULTS/calibration.md, both or neither (`write_together`), replacing
those of an earlier calibrate into the same --out. It weighs only this run's --L, even when --out
holds cells of other L from an earlier run; an SPD timed in another session than its target-only
baseline (a resumed or extended --out) is marked * and named in a note. A repeated list option adds
its values to the earlier ones (`--L 1 --L 2` is `--L 1 2`).

Exit status: 0 the recommendation was written; 1 the calibration files could not be written at the end
(the recorded cells are kept: the same command again writes them), or prompts got no answer (recorded in
failures.jsonl; no calibration is written without every cell, and the same command retries them); 2 bad
options or settings, nothing generated (also an --out that cannot be created or written, that holds
results of other settings, or that holds a calibration.json or calibration.md but is no results
directory, no study.json: a file of the user's own); 3 the judge could not score a finished cell (`EXIT_JUDGE_FAILED`); 4 another run
holds --out (`EXIT_IN_USE`); 130 interrupted (Ctrl-C; the same command again resumes).
"""

from __future__ import annotations

import argparse
import os
import stat
from contextlib import ExitStack
from pathlib import Path
from typing import Sequence

from hf_securesd.bench.calibrate import (
    DEFAULT_LENGTHS,
    LevelResult,
    Recommendation,
    check_text,
    kept_percent,
    left_out_note,
    schedule_name,
    session_note,
)
from hf_securesd.bench.formatting import fmt, table
from hf_securesd.bench.report_markdown import code_span, inline_text
from hf_securesd.bench.cli_bench import (
    SETUP_ERRORS,
    accept_underscores,
    add_common_options,
    check_out_dir,
    chosen_profile,
    prepare,
    report_failed_prompts,
    setup_error,
    study_exit_code,
)
from hf_securesd.bench.plan import (
    RunConfig,
    check_no_repeats,
    refuse_zero_length,
    resolve_text_boundaries,
    short_schedule,
    verifier_label,
)
from hf_securesd.bench.report_files import replacing
from hf_securesd.bench.results import MANIFEST
from hf_securesd.bench.terminal import print_error
from hf_securesd.cli import Accumulate, non_negative_float
from hf_securesd.segments import LOSSLESS, Segments, SegmentSchedule

DEFAULT_VERIFIER = "mars:0.5"
CALIBRATION_FILES = ("calibration.json", "calibration.md")


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``securesd calibrate``."""
    add_common_options(parser, default_profile="cpu-small", engines=False)
    parser.add_argument(
        "--verifier",
        nargs="+",
        action=Accumulate,
        default=[DEFAULT_VERIFIER],
        help=f"relaxed verifier setting(s) to calibrate for, NAME:VALUE (default: {DEFAULT_VERIFIER})",
    )
    parser.add_argument(
        "--L",
        dest="lengths",
        type=int,
        nargs="+",
        action=Accumulate,
        default=list(DEFAULT_LENGTHS),
        help=f"Step(L) lengths to try (default: {' '.join(map(str, DEFAULT_LENGTHS))})",
    )
    parser.add_argument(
        "--segment-boundary",
        nargs="+",
        action=Accumulate,
        default=None,
        help="sweep L of the answer segment after this boundary (text such as '</think>', or ids:151668)",
    )
    parser.add_argument(
        "--segment-before",
        default="none",
        help="schedule of the segment before the boundary: none, lossless, step:L, linear:L, power:L:GAMMA "
        "(default: none; needs --segment-boundary)",
    )
    parser.add_argument(
        "--tolerance",
        type=non_negative_float,
        default=0.05,
        help="allowed safety-PRR shortfall from lossless, between 0 and 1 (PRR runs from 0, the draft alone, "
        "to 1, the target alone; default 0.05)",
    )
    parser.add_argument(
        "--spd-tolerance",
        type=non_negative_float,
        default=0.1,
        help="allowed SPD loss relative to the relaxed verifier, as a fraction between 0 and 1 (default 0.1)",
    )
    accept_underscores(parser)


def check_swept_lengths(lengths: Sequence[int]) -> None:
    """Refuse an --L named twice, and L = 0: Step(L=0) verifies no token losslessly, so it is the
    relaxed verifier alone, which calibrate runs anyway (the ``none (relaxed)`` row)."""
    if 0 in lengths:
        raise ValueError("--L 0: Step(L=0) verifies no token losslessly, so it is the relaxed verifier alone, "
                         "which calibrate runs anyway (the 'none (relaxed)' row); give each L >= 1")
    check_no_repeats("--L", lengths, lambda length: (f"L={length}",))


def check_draft_lengths(configs: Sequence[RunConfig], num_draft_tokens: int) -> None:
    """Refuse, before any model is loaded, a relaxed verifier that cannot work with the draft length k
    (`num_draft_tokens`: --num-assistant-tokens, else the profile's), such as FLy, whose window needs k >= 2."""
    for config in configs:
        if config.verifier is None:
            continue
        try:
            config.verifier.check_draft_length(num_draft_tokens)
        except ValueError as error:
            raise ValueError(f"--verifier {verifier_label(config.verifier)} with --num-assistant-tokens "
                             f"{num_draft_tokens}: {error}") from None


def check_calibration_files(out: Path) -> None:
    """Refuse, before any model is loaded, an existing --out whose calibration files calibrate could not
    or should not replace at the end: one of them is a folder, or the folder is no results directory (no
    study.json), so that files of those names are the user's own, not an earlier calibration's."""
    if not out.is_dir():
        return
    present = [out / name for name in CALIBRATION_FILES if os.path.lexists(out / name)]
    for path in present:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise ValueError(f"--out {out}: {path} is a folder, where calibrate writes its recommendation; "
                             "move it away or give another --out")
    if present and not (out / MANIFEST).is_file():
        names, them = " and ".join(path.name for path in present), "them" if len(present) > 1 else "it"
        raise ValueError(f"--out {out} holds {names} but is no results directory (no {MANIFEST}), so not an "
                         f"earlier calibration's, and calibrate would replace {them}; move {them} away or give "
                         "another --out")


def write_together(files: dict[Path, str]) -> None:
    """Write each file of `files` (path -> text) through a temporary file beside it (`replacing`: a link
    at its name is replaced, never followed), renaming them into place only once every one is written,
    so that a failure to write one leaves the earlier files as they were. An OSError names the file it
    failed on (its ``filename``)."""
    with ExitStack() as renames:
        for path, text in files.items():
            try:
                renames.enter_context(replacing(path)).write_text(text, encoding="utf-8")
            except OSError as error:
                raise OSError(error.errno, error.strerror or str(error), str(path)) from None


def write_calibration(out: Path, texts: Sequence[str]) -> int:
    """Write `texts` as calibration.json and calibration.md of `out`, both or neither (`write_together`), and
    say where, and whether they replaced an earlier calibration's: 0; a file that cannot be written is one
    line naming it, and 1."""
    paths = [out / name for name in CALIBRATION_FILES]
    replaced = any(os.path.lexists(path) for path in paths)
    try:
        write_together(dict(zip(paths, texts)))
    except OSError as error:
        print_error(f"cannot write {error.filename2 or error.filename}: {error.strerror or error}; the earlier "
                    f"calibration files of {out} (if any) are left as they were, and the recorded cells are "
                    "kept: fix the cause and run the same command again")
        return 1
    print(f"calibration: {paths[0]}, {paths[1]}" + (" (replaced an earlier calibration's)" if replaced else ""))
    return 0


def segments_template(boundaries: list[str] | None, before: str) -> Segments | None:
    """The `Segments` whose answer segment is swept (after= is replaced by Step(L)), or None."""
    if boundaries is None:
        if before != "none":
            raise ValueError(
                "--segment-before needs --segment-boundary (the boundary that ends that segment)"
            )
        return None
    parsed: list[object] = []
    for value in boundaries:
        if value.startswith("ids:"):
            try:
                parsed.append([int(token) for token in value[len("ids:") :].split(",")])
            except ValueError:
                raise ValueError(
                    f"--segment-boundary {value!r}: write token ids as ids:151668 or ids:1,2"
                ) from None
        else:
            parsed.append(value)
    return Segments(parsed, before=_first_segment_schedule(before), after=LOSSLESS)


_FIRST_SEGMENT_FORMS = "none, lossless, step:L, linear:L or power:L:GAMMA (e.g. --segment-before step:1)"


def _first_segment_schedule(before: str) -> SegmentSchedule:
    """The --segment-before value as the first segment's schedule: none, lossless, step:L, linear:L or
    power:L:GAMMA; anything else is a ValueError naming the option and the forms it takes."""
    text = before.strip().lower()
    if text == LOSSLESS:
        return LOSSLESS
    name, *numbers = text.split(":")
    if name == "none" and not numbers:
        return None
    try:
        schedule = short_schedule(name, numbers)
    except ValueError as error:
        raise ValueError(f"--segment-before {before!r}: {error}; use {_FIRST_SEGMENT_FORMS}") from None
    if schedule is None:
        raise ValueError(
            f"--segment-before {before!r} is not a schedule of the segment before the boundary: use "
            f"{_FIRST_SEGMENT_FORMS}"
        )
    try:
        return refuse_zero_length(schedule, before)
    except ValueError as error:
        raise ValueError(f"--segment-before: {error}") from None


def _spd_text(level: LevelResult) -> str:
    """A level's SPD as the table shows it, marked * when timed in another session than its baseline."""
    return fmt(level.spd, 2) + ("" if level.spd_same_session else " *")


def _swept_text(segments: Segments | None) -> str:
    """The swept schedule as calibration.md's heading names it, its boundary text escaped (`inline_text`)."""
    if segments is None:
        return "Step(L)"
    boundaries = [item if isinstance(item, str) else list(item) for item in segments.boundary]
    template = f"Segments({boundaries}, before={segments.before!r}, after=Step(L))"
    return f"Answer-segment Step(L) ({inline_text(template)})"


def calibration_markdown(
    recommendations: Sequence[Recommendation],
    manifest: dict,
    tolerance: float,
    spd_tolerance: float,
    n_examples: dict[str, int],
    segments: Segments | None = None,
) -> str:
    """calibration.md: the rule, the study's models and calibration set, and per relaxed setting its
    recommendation, why, and the table behind it. Text that comes from the user or the results (model
    names, the segment boundary, task and verifier names) is made inert as in report.md (`code_span`,
    `inline_text`)."""
    models = manifest.get("models", {})
    ids = {role: models.get(role, {}).get("id", manifest[role]) for role in ("target", "draft")}
    seed = manifest.get("seed")
    tasks = ", ".join(f"{inline_text(task)} ({n})" for task, n in n_examples.items())
    lines = [
        f"# {_swept_text(segments)} calibration: {code_span(str(manifest['target']))} with draft "
        f"{code_span(str(manifest['draft']))}",
        "",
        f"Rule: the smallest L with safety PRR >= lossless - {tolerance} and SPD >= "
        f"{kept_percent(spd_tolerance)} of the relaxed verifier's SPD without SecureSD.",
        "",
        f"- target {code_span(str(ids['target']))}, draft {code_span(str(ids['draft']))}; judge "
        f"{code_span(str(manifest.get('judge')))}; task seed {seed if seed is not None else 'default (0)'}",
        f"- calibration set: {tasks} examples",
        "",
    ]
    for rec in recommendations:
        rows = [
            [
                "none (relaxed)",
                fmt(rec.relaxed.safety_prr),
                fmt(rec.relaxed.utility_prr),
                _spd_text(rec.relaxed),
                fmt(rec.relaxed.acceptance_rate),
                "",
                "",
            ]
        ]
        rows += [
            [
                level.L,
                fmt(level.safety_prr),
                fmt(level.utility_prr),
                _spd_text(level),
                fmt(level.acceptance_rate),
                check_text(level.safe),
                check_text(level.fast),
            ]
            for level in rec.levels
        ]
        rows.append(["lossless", fmt(rec.lossless_safety_prr), "", "", "", "", ""])
        title = schedule_name(rec.L, segments) if rec.L is not None else "no recommendation"
        lines += [
            f"## {inline_text(rec.verifier)}: {title}",
            "",
            rec.reason,
            "",
            table(["L", "safety PRR", "utility PRR", "SPD", "AR", "safe", "keeps SPD"], rows),
            "",
        ]
        for note in (session_note(rec), left_out_note(rec)):
            if note:
                lines += [f"Note: {note}.", ""]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from hf_securesd.bench.calibrate import (
        calibration_configs,
        check_boundaries_in_vocabulary,
        check_fraction,
        check_lengths,
        check_safety_tolerance,
        recommend,
        verifier_labels,
    )
    from hf_securesd.bench.results import ResultsDir, json_text
    from hf_securesd.bench.runner import run_study

    try:
        check_lengths(args.lengths)
        check_swept_lengths(args.lengths)
        check_safety_tolerance(args.tolerance)
        check_fraction("--spd-tolerance", args.spd_tolerance)
        segments = segments_template(args.segment_boundary, args.segment_before)
        configs = calibration_configs(args.verifier, args.lengths, segments)
        check_draft_lengths(configs, args.num_assistant_tokens or chosen_profile(args).num_assistant_tokens)
        check_out_dir(args.out)
        check_calibration_files(args.out)
        settings, engine, tasks = prepare(args)
        configs = resolve_text_boundaries(configs, engine.tokenizer)
        check_boundaries_in_vocabulary(configs, engine)
    except SETUP_ERRORS as error:
        return setup_error(error)
    try:
        outcome = run_study(settings, engine, tasks, configs, args.out, progress=not args.no_progress)
    except Exception as error:  # noqa: BLE001 - study_exit_code re-raises what is not a one-line error
        return study_exit_code(error)
    if outcome.failed:
        # A cell with an unanswered prompt is not recorded: a recommendation without it would name a larger
        # "smallest L" than the one measured later, or none, as if the sweep had been complete.
        report_failed_prompts(outcome, "No calibration was written: it needs every cell of the sweep. ")
        return 1
    from hf_securesd.bench.report import rederived

    results = ResultsDir(args.out)
    current = {task_run.baseline_id for task_run in tasks}
    # PRR and SPD from the recorded scores and seconds (a resumed --out's records may be stale or edited)
    cells = rederived([cell for cell in results.runs() if cell["baseline_id"] in current],
                      results.read_manifest().get("seed") or 0)
    recommendations = [
        recommend(cells, label, args.tolerance, args.spd_tolerance, segments, args.lengths)
        for label in verifier_labels(args.verifier)
    ]
    calibration = json_text([rec.to_dict() for rec in recommendations], indent=2)
    markdown = calibration_markdown(
        recommendations,
        results.read_manifest(),
        args.tolerance,
        args.spd_tolerance,
        {task_run.task.name: len(task_run.examples) for task_run in tasks},
        segments,
    )
    for rec in recommendations:
        print(f"{rec.verifier}: {'L=%d' % rec.L if rec.L is not None else 'no L'} - {rec.reason}")
        for note in (session_note(rec), left_out_note(rec)):
            if note:
                print(f"note: {note}")
    return write_calibration(results.path, [calibration + "\n", markdown])
