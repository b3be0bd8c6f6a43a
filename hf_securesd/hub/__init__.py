"""The `custom_generate` Hub repo shipped with hf-securesd.

This folder is a ready-to-push Hub repository: `README.md` (its card) and
`custom_generate/generate.py` + `custom_generate/requirements.txt`, the layout transformers loads
for `model.generate(..., custom_generate="<repo id or folder>", trust_remote_code=True)`.

```python
>>> import hf_securesd.hub
>>> out = model.generate(**inputs, custom_generate=hf_securesd.hub.path(), trust_remote_code=True,
...                      assistant_model=draft, verifier="mars", secure_schedule={"schedule": "step", "L": 1})
```

`export_repo`, `export_custom_generate` and `hf_securesd.metrics.export` write with `export_files`:
each file through a new temporary file renamed into place, so a symbolic link at a file's name is
replaced, never written through, and nothing is written outside the folder; the files are renamed
only once all are written, so a failed export (a read-only subfolder, a full disk) leaves the old
files as they were, and its error names the file it could not write. They refuse a folder
that already holds other files or different versions of theirs unless `overwrite=True`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

from ..models.partials import write_files

_ROOT = Path(__file__).resolve().parent
REPO_FILES: tuple[str, ...] = ("README.md", "custom_generate/generate.py", "custom_generate/requirements.txt")
CUSTOM_GENERATE_FILES: tuple[str, ...] = ("custom_generate/generate.py", "custom_generate/requirements.txt")
# What a Hub upload leaves out of a folder: `.git` (a clone's history) and `.cache/huggingface`
# (`hf download --local-dir`'s metadata); and what every Hub repo holds: a `.gitattributes` file.
UPLOAD_SKIPPED: frozenset[str] = frozenset({".git", ".cache/huggingface"})
HUB_FILES: frozenset[str] = frozenset({".gitattributes"})
_SEARCHED = ".cache"  # searched for what else it holds (its `huggingface` entry is skipped)


def _allowed_beside(name: str, entry: Path) -> bool:
    """Whether the entry `name` (relative to the export's folder) may stay beside the export: skipped by
    uploads, or a Hub repo's own regular file (a link or folder there would be uploaded as something else)."""
    if name in UPLOAD_SKIPPED:
        return True
    return name in HUB_FILES and entry.is_file() and not entry.is_symlink()


def path() -> str:
    """This folder, usable as `custom_generate=` (it holds `custom_generate/generate.py`)."""
    return str(_ROOT)


def _parent_folders(files: Mapping[str, Path]) -> set[str]:
    """The folders (relative, POSIX form) that hold the files named in `files`, nested ones too."""
    return {str(parent) for name in files for parent in PurePosixPath(name).parents if str(parent) != "."}


def _check_writable(directory: Path, files: Mapping[str, Path]) -> None:
    """Refuse (FileExistsError) a folder of the export that is a symbolic link or not a folder, and
    a folder where the export writes a file: writing there would leave `directory` or fail midway."""
    for folder in sorted(_parent_folders(files)):
        entry = directory / folder
        if entry.is_symlink() or (entry.exists() and not entry.is_dir()):
            raise FileExistsError(
                f"{entry} is a symbolic link or not a folder; the export writes only into real folders "
                f"inside {directory}: remove it, or export into a new folder."
            )
    for name in files:
        if (directory / name).is_dir() and not (directory / name).is_symlink():
            raise FileExistsError(
                f"{directory / name} is a folder where the export writes a file; remove it, or export into "
                "a new folder."
            )


def _replaced_files(directory: Path, files: Mapping[str, Path]) -> Iterator[str]:
    """The files of the export that `directory` already holds in another form: a symbolic link or
    another special file (it would be replaced, never followed or read) or a file whose content differs."""
    for name, source in files.items():
        target = directory / name
        if target.is_symlink() or (target.exists() and not target.is_file()):
            yield f"{name} (a symbolic link or special file, which would be replaced)"
        elif target.exists() and not _same_content(target, source):
            yield f"{name} (different content)"


def _same_content(file: Path, source: Path) -> bool:
    """Whether the regular file `file` holds the same bytes as `source` (sizes compared first)."""
    return file.stat().st_size == source.stat().st_size and file.read_bytes() == source.read_bytes()


def _other_entries(folder: Path, prefix: str, files: Mapping[str, Path], folders: set[str]) -> Iterator[str]:
    """The entries under `folder` (named `prefix`... relative to the export's folder) that are not
    part of the export, without descending into them; the export's own folders are searched."""
    for entry in sorted(folder.iterdir()):
        name = f"{prefix}{entry.name}"
        if name in files or _allowed_beside(name, entry):
            continue
        if name in folders or (name == _SEARCHED and entry.is_dir() and not entry.is_symlink()):
            yield from _other_entries(entry, f"{name}/", files, folders)
        else:
            kind = "/" if entry.is_dir() and not entry.is_symlink() else ""
            yield f"{name}{kind} (not part of the export)"


def export_files(directory: str | Path, files: Mapping[str, Path], *, overwrite: bool = False,
                 scope: str = "") -> Path:
    """Write `files` (destination name relative to `directory`, POSIX form → source file) into
    `directory`, creating it and the folders the names need, and return `directory`.

    Each file is written through a new temporary file in its folder, then renamed over its name, so
    a symbolic link there is replaced, never written through; the renames start once every file is
    written (`write_files`: a failure to write one leaves every file of `directory` as it was). Before anything is written, a folder
    of the export that is a link or a file is refused, and so, unless `overwrite` is True, is a
    destination that already holds any of the files in another form (different content, a link) or
    entries that are not part of the export (which an upload of the folder would include). Only the
    entries under the subfolder `scope` of `directory` are looked at ("": all of it, but for
    what `_allowed_beside` allows). A `directory` given as a link is checked and written as the folder
    it names. With `overwrite=True` the export's files are replaced and other entries are kept."""
    directory = given = Path(directory)
    if directory.is_symlink() and not directory.exists():
        raise FileExistsError(f"{directory} is a symbolic link to nothing; export into a folder (a new one is made)")
    if directory.exists() and not directory.is_dir():
        raise FileExistsError(f"{directory} is a file, not a folder; export into a folder (a new one is made)")
    if directory.exists():
        directory = directory.resolve()  # the folder the caller named, even through a link: checked as written
        _check_writable(directory, files)
        root = directory / scope
        found = [*_replaced_files(directory, files)]
        if root.is_dir() and not root.is_symlink():
            prefix = f"{scope}/" if scope else ""
            found += _other_entries(root, prefix, files, _parent_folders(files))
        if found and not overwrite:
            raise FileExistsError(
                f"{directory} already holds {', '.join(found)}. Export into a new or empty folder, or pass "
                "overwrite=True to replace the exported files (other entries are kept, and uploading the "
                "folder would include them)."
            )
    directory.mkdir(parents=True, exist_ok=True)
    real = directory.resolve()  # no link below the folder is followed (`_check_writable`, `write_files`)
    for name in files:
        (real / name).parent.mkdir(parents=True, exist_ok=True)
    write_files({real / name: source.read_bytes() for name, source in files.items()})
    return given


def export_custom_generate(directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write `custom_generate/generate.py` and `requirements.txt` into `directory` (e.g. a model saved
    with `save_pretrained`) and return the `custom_generate` folder. The rest of `directory` is left
    alone; `custom_generate/` holding other files, or other versions of these two, is refused unless
    `overwrite=True` (see `export_files`)."""
    files = {name: _ROOT / name for name in CUSTOM_GENERATE_FILES}
    export_files(directory, files, overwrite=overwrite, scope="custom_generate")
    return Path(directory) / "custom_generate"


def export_repo(directory: str | Path, *, overwrite: bool = False) -> Path:
    """Write the Hub repo (card and `custom_generate/`, nothing else) into `directory`, ready for
    `huggingface-cli upload <org>/securesd <directory>`, and return it. A folder that holds other
    files, or other versions of these, is refused unless `overwrite=True` (see `export_files`)."""
    return export_files(directory, {name: _ROOT / name for name in REPO_FILES}, overwrite=overwrite)
