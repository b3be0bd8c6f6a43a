"""Where `securesd demo --json` writes (`check_json_path`, `write_answers`), without models: a terminal, FIFO,
pipe or stdout (/dev/stdout, /proc/self/fd/N) is written through and the link to it kept, never replaced by a
file (as root, `--json /dev/stdout > out.json` replaced the system's /dev/stdout and out.json stayed empty); a
file is replaced atomically with the permissions `>` would give it. Every link here is a stand-in in tmp_path:
nothing under /dev or /proc is ever a target of these tests."""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from dataclasses import asdict
from pathlib import Path

import pytest

from hf_securesd import demo

ROWS = [demo.Answer("custom", "hi", "target only", "Hello.", 3, 0.5, None, False),
        demo.Answer("custom", "hi", "MARS(theta=0.5)", "Hello!", 3, 0.25, 0.5, True)]


def expected_json() -> list[dict]:
    """What ROWS read back as from the JSON file."""
    return [asdict(row) | {"tokens_per_s": row.tokens_per_s} for row in ROWS]


def stand_in(tmp_path: Path, target: str | Path) -> Path:
    """A symbolic link in tmp_path to `target`, in place of /dev/stdout and its kind."""
    link = tmp_path / "out.json"
    link.symlink_to(target)
    return link


def test_a_link_to_a_fifo_is_written_through_and_kept(tmp_path) -> None:
    fifo = tmp_path / "answers.fifo"
    os.mkfifo(fifo)
    link = stand_in(tmp_path, fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    demo.check_json_path(link)  # was refused: "not a regular file (a device or a pipe)"
    assert demo.write_answers(link, ROWS) == ""
    reader.join(timeout=30)
    assert json.loads(received[0]) == expected_json()
    assert link.is_symlink() and os.readlink(link) == str(fifo) and stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_link_to_a_pipe_descriptor_is_written_through_and_kept(tmp_path) -> None:
    """/dev/stdout and /dev/fd/N lead to /proc/self/fd/N; here N is a pipe of the test's own."""
    read_end, write_end = os.pipe()
    link = stand_in(tmp_path, f"/proc/self/fd/{write_end}")
    try:
        demo.check_json_path(link)
        assert demo.write_answers(link, ROWS) == ""
    finally:
        os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as pipe:
        assert json.loads(pipe.read()) == expected_json()
    assert link.is_symlink() and os.readlink(link) == f"/proc/self/fd/{write_end}"


def test_a_link_to_a_terminal_is_written_through_and_kept(tmp_path) -> None:
    """A terminal is a character device, as /dev/null is; here a pseudo-terminal of the test's own."""
    main_end, terminal = os.openpty()
    link = stand_in(tmp_path, f"/proc/self/fd/{terminal}")
    try:
        demo.check_json_path(link)
        assert demo.write_answers(link, ROWS) == ""
        shown = b""
        while not shown.endswith(b"]\r\n") and select.select([main_end], [], [], 5)[0]:
            shown += os.read(main_end, 65536)
    finally:
        os.close(terminal)
        os.close(main_end)
    assert json.loads(shown.decode().replace("\r\n", "\n")) == expected_json()  # the terminal shows \n as \r\n
    assert link.is_symlink()


def test_stdout_redirected_to_a_file_gets_the_json_and_no_link_is_replaced(tmp_path) -> None:
    """`securesd demo --json /dev/stdout >> out.json` in a child process, with a stand-in link for /dev/stdout:
    the JSON goes to the file stdout was redirected to, after what was there; the link and /dev/stdout stay
    as they were (the link was replaced by a file holding the JSON, and out.json stayed empty)."""
    link = stand_in(tmp_path, "/proc/self/fd/1")
    out = tmp_path / "redirected.txt"
    out.write_text("earlier output\n")
    dev_stdout = os.lstat("/dev/stdout") if os.path.lexists("/dev/stdout") else None
    child = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from hf_securesd import demo
        rows = [demo.Answer(**row) for row in json.loads({json.dumps([asdict(row) for row in ROWS])!r})]
        link = Path({str(link)!r})
        demo.check_json_path(link)
        print("message:", repr(demo.write_answers(link, rows)), file=sys.stderr)
    """)
    with out.open("a") as stdout:
        done = subprocess.run([sys.executable, "-c", child], stdout=stdout, stderr=subprocess.PIPE, text=True,
                              timeout=300)
    assert done.returncode == 0, done.stderr
    assert "message: ''" in done.stderr
    text = out.read_text()
    assert text.startswith("earlier output\n[") and json.loads(text.removeprefix("earlier output\n")) == expected_json()
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    if dev_stdout is not None:
        after = os.lstat("/dev/stdout")
        assert stat.S_ISLNK(after.st_mode) and (after.st_ino, after.st_dev) == (dev_stdout.st_ino, dev_stdout.st_dev)


def test_a_link_to_a_file_is_followed_the_file_replaced_and_the_link_kept(tmp_path) -> None:
    """As with `>`: the file the link names gets the JSON, replaced atomically in its own folder."""
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / "answers.json"
    target.write_text("old answers")
    link = stand_in(tmp_path, Path("data") / "answers.json")  # a relative link, read from the link's folder
    demo.check_json_path(link)
    assert demo.write_answers(link, ROWS) == (f" (replaced {target}, the file its symbolic link leads to; the link "
                                              "is kept)")
    assert link.is_symlink() and os.readlink(link) == str(Path("data") / "answers.json")
    assert json.loads(target.read_text()) == expected_json()
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["answers.json", "data", "out.json"]  # no temporary


@pytest.fixture
def umask_027():
    """The process's umask set to 027 (others get nothing, the group no write) for the test, then restored."""
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_a_new_file_gets_the_permissions_the_umask_gives(tmp_path, umask_027) -> None:
    """It was always 0644, whatever the umask."""
    out = tmp_path / "answers.json"
    demo.check_json_path(out)
    assert demo.write_answers(out, ROWS) == ""
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and json.loads(out.read_text()) == expected_json()


def test_a_replaced_file_keeps_its_permissions(tmp_path, umask_027) -> None:
    """A private file stays private (it became 0644, readable by everyone)."""
    out = tmp_path / "answers.json"
    out.write_text("old answers")
    out.chmod(0o600)
    assert demo.write_answers(out, ROWS) == " (replaced the existing file)"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and json.loads(out.read_text()) == expected_json()


def test_a_socket_is_refused_before_any_answer(tmp_path) -> None:
    """A socket cannot be opened as a file (ENXIO): refused up front, not after every answer."""
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "answers.sock"))
        with pytest.raises(ValueError, match="is a socket, which cannot be opened for writing"):
            demo.check_json_path(stand_in(tmp_path, tmp_path / "answers.sock"))
