"""Run untrusted Python (model-written HumanEval completions) in a contained subprocess.

Layers, outermost first:

1. **bubblewrap** (`bwrap`), when installed and usable: the whole filesystem is mounted read-only,
   `/tmp` is a fresh tmpfs, the only writable directory is a per-run working directory, and every
   namespace is unshared (no network, own PID space, so killing the sandbox kills everything it
   started). Without `bwrap` the sandbox falls back to the layers below and warns loudly: the code
   can then read and write whatever the current user can, and reach the network.
2. **resource limits** set before the interpreter starts: CPU seconds, address space, number of
   processes, size of any written file, no core files.
3. **a watchdog** in the parent: a wall-clock timeout, and a cap on the size of the process tree
   (the kernel ignores `RLIMIT_NPROC` for root, so a fork bomb is also counted and killed here).

Every run gets its own temporary working directory, removed afterwards. A run passes only when
the process exits with status 0 *and* prints a per-run random marker after the test code, so a
completion that calls `sys.exit(0)` or `os._exit(0)` early does not pass. Programs run under the
module name `__sandbox__`, so a completion's `if __name__ == "__main__":` block (often a demo that
reads input) is skipped.

Example:

    >>> sandbox = Sandbox(SandboxLimits(timeout_s=5))
    >>> sandbox.run("assert 1 + 1 == 2").passed
    True
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Sequence

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "rlimits"]

BWRAP_ARGS = ("--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
              "--unshare-all", "--die-with-parent")
SANDBOX_WORKDIR = "/tmp/work"
OUTPUT_TAIL_CHARS = 2000
POLL_INTERVAL_S = 0.05

FALLBACK_WARNING = (
    "bubblewrap (`bwrap`) is not available or not usable here: generated code will run with "
    "resource limits and a timeout ONLY, without filesystem or network isolation. It can read and "
    "write anything the current user can and open network connections. Install it "
    "(Debian/Ubuntu: `apt-get install -y bubblewrap`) before executing untrusted model output."
)

# Runs in the child before the real command: apply the limits, then exec the command.
_LAUNCHER = (
    "import json, os, resource, sys\n"
    "for name, value in json.loads(sys.argv[1]).items():\n"
    "    which = getattr(resource, name)\n"
    "    hard = resource.getrlimit(which)[1]\n"
    "    if hard != resource.RLIM_INFINITY:\n"
    "        value = min(value, hard)\n"
    "    resource.setrlimit(which, (value, value))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)

_RUN_AS_SANDBOX = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__sandbox__')"


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. `max_processes` counts processes started by the run (the interpreter and
    everything it forks), enforced both as `RLIMIT_NPROC` headroom and by the parent's watchdog."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 2 * 1024**3
    max_processes: int = 32
    max_file_bytes: int = 16 * 1024**2


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one run. `status` is one of "passed", "failed" (non-zero exit or missing end
    marker), "timeout" (wall clock), "process_limit" (too many processes) or "error" (the sandbox
    itself could not start the program)."""

    passed: bool
    status: str
    returncode: int | None
    duration_s: float
    output: str


def _base_command(python: str) -> list[str]:
    return [python, "-I", "-B"]


@lru_cache(maxsize=None)
def bwrap_usable(python: str = sys.executable) -> bool:
    """Whether `bwrap` exists and can start `python` with the sandbox's arguments (it may exist
    but fail, e.g. where unprivileged user namespaces are disabled)."""
    binary = shutil.which("bwrap")
    if binary is None:
        return False
    try:
        probe = subprocess.run([binary, *BWRAP_ARGS, *_base_command(python), "-c", "pass"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if probe.returncode != 0:
        logger.warning("bwrap is installed but failed to start a sandbox: %s",
                       probe.stderr.decode(errors="replace").strip())
    return probe.returncode == 0


def _process_table() -> dict[int, int]:
    """pid -> parent pid for every visible process."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        table[int(entry)] = int(fields[1])
    return table


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    """Pids of every live descendant of `root` (from `table`, pid -> parent, default: read now)."""
    table = _process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, parent in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _user_task_count(uid: int) -> int:
    """Tasks (processes and threads) the kernel charges to `uid` for `RLIMIT_NPROC`."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as handle:
                status = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        if int(status.get("Uid", "-1").split()[0]) == uid:
            total += int(status.get("Threads", "1"))
    return total


def _kill_tree(process: subprocess.Popen) -> None:
    """Kill the run's process group and every descendant still attached to the tree."""
    for _ in range(3):
        pids = descendants(process.pid)
        for pid in [process.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
        if not pids:
            break
    process.wait()


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - OUTPUT_TAIL_CHARS))
        return handle.read().decode(errors="replace")


class Sandbox:
    """Runs Python programs under the layers described in the module docstring.

    Args:
        limits: per-run limits.
        isolation: "auto" uses bubblewrap when usable and otherwise falls back to limits only
            (with a loud warning); "bwrap" requires it (error otherwise); "rlimits" never uses it.
        python: interpreter that runs the programs (default: the current one).
    """

    def __init__(self, limits: SandboxLimits | None = None, isolation: Isolation = "auto",
                 python: str = sys.executable) -> None:
        self.limits = limits or SandboxLimits()
        self.python = python
        if isolation not in ("auto", "bwrap", "rlimits"):
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'rlimits', not {isolation!r}")
        use_bwrap = isolation != "rlimits" and bwrap_usable(python)
        if isolation == "bwrap" and not use_bwrap:
            raise RuntimeError("isolation='bwrap' was requested but bubblewrap is not usable. "
                               "Install it (Debian/Ubuntu: `apt-get install -y bubblewrap`) and make "
                               "sure unprivileged user namespaces are allowed, or pass isolation='auto'.")
        if isolation == "auto" and not use_bwrap:
            warnings.warn(FALLBACK_WARNING, RuntimeWarning, stacklevel=2)
            logger.warning(FALLBACK_WARNING)
        self.isolation: Literal["bwrap", "rlimits"] = "bwrap" if use_bwrap else "rlimits"

    def _rlimits(self) -> dict[str, int]:
        process_headroom = self.limits.max_processes + 4  # the launcher and bwrap's own processes
        if os.getuid() != 0:  # the kernel counts every task of the user against RLIMIT_NPROC
            process_headroom += _user_task_count(os.getuid())
        return {
            "RLIMIT_CPU": int(self.limits.cpu_s),
            "RLIMIT_AS": int(self.limits.memory_bytes),
            "RLIMIT_NPROC": process_headroom,
            "RLIMIT_FSIZE": int(self.limits.max_file_bytes),
            "RLIMIT_CORE": 0,
        }

    def _command(self, workdir: Path) -> list[str]:
        program = [*_base_command(self.python), "-c", _RUN_AS_SANDBOX]
        if self.isolation == "bwrap":
            return [shutil.which("bwrap") or "bwrap", *BWRAP_ARGS, "--bind", str(workdir), SANDBOX_WORKDIR,
                    "--chdir", SANDBOX_WORKDIR, *program, f"{SANDBOX_WORKDIR}/program.py"]
        return [*program, str(workdir / "program.py")]

    def run(self, program: str) -> ExecutionResult:
        """Execute one Python program; never raises for anything the program does."""
        marker = f"sandbox-done-{secrets.token_hex(8)}"
        source = (f"{program}\n\nimport os as _sandbox_os, sys as _sandbox_sys\n_sandbox_sys.stdout.flush()\n"
                  f"_sandbox_os.write(1, b'\\n{marker}\\n')\n")
        scratch = Path(tempfile.mkdtemp(prefix="securesd-sandbox-"))
        workdir = scratch / "work"
        workdir.mkdir()
        (workdir / "program.py").write_text(source, encoding="utf-8")
        log_path = scratch / "output.log"
        inside_home = SANDBOX_WORKDIR if self.isolation == "bwrap" else str(workdir)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": inside_home, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        command = [self.python, "-I", "-S", "-c", _LAUNCHER, json.dumps(self._rlimits()),
                   *self._command(workdir)]
        start = time.monotonic()
        status = ""
        try:
            with open(log_path, "wb") as log:
                process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            status = self._watch(process, start)
            duration = time.monotonic() - start
            output = _tail(log_path)
        except OSError as error:
            return ExecutionResult(False, "error", None, time.monotonic() - start, f"sandbox error: {error}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        returncode = process.returncode
        if not status:
            status = "passed" if returncode == 0 and marker in output else "failed"
        return ExecutionResult(status == "passed", status, returncode, duration,
                               output.replace(f"\n{marker}\n", "").strip("\n"))

    def _watch(self, process: subprocess.Popen, start: float) -> str:
        """Wait for `process`; kill its tree on timeout or too many processes. Returns "" when it
        exited by itself, else the reason it was killed."""
        allowed = self.limits.max_processes + 3  # bwrap's monitor and init, the interpreter itself
        while True:
            try:
                process.wait(timeout=POLL_INTERVAL_S)
                return ""
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - start > self.limits.timeout_s:
                _kill_tree(process)
                return "timeout"
            if len(descendants(process.pid)) > allowed:
                _kill_tree(process)
                return "process_limit"

    def run_many(self, programs: Sequence[str], workers: int | None = None,
                 progress: bool = True, description: str = "sandbox") -> list[ExecutionResult]:
        """Execute programs concurrently (`workers` defaults to the CPU count, at most 8), in order."""
        workers = workers or min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(tqdm(pool.map(self.run, programs), total=len(programs), desc=description,
                             disable=not progress))
