"""Writing the Hub folders (`hf_securesd.hub.export_repo`, `export_custom_generate`,
`hf_securesd.metrics.export`): only inside the folder, never through a symbolic link, and never over
other files or stale ones without `overwrite=True`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import hf_securesd
import hf_securesd.hub
import hf_securesd.metrics

EXPORTS = {
    "metric": (lambda folder, **kwargs: hf_securesd.metrics.export("prr", folder, **kwargs), "README.md"),
    "repo": (hf_securesd.hub.export_repo, "custom_generate/generate.py"),
    "custom_generate": (hf_securesd.hub.export_custom_generate, "custom_generate/generate.py"),
}


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious user file\n")
    return victim


@pytest.mark.parametrize("kind", EXPORTS)
def test_a_symbolic_link_at_a_files_name_is_refused_then_replaced_never_followed(kind, tmp_path):
    export, name = EXPORTS[kind]
    victim = _victim(tmp_path)
    link = tmp_path / "out" / name
    link.parent.mkdir(parents=True)
    link.symlink_to(victim)
    refused = rf"{name} \(a symbolic link or special file, which would be replaced\).*overwrite=True"
    with pytest.raises(FileExistsError, match=refused):
        export(tmp_path / "out")
    export(tmp_path / "out", overwrite=True)
    assert victim.read_text() == "precious user file\n"
    assert not link.is_symlink() and link.stat().st_size > 0


@pytest.mark.parametrize("kind", ["repo", "custom_generate"])
def test_a_linked_custom_generate_folder_is_refused_even_with_overwrite(kind, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "custom_generate").symlink_to(outside, target_is_directory=True)
    with pytest.raises(FileExistsError, match="custom_generate is a symbolic link or not a folder"):
        EXPORTS[kind][0](tmp_path / "out", overwrite=True)
    assert list(outside.iterdir()) == []


def test_other_and_different_files_are_named_and_kept_unless_overwrite(tmp_path):
    space = tmp_path / "space"
    space.mkdir()
    (space / "app.py").write_text("my own app\n")
    (space / "stale.py").write_text("left from before\n")
    (space / "old").mkdir()
    with pytest.raises(FileExistsError) as refused:
        hf_securesd.metrics.export("flips", space)
    message = str(refused.value)
    for part in ("app.py (different content)", "old/ (not part of the export)",
                 "stale.py (not part of the export)", "new or empty folder", "overwrite=True"):
        assert part in message
    assert (space / "app.py").read_text() == "my own app\n" and not (space / "flips.py").exists()
    hf_securesd.metrics.export("flips", space, overwrite=True)
    shipped = Path(hf_securesd.metrics.path("flips"))
    assert (space / "app.py").read_bytes() == (shipped / "app.py").read_bytes()
    assert (space / "stale.py").exists() and (space / "old").is_dir()


def test_a_second_metric_is_refused_in_the_first_ones_folder(tmp_path):
    hf_securesd.metrics.export("prr", tmp_path / "space")
    refused = r"README.md \(different content\).*prr.py \(not part of the export\)"
    with pytest.raises(FileExistsError, match=refused):
        hf_securesd.metrics.export("afr", tmp_path / "space")


def test_exporting_again_into_the_same_folder_and_into_a_git_clone_is_allowed(tmp_path):
    repo = hf_securesd.hub.export_repo(tmp_path / "repo")
    (repo / ".git").mkdir()  # uploads skip it
    assert hf_securesd.hub.export_repo(repo) == repo
    folder = hf_securesd.hub.export_custom_generate(tmp_path / "model")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights")  # not under custom_generate/: ignored
    assert hf_securesd.hub.export_custom_generate(tmp_path / "model") == folder
    (folder / "extra.py").write_text("x = 1\n")
    with pytest.raises(FileExistsError, match=r"custom_generate/extra.py \(not part of the export\)"):
        hf_securesd.hub.export_custom_generate(tmp_path / "model")


def test_a_folder_given_as_a_link_is_written_through_the_link_the_caller_named(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "named").symlink_to(tmp_path / "real", target_is_directory=True)
    hf_securesd.hub.export_repo(tmp_path / "named")
    assert sorted(str(path.relative_to(tmp_path / "real")) for path in (tmp_path / "real").rglob("*")
                  if path.is_file()) == sorted(hf_securesd.hub.REPO_FILES)


def test_exported_files_get_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        space = hf_securesd.metrics.export("prr", tmp_path / "space")
    finally:
        os.umask(umask)
    modes = {oct((space / name).stat().st_mode & 0o777) for name in hf_securesd.metrics.SPACE_FILES}
    assert modes == {"0o644"}


def test_a_named_pipe_at_a_files_name_is_not_read(tmp_path):
    (tmp_path / "space").mkdir()
    os.mkfifo(tmp_path / "space" / "app.py")  # reading it would block
    with pytest.raises(FileExistsError, match=r"app.py \(a symbolic link or special file"):
        hf_securesd.metrics.export("prr", tmp_path / "space")


def test_a_wrapped_models_save_writes_over_an_older_custom_generate(tmp_path):
    """save_pretrained writes over a folder by design: a custom_generate/ from another version (a different
    generate.py, an extra file) is replaced, not refused after the weights are written."""
    from hf_securesd.tiny import tiny_pair

    _, target = tiny_pair()
    model = hf_securesd.wrap(target)
    model.generation_config.verifier = "lossless"
    stale = tmp_path / "custom_generate"
    stale.mkdir()
    (stale / "generate.py").write_text("# an older version\n")
    (stale / "notes.txt").write_text("kept\n")
    model.save_pretrained(tmp_path)
    assert (stale / "generate.py").read_text() == (Path(hf_securesd.hub.path()) / "custom_generate" / "generate.py").read_text()
    assert (stale / "notes.txt").read_text() == "kept\n"


def test_a_folder_named_through_a_link_is_checked_as_the_folder_it_names(tmp_path):
    """The link is the caller's own name for the folder: its other files are refused as they are by the
    folder's real path, not skipped."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "secrets.env").write_text("TOKEN=x\n")
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    for folder in (tmp_path / "link", real):
        with pytest.raises(FileExistsError, match=r"secrets.env \(not part of the export\)"):
            hf_securesd.metrics.export("prr", folder)
    assert sorted(entry.name for entry in real.iterdir()) == ["secrets.env"]


def test_a_hub_clone_or_download_is_exported_into_again(tmp_path):
    """A Space clone has `.gitattributes` and `.git`; `hf download --local-dir` leaves `.cache/huggingface`:
    uploads leave `.git` and `.cache` out, and every Hub repo has a `.gitattributes`."""
    clone = tmp_path / "clone"
    hf_securesd.metrics.export("prr", clone)
    (clone / ".gitattributes").write_text("*.bin filter=lfs\n")
    (clone / ".cache" / "huggingface").mkdir(parents=True)
    (clone / ".git").mkdir()
    hf_securesd.metrics.export("prr", clone)
    assert (clone / ".gitattributes").read_text() == "*.bin filter=lfs\n"


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_a_file_or_a_link_to_nothing_as_the_folder_is_named(kind, tmp_path):
    target = tmp_path / "out"
    if kind == "file":
        target.write_text("x")
    else:
        target.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError, match="is a file, not a folder" if kind == "file" else "symbolic link to nothing"):
        hf_securesd.metrics.export("prr", target)


@pytest.mark.parametrize("entry", [".gitattributes/secrets.env", ".gitattributes -> link", ".cache/secrets.env", ".cache file"])
def test_only_what_uploads_skip_or_a_repos_own_gitattributes_file_is_allowed_beside(entry, tmp_path):
    """A `.gitattributes` folder or link, or a `.cache` holding more than `huggingface/`, would be uploaded."""
    folder = tmp_path / "out"
    folder.mkdir()
    if entry == ".gitattributes -> link":
        (tmp_path / "outside.txt").write_text("secret\n")
        (folder / ".gitattributes").symlink_to(tmp_path / "outside.txt")
    elif entry == ".cache file":
        (folder / ".cache").write_text("x")
    else:
        (folder / entry).parent.mkdir()
        (folder / entry).write_text("TOKEN=x\n")
    with pytest.raises(FileExistsError, match="not part of the export"):
        hf_securesd.metrics.export("prr", folder)


def test_the_saved_requirement_is_the_installed_release():
    """A folder saved by this release asks for this release or a later one: a config written by a newer
    release (a verifier or schedule this one does not know) then meets transformers' requirement check,
    which names the release to install, instead of an unknown-verifier error."""
    requirement = (Path(hf_securesd.hub.path()) / "custom_generate" / "requirements.txt").read_text().split()
    assert requirement == [f"hf-securesd>={hf_securesd.__version__}"]


def test_a_file_that_cannot_be_written_leaves_every_file_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "out"
    hf_securesd.hub.export_repo(out)
    (out / "README.md").write_text("an older card\n")
    (out / "custom_generate" / "generate.py").write_text("an older generate.py\n")
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if str(path).startswith(".generate.py.") and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", path)  # as a read-only custom_generate/ would
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    with pytest.raises(PermissionError) as caught:
        hf_securesd.hub.export_repo(out, overwrite=True)
    monkeypatch.undo()
    assert caught.value.filename == str((out / "custom_generate" / "generate.py").resolve())
    assert (out / "README.md").read_text() == "an older card\n"  # not renamed in before the failure
    assert (out / "custom_generate" / "generate.py").read_text() == "an older generate.py\n"
    assert sorted(path.name for path in out.rglob("*")) == ["README.md", "custom_generate", "generate.py", "requirements.txt"]
