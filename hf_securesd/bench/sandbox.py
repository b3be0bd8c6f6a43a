"""Run untrusted Python (model-written HumanEval completions) in a contained subprocess.

Layers, outermost first:

1. **bubblewrap** (`sandbox_bwrap`): new user, PID, network, IPC, UTS and cgroup namespaces, a
   cleared environment, uid/gid ``nobody`` without capabilities, only ``/usr`` and the interpreter
   mounted (read-only), two size-limited tmpfs as the only writable places. The runner is the PID
   namespace's init: when it ends (normally, by error or killed), the kernel kills everything the
   program left running.
   **Required by default**: without a usable bubblewrap the sandbox refuses to run and says why
   and how to install it. Running untrusted code with resource limits only is an explicit opt-in,
   ``isolation="unsafe-none"`` (CLI ``--unsafe-no-isolation``), and warns loudly.
2. **a control group per run** (`sandbox_limits`, when the hierarchy is writable, as for root):
   memory and tasks (processes + threads) bounded over the whole run; every member is killed
   when the run ends.
3. **resource limits** per process: CPU seconds, address space, size of each written file, no
   core files (and a process count, which the kernel enforces for non-root users).
4. **a watchdog** in the harness: wall-clock timeout; the size of the process tree (for hosts
   without control groups); the process group and all descendants are killed after every run.

The harness's death also ends the run: the child asks the kernel for SIGKILL when its parent
dies (``PR_SET_PDEATHSIG``), and bubblewrap's ``--die-with-parent`` passes it on. Scratch folders
(``securesd-sandbox-<pid>-*``) and control groups left by a harness that was killed are removed
by the next `Sandbox`.

Verdicts (`Sandbox.check`): the solution runs in its own interpreter, and a separate, trusted
checker process runs the tests, calling the solution through a pipe with plain data only. Only
the checker holds the file descriptor on which ``passed`` is reported (see `sandbox_runner`), so a
solution under bubblewrap cannot forge a pass by printing a marker, exiting early with status 0, or
returning an object that equals everything (without isolation it runs as the harness's user and can:
``unsafe-none`` verdicts are only as good as the code scored). `Sandbox.run` executes a whole program in one process and reports
whether it ran to its end; that report can be forged by the program itself, so it is for trusted
code and tests of the sandbox, not for scoring.

Example:

    >>> sandbox = Sandbox(SandboxLimits(timeout_s=5))                                 # doctest: +SKIP
    >>> sandbox.check("def add(a, b):\\n    return a + b\\n",
    ...               "def check(f):\\n    assert f(2, 3) == 5\\n", "add").passed    # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import keyword
import logging
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Sequence

from tqdm.auto import tqdm

from hf_securesd.bench import sandbox_runner
from hf_securesd.bench.sandbox_bwrap import (
    INSIDE_INPUTS,
    INSTALL_HINT,
    bwrap_command,
    bwrap_problem,
    exposure_problem,
    resolve_interpreter,
)
from hf_securesd.bench.sandbox_limits import RUN_PREFIX, RunCgroup, SandboxLimits, rlimits, sweep_stale

logger = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "unsafe-none"]
ISOLATIONS = ("auto", "bwrap", "unsafe-none")
OUTPUT_TAIL_CHARS = 2000
POLL_INTERVAL_S = 0.05
# tasks the sandbox itself adds to a run: bwrap outside the namespace (with bubblewrap), the checker (`check`:
# its main thread and the thread that drains the solution's output)
BWRAP_TASKS = 1
CHECKER_TASKS = 2
# threads the harness starts for a run after its limits are set (standard input, output), which the
# kernel counts against the user's RLIMIT_NPROC like the run's own tasks
HARNESS_THREADS = 2

UNSAFE_WARNING = (
    "isolation='unsafe-none': generated code runs WITHOUT isolation, with resource limits and a "
    "timeout only. It can read and write anything this user can (keys in the environment of other "
    "processes, the home folder, the working tree and the expected answers), open network connections, "
    "leave processes running and forge its own verdict. Only use this for code you trust. To isolate it: " + INSTALL_HINT + "."
)

# keyctl's system call number per machine (`platform.machine()`), for KEYCTL_JOIN_SESSION_KEYRING
KEYCTL_SYSCALLS = {"x86_64": 250, "amd64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219,
                   "ppc64le": 280, "ppc64": 280, "s390x": 280, "i686": 288, "i386": 288, "armv7l": 311}
KEYRING_EXIT = 71  # the launcher could not give the run a session keyring of its own

# Runs in the child before the sandbox: die with the harness, leave the harness's session keyring
# for a new, empty one (bubblewrap does not isolate keyrings: the run could read the harness's keys,
# plant its own, or pass data to a later run through it), join the run's control group, apply the
# per-process limits, then exec the sandbox. Where the kernel or a seccomp filter refuses keyrings
# altogether (ENOSYS, EPERM), there is nothing to share.
_LAUNCHER = (
    "import ctypes, errno, json, os, resource, sys\n"
    "settings = json.loads(sys.argv[1])\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.prctl(1, 9, 0, 0, 0)\n"  # PR_SET_PDEATHSIG, SIGKILL
    "if os.getppid() != settings['parent']:\n"
    "    os._exit(70)\n"
    "number = settings['keyctl']\n"
    "if number is None or (libc.syscall(number, 1, None) < 0\n"  # KEYCTL_JOIN_SESSION_KEYRING, anonymous
    "                      and ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM)):\n"
    "    sys.stderr.write('sandbox: cannot give the run a session keyring of its own (keyctl unknown on '\n"
    "                     'this machine or refused); not running it\\n')\n"
    f"    os._exit({KEYRING_EXIT})\n"
    "for procs in settings['cgroups']:\n"
    "    with open(procs, 'w') as handle:\n"
    "        handle.write(str(os.getpid()))\n"
    "for name, value in settings['rlimits'].items():\n"
    "    which = getattr(resource, name)\n"
    "    hard = resource.getrlimit(which)[1]\n"
    "    if hard != resource.RLIM_INFINITY:\n"
    "        value = min(value, hard)\n"
    "    resource.setrlimit(which, (value, value))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


class SandboxUnavailableError(RuntimeError):
    """The requested isolation cannot be provided here; the message says why and how to fix it."""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one run. `status` is one of "passed", "failed" (the tests failed, the program
    raised or exited early), "timeout" (wall clock), "process_limit" (too many processes or
    threads), "memory_limit" (the run's memory) or "error" (the sandbox could not start it)."""

    passed: bool
    status: str
    returncode: int | None
    duration_s: float
    output: str


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


def _feed(pipe, data: bytes) -> threading.Thread:
    """Write `data` to the runner's standard input and close it, in a thread (a pipe holds 64 KiB).

    A pipe, not a file: the sandbox's filesystem is the solution's to search, and a pipe that the
    checker has read to its end (before it starts the solution) has nothing left to give."""

    def write() -> None:
        try:
            pipe.write(data)
        except OSError:  # the runner died or never read it: the run fails on its own
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass

    thread = threading.Thread(target=write, name="sandbox-input", daemon=True)
    thread.start()
    return thread


def _encodes(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _OutputTail:
    """Drains the run's standard output and error (one pipe) in a thread, keeping the last
    `OUTPUT_TAIL_CHARS` bytes.

    A pipe, not a file in the scratch folder: a file would be the run's own (its user is the harness's
    user, mapped), and the program could change it through its descriptor, e.g. make it a setuid
    executable that another local user opens while the run lasts. A pipe is no file of anyone's."""

    def __init__(self, pipe) -> None:
        self._fd = pipe.fileno()
        self._pipe = pipe
        self._poller = select.poll()  # (select.select refuses descriptors from 1024 on)
        self._poller.register(self._fd, select.POLLIN)
        self._kept = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="sandbox-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        deadline = None
        while True:
            readable = bool(self._poller.poll(POLL_INTERVAL_S * 1000))  # data, end of file or an error
            if self._stop.is_set():
                # Every writer is dead by now, unless one escaped the kill (possible only without
                # isolation): read what is left for at most one more interval, then stop waiting.
                deadline = deadline or time.monotonic() + POLL_INTERVAL_S
                if not readable or time.monotonic() > deadline:
                    return
            if not readable:
                continue
            try:
                chunk = os.read(self._fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            self._kept += chunk
            del self._kept[:-OUTPUT_TAIL_CHARS]

    def finish(self) -> str:
        """The tail, once every writer has exited (or after one more poll interval)."""
        self._stop.set()
        self._thread.join()
        self._pipe.close()
        return self._kept.decode(errors="replace")


@lru_cache(maxsize=1)
def _sweep_once() -> None:
    removed = sweep_stale()
    if removed:
        logger.info("removed %d sandbox leftovers of killed runs: %s", len(removed),
                    ", ".join(map(str, removed)))


class Sandbox:
    """Runs Python under the layers described in the module docstring.

    Args:
        limits: per-run limits.
        isolation: "auto" and "bwrap" require bubblewrap (`SandboxUnavailableError`, naming the
            cause and the fix, when it cannot start the interpreter); "unsafe-none" runs without
            isolation (resource limits, control group and watchdog only) and warns loudly.
        python: interpreter that runs the programs (default: the current one); a bare name is looked up
            on PATH, a launcher script (a pyenv shim) stands for the interpreter it starts, and with
            bubblewrap an interpreter whose folders hold the working directory or the home folder is
            refused (they would be mounted inside; other private folders under them, such as a data
            folder with expected answers, are the caller's to keep out).
    """

    def __init__(self, limits: SandboxLimits | None = None, isolation: Isolation = "auto",
                 python: str = sys.executable) -> None:
        if isolation == "rlimits":
            raise ValueError("isolation='rlimits' is now called 'unsafe-none' (no isolation: generated "
                             "code can read and write what this user can); the default requires bubblewrap")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(map(repr, ISOLATIONS))}, not {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.python = resolve_interpreter(python)
        if isolation == "unsafe-none":
            warnings.warn(UNSAFE_WARNING, RuntimeWarning, stacklevel=2)
            logger.warning(UNSAFE_WARNING)
            self.isolation: Literal["bwrap", "unsafe-none"] = "unsafe-none"
        else:
            problem = exposure_problem(self.python) or bwrap_problem(self.python)
            if problem is not None:
                raise SandboxUnavailableError(
                    f"refusing to run generated code without isolation: {problem}. To accept the risk "
                    "anyway, pass isolation='unsafe-none' (CLI: --unsafe-no-isolation).")
            self.isolation = "bwrap"
        _sweep_once()

    def run(self, program: str) -> ExecutionResult:
        """Execute one program as a module; "passed" when it exits 0 after running to its end.
        The program can forge that (see the module docstring): use `check` to score untrusted code."""
        return self._execute({"program.py": program}, "run", "program.py", [], b"completed", 0)

    def check(self, solution: str, tests: str, entry_point: str, helpers: str = "") -> ExecutionResult:
        """Run `solution` and, in a separate trusted process, `tests` (which define
        `check(candidate)`) against its `entry_point`; "passed" only when `check` returns.
        `helpers` is trusted code the tests may use (e.g. a HumanEval prompt's helper functions)."""
        # The tests and helpers reach the checker on its standard input, never a file: the solution
        # shares the sandbox's filesystem and could otherwise read the expected answers.
        if not isinstance(entry_point, str) or not entry_point.isidentifier() or keyword.iskeyword(entry_point):
            return ExecutionResult(False, "error", None, 0.0,
                                   f"entry_point {entry_point!r} is not a Python function name; the task's "
                                   "entry_point must name the function the tests call")
        trusted = json.dumps({"tests": tests, "helpers": helpers})
        return self._execute({"solution.py": solution}, "check", "solution.py", [entry_point], b"passed",
                             CHECKER_TASKS, trusted)

    def _execute(self, files: dict[str, str], mode: str, program: str, arguments: list[str], token: bytes,
                 own_tasks: int, trusted_input: str = "") -> ExecutionResult:
        """Run the runner in `mode` on input file `program` (one of `files`) with `arguments`; "passed"
        when it exits 0 after writing `token` to its result descriptor. `own_tasks`: trusted processes
        of the runner beside the program's. `trusted_input`: the runner's standard input, through a
        pipe (see `_feed`)."""
        unencodable = [name for name, text in files.items() if not _encodes(text)]
        if unencodable:  # e.g. a lone surrogate in model-written text: no interpreter could read it
            return ExecutionResult(False, "failed", None, 0.0,
                                   f"{unencodable[0]} is not valid Unicode text (it cannot be written as UTF-8)")
        overhead = own_tasks + (BWRAP_TASKS if self.isolation == "bwrap" else 0)
        # mkdtemp: a folder only this user can enter (0700); the run's user inside the sandbox is this
        # user, mapped, so it reads its inputs as their owner
        scratch = Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-"))
        start = time.monotonic()
        read_end, write_end = os.pipe()
        cgroup = None
        process = None
        output_tail = None
        status = ""
        try:
            inputs = scratch / "in"
            workdir = scratch / "work"
            inputs.mkdir()
            workdir.mkdir()
            shutil.copyfile(sandbox_runner.__file__, inputs / "runner.py")
            for name, text in files.items():
                (inputs / name).write_text(text, encoding="utf-8")
            cgroup = RunCgroup.create(self.limits, overhead)
            command = self._command(scratch, mode, program, arguments, write_end, cgroup, overhead)
            env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8",
                   "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
            process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                       pass_fds=(write_end,))
            output_tail = _OutputTail(process.stdout)
            feeder = _feed(process.stdin, trusted_input.encode("utf-8"))
            os.close(write_end)
            write_end = -1
            status = self._watch(process, start, self.limits.max_processes + self._tree_overhead(mode))
            _kill_tree(process)
            feeder.join(timeout=5)
            limit_hit = ""
            if cgroup is not None:
                limit_hit = "memory_limit" if cgroup.oom_killed() else \
                    "process_limit" if cgroup.task_limit_hit() else ""
                cgroup.destroy()
            duration = time.monotonic() - start
            os.set_blocking(read_end, False)
            try:
                reported = os.read(read_end, 64)
            except BlockingIOError:  # a writer escaped the kill (possible only without isolation)
                reported = b""
            output = output_tail.finish()
            output_tail = None
        except OSError as error:
            return ExecutionResult(False, "error", None, time.monotonic() - start, f"sandbox error: {error}")
        finally:
            if process is not None and process.returncode is None:
                _kill_tree(process)
            if output_tail is not None:
                output_tail.finish()
            if cgroup is not None:
                cgroup.destroy()
            for fd in (read_end, write_end):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            shutil.rmtree(scratch, ignore_errors=True)
        returncode = process.returncode
        if returncode == 0 and reported == token and not status:
            status = "passed"
        elif status != "process_limit":
            status = limit_hit or status or "failed"
        return ExecutionResult(status == "passed", status, returncode, duration, output.strip("\n"))

    def _command(self, scratch: Path, mode: str, program: str, arguments: list[str], result_fd: int,
                 cgroup: RunCgroup | None, overhead: int) -> list[str]:
        """The launcher, then bwrap (or nothing, unsafe), then the runner with its arguments."""
        inside = INSIDE_INPUTS if self.isolation == "bwrap" else str(scratch / "in")
        runner = [self.python, "-I", "-S", f"{inside}/runner.py", mode, f"{inside}/{program}", *arguments,
                  str(result_fd)]
        nproc = self.limits.max_processes + overhead
        if os.getuid() != 0:  # the kernel counts every task of the user against RLIMIT_NPROC
            nproc += _user_task_count(os.getuid()) + HARNESS_THREADS
        settings = {"parent": os.getpid(), "cgroups": cgroup.procs_files if cgroup else [],
                    "rlimits": rlimits(self.limits, nproc), "keyctl": KEYCTL_SYSCALLS.get(platform.machine())}
        prefix = bwrap_command(self.python, scratch / "in", self.limits.disk_bytes) \
            if self.isolation == "bwrap" else []
        return [self.python, "-I", "-S", "-c", _LAUNCHER, json.dumps(settings), *prefix, *runner]

    def _tree_overhead(self, mode: str) -> int:
        """Processes of the watched tree (the `descendants` of the process the harness starts) that are not
        the program's, less the program's main process where it is that process itself: with bubblewrap
        the tree holds the runner (in "check" mode the checker, else the program's main process); without
        isolation the harness starts the runner itself, so the tree holds a checked solution's processes
        or a program's children. (Threads do not count here; control groups count them.)"""
        return int(mode == "check") - int(self.isolation != "bwrap")

    def _watch(self, process: subprocess.Popen, start: float, allowed: int) -> str:
        """Wait for `process`; kill its tree on timeout or when it holds more than `allowed` processes.
        Returns "" when it exited by itself, else the reason it was killed."""
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
        """`run` each program concurrently (`workers` defaults to the CPU count, at most 8), in order."""
        return self._map(self.run, [(program,) for program in programs], workers, progress, description)

    def check_many(self, cases: Sequence[tuple[str, str, str, str]], workers: int | None = None,
                   progress: bool = True, description: str = "sandbox") -> list[ExecutionResult]:
        """`check` each (solution, tests, entry_point, helpers) concurrently, in order."""
        return self._map(self.check, list(cases), workers, progress, description)

    @staticmethod
    def _map(function, argument_lists, workers, progress, description) -> list[ExecutionResult]:
        workers = workers or min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(tqdm(pool.map(lambda arguments: function(*arguments), argument_lists),
                             total=len(argument_lists), desc=description, disable=not progress))
