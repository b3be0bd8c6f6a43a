"""Programs written to escape or fool the sandbox, run under the DEFAULT configuration: each must
be contained (or, without isolation, refused). docs/security.md tabulates these tests."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support import needs_bwrap

from hf_securesd.bench.sandbox import Sandbox, SandboxLimits
from hf_securesd.bench.sandbox_limits import RUN_CPUS, RUN_PREFIX, RunCgroup, sweep_stale

pytestmark = needs_bwrap
LIMITS = SandboxLimits(timeout_s=20, cpu_s=8, memory_bytes=512 * 1024**2, run_memory_bytes=768 * 1024**2,
                       max_processes=16, disk_bytes=8 * 1024**2)
TESTS = "def check(f):\n    assert f(2, 3) == 5\n"
WRONG = "def add(a, b):\n    return a - b\n"


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS)


def _program(source: str) -> str:
    return textwrap.dedent(source).strip() + "\n"


def _live_cmdlines_with(marker: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(cmdline)
    return found


# --- point 1: escape attempts -------------------------------------------------------------------

def test_environment_of_other_processes_is_invisible(sandbox: Sandbox) -> None:
    secret = f"sk-planted-{secrets.token_hex(8)}"
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, "OPENAI_API_KEY": secret, "HF_TOKEN": secret})
    try:
        result = sandbox.run(_program(f"""
            import os
            found = []
            for pid in os.listdir('/proc'):
                try:
                    if b{secret!r} in open(f'/proc/{{pid}}/environ', 'rb').read():
                        found.append(pid)
                except OSError:
                    pass
            print('found', found, sorted(os.environ))
        """))
    finally:
        victim.kill()
        victim.wait()
    assert result.passed, result.output
    assert "found []" in result.output and secret not in result.output
    assert "OPENAI_API_KEY" not in result.output and "HF_TOKEN" not in result.output


def test_home_working_tree_and_host_tmp_are_not_mounted(sandbox: Sandbox, tmp_path: Path) -> None:
    planted = tmp_path / "secret.txt"
    planted.write_text("planted secret")
    targets = [str(planted), str(Path(__file__).resolve()), str(Path.home() / ".bashrc"), "/etc/passwd",
               "/etc/shadow"]
    result = sandbox.run(_program(f"""
        import os
        readable = []
        for path in {targets!r}:
            try:
                open(path).read()
                readable.append(path)
            except OSError:
                pass
        print('readable', readable)
        print('root', sorted(os.listdir('/root')) if os.path.isdir('/root') else None)
    """))
    assert result.passed, result.output
    assert "readable []" in result.output
    assert "planted secret" not in result.output


def test_no_network_not_even_loopback(sandbox: Sandbox) -> None:
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = sandbox.run(_program(f"""
            import socket
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')
                print('connected')
            except OSError as error:
                print('blocked', error)
        """))
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
    assert "blocked" in result.output, result.output


def test_writes_outside_the_sandbox_tmpfs_do_not_reach_the_host(sandbox: Sandbox) -> None:
    name = f"securesd-attack-{secrets.token_hex(6)}"
    result = sandbox.run(_program(f"""
        written = []
        for folder in ('/dev/shm', '/tmp', '/var/tmp', '/usr', '/root', '.'):
            try:
                with open(folder + '/{name}', 'w') as handle:
                    handle.write('x')
                written.append(folder)
            except OSError:
                pass
        print('written', written)
    """))
    assert result.passed, result.output
    for folder in ("/dev/shm", "/tmp", "/var/tmp", "/usr", str(Path.home()), os.getcwd()):
        assert not Path(folder, name).exists(), f"the sandbox wrote {folder}/{name} on the host"


def test_host_processes_are_invisible_and_unkillable(sandbox: Sandbox) -> None:
    result = sandbox.run(_program("""
        import os, signal
        pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]
        print('visible', len(pids), 'uid', os.getuid())
        for pid in pids:
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    """))
    visible = int(result.output.split("visible")[1].split()[0])
    assert visible <= 4, result.output  # the program (PID 1) and a few of its own
    assert "uid 65534" in result.output
    assert os.getppid() > 1  # the harness (this process) is alive and still has its parent


def test_background_processes_do_not_survive_a_normal_exit(sandbox: Sandbox) -> None:
    marker = f"securesd-orphan-{secrets.token_hex(6)}"
    result = sandbox.run(_program(f"""
        import subprocess, sys
        for _ in range(3):
            subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print('started 3')
    """))
    assert result.passed and "started 3" in result.output, result.output
    deadline = time.monotonic() + 5
    while _live_cmdlines_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_cmdlines_with(marker) == []


def test_unsafe_mode_still_kills_background_processes_on_exit() -> None:
    marker = f"securesd-orphan-{secrets.token_hex(6)}"
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        unsafe = Sandbox(LIMITS, isolation="unsafe-none")
    result = unsafe.run(_program(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print('started')
    """))
    assert "started" in result.output
    assert _live_cmdlines_with(marker) == []


def test_the_only_writable_places_are_the_size_limited_tmpfs(sandbox: Sandbox) -> None:
    # bubblewrap builds / and /dev as tmpfs without a size: writable, they would hold any amount (memory
    # that no per-process limit counts), so they are read-only; /tmp and /dev/shm are sized.
    result = sandbox.run(_program("""
        import errno, os
        for folder in ('/', '/root', '/dev', '/sandbox', '/usr', '/tmp', '/dev/shm'):
            try:
                with open(os.path.join(folder, 'planted'), 'wb') as handle:
                    handle.write(b'x')
                print('writable', folder)
            except OSError as error:
                print('refused', folder, errno.errorcode[error.errno])
        with open('/dev/null', 'wb') as handle:
            handle.write(b'device nodes still work')
        print('wrote /dev/null')
    """))
    assert result.passed, result.output
    writable = [line.split()[1] for line in result.output.splitlines() if line.startswith("writable")]
    assert sorted(writable) == ["/dev/shm", "/tmp"], result.output
    assert "wrote /dev/null" in result.output


def test_the_output_descriptor_is_a_pipe_not_a_host_file(sandbox: Sandbox) -> None:
    # A file would be owned by the run's user (the harness's, mapped): the program could make it a
    # setuid executable through its descriptor, for another local user to open while the run lasts.
    result = sandbox.run(_program("""
        import os, stat
        mode = os.fstat(1).st_mode
        try:
            os.fchmod(1, 0o4755)
        except OSError:
            pass
        print('fifo', stat.S_ISFIFO(mode), 'regular', stat.S_ISREG(mode))
    """))
    assert result.passed and "fifo True regular False" in result.output, result.output


_TRACE_EVERY_PROCESS = _program("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    traced = []
    for pid in sorted(int(entry) for entry in os.listdir('/proc') if entry.isdigit()):
        if pid != os.getpid() and libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
            traced.append(pid)
            libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    print('traced', traced, 'parent', os.getppid(), flush=True)
""")


@pytest.mark.parametrize("control_groups", [True, False], ids=["control groups", "no control groups"])
def test_no_process_of_the_sandbox_can_be_traced_and_nothing_outlives_the_run(
    control_groups: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With bubblewrap's own PID 1 inside, a solution could attach to it (dumpable, the run's user), keep
    # it from exiting and so keep the namespace, and its own processes, alive after the run. The runner is
    # the namespace's init instead, and the checker is not dumpable. Without control groups (an
    # unprivileged harness) the namespace is all that ends leftover processes.
    if not control_groups:
        monkeypatch.setattr(RunCgroup, "create", classmethod(lambda cls, limits, headroom: None))
    marker = f"securesd-orphan-{secrets.token_hex(6)}"
    solution = _TRACE_EVERY_PROCESS + _program(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'],
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    """)
    tests = "def check(f):\n    assert f(2, 3) == 5\n"
    result = Sandbox(LIMITS).check(solution + "def add(a, b):\n    return a + b\n", tests, "add")
    assert result.passed, result.output
    assert "traced [] parent 1" in result.output, result.output  # the checker is PID 1, out of reach
    deadline = time.monotonic() + 5
    while _live_cmdlines_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_cmdlines_with(marker) == []


def test_files_planted_in_the_working_directory_do_not_reach_the_checker(sandbox: Sandbox) -> None:
    # The checker prints a traceback when the tests fail; planted files named like its trusted code must
    # neither put fake lines in it nor block it (a FIFO).
    planted = _program("""
        import os
        for name in ('tests.py', '<tests>', 'helpers.py'):
            with open(name, 'w') as handle:
                handle.write('FORGED LINE\\n' * 10)
        for name in ('runner.py', '<helpers>'):
            os.mkfifo(name)
    """)
    result = sandbox.check(planted + WRONG, TESTS, "add")
    assert result.status == "failed", result
    assert "assert f(2, 3) == 5" in result.output and "FORGED" not in result.output, result.output


def test_kernel_settings_under_proc_sys_are_read_only(sandbox: Sandbox) -> None:
    # A root harness's runs are uid 0 to the kernel's sysctl files (0644 root), which bubblewrap left
    # writable: kernel.core_pattern among them (a program run as root on the next crash).
    result = sandbox.run(_program("""
        import errno, os
        for name in ('fs/lease-break-time', 'kernel/core_pattern', 'vm/drop_caches'):
            try:
                os.close(os.open('/proc/sys/' + name, os.O_WRONLY))
                print('writable', name)
            except OSError as error:
                print('refused', name, errno.errorcode[error.errno])
    """))
    assert result.passed and "writable" not in result.output and result.output.count("refused") == 3, result.output


def test_proc_files_only_root_may_read_are_covered(sandbox: Sandbox) -> None:
    # A root harness's runs are uid 0 to the kernel: files such as /proc/slabinfo or /proc/kpageflags
    # (0400 root, kernel heap and physical page state) would be readable by their mode alone.
    from hf_securesd.bench.sandbox_bwrap import masked_proc_entries

    masked = masked_proc_entries()
    if not masked or os.getuid() != 0:
        pytest.skip("only a root harness's runs could read them (and this kernel's /proc has some)")
    result = sandbox.run(_program(f"""
        for path in {masked!r}:
            try:
                with open(path, 'rb') as handle:
                    data = handle.read(4096)
                print('read' if data else 'empty', path)
            except OSError as error:
                print('refused', path, error.strerror)
    """))
    assert result.passed and "read /proc" not in result.output, result.output


def test_a_task_limit_of_n_gives_the_solution_n_tasks() -> None:
    # The checker's own threads come on top of the solution's budget: a solution that starts exactly
    # max_processes tasks (its main thread included) runs, one more is refused.
    limits = replace(LIMITS, max_processes=6)
    solution = _program("""
        import threading
        threading.stack_size(65536)
        WANTED = {wanted}
        event, threads = threading.Event(), []
        for _ in range(WANTED - 1):
            threads.append(threading.Thread(target=event.wait, daemon=True))
            threads[-1].start()
        event.set()
        def add(a, b):
            return a + b
    """)
    sandbox = Sandbox(limits)
    assert sandbox.check(solution.format(wanted=6), TESTS, "add").passed
    assert sandbox.check(solution.format(wanted=7), TESTS, "add").status in ("process_limit", "failed")


# Run in a process of its own (it joins a session keyring): the harness holds a secret key in its session
# keyring; a run tries to read it and to plant a key there.
_KEYRING_PROBE = textwrap.dedent("""
    import ctypes, json, platform, sys
    from hf_securesd.bench.sandbox import Sandbox, SandboxLimits
    libc = ctypes.CDLL(None, use_errno=True)
    KEYCTL, ADD_KEY = {"x86_64": (250, 248), "aarch64": (219, 217)}[platform.machine()]
    SESSION = -3
    if libc.syscall(KEYCTL, 1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING
        print(json.dumps({"skip": "keyrings are not available here"}))
        sys.exit(0)
    secret = libc.syscall(ADD_KEY, b"user", b"harness-secret", b"TOP-SECRET", 10, SESSION)
    program = (
        "import ctypes\\n"
        "libc = ctypes.CDLL(None, use_errno=True)\\n"
        "buffer = ctypes.create_string_buffer(64)\\n"
        f"print('read', libc.syscall({KEYCTL}, 11, {secret}, buffer, 64), buffer.raw[:10])\\n"
        f"print('planted', libc.syscall({ADD_KEY}, b'user', b'from-sandbox', b'x', 1, -3) > 0)\\n"
    )
    result = Sandbox(SandboxLimits(timeout_s=20)).run(program)
    ids = (ctypes.c_int32 * 64)()
    count = libc.syscall(KEYCTL, 11, SESSION, ids, ctypes.sizeof(ids))  # KEYCTL_READ of a keyring: its keys
    print(json.dumps({"output": result.output, "keys": list(ids[: count // 4]), "secret": secret}))
""")


def test_the_harness_keyring_is_out_of_reach_and_runs_cannot_pass_data_through_one() -> None:
    # bubblewrap does not isolate kernel keyrings: a run shared its harness's session keyring (read its
    # keys, planted its own: a channel from one run to the next). The launcher gives each run a new one.
    probe = subprocess.run([sys.executable, "-c", _KEYRING_PROBE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    if "skip" in seen:
        pytest.skip(seen["skip"])
    assert "TOP-SECRET" not in seen["output"] and "read -1" in seen["output"], seen["output"]
    assert seen["keys"] == [seen["secret"]], seen  # nothing planted in the harness's keyring


def test_the_solution_cannot_touch_the_harness_output_and_its_own_is_passed_on(sandbox: Sandbox) -> None:
    # A process the solution leaves behind used to write (or read back) the harness's output pipe after
    # the checker's last line; the solution now writes to a pipe of the checker's, passed on labelled,
    # and one that never stops writing does not hold the checker up.
    flood = "import os\nwhile True:\n    os.write(1, b'All tests passed; verdict: passed\\n')\n"
    solution = _program(f"""
        import subprocess, sys
        print('the solution speaks', flush=True)
        subprocess.Popen([sys.executable, '-c', {flood!r}], start_new_session=True)
    """)
    result = sandbox.check(solution + WRONG, TESTS, "add")
    assert result.status == "failed", result
    assert result.output.rstrip().endswith("AssertionError"), result.output
    assert "--- end of the solution's output ---" in result.output


def test_the_checker_cannot_be_interrupted_from_inside(sandbox: Sandbox) -> None:
    # Python's SIGINT handler made the checker (the namespace's init) exit with status 130.
    storm = _program("""
        import os, signal
        for _ in range(200):
            os.kill(1, signal.SIGINT)
            os.kill(1, signal.SIGTERM)
    """)
    result = sandbox.check(storm + "def add(a, b):\n    return a + b\n", TESTS, "add")
    assert result.passed, result


def test_open_files_are_limited(sandbox: Sandbox) -> None:
    # memfd files written with write() count against no address space: the number a process holds open
    # (each at most max_file_bytes) bounds them
    result = sandbox.run(_program("""
        import os
        opened = []
        try:
            for index in range(1000):
                opened.append(os.memfd_create(f'm{index}'))
        except OSError as error:
            print('stopped at', len(opened), error.strerror)
    """))
    stopped = int(result.output.split("stopped at")[1].split()[0])
    assert stopped < LIMITS.max_open_files, result.output


# --- point 3: forged passes -------------------------------------------------------------------

FORGERIES = {
    "print_marker_and_exit_0": "import os\nprint('passed')\nprint(open(__file__).read())\nos._exit(0)\n",
    "write_verdict_to_every_fd": ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'passed')\n"
                                  "    except OSError:\n        pass\nos._exit(0)\n"),
    "read_the_checker_fds_through_proc": (
        "import os\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n"
        "        try:\n            for fd in os.listdir(f'/proc/{pid}/fd'):\n"
        "                try:\n                    os.write(os.open(f'/proc/{pid}/fd/{fd}', os.O_WRONLY), b'passed')\n"
        "                except OSError:\n                    pass\n        except OSError:\n            pass\n"),
    "sys_exit_0_at_import": "import sys\nsys.exit(0)\n",
    "kill_the_checker": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_pass_is_scored_as_a_failure(sandbox: Sandbox, name: str) -> None:
    result = sandbox.check(FORGERIES[name] + WRONG, TESTS, "add")
    assert not result.passed and result.status == "failed", result


def test_the_checker_process_is_out_of_reach_of_the_solution(sandbox: Sandbox) -> None:
    probe = _program("""
        import os
        checker = os.getppid()
        for what in ('fd', 'mem', 'environ'):
            try:
                if what == 'fd':  # the verdict pipe is one of these
                    for fd in os.listdir(f'/proc/{checker}/fd'):
                        os.close(os.open(f'/proc/{checker}/fd/{fd}', os.O_WRONLY))
                else:
                    open(f'/proc/{checker}/{what}', 'rb').read(1)
                print('reachable', what)
            except OSError as error:
                print('denied', what, error.errno)
    """)
    result = sandbox.check(probe + WRONG, TESTS, "add")
    assert not result.passed
    assert "reachable" not in result.output and result.output.count("denied") == 3, result.output


# A solution that searches everything it can open for a token: the sandbox's files, its /tmp, and every
# descriptor and cmdline/environ under /proc (bubblewrap's PID 1 and the checker included).
_TOKEN_SEARCH = _program("""
    import os, re
    def _texts():
        for root in ('/sandbox', '/tmp'):
            for folder, _, names in os.walk(root):
                for name in names:
                    yield os.path.join(folder, name)
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                yield f'/proc/{pid}/cmdline'
                yield f'/proc/{pid}/environ'
                try:
                    yield from (f'/proc/{pid}/fd/{fd}' for fd in os.listdir(f'/proc/{pid}/fd'))
                except OSError:
                    pass
    def answer():
        for path in _texts():
            try:
                handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    data = os.read(handle, 1 << 20)
                finally:
                    os.close(handle)
            except OSError:
                continue
            for token in re.findall(rb'zq-[0-9a-f]{16}', data):
                if token.decode() != OWN:
                    return token.decode()
        return None
""")


def test_the_tests_cannot_be_read_by_the_solution(sandbox: Sandbox) -> None:
    """The expected answer exists only in the tests: the solution finds it nowhere it can look (the
    tests reach the checker over a pipe drained before the solution starts). Control: the same search
    finds a token the solution's own file holds."""
    own, expected = f"zq-{secrets.token_hex(8)}", f"zq-{secrets.token_hex(8)}"
    tests = f"def check(f):\n    assert f() == {expected!r}\n"
    hidden = sandbox.check(f"OWN = {own!r}\n" + _TOKEN_SEARCH, tests, "answer")
    assert not hidden.passed and hidden.status == "failed", hidden
    control_token = f"zq-{secrets.token_hex(8)}"
    control = sandbox.check(f"OWN = {own!r}\n# {control_token}\n" + _TOKEN_SEARCH,
                            f"def check(f):\n    assert f() == {control_token!r}\n", "answer")
    assert control.passed, control


def test_object_equal_to_everything_cannot_cross(sandbox: Sandbox) -> None:
    solution = "class Always:\n    def __eq__(self, other):\n        return True\n\ndef add(a, b):\n    return Always()\n"
    result = sandbox.check(solution, TESTS, "add")
    assert not result.passed and "cannot cross" in result.output


def test_subclasses_of_builtins_cross_as_their_base_type(sandbox: Sandbox) -> None:
    solution = textwrap.dedent("""
        import collections
        class Liar(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def histogram(text):
            return collections.Counter(text.split())
        def liar(x):
            return Liar(x + 1)
    """)
    tests = "def check(f):\n    assert f('a b a') == {'a': 2, 'b': 1}\n"
    assert sandbox.check(solution, tests, "histogram").passed
    liar = sandbox.check(solution, "def check(f):\n    assert f(1) == 1\n", "liar")
    assert not liar.passed and "AssertionError" in liar.output  # its int value crossed, not its __eq__


def test_correct_solution_passes_and_values_round_trip(sandbox: Sandbox) -> None:
    solution = "def echo(*args, **kwargs):\n    return args, kwargs\n"
    tests = textwrap.dedent("""
        def check(f):
            args = (None, True, 3, 10**30, -0.5, float('inf'), 'é', b'\\x00', [1, (2,)], {'k': {1, 2}},
                    frozenset({3}))
            got_args, got_kwargs = f(*args, key=[1])
            assert got_args == args and got_kwargs == {'key': [1]}
            assert type(got_args) is tuple and got_args[1] is True
            assert f(float('nan'))[0][0] != f(float('nan'))[0][0]
    """)
    result = sandbox.check(solution, tests, "echo")
    assert result.passed, result.output


# --- point 4: limits for the whole run --------------------------------------------------------

def _cgroups_writable() -> bool:
    group = RunCgroup.create(LIMITS, 0)
    if group is None:
        return False
    group.destroy()
    return True


@pytest.mark.skipif(not _cgroups_writable(), reason="no writable control group hierarchy (run as root or "
                    "delegate a cgroup subtree): memory is bounded per process only")
def test_memory_is_bounded_over_all_processes_of_a_run() -> None:
    # 4 processes x 300 MiB, each under the per-process limit, together over the run's 768 MiB
    patient = Sandbox(replace(LIMITS, timeout_s=60, cpu_s=60))
    result = patient.run(_program("""
        import subprocess, sys
        code = "import time; blob = b'x' * (300 * 1024 * 1024); time.sleep(4)"
        children = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(4)]
        print('exits', [child.wait() for child in children])
    """))
    exits = result.output.split("exits")[1]
    assert "-9" in exits, result.output  # the kernel killed some: the four never held 1.2 GiB together


def _cpu_quota() -> float | None:
    """The CPUs a run's group may use (v2 cpu.max or v1 cfs quota), None without a CPU group."""
    group = RunCgroup.create(LIMITS, 0)
    if group is None:
        return None
    try:
        for path in group.paths:
            if (path / "cpu.max").is_file():
                quota, period = (path / "cpu.max").read_text().split()
                return None if quota == "max" else int(quota) / int(period)
            if (path / "cpu.cfs_quota_us").is_file():
                quota = int((path / "cpu.cfs_quota_us").read_text())
                return None if quota < 0 else quota / int((path / "cpu.cfs_period_us").read_text())
        return None
    finally:
        group.destroy()


@pytest.mark.skipif(_cpu_quota() is None, reason="no writable CPU controller: a run's CPU is bounded per process only")
def test_a_run_in_many_sessions_gets_at_most_its_cpus() -> None:
    """A program that spreads spinning children over sessions of their own (setsid: the kernel's
    autogroups shared the CPU by session, so it starved a run scored beside it into a timeout) uses
    at most the run's RUN_CPUS together."""
    assert _cpu_quota() == RUN_CPUS
    patient = Sandbox(replace(LIMITS, timeout_s=60, cpu_s=60))
    result = patient.run(_program("""
        import os, resource, time
        start, children = time.monotonic(), []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                os.setsid()
                end = time.monotonic() + 2.0
                while time.monotonic() < end:
                    pass
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        print('ratio', (used.ru_utime + used.ru_stime) / (time.monotonic() - start))
    """))
    ratio = float(result.output.split("ratio")[1].split()[0])
    assert ratio <= RUN_CPUS + 0.25, result.output


def test_threads_and_processes_are_capped_for_the_run(sandbox: Sandbox) -> None:
    result = sandbox.run(_program("""
        import threading, time
        started = 0
        try:
            for _ in range(300):
                threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
                started += 1
        finally:
            print('started', started, flush=True)
    """))
    started = int(result.output.split("started")[1].split()[0])
    assert started < LIMITS.max_processes, result.output  # the main thread is one of them
    # refused by the run's task limit (control group) or the per-user process limit
    assert not result.passed and result.status in ("process_limit", "failed")
    assert "can't start new thread" in result.output


def test_disk_is_bounded_for_the_whole_run(sandbox: Sandbox) -> None:
    result = sandbox.run(_program("""
        written = 0
        try:
            for index in range(600):
                with open(f'chunk{index}', 'wb') as handle:
                    handle.write(b'x' * 1024 * 1024)
                written += 1024 * 1024
        finally:
            print('written', written, flush=True)
    """))
    written = int(result.output.split("written")[1].split()[0])
    assert written <= LIMITS.disk_bytes, result.output
    assert not result.passed and "No space left" in result.output


def test_killed_harness_leaves_nothing_running_and_leftovers_are_swept(tmp_path: Path) -> None:
    marker = f"securesd-orphan-{secrets.token_hex(6)}"
    harness = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from hf_securesd.bench.sandbox import Sandbox, SandboxLimits
        Sandbox(SandboxLimits(timeout_s=120, cpu_s=120)).run(
            "import subprocess, sys, time\\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker[:9]}' + '{marker[9:]}'])\\n"
            "time.sleep(120)\\n")
    """)])
    deadline = time.monotonic() + 60
    while not _live_cmdlines_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _live_cmdlines_with(marker), "the sandboxed program never started"
    scratch = list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"{RUN_PREFIX}{harness.pid}-*"))
    assert scratch
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    deadline = time.monotonic() + 10
    while _live_cmdlines_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_cmdlines_with(marker) == []
    removed = sweep_stale()
    assert set(scratch) <= set(removed)
    assert not any(path.exists() for path in scratch)
