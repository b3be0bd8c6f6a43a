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
`huggingface-cli upload securesd/<name> <directory> --repo-type space`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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


def export(name: str, directory: str | Path) -> Path:
    """Write the Space `securesd/<name>` (module, card, app, requirements; nothing else) into
    `directory` and return it."""
    source = Path(path(name))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for file in (f"{name}.py", *SPACE_FILES):
        shutil.copyfile(source / file, directory / file)
    return directory
