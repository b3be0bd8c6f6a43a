"""The `custom_generate` Hub repo shipped with hf-securesd.

This folder is a ready-to-push Hub repository: `README.md` (its card) and
`custom_generate/generate.py` + `custom_generate/requirements.txt`, the layout transformers loads
for `model.generate(..., custom_generate="<repo id or folder>", trust_remote_code=True)`.

```python
>>> import hf_securesd.hub
>>> out = model.generate(**inputs, custom_generate=hf_securesd.hub.path(), trust_remote_code=True,
...                      assistant_model=draft, verifier="mars", secure_schedule={"schedule": "step", "L": 1})
```
"""

from __future__ import annotations

import shutil
from pathlib import Path

_ROOT = Path(__file__).resolve().parent
REPO_FILES: tuple[str, ...] = ("README.md", "custom_generate/generate.py", "custom_generate/requirements.txt")


def path() -> str:
    """This folder, usable as `custom_generate=` (it holds `custom_generate/generate.py`)."""
    return str(_ROOT)


def export_custom_generate(directory: str | Path) -> Path:
    """Copy `custom_generate/generate.py` and `requirements.txt` into `directory` (e.g. a model saved
    with `save_pretrained`) and return the new `custom_generate` folder."""
    target = Path(directory) / "custom_generate"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("generate.py", "requirements.txt"):
        shutil.copyfile(_ROOT / "custom_generate" / name, target / name)
    return target


def export_repo(directory: str | Path) -> Path:
    """Write the Hub repo (card and `custom_generate/`, nothing else) into `directory`, ready for
    `huggingface-cli upload <org>/securesd <directory>`."""
    directory = Path(directory)
    for name in REPO_FILES:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_ROOT / name, directory / name)
    return directory
