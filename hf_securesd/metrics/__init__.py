"""`evaluate` metric modules shipped with hf-securesd, each a ready-to-push Hub Space.

Every folder here (`prr`, `afr`, and any other `<name>/<name>.py`) holds the module, its metric
card (`README.md`, with the Space's YAML header), `app.py` (the Space's widget) and
`requirements.txt`. Two ways to load one:

```python
>>> import evaluate, hf_securesd.metrics
>>> prr = evaluate.load(hf_securesd.metrics.path("prr"))   # offline, from the installed package
>>> prr = evaluate.load("securesd/prr")                     # online, from the published Space
```

`export(name, directory)` writes exactly the Space's files, ready for
`huggingface-cli upload securesd/<name> <directory> --repo-type space`. It replaces a symbolic link
at a file's name rather than writing through it, and refuses a folder that already holds other
files, or other versions of the Space's, unless `overwrite=True` (`hf_securesd.hub.export_files`).
"""

from __future__ import annotations

from pathlib import Path

from ..hub import export_files

_ROOT = Path(__file__).resolve().parent
METRICS: tuple[str, ...] = tuple(
    sorted(folder.name for folder in _ROOT.iterdir() if (folder / f"{folder.name}.py").is_file())
)
SPACE_FILES: tuple[str, ...] = ("README.md", "app.py", "requirements.txt")


def path(name: str) -> str:
    """Folder of the `evaluate` module `name` (one of `METRICS`), suitable for `evaluate.load`."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; choose one of {', '.join(METRICS)}.")
    return str(_ROOT / name)


def export(name: str, directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write the Space `securesd/<name>` (module, card, app, requirements; nothing else) into
    `directory` and return it. A folder that already holds other files, or other versions of these,
    is refused (FileExistsError naming them) unless `overwrite=True`, which replaces the Space's
    files and keeps the others; a symbolic link at a file's name is replaced, never written through."""
    source = Path(path(name))
    return export_files(directory, {file: source / file for file in (f"{name}.py", *SPACE_FILES)},
                        overwrite=overwrite)
