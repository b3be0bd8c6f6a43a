"""The HumanEval sandbox: hostile completions are contained and fail, the harness keeps going, and
real solutions pass. Runs against the local benchmark data ($SECURESD_DATA_DIR, else ../shared/data
beside the checkout)."""

from __future__ import annotations

import os
import sys
import socket
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
from support import needs_bwrap

from hf_securesd.bench.sandbox import Sandbox, SandboxLimits, SandboxUnavailableError, descendants
from hf_securesd.bench.sandbox_bwrap import bwrap_problem
from hf_securesd.bench.tasks import Example, ScoreOptions, get_task
from hf_securesd.bench.tasks.humaneval import build_solution, extract_code

LIMITS = SandboxLimits(timeout_s=4, cpu_s=4, memory_bytes=1024**3, max_processes=16)


@pytest.fixture(scope="module")
def problems(data_dir: Path) -> dict[str, Example]:
    return {example.id: example for example in get_task("humaneval").examples(data_dir=data_dir)}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS)


def _options(isolation: str = "auto") -> ScoreOptions:
    return ScoreOptions(sandbox_limits=LIMITS, isolation=isolation, workers=2, progress=False)


def _completion(problem: Example, preamble: str) -> str:
    """A chat-style answer that runs `preamble` inside the function, then the canonical body."""
    fields = problem.fields
    body = textwrap.indent(textwrap.dedent(preamble).strip(), "    ")
    return f"```python\n{fields['prompt']}{body}\n{fields['canonical_solution']}```"


def _descendant_count() -> int:
    return len(descendants(os.getpid()))


@needs_bwrap
def test_canonical_solutions_pass(problems: dict[str, Example]) -> None:
    task = get_task("humaneval")
    chosen = [problems[f"HumanEval/{index}"] for index in (0, 2, 14, 15, 32)]
    responses = [f"```python\n{p.fields['prompt']}{p.fields['canonical_solution']}```" for p in chosen]
    result = task.score(chosen, responses, _options())
    assert result.per_example == [1.0] * len(chosen), result.details
    assert result.value == 1.0


@needs_bwrap
def test_body_only_completion_passes(problems: dict[str, Example]) -> None:
    problem = problems["HumanEval/2"]
    result = get_task("humaneval").score([problem], [problem.fields["canonical_solution"]], _options())
    assert result.value == 1.0, result.details


@needs_bwrap
def test_off_by_one_fails(problems: dict[str, Example]) -> None:
    fifteen, fourteen = problems["HumanEval/15"], problems["HumanEval/14"]
    broken = [fifteen.fields["canonical_solution"].replace("range(n + 1)", "range(n)"),
              fourteen.fields["canonical_solution"].replace("string[:i+1]", "string[:i]")]
    assert broken != [fifteen.fields["canonical_solution"], fourteen.fields["canonical_solution"]]
    result = get_task("humaneval").score([fifteen, fourteen], broken, _options())
    assert result.per_example == [0.0, 0.0]
    assert all(detail["status"] == "failed" for detail in result.details)
    assert "AssertionError" in result.details[0]["output"]


@needs_bwrap
def test_hostile_completions_are_contained_and_the_harness_goes_on(problems: dict[str, Example]) -> None:
    problem = problems["HumanEval/0"]
    hostile = {
        "infinite_loop": "while True:\n    pass",
        "sleep_forever": "import time\ntime.sleep(3600)",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "allocate_10gb": "blob = bytearray(10 * 1024 ** 3)",
        "early_exit_zero": "import os\nos._exit(0)",
    }
    responses = [_completion(problem, preamble) for preamble in hostile.values()]
    responses.append(f"```python\n{problem.fields['prompt']}{problem.fields['canonical_solution']}```")
    before = _descendant_count()
    result = get_task("humaneval").score([problem] * len(responses), responses, _options())
    statuses = dict(zip([*hostile, "canonical"], (detail["status"] for detail in result.details)))
    assert result.per_example == [0.0] * len(hostile) + [1.0], statuses
    assert statuses["infinite_loop"] == "timeout" and statuses["sleep_forever"] == "timeout"
    assert statuses["fork_bomb"] in ("process_limit", "timeout", "failed")
    assert statuses["allocate_10gb"] == "failed" and "MemoryError" in result.details[3]["output"]
    assert _descendant_count() <= before  # nothing the completions started is left running


@needs_bwrap
def test_a_completion_that_is_not_valid_unicode_fails_without_stopping_the_others(problems: dict[str, Example]) -> None:
    """A lone surrogate (a JSON escape from a server) cannot be written as UTF-8: that completion fails,
    the batch is scored."""
    problem = problems["HumanEval/0"]
    canonical = f"```python\n{problem.fields['prompt']}{problem.fields['canonical_solution']}```"
    broken = canonical.replace("return False", "return '\ud800' == 1", 1)
    result = get_task("humaneval").score([problem, problem], [broken, canonical], _options())
    assert result.per_example == [0.0, 1.0]
    assert result.details[0]["status"] == "failed" and "not valid Unicode" in result.details[0]["output"]


@needs_bwrap
@pytest.mark.parametrize("entry_point", ["{0}", "{inputs.__class__}", "a b", "class", ""])
def test_an_entry_point_that_is_not_a_name_fails_that_example_only(problems: dict[str, Example],
                                                                   entry_point: str) -> None:
    """The entry point comes from the dataset file: one that names no function is an error for its own
    example (it used to reach a str.format of the runner's arguments and stop the batch)."""
    problem = problems["HumanEval/0"]
    broken = Example(problem.id, {**problem.fields, "entry_point": entry_point})
    canonical = f"```python\n{problem.fields['prompt']}{problem.fields['canonical_solution']}```"
    result = get_task("humaneval").score([broken, problem], [canonical, canonical], _options())
    assert result.per_example == [0.0, 1.0]
    assert result.details[0]["status"] == "error" and "not a Python function name" in result.details[0]["output"]


@needs_bwrap
def test_deleting_files_outside_the_workdir_is_contained(problems: dict[str, Example],
                                                         tmp_path: Path) -> None:
    outside_tmp = Path(tempfile.mkdtemp(dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None))
    victims = [tmp_path / "victim.txt", outside_tmp / "victim.txt"]
    for victim in victims:
        victim.write_text("keep me")
    preamble = "import os, shutil\n" + "".join(
        f"os.remove({str(victim)!r})\nshutil.rmtree({str(victim.parent)!r})\n" for victim in victims)
    preamble += "open('written_inside_workdir.txt', 'w').write('fine')\n"
    try:
        problem = problems["HumanEval/0"]
        result = get_task("humaneval").score([problem], [_completion(problem, preamble)], _options("bwrap"))
        assert result.per_example == [0.0]
        assert all(victim.read_text() == "keep me" for victim in victims)
    finally:
        for victim in victims[1:]:
            victim.unlink()
            victim.parent.rmdir()


@needs_bwrap
def test_network_is_unreachable(problems: dict[str, Example]) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        preamble = (f"import socket\n"
                    f"socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
                    "socket.create_connection(('example.com', 80), timeout=2)")
        problem = problems["HumanEval/0"]
        result = get_task("humaneval").score([problem], [_completion(problem, preamble)], _options("bwrap"))
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection is waiting in the backlog
            server.accept()
    assert result.per_example == [0.0]
    assert "Network is unreachable" in result.details[0]["output"] or "refused" in result.details[0]["output"]


@needs_bwrap
def test_sandbox_direct_use(sandbox: Sandbox) -> None:
    assert sandbox.run("assert sum(range(4)) == 6").passed
    failed = sandbox.run("raise SystemExit(3)")
    assert (failed.passed, failed.status, failed.returncode) == (False, "failed", 3)
    assert sandbox.run("import sys\nsys.exit(0)").status == "failed"  # exits before its end
    main_block = sandbox.run("if __name__ == '__main__':\n    input()\nprint('ok')")
    assert main_block.passed and main_block.output == "ok"


@needs_bwrap
def test_run_many_keeps_order(sandbox: Sandbox) -> None:
    results = sandbox.run_many([f"print({index})" for index in range(4)], workers=2, progress=False)
    assert [result.output for result in results] == ["0", "1", "2", "3"]


@needs_bwrap
def test_file_size_limit() -> None:
    small = Sandbox(SandboxLimits(timeout_s=4, max_file_bytes=1024 * 1024))
    result = small.run("open('big.bin', 'wb').write(b'x' * (8 * 1024 * 1024))")
    assert not result.passed


def test_without_bwrap_it_refuses_unless_unsafe_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_securesd.bench import sandbox as module

    monkeypatch.setattr(module, "bwrap_problem", lambda python=None: "bubblewrap (`bwrap`) is not installed: "
                        "install bubblewrap (Debian/Ubuntu: `apt-get install -y bubblewrap`)")
    for isolation in ("auto", "bwrap"):
        with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap.*unsafe-none"):
            Sandbox(LIMITS, isolation=isolation)
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        unsafe = Sandbox(LIMITS, isolation="unsafe-none")
    assert unsafe.isolation == "unsafe-none"
    assert unsafe.run("print(6 * 7)").output == "42"


def test_bad_isolation_name() -> None:
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(LIMITS, isolation="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unsafe-none"):
        Sandbox(LIMITS, isolation="rlimits")  # type: ignore[arg-type]


def test_extract_code_variants() -> None:
    fenced = "Here you go:\n```python\ndef f(x):\n    return x\n```\nDone."
    assert extract_code(fenced, "f") == "def f(x):\n    return x\n"
    two_blocks = "```\nimport math\n```\n```python\ndef g():\n    return 1\n```"
    assert extract_code(two_blocks, "g") == "def g():\n    return 1\n"
    truncated = "```python\ndef f(x):\n    return x +"
    assert extract_code(truncated, "f") == "def f(x):\n    return x +"
    assert extract_code("    return 1\n", "f") == "    return 1\n"


@needs_bwrap
def test_build_solution_replaces_the_stub() -> None:
    example = Example("t/0", {"prompt": "import math\n\ndef f(x):\n    \"\"\"doc\"\"\"\n", "entry_point": "f",
                              "test": "def check(c):\n    assert c(2) == 4\n", "canonical_solution": ""})
    solution = build_solution(example, "```python\ndef f(x):\n    return x * 2\n```")
    assert solution.startswith("import math") and solution.rstrip().endswith("return x * 2")
    assert Sandbox(LIMITS).check(solution, example.fields["test"], "f", example.fields["prompt"]).passed


@needs_bwrap
def test_interpreter_in_a_virtual_environment_under_tmp_is_isolated(tmp_path: Path) -> None:
    assert str(tmp_path).startswith(tempfile.gettempdir())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    assert bwrap_problem(python) is None
    sandbox = Sandbox(LIMITS, isolation="bwrap", python=python)
    result = sandbox.run("import os, sys\nprint(sys.executable, len([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert result.passed, result.output
    executable, visible = result.output.split()
    assert executable == python and int(visible) <= 3  # its own PID namespace


@needs_bwrap
def test_a_bare_interpreter_name_runs_the_interpreter_on_path_without_mounting_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `python="python3"` once mounted the folder "python3" would be in: the harness's working directory
    (tmp_path / "answers.txt").write_text("expected answers")
    monkeypatch.chdir(tmp_path)
    bare = os.path.basename(sys.executable)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    sandbox = Sandbox(LIMITS, isolation="bwrap", python=bare)
    assert sandbox.python == sys.executable
    result = sandbox.run(f"import os\nprint(os.path.exists({str(tmp_path / 'answers.txt')!r}))")
    assert result.passed and result.output == "False", result.output


@needs_bwrap
def test_output_is_drained_when_the_harness_holds_over_1024_descriptors() -> None:
    # select.select refuses descriptors from 1024 on: the output thread died, a run printing more than
    # a pipe holds blocked until its timeout and a failure lost its output
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the hard limit on open files is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        sandbox = Sandbox(LIMITS)
        printed = sandbox.run("print('x' * 200_000)\nprint('end')")
        assert printed.passed and printed.output.endswith("end"), printed.status
        tests = "def check(f):\n    assert f(2, 3) == 5\n"
        failed = sandbox.check("def add(a, b):\n    raise ValueError('visible')\n", tests, "add")
        assert not failed.passed and "visible" in failed.output
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@needs_bwrap
def test_a_launcher_script_stands_for_the_interpreter_it_starts(tmp_path: Path) -> None:
    # a pyenv shim is a shell script: run inside the sandbox it failed (its own folders are not mounted)
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    sandbox = Sandbox(LIMITS, isolation="bwrap", python=str(shim))
    assert sandbox.python == sys.executable
    assert sandbox.run("print(6 * 7)").output == "42"
    not_python = tmp_path / "bin" / "true"
    not_python.write_text("#!/bin/sh\nexit 3\n")
    not_python.chmod(0o755)
    with pytest.raises(ValueError, match="did not run as a Python interpreter"):
        Sandbox(LIMITS, python=str(not_python))


@needs_bwrap
def test_without_a_control_group_the_watchdog_allows_exactly_max_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the watchdog counts processes (the checker's threads do not count there): a solution of exactly
    # max_processes processes runs, one more is stopped
    from hf_securesd.bench import sandbox as module

    monkeypatch.setattr(module.RunCgroup, "create", classmethod(lambda cls, *args: None))
    limits = SandboxLimits(timeout_s=10, cpu_s=4, memory_bytes=1024**3, max_processes=3)
    solution = textwrap.dedent("""
        import os, time
        for _ in range({children}):
            if os.fork() == 0:
                time.sleep(2)
                os._exit(0)
        time.sleep(0.6)
        def add(a, b):
            return a + b
    """)
    sandbox = Sandbox(limits)
    tests = "def check(f):\n    assert f(2, 3) == 5\n"
    assert sandbox.check(solution.format(children=2), tests, "add").passed
    assert sandbox.check(solution.format(children=3), tests, "add").status == "process_limit"


def test_an_interpreter_that_cannot_be_found_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no-such-python.*no such executable on PATH"):
        Sandbox(LIMITS, python="no-such-python")
    with pytest.raises(ValueError, match="no such executable"):
        Sandbox(LIMITS, python="/opt/nowhere/python3")


def test_mounts_holding_the_working_directory_or_home_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The interpreter's folders are mounted read-only inside: a harness started in one of them (or an
    # interpreter whose prefix is the home folder) would show the program its working tree or home.
    from hf_securesd.bench import sandbox_bwrap

    paths = sandbox_bwrap.interpreter_paths(sys.executable)
    if not paths:
        pytest.skip("this interpreter lives under /usr, which is mounted anyway")
    prefix = paths[0]
    monkeypatch.chdir(prefix)
    with pytest.raises(SandboxUnavailableError, match="holds the working directory"):
        Sandbox(LIMITS)
    monkeypatch.chdir("/")
    monkeypatch.setenv("HOME", prefix)
    with pytest.raises(SandboxUnavailableError, match="holds the home folder"):
        Sandbox(LIMITS)


def test_proc_files_other_users_may_not_read_are_masked(tmp_path: Path) -> None:
    from hf_securesd.bench.sandbox_bwrap import masked_proc_entries

    for name, mode in (("slabinfo", 0o400), ("kmsg", 0o400), ("cpuinfo", 0o444), ("bset", 0o600)):
        (tmp_path / name).write_text("x")
        (tmp_path / name).chmod(mode)
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "environ").write_text("x")
    expected = tuple(str(tmp_path / name) for name in ("bset", "kmsg", "slabinfo"))
    assert masked_proc_entries(str(tmp_path)) == expected


def test_a_failing_sandbox_names_the_real_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_securesd.bench import sandbox_bwrap

    if sandbox_bwrap.bwrap_binary() is not None:
        # bwrap works but the interpreter's folders are not mounted: the message must say so
        monkeypatch.setattr(sandbox_bwrap, "interpreter_paths", lambda python: ())
        message = sandbox_bwrap.bwrap_problem.__wrapped__("/opt/nowhere/python3")
        assert message is not None and "interpreter /opt/nowhere/python3 failed inside the sandbox" in message
        assert "namespaces" not in message
    monkeypatch.setattr(sandbox_bwrap, "bwrap_binary", lambda: None)
    message = sandbox_bwrap.bwrap_problem.__wrapped__(sys.executable)
    assert "not installed" in message and "apt-get install -y bubblewrap" in message


def test_a_study_with_humaneval_refuses_before_generating(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    import argparse

    from hf_securesd.bench import cli_bench
    from hf_securesd.bench import sandbox as module
    from hf_securesd.bench.runner import StudySettings, TaskRun, run_study

    parser = argparse.ArgumentParser()
    cli_bench.configure(parser)
    assert parser.parse_args(["--out", "x", "--unsafe-no-isolation"]).unsafe_no_isolation
    assert not parser.parse_args(["--out", "x"]).unsafe_no_isolation
    monkeypatch.setattr(module, "bwrap_problem", lambda python=None: "bubblewrap (`bwrap`) is not installed")
    humaneval = TaskRun(get_task("humaneval"), [], [], 8)
    with pytest.raises(SandboxUnavailableError, match="--unsafe-no-isolation"):
        run_study(StudySettings("tiny", "tiny"), None, [humaneval], [], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing generated, nothing written
    unsafe = StudySettings("tiny", "tiny", isolation="unsafe-none")
    assert unsafe.score_options().isolation == "unsafe-none"


def test_runs_without_a_control_group_are_announced_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Without control groups the run's memory and task count are not bounded as a whole: the operator
    # is told once (it was a debug line), not at every run.
    from hf_securesd.bench import sandbox_limits

    monkeypatch.setattr(sandbox_limits, "CGROUP_ROOT", tmp_path / "no-cgroups")
    monkeypatch.setattr(sandbox_limits, "_warned_without_control_group", [])
    with caplog.at_level("DEBUG", logger=sandbox_limits.logger.name):
        assert sandbox_limits.RunCgroup.create(LIMITS, 1) is None
        assert sandbox_limits.RunCgroup.create(LIMITS, 1) is None
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1 and "run_memory_bytes" in warnings[0].getMessage()
