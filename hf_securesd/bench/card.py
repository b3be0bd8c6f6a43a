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

import json
import os
from pathlib import Path
from typing import Sequence

CARD_FILE = "card.json"
FIGURES = ("prr_vs_ar.png", "position_tv.png")


def _paragraphs(value: str | Sequence[str] | None) -> list[str]:
    if not value:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [line for item in items for line in (item, "")]


def companion_engines(results_dir: str | os.PathLike) -> list[str]:
    """The results directories (relative to `results_dir`) that card.json names under "engines"."""
    spec_path = Path(results_dir) / CARD_FILE
    if not spec_path.is_file():
        return []
    engines = json.loads(spec_path.read_text(encoding="utf-8")).get("engines") or []
    if not isinstance(engines, list) or not all(isinstance(entry, str) for entry in engines):
        raise ValueError(f"{spec_path}: \"engines\" must be a list of results directories, got {engines!r}")
    return engines


def write_card(results_dir: str | os.PathLike, report_lines: Sequence[str]) -> Path | None:
    """Write the card described by RESULTS/card.json from the report's Markdown lines (its first
    line, the report title, is replaced by the card's). Returns the card's path, or None when the
    directory has no card.json."""
    results = Path(results_dir)
    spec_path = results / CARD_FILE
    if not spec_path.is_file():
        return None
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    for key in ("output", "title"):
        if not spec.get(key):
            raise ValueError(f"{spec_path} needs an {key!r} entry (see hf_securesd.bench.card)")
    output = (results / spec["output"]).resolve()
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
    lines = [f"# {spec['title']}", "", *_paragraphs(spec.get("preamble"))]
    if spec.get("commands"):
        lines += ["## Commands", "", "```bash", *spec["commands"], "```", ""]
    lines += body
    lines += ["", *_paragraphs(spec.get("closing"))]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return output
