"""The bubblewrap (`bwrap`) layer of the sandbox: the command line, the mounts the interpreter
needs, and a diagnosis that names the real cause when bubblewrap cannot start it.

Inside, the program sees: read-only ``/usr`` (with the usual ``/bin``, ``/lib``... links), the
interpreter's own prefixes read-only (``sys.prefix``, ``sys.base_prefix`` and the real folder of
its executable, so an interpreter or virtual environment under ``/tmp`` or ``/root`` works), its
own ``/proc`` and minimal ``/dev``, a size-limited tmpfs at ``/tmp`` (the working directory is
``/tmp/work``) and a tiny one at ``/dev/shm``, and the run's inputs read-only at ``/sandbox``. Those
two tmpfs are the only writable places: the root and ``/dev`` (tmpfs that bubblewrap builds) are
remounted read-only once everything is mounted, so nothing the program writes escapes the size
limits (writing to ``/dev/null`` and the other device nodes still works). Not mounted: ``/etc``,
``/home``, ``/root`` (beyond the interpreter), the working tree, the host's ``/proc``,
``/dev/shm`` and ``/tmp``. Every namespace is new (user, PID, network, IPC, UTS, cgroup), the
environment is cleared, the program runs as ``nobody`` (65534) with no capabilities and cannot
create further user namespaces.

The runner is the PID namespace's init (``--as-pid-1``): no bubblewrap process runs inside, so
the program has no process of the sandbox's to take over (bubblewrap's own PID 1 is the program's
user's, dumpable, and can be traced and made to outlive the run). When the runner exits, the
kernel kills every process left in the namespace, on a normal exit as well as on a timeout; the
runner that checks a solution is not dumpable (`sandbox_runner`), so the solution cannot trace it,
and keeps no signal handler the solution could trigger (the kernel drops an init's signals without one
when they come from inside its namespace). ``/proc/sys`` is bound read-only over the new ``/proc``:
bubblewrap covers it only where it finds it writable, and a root harness's runs are uid 0 to the
kernel's sysctl files; for the same reason the top-level ``/proc`` files other users may not read
(``slabinfo``, ``kpageflags``, ``timer_list``...) are covered with ``/dev/null``. The interpreter is
resolved to its absolute path first, and a sandbox whose interpreter mounts would hold the working
directory or the home folder is refused (`exposure_problem`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

INSIDE_INPUTS = "/sandbox"
INSIDE_WORKDIR = "/tmp/work"
NOBODY = "65534"
SHM_BYTES = 1024 * 1024
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`; Fedora: "
                "`dnf install bubblewrap`) and allow unprivileged user namespaces "
                "(`sysctl kernel.unprivileged_userns_clone=1` where that setting exists)")
_SYSTEM_LINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"),
                 ("usr/lib32", "/lib32"), ("usr/lib64", "/lib64"), ("usr/libx32", "/libx32"))
_PROBE = ("import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
          "sys.base_exec_prefix, os.path.realpath(sys.executable)]))")


@lru_cache(maxsize=None)
def interpreter_paths(python: str) -> tuple[str, ...]:
    """Folders `python` needs, resolved: its prefixes and the real folder of its executable
    (minus what is under /usr, which is mounted anyway)."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                 os.path.realpath(sys.executable)]
    else:
        probe = subprocess.run([python, "-I", "-S", "-c", _PROBE], capture_output=True, text=True,
                               timeout=60, check=True)
        found = json.loads(probe.stdout)
    found[-1] = os.path.dirname(found[-1])
    found.append(os.path.dirname(python))  # its folder as named (absolute: `resolve_interpreter`)
    paths = sorted({os.path.realpath(path) for path in found} | {os.path.abspath(path) for path in found})
    kept = [path for path in paths if path != "/" and not (path + "/").startswith("/usr/")]
    # a folder inside another one is mounted with it
    return tuple(path for path in kept if not any(path.startswith(other + "/") for other in kept))


def resolve_interpreter(python: str) -> str:
    """The absolute path of the interpreter `python` starts (a bare name is looked up on PATH, as the
    harness's shell would find it; a launcher script such as a pyenv shim stands for the interpreter it
    runs, whose `sys.executable` is asked): the sandbox runs exactly the interpreter it checked, and mounts
    only its folders. Raises ValueError when there is no such executable or it is not a Python."""
    found = shutil.which(python) if os.sep not in python else python
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise ValueError(f"python={python!r}: no such executable{'' if os.sep in python else ' on PATH'}; "
                         "give the path of the interpreter that runs the programs")
    return _started_interpreter(os.path.abspath(found))


@lru_cache(maxsize=None)
def _started_interpreter(path: str) -> str:
    """`sys.executable` of the interpreter the executable at `path` starts (itself, for an interpreter or a
    virtual environment's link to one)."""
    if os.path.realpath(path) == os.path.realpath(sys.executable):
        return path
    try:
        probe = subprocess.run([path, "-I", "-S", "-c", "import sys; print(sys.executable)"],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ValueError(f"python={path!r} could not be run: {error}") from None
    started = probe.stdout.strip()
    if probe.returncode != 0 or not os.path.isabs(started):
        raise ValueError(f"python={path!r} did not run as a Python interpreter (exit status "
                         f"{probe.returncode}); give the path of the interpreter that runs the programs")
    return started


def exposure_problem(python: str) -> str | None:
    """None unless a folder mounted for `python` is or holds the working directory or the home folder
    (an interpreter installed with the home folder as its prefix, a harness started inside the
    interpreter's folders): mounting it would show the program the working tree or the home folder
    (keys, expected answers), so such a sandbox is refused with the reason."""
    private = {"the working directory": os.path.realpath(os.getcwd()),
               "the home folder": os.path.realpath(os.path.expanduser("~"))}
    for path in interpreter_paths(python):
        for name, folder in private.items():
            if folder == path or folder.startswith(path.rstrip("/") + "/"):
                return (f"the interpreter {python} needs {path} mounted inside the sandbox, which holds "
                        f"{name} ({folder}): the program could read it. Run the harness from another folder, "
                        "or use an interpreter (or virtual environment) installed outside it")
    return None


@lru_cache(maxsize=None)
def masked_proc_entries(proc: str = "/proc") -> tuple[str, ...]:
    """The top-level files of `proc` that other users may not read (slabinfo, kpageflags, timer_list...):
    to the kernel, a root harness's run is uid 0 without capabilities, which the files' modes alone let
    read them, so they are covered with /dev/null in the sandbox's /proc. Process folders are the run's
    own (a new PID namespace). Read once per folder (top-level /proc files do not come and go)."""
    masked = []
    for name in sorted(os.listdir(proc)):
        if name.isdigit():
            continue
        path = os.path.join(proc, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError:  # gone meanwhile
            continue
        if stat.S_ISREG(mode) and not mode & stat.S_IROTH:
            masked.append(path)
    return tuple(masked)


def bwrap_binary() -> str | None:
    return shutil.which("bwrap")


def bwrap_command(python: str, inputs: Path, disk_bytes: int) -> list[str]:
    """bwrap and its arguments, up to (not including) the command to run inside."""
    command = [bwrap_binary() or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
               "--as-pid-1", "--die-with-parent", "--new-session", "--clearenv",
               "--uid", NOBODY, "--gid", NOBODY, "--cap-drop", "ALL",
               "--ro-bind", "/usr", "/usr"]
    for target, link in _SYSTEM_LINKS:
        if os.path.islink(link):
            command += ["--symlink", target, link]
        elif os.path.isdir(link) and not os.path.realpath(link).startswith("/usr/"):
            command += ["--ro-bind", link, link]
    # bubblewrap covers /proc/sys only where it finds it writable, and a run of a root harness is the
    # host's uid 0 to the kernel's sysctl files (0644 root): read-only, as the rest of /proc's knobs
    command += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    for path in masked_proc_entries():
        command += ["--ro-bind", "/dev/null", path]
    command += ["--dev", "/dev",
                "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
                "--size", str(disk_bytes), "--tmpfs", "/tmp"]
    for path in interpreter_paths(python):
        command += ["--ro-bind", path, path]
    command += ["--ro-bind", str(inputs), INSIDE_INPUTS, "--dir", INSIDE_WORKDIR, "--chdir", INSIDE_WORKDIR,
                "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", INSIDE_WORKDIR,
                "--setenv", "LANG", "C.UTF-8", "--setenv", "OMP_NUM_THREADS", "1",
                "--setenv", "PYTHONHASHSEED", "0",
                # last: every mount point exists; the two size-limited tmpfs stay writable
                "--remount-ro", "/dev", "--remount-ro", "/"]
    return command


def _stderr(result: subprocess.CompletedProcess) -> str:
    return result.stderr.decode(errors="replace").strip() or f"exit status {result.returncode}, no message"


@lru_cache(maxsize=None)
def bwrap_problem(python: str = sys.executable) -> str | None:
    """None when bubblewrap can start `python` in the sandbox; else the real cause, in words: bwrap
    missing, bwrap unable to create its namespaces (its own message), or bwrap working but the
    interpreter failing inside (its message)."""
    binary = bwrap_binary()
    if binary is None:
        return f"bubblewrap (`bwrap`) is not installed: {INSTALL_HINT}"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="securesd-bwrap-probe-") as inputs:
        try:
            full = subprocess.run([*bwrap_command(python, Path(inputs), SHM_BYTES), python, "-I", "-S", "-c",
                                   "import json, math"], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap could not be run: {error}"
    if full.returncode == 0:
        return None
    try:
        trivial = subprocess.run([binary, "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"],
                                 capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap could not be run: {error}"
    if trivial.returncode != 0:
        return (f"bwrap cannot create its namespaces here: {_stderr(trivial)}; {INSTALL_HINT} "
                "(in a container, the container must allow nested user namespaces)")
    return (f"bwrap works, but the interpreter {python} failed inside the sandbox: {_stderr(full)} "
            f"(mounted for it: {', '.join(interpreter_paths(python)) or 'only /usr'})")
