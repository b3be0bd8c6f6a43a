"""A model card regenerated from a results directory: `securesd report RESULTS` also writes the
card when RESULTS/card.json exists, so every number in the card comes from the recorded runs.

card.json holds only prose and commands (no numbers):

```json
{
  "output": "../my-pair.md",            // where the card goes, relative to RESULTS
  "title": "My pair under lossy speculative decoding",
  "preamble": ["paragraph", "..."],     // Markdown before the report
  "commands": ["securesd bench ...", "securesd report RESULTS"],
  "closing": ["paragraph", "..."],      // Markdown after the report
  "engines": ["../my-pair-vllm-results"] // optional: the same study through another engine,
}                                        //   compared prompt for prompt (report_engines)
```

The card is the title, the preamble, the commands, the report's sections (figure links rewritten
to point into RESULTS/report/) and the closing text.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Sequence

from hf_securesd.bench.results import (
    CORRUPT_FIX,
    CorruptResultsError,
    _parse_json,
    _UNREADABLE,
    read_in_place,
)
from hf_securesd.bench.report_markdown import one_line
from hf_securesd.bench.terminal import printable, readable

CARD_FILE = "card.json"
FIGURES = ("prr_vs_ar.png", "position_tv.png")
CARD_SUFFIX = ".md"
RESULTS_SUFFIX = "-results"  # a results directory NAME-results keeps its card beside it as NAME.md
# card.json entries: JSON type, and whether the card needs the entry
_TEXT_LIST = (str, list)
CARD_ENTRIES: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "output": (str, True), "title": (str, True), "preamble": (_TEXT_LIST, False),
    "commands": (list, False), "closing": (_TEXT_LIST, False), "engines": (list, False),
}


def _paragraphs(value: str | Sequence[str] | None) -> list[str]:
    """card.json text or list of text as paragraphs (`readable`: Markdown, but no control characters)."""
    if not value:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [line for item in items for line in (readable(item), "")]


def _unknown_entry_problem(spec: dict[str, Any]) -> str | None:
    """What is wrong with the first entry of `spec` that is not in `CARD_ENTRIES` (a misspelt entry
    would otherwise drop its part of the card without a word), or None when there is none."""
    unknown = next((key for key in spec if key not in CARD_ENTRIES), None)
    if unknown is None:
        return None
    close = difflib.get_close_matches(unknown, CARD_ENTRIES, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    valid = ", ".join(f'"{key}"' for key in CARD_ENTRIES)
    return f"unknown entry {printable(repr(unknown))}{hint}; the entries are {valid}"


def read_card_spec(results_dir: str | os.PathLike) -> dict[str, Any] | None:
    """RESULTS/card.json, checked (only entries of `CARD_ENTRIES`, each with its type, lists of text), or
    None when the directory has none. `CorruptResultsError` names the file and the entry."""
    spec_path = Path(results_dir) / CARD_FILE
    if not spec_path.is_file():
        return None
    spec = _parse_json(read_in_place(spec_path))
    if spec is _UNREADABLE or not isinstance(spec, dict):
        unreadable = "not valid UTF-8 JSON (or nested too deeply to read)"
        found = unreadable if spec is _UNREADABLE else f"{spec!r} is not a JSON object"
        raise CorruptResultsError(f"{spec_path}: {found}; write it as described in hf_securesd.bench.card")
    unknown = _unknown_entry_problem(spec)
    if unknown:
        raise CorruptResultsError(f"{spec_path}: {unknown}; rename or remove it (see hf_securesd.bench.card)")
    for key, (kind, needed) in CARD_ENTRIES.items():
        value = spec.get(key)
        if value is None and not needed:
            continue
        if value is None:
            raise CorruptResultsError(f"{spec_path} needs an {key!r} entry (see hf_securesd.bench.card)")
        text_items = isinstance(value, list) and all(isinstance(item, str) for item in value)
        if (needed and not value) or not isinstance(value, kind) or (isinstance(value, list) and not text_items):
            what = "text" if kind is str else "text or a list of text" if kind is _TEXT_LIST else "a list of text"
            raise CorruptResultsError(f'{spec_path}: "{key}" must be {what}, got {value!r}; '
                                      f"see hf_securesd.bench.card ({CORRUPT_FIX})")
    card_output(results_dir, spec["output"])
    for companion in spec.get("engines") or []:
        companion_path(results_dir, companion)
    return spec


def card_output(results_dir: str | os.PathLike, output: str) -> Path:
    """Where card.json's `output` puts the card: a ``.md`` file directly in RESULTS, or the one card
    directly beside it named after RESULTS (``../NAME.md`` for a directory NAME-results or NAME).
    Anything else (an absolute path, a path climbing further up, into a subfolder or another folder, or
    another file beside RESULTS such as ``../README.md``) is refused: a results directory must not
    choose where `report` writes. The card is written through a temporary file renamed into place,
    so a link at its name is replaced, not followed."""
    results = Path(results_dir).resolve()
    relative = Path(output)
    path = Path(os.path.normpath(results / relative))
    beside = f"{results.name.removesuffix(RESULTS_SUFFIX)}{CARD_SUFFIX}"
    inside = path.parent == results
    if relative.is_absolute() or path.suffix != CARD_SUFFIX or not (inside or path == results.parent / beside):
        raise ValueError(
            f"{results / CARD_FILE}: the card 'output' {output!r} is not a {CARD_SUFFIX} file directly in "
            f"{results}, nor the card beside it named after the directory; give \"NAME{CARD_SUFFIX}\" or "
            f"\"../{beside}\""
        )
    return path


def companion_path(results_dir: str | os.PathLike, companion: str) -> Path:
    """The results directory that card.json's "engines" entry `companion` names: a folder directly
    beside RESULTS (``../NAME``) or directly in it. Anything else (an absolute path, a path climbing
    further up or into a subfolder's subfolder, and RESULTS itself: ``.`` or an empty entry) is
    refused, as the card's `output` is: a results directory must not choose which other folders
    `report` reads into its report and card. So is an entry that reaches its folder through a
    symbolic link (the folder itself, or a folder on the way such as ``sub/../../NAME``): a shared
    directory or archive can carry a link to any of the reader's results folders."""
    results = Path(results_dir).resolve()
    path = Path(os.path.normpath(results / companion))
    if Path(companion).is_absolute() or path == results or path.parent not in (results, results.parent):
        raise ValueError(
            f"{results / CARD_FILE}: the 'engines' entry {companion!r} is not a results directory directly "
            f"beside {results} (\"../NAME\") or directly in it; RESULTS itself, absolute paths and any "
            "other folder are refused"
        )
    if path.is_symlink() or Path(os.path.realpath(results / companion)) != path:
        raise ValueError(
            f"{results / CARD_FILE}: the 'engines' entry {companion!r} leads to another folder through a "
            f"symbolic link; name the other engine's results directory itself, directly beside {results} "
            "(\"../NAME\") or directly in it, or remove the entry"
        )
    return path


def companion_engines(results_dir: str | os.PathLike) -> list[str]:
    """The results directories (relative to `results_dir`) that card.json names under "engines"."""
    spec = read_card_spec(results_dir)
    return list(spec.get("engines") or []) if spec else []


def card_file(results_dir: str | os.PathLike, report_lines: Sequence[str]) -> tuple[Path, str] | None:
    """The card described by RESULTS/card.json, made from the report's Markdown lines (its first line,
    the report title, is replaced by the card's): (where it goes, its text), or None when the directory
    has no card.json. `report.write_report` writes it with the report's files."""
    results = Path(results_dir)
    spec = read_card_spec(results)
    if spec is None:
        return None
    output = card_output(results, spec["output"])
    figures = Path(os.path.relpath((results / "report").resolve(), output.parent)).as_posix()
    body = list(report_lines[1:]) if report_lines and report_lines[0].startswith("# ") else list(report_lines)
    relative = Path(os.path.relpath(results.resolve(), output.parent)).as_posix()
    spellings = sorted({str(results.resolve()), str(results)}, key=len, reverse=True)
    for index, line in enumerate(body):
        for figure in FIGURES:
            line = line.replace(f"]({figure})", f"]({figures}/{figure})")
        for spelling in spellings:
            line = line.replace(f"`{spelling}/", f"`{relative}/")
        body[index] = line
    lines = [f"# {one_line(spec['title'])}", "", *_paragraphs(spec.get("preamble"))]
    if spec.get("commands"):
        lines += ["## Commands", "", "```bash", *map(readable, spec["commands"]), "```", ""]
    lines += body
    lines += ["", *_paragraphs(spec.get("closing"))]
    return output, "\n".join(lines).rstrip() + "\n"
