"""Per-run limits of the sandbox: a control group for the whole run (memory and task count over
every process and thread it starts), per-process resource limits, and the sweep of what a killed
harness left behind.

Control groups: cgroup v2 (``memory.max``, ``memory.swap.max``, ``pids.max``) when the unified
hierarchy has the controllers, else cgroup v1 (``memory.limit_in_bytes``, ``pids.max``). Each run
gets a group named ``securesd-sandbox-<harness pid>-<random>`` below the harness's own group, so a
container limit above still applies. Where the CPU controller is there too (v2 ``cpu.max``, v1
``cpu.cfs_quota_us``), the run's group is also a CPU group capped at `RUN_CPUS` CPUs: the kernel
then shares the CPU between runs by group, not by session, so a program that spreads over many
sessions (``setsid`` in each child) cannot starve a run scored beside it into a timeout. Without
that controller a run's CPU is limited per process only (`rlimits`). Creating a group needs write
access to the hierarchy (root, or a delegated subtree); without it `RunCgroup.create` returns None and
the caller falls back to per-process limits plus its watchdog.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hf_securesd.processes import pid_alive

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
RUN_PREFIX = "securesd-sandbox-"
RUN_CPUS = 1  # CPUs a run's processes may use together, where the CPU controller is available
CPU_PERIOD_US = 100_000
_RUN_NAME = re.compile(rf"^{RUN_PREFIX}(\d+)-\w+$")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run.

    Whole run (every process and thread it starts, via a control group when one can be created):
    `run_memory_bytes` of memory (tmpfs files included), `max_processes` tasks (processes plus
    threads, the program's main thread included; the sandbox's own processes come on top). Per process: `cpu_s` CPU seconds,
    `memory_bytes` of address space, `max_file_bytes` per written file, `max_open_files` open files
    (which also bounds what memfd files hold: each at most `max_file_bytes`). Disk: the only writable
    directory is a tmpfs of `disk_bytes` (bubblewrap). Wall clock: `timeout_s`."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 2 * 1024**3
    run_memory_bytes: int = 3 * 1024**3
    max_processes: int = 32
    max_file_bytes: int = 16 * 1024**2
    disk_bytes: int = 64 * 1024**2
    max_open_files: int = 64

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_bytes", "run_memory_bytes", "max_processes",
                     "max_file_bytes", "disk_bytes", "max_open_files"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


def rlimits(limits: SandboxLimits, nproc: int) -> dict[str, int]:
    """`resource` limit name -> value, applied in the child before the sandbox starts."""
    return {
        "RLIMIT_CPU": int(limits.cpu_s),
        "RLIMIT_AS": int(limits.memory_bytes),
        "RLIMIT_NPROC": int(nproc),
        "RLIMIT_FSIZE": int(limits.max_file_bytes),
        "RLIMIT_NOFILE": int(limits.max_open_files),
        "RLIMIT_CORE": 0,
    }


def _own_cgroup(controller: str | None) -> str:
    """This process's group path in the v1 `controller` hierarchy (None: the v2 one)."""
    with open("/proc/self/cgroup", encoding="utf-8") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (controller is None and controllers == "") or controller in controllers.split(","):
                return path.lstrip("/")
    raise LookupError(f"no {controller or 'unified'} cgroup for this process")


def _v2_parent() -> Path | None:
    mount = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").is_file() else None
    if mount is None:
        return None
    parent = mount / _own_cgroup(None)
    controllers = (parent / "cgroup.subtree_control").read_text().split()
    return parent if {"memory", "pids"} <= set(controllers) else None


@dataclass
class RunCgroup:
    """The control group(s) of one run: `procs_files` are what a process writes its pid to, to join."""

    paths: list[Path] = field(default_factory=list)

    @property
    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.paths]

    @classmethod
    def create(cls, limits: SandboxLimits, headroom: int) -> RunCgroup | None:
        """A fresh group limited to `limits.run_memory_bytes` and `limits.max_processes + headroom`
        tasks, or None when control groups cannot be created here."""
        name = f"{RUN_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        tasks = str(limits.max_processes + headroom)
        memory = str(limits.run_memory_bytes)
        group = cls()
        try:
            parent = _v2_parent()
            if parent is not None:
                path = parent / name
                path.mkdir()
                group.paths.append(path)
                (path / "memory.max").write_text(memory)
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
                (path / "pids.max").write_text(tasks)
                if "cpu" in (parent / "cgroup.subtree_control").read_text().split():
                    _write_quietly(path / "cpu.max", f"{RUN_CPUS * CPU_PERIOD_US} {CPU_PERIOD_US}")
                return group
            for controller, settings in (("memory", {"memory.limit_in_bytes": memory}),
                                         ("pids", {"pids.max": tasks})):
                path = CGROUP_ROOT / controller / _own_cgroup(controller) / name
                path.mkdir()
                group.paths.append(path)
                for key, value in settings.items():
                    (path / key).write_text(value)
        except (OSError, LookupError) as error:
            _warn_once_without_control_group(error)
            group.destroy()
            return None
        group._add_v1_cpu_group(name)
        return group

    def _add_v1_cpu_group(self, name: str) -> None:
        """Join a v1 CPU group capped at `RUN_CPUS` CPUs to the run's groups, where that hierarchy is
        mounted and writable (else the run has no CPU group: see the module docstring)."""
        try:
            path = CGROUP_ROOT / "cpu" / _own_cgroup("cpu") / name
            path.mkdir()
        except (OSError, LookupError) as error:
            logger.debug("no CPU control group for the sandbox run: %s", error)
            return
        self.paths.append(path)  # without its quota, the group still gives the run its own share of the CPU
        if _write_quietly(path / "cpu.cfs_period_us", str(CPU_PERIOD_US)):
            _write_quietly(path / "cpu.cfs_quota_us", str(RUN_CPUS * CPU_PERIOD_US))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths:
            try:
                found |= {int(pid) for pid in (path / "cgroup.procs").read_text().split()}
            except OSError:
                continue
        return found

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run for exceeding its memory."""
        for path in self.paths:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                try:
                    text = (path / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == key and int(parts[1]) > 0:
                        return True
        return False

    def task_limit_hit(self) -> bool:
        """Whether a fork or thread creation of the run was refused by the task limit."""
        for path in self.paths:
            try:
                text = (path / "pids.events").read_text()
            except OSError:
                continue
            if any(line.split()[:1] == ["max"] and int(line.split()[1]) > 0 for line in text.splitlines()):
                return True
        return False

    def destroy(self) -> None:
        """Kill every process still in the group, then remove it."""
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)
        for path in self.paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _write_quietly(path: Path, value: str) -> bool:
    """Write a control group setting that the run can do without; False (logged) when it cannot."""
    try:
        path.write_text(value)
    except OSError as error:
        logger.debug("sandbox run: %s not set: %s", path.name, error)
        return False
    return True


def _stale(name: str) -> bool:
    match = _RUN_NAME.match(name)
    return bool(match) and int(match.group(1)) != os.getpid() and not pid_alive(int(match.group(1)))


def sweep_stale(temp_dir: str | os.PathLike | None = None) -> list[Path]:
    """Remove scratch folders and control groups left by sandbox harnesses that died (their pid,
    part of the name, is no longer alive); returns what was removed."""
    removed: list[Path] = []
    root = Path(temp_dir or tempfile.gettempdir())
    for entry in root.glob(f"{RUN_PREFIX}*"):
        if entry.is_dir() and _stale(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    parents: list[Path] = []
    try:
        v2 = _v2_parent()
        parents = [v2] if v2 is not None else [CGROUP_ROOT / c / _own_cgroup(c) for c in ("memory", "pids")]
        if v2 is None:
            parents.append(CGROUP_ROOT / "cpu" / _own_cgroup("cpu"))
    except (OSError, LookupError):
        pass
    for parent in parents:
        if not parent.is_dir():
            continue
        for entry in parent.glob(f"{RUN_PREFIX}*"):
            if entry.is_dir() and _stale(entry.name):
                RunCgroup([entry]).destroy()
                removed.append(entry)
    return removed


_warned_without_control_group: list[bool] = []


def _warn_once_without_control_group(error: BaseException) -> None:
    """Say once per process that runs get no control group (memory over the whole run and the run's task
    count unbounded, see the module docstring); later runs log it at debug level."""
    if _warned_without_control_group:
        logger.debug("no control group for the sandbox run: %s", error)
        return
    _warned_without_control_group.append(True)
    logger.warning(
        "sandbox runs get no control group here (%s): run_memory_bytes and the run's task count are not "
        "enforced, only per-process limits; run the harness as root or in a delegated cgroup subtree for "
        "a hard bound", error,
    )
