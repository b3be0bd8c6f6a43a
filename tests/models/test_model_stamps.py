"""What the cache trusts: a copy only with the stamp of a verified build of the current pin, listing
exactly the folder's regular files; a GGUF only with a stamp matching its status (times, device,
inode) or a re-hash; a malformed stamp counts as missing and never crashes a command."""

from __future__ import annotations

import argparse
import json
import re
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_model_resolution import (  # noqa: F401
    fake_converter,
    gguf_file,
    index,
    published,
    registered,
)

import hf_securesd.models as models
from hf_securesd.models import pypi_assembly, registry, stamps
from hf_securesd.models.cli import configure, run
from hf_securesd.models.pypi_assembly import AssemblyError


def cli(*argv: str) -> int:
    """Run ``securesd models ARGV``."""
    parser = argparse.ArgumentParser()
    configure(parser)
    return run(parser.parse_args(list(argv)))


@pytest.fixture()
def copy(published, tmp_path: Path) -> tuple:
    """A fetched copy of the tiny model: (spec, fake index, cache folder, copy folder)."""
    spec, index = published
    folder = pypi_assembly.fetch(spec, tmp_path, downloader=index, converter=fake_converter)
    return spec, index, tmp_path, folder


# ---- the copy's stamp -------------------------------------------------------------------------


def test_a_copy_built_for_an_older_pin_is_not_trusted(copy) -> None:
    spec, index, cache, folder = copy
    repinned = replace(spec, sha256="f" * 64)
    assert stamps.is_cached_copy(folder, spec) and not stamps.is_cached_copy(folder, repinned)
    downloads = len(index.downloads)
    with pytest.raises(AssemblyError) as error:  # rebuilt (and the old chunks fail the new pin)
        pypi_assembly.fetch(repinned, cache, downloader=index, converter=fake_converter)
    assert error.value.step == "sha256 check" and len(index.downloads) == 2 * downloads


def test_resolution_does_not_return_a_copy_of_an_older_pin(registered,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cache = registered
    assert models.resolve_model(spec.key, cache_dir=cache, offline=True) == str(cache / "tiny-test-bf16")
    monkeypatch.setitem(registry.MODELS, spec.key, replace(spec, sha256="f" * 64))
    with pytest.raises(models.ModelNotCachedError):
        models.resolve_model(spec.key, cache_dir=cache, offline=True, download=False)


@pytest.mark.parametrize("plant", ["generation_config", "tokenizer_config", "folder", "link", "listed_link"])
def test_anything_unlisted_in_a_copy_is_refused(copy, plant: str) -> None:
    spec, index, cache, folder = copy
    if plant == "generation_config":
        (folder / "generation_config.json").write_text('{"do_sample": true, "temperature": 5.0}')
    elif plant == "tokenizer_config":
        (folder / "tokenizer_config.json").write_text('{"chat_template": "{{ planted }}"}')
    elif plant == "folder":
        (folder / "extra").mkdir()
    elif plant == "link":
        (folder / "linked.json").symlink_to(folder / "config.json")
    else:  # a listed file replaced by a link to a file of the same size
        (cache / "elsewhere").write_bytes((folder / "model.safetensors").read_bytes())
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors").symlink_to(cache / "elsewhere")
    assert not stamps.is_cached_copy(folder, spec)


def test_a_same_size_change_is_found_only_by_a_rehash(copy) -> None:
    spec, index, cache, folder = copy
    (folder / "model.safetensors").write_bytes(b"weightz")
    assert stamps.is_cached_copy(folder, spec) and not stamps.is_cached_copy(folder, spec, rehash=True)


def test_where_verify_rehashes_each_copy(registered, capsys: pytest.CaptureFixture[str]) -> None:
    spec, cache = registered
    folder = Path(models.resolve_model(spec.key, cache_dir=cache, offline=True))
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline", "--verify") == 0
    assert "every file re-hashed" in capsys.readouterr().out
    (folder / "model.safetensors").write_bytes(b"weightz")  # same size, other bytes
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline") == 0
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline", "--verify") == 1
    captured = capsys.readouterr()
    assert "FAILS re-hashing: the sha256 of 'model.safetensors' differs from its stamp" in captured.out
    assert "still uses it" in captured.out and "NOT USED" not in captured.out  # loading checks sizes only
    assert f"resolves to: {folder}" in captured.out
    assert f"securesd models fetch {spec.key} --dtype bf16 --cache-dir {cache} --force" in captured.out
    assert "does not match its stamp" in captured.err


def test_where_names_an_unlisted_file_and_verify_fails_on_it(registered, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy with a file its stamp does not list is not used (it would change loading); `where` must say
    so and why, not report it as missing, and `--verify` must fail."""
    spec, cache = registered
    folder = Path(models.resolve_model(spec.key, cache_dir=cache, offline=True))
    (folder / "extra.txt").write_text("x")
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline") == 0
    out = capsys.readouterr().out
    assert "NOT USED: it holds files its stamp does not list: 'extra.txt'" in out and "not cached" not in out
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline", "--verify") == 1
    with pytest.raises(models.ModelNotCachedError,
                       match=rf"copy in {re.escape(str(cache))} is not used: it holds files .*--cache-dir"):
        models.resolve_model(spec.key, cache_dir=cache, offline=True, download=False)


# ---- malformed stamps --------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["entry_is_size", "entry_is_list", "size_is_float", "size_is_text",
                                    "sha256_is_number", "files_is_list"])
def test_a_copy_stamp_with_wrong_types_counts_as_missing(copy, change: str) -> None:
    spec, index, cache, folder = copy
    stamp = json.loads((folder / stamps.STAMP_FILE).read_text())
    files = stamp["files"]
    entry = files["config.json"]
    if change == "entry_is_size":
        files["config.json"] = entry["size"]
    elif change == "entry_is_list":
        files["config.json"] = [entry["size"], entry["sha256"]]
    elif change == "size_is_float":  # equal in value to the right size
        entry["size"] = float(entry["size"])
    elif change == "size_is_text":
        entry["size"] = str(entry["size"])
    elif change == "sha256_is_number":
        entry["sha256"] = 5
    else:
        stamp["files"] = list(files)
    (folder / stamps.STAMP_FILE).write_text(json.dumps(stamp))
    assert not stamps.is_cached_copy(folder, spec)
    assert pypi_assembly.fetch(spec, cache, downloader=index, converter=fake_converter) == folder
    assert stamps.is_cached_copy(folder, spec)  # rebuilt


@pytest.mark.parametrize("content", ["nested", "oversized", "dev_zero", "link"])
def test_an_unreadable_copy_stamp_counts_as_missing(copy, content: str) -> None:
    spec, index, cache, folder = copy
    stamp = folder / stamps.STAMP_FILE
    good = stamp.read_text()
    stamp.unlink()
    if content == "nested":
        stamp.write_text("[" * 100_000 + "]" * 100_000)
    elif content == "oversized":  # a valid stamp padded past the cap
        stamp.write_text(good + " " * stamps.STAMP_MAX_BYTES)
    elif content == "dev_zero":
        stamp.symlink_to("/dev/zero")
    else:  # a link to a valid stamp
        (cache / "stamp.json").write_text(good)
        stamp.symlink_to(cache / "stamp.json")
    assert not stamps.is_cached_copy(folder, spec)


@pytest.mark.parametrize("content", ['{"sha256": ["x"], "stat": 5}', "[" * 100_000, "dev_zero"])
def test_a_malformed_gguf_stamp_means_a_rehash(published, tmp_path: Path, content: str) -> None:
    spec, index = published
    path = pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    stamp = stamps.gguf_stamp(path)
    stamp.unlink()
    if content == "dev_zero":
        stamp.symlink_to("/dev/zero")
    else:
        stamp.write_text(content)
    assert stamps.verified_gguf(path, spec)


def test_commands_survive_a_stamp_of_wrong_types(registered, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    spec, cache = registered
    folder = Path(models.resolve_model(spec.key, cache_dir=cache, offline=True))
    (folder / stamps.STAMP_FILE).write_text(json.dumps({"files": {"config.json": 2, "model.safetensors": 1}}))
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline") == 0
    assert "NOT USED: it has no readable stamp (securesd_verified.json)" in capsys.readouterr().out
    offline_fetch = models.fetch
    monkeypatch.setattr("hf_securesd.models.cli.fetch",
                        lambda spec, cache, dtype, force: offline_fetch(spec, cache, dtype))
    assert cli("fetch", spec.key, "--cache-dir", str(cache)) == 0
    assert stamps.is_cached_copy(folder, spec)


# ---- the GGUF's stamp --------------------------------------------------------------------------


def test_an_edit_that_restores_the_modification_time_is_caught(published, tmp_path: Path) -> None:
    spec, index = published
    path = pypi_assembly.assemble_gguf(spec, tmp_path, downloader=index)
    before = path.stat()
    time.sleep(0.05)  # past the file system's timestamp granularity
    with open(path, "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    assert not stamps.verified_gguf(path, spec)


def test_where_reports_a_gguf_only_once_verified(registered, capsys: pytest.CaptureFixture[str]) -> None:
    spec, cache = registered
    gguf = pypi_assembly.gguf_path(spec, cache)
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF")  # an unchecked 4-byte file
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline") == 0
    assert "GGUF:      not cached" in capsys.readouterr().out
    models.resolve_model(spec.key, cache_dir=cache, offline=True)  # assembles and checks it
    assert cli("where", spec.key, "--cache-dir", str(cache), "--offline") == 0
    assert f"GGUF:      {gguf}" in capsys.readouterr().out
