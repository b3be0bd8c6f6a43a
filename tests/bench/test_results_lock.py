"""A results directory has one writer at a time: a second run fails fast naming the holder, and
concurrent openers never leave an unreadable study.json. Real processes, no threads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hf_securesd.bench.results import MANIFEST, ResultsDir, ResultsDirInUseError

MANIFEST_VALUES = {"target": "t", "draft": "d", "device": "cpu", "dtype": "fp32", "num_assistant_tokens": 5,
                   "batch_size": 1, "seed": None, "judge": "refusal_prefix", "judge_options": {},
                   "decoding": "greedy"}

HOLDER = textwrap.dedent("""
    import sys, time
    from hf_securesd.bench.results import ResultsDir
    results = ResultsDir(sys.argv[1])
    results.open({manifest}, {{"id": "holder"}})
    print("locked", flush=True)
    time.sleep(60)
""").format(manifest=repr(MANIFEST_VALUES))

OPENER = textwrap.dedent("""
    import sys
    from hf_securesd.bench.results import ResultsDir, ResultsDirInUseError
    opened = busy = 0
    for index in range(int(sys.argv[2])):
        results = ResultsDir(sys.argv[1])
        try:
            results.open({manifest}, {{"id": sys.argv[3] + str(index), "pad": "x" * 4000}})
            opened += 1
        except ResultsDirInUseError:
            busy += 1
        finally:
            results.close()
    print(opened, busy)
""").format(manifest=repr(MANIFEST_VALUES))


def test_second_run_fails_fast_naming_the_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ResultsDirInUseError, match=rf"in use by another run \(pid {holder.pid}\)"):
            ResultsDir(tmp_path).open(dict(MANIFEST_VALUES), {"id": "second"})
    finally:
        holder.kill()
        holder.wait()
    # the holder died without cleaning up: the kernel released its lock
    results = ResultsDir(tmp_path)
    results.open(dict(MANIFEST_VALUES), {"id": "after"})
    results.close()
    assert [session["id"] for session in results.read_manifest()["sessions"]] == ["holder", "after"]


def test_concurrent_openers_never_corrupt_the_manifest(tmp_path: Path) -> None:
    rounds = 40
    writers = [subprocess.Popen([sys.executable, "-c", OPENER, str(tmp_path), str(rounds), name],
                                stdout=subprocess.PIPE, text=True) for name in ("a", "b")]
    reads = 0
    while any(writer.poll() is None for writer in writers):
        path = tmp_path / MANIFEST
        if path.exists():
            json.loads(path.read_text())  # never torn, never "Extra data"
            reads += 1
        time.sleep(0.005)
    counts = [tuple(map(int, writer.communicate()[0].split())) for writer in writers]
    assert all(writer.returncode == 0 for writer in writers)
    opened = sum(count[0] for count in counts)
    assert sum(sum(count) for count in counts) == 2 * rounds
    sessions = json.loads((tmp_path / MANIFEST).read_text())["sessions"]
    assert len(sessions) == opened  # every successful open was recorded, none lost
    assert not list(tmp_path.glob("*.tmp")) and reads > 0


def test_the_same_process_can_reopen_after_close(tmp_path: Path) -> None:
    first = ResultsDir(tmp_path)
    first.open(dict(MANIFEST_VALUES), {"id": "1"})
    with pytest.raises(ResultsDirInUseError):
        ResultsDir(tmp_path).lock()
    first.close()
    with ResultsDir(tmp_path) as second:
        second.open(dict(MANIFEST_VALUES), {"id": "2"})
