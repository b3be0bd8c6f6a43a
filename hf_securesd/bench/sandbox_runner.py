"""Trusted code that runs INSIDE the sandbox (standard library only; copied next to the program and
started as a script with ``python -I -S``). Never imported by the package.

Modes (first argument):

``run PROGRAM RESULT_FD``
    Execute PROGRAM as the module ``__sandbox__``; when it returns, write ``completed`` to RESULT_FD.
    The program shares this process, so it can write that word itself: ``run`` reports how a
    program ended, it is not a verdict on untrusted code.

``check SOLUTION ENTRY_POINT RESULT_FD`` (standard input: JSON {"tests": ..., "helpers": ...})
    The verdict channel for untrusted code. This process (the *checker*) makes itself
    non-dumpable (no ptrace, no access to its ``/proc/<pid>/fd`` or memory by its children), reads
    the trusted tests and helpers from its standard input (a pipe from the harness, read to its end
    before any untrusted code runs, so the solution can never read the expected answers), then starts a *second, fresh interpreter*
    (``serve``, standard input /dev/null, standard output and error a pipe of the checker's, whose end
    the checker passes on labelled) that executes SOLUTION and answers calls to ENTRY_POINT over
    two pipes. RESULT_FD and the harness's output are not inherited by that process. The checker executes
    the trusted helpers (the task's prompt, for helper functions the tests use) and tests, and calls
    ``check(candidate)`` with a proxy that forwards each call. Arguments and return values cross as
    tagged JSON holding only None, bool, int, float, str, bytes, list, tuple, dict, set and
    frozenset (subclasses cross as their base type), rebuilt here as exact built-in types. Only when ``check`` returns does the checker
    write ``passed`` to RESULT_FD. The solution can therefore neither print nor write the verdict,
    nor return objects that compare equal to everything.

``serve SOLUTION ENTRY_POINT IN_FD OUT_FD``
    The untrusted side of ``check``.
"""

import ctypes
import json
import linecache
import math
import os
import runpy
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
PR_SET_DUMPABLE = 4
SOLUTION_OUTPUT_BYTES = 1500  # the end of the solution's own output that the checker passes on
_HEADER = struct.Struct("<Q")


def encode(value):
    """A JSON-ready tagged form of `value`. Subclasses of the built-in types (a Counter, a
    namedtuple, an IntEnum) cross as their base type; anything else raises TypeError."""
    if value is None or type(value) is bool:
        return value
    if isinstance(value, int):
        return {"i": str(int(value))}
    if isinstance(value, float):
        value = float(value)
        return value if math.isfinite(value) else {"f": repr(value)}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, list):
        return {"l": [encode(item) for item in value]}
    if isinstance(value, tuple):
        return {"t": [encode(item) for item in value]}
    if isinstance(value, (set, frozenset)):
        return {"z" if isinstance(value, frozenset) else "s": [encode(item) for item in value]}
    if isinstance(value, dict):
        return {"d": [[encode(key), encode(item)] for key, item in value.items()]}
    raise TypeError(f"a value of type {type(value).__name__} cannot cross the sandbox boundary")


def decode(data):
    """Inverse of `encode`, building only exact built-in types; ValueError on anything else."""
    if data is None or type(data) in (bool, str):
        return data
    if type(data) is float:
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError("malformed value from the candidate process")
    (tag, body), = data.items()
    if tag == "i" and type(body) is str:
        return int(body)
    if tag == "f" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError("malformed value from the candidate process")
    if tag == "l":
        return [decode(item) for item in body]
    if tag == "t":
        return tuple(decode(item) for item in body)
    if tag == "s":
        return {decode(item) for item in body}
    if tag == "z":
        return frozenset(decode(item) for item in body)
    if tag == "d":
        return {decode(pair[0]): decode(pair[1]) for pair in body}
    raise ValueError(f"unknown value tag {tag!r} from the candidate process")


def send(fd, message):
    payload = json.dumps(message).encode("utf-8")
    data = _HEADER.pack(len(payload)) + payload
    while data:
        data = data[os.write(fd, data):]


def receive(fd):
    """One framed message, or None at end of file. ValueError when over MAX_MESSAGE_BYTES."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {size} bytes from the candidate process exceeds the cap")
    payload = _read_exactly(fd, size)
    if payload is None:
        raise EOFError("the candidate process closed the channel mid-message")
    return json.loads(payload)


def _read_exactly(fd, size):
    chunks, missing = [], size
    while missing:
        chunk = os.read(fd, min(missing, 1 << 20))
        if not chunk:
            if missing == size:
                return None
            raise EOFError("the candidate process closed the channel mid-message")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def _trusted_code(source, name):
    """`source` compiled under the file name `name` (in angle brackets: no file is ever read for it),
    its lines registered with `linecache` so that tracebacks still show them. The working directory is
    the solution's to write: a file named like the trusted code there could otherwise put fake lines in
    a traceback, or a FIFO block the checker while it prints one."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    return compile(source, name, "exec")


def _source(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


class CandidateError(Exception):
    """The candidate raised, returned something that cannot cross, or died."""


def _run(program, result_fd):
    runpy.run_path(program, run_name="__sandbox__")
    sys.stdout.flush()
    os.write(result_fd, b"completed")


def _serve(solution, entry_point, in_fd, out_fd):
    namespace = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    exec(compile(_source(solution), "solution.py", "exec"), namespace)
    function = namespace[entry_point]
    while True:
        request = receive(in_fd)
        if request is None:
            return
        try:
            args = decode(request["args"])
            kwargs = decode(request["kwargs"])
            reply = {"ok": encode(function(*args, **kwargs))}
        except BaseException as error:  # the checker decides what a failure means
            reply = {"error": f"{type(error).__name__}: {error}"[:2000]}
        sys.stdout.flush()
        send(out_fd, reply)


def _read_trusted_input():
    """The tests and helpers from standard input, which then reads /dev/null (descriptor 0 stays taken,
    so no pipe opened later lands on it)."""
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    trusted = json.loads(b"".join(chunks).decode("utf-8"))
    return trusted["tests"], trusted["helpers"]


class _SolutionOutput:
    """The solution's standard output and error, through a pipe of the checker's own: the harness's
    output descriptor stays out of the solution's reach (it could otherwise write after the checker's
    last line, or read the checker's traceback back). Drained in a thread; the end is kept."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self._poller = select.poll()
        self._poller.register(self.read_fd, select.POLLIN)
        self._kept = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self):
        deadline = None
        while True:
            readable = bool(self._poller.poll(50))  # (select.select refuses descriptors from 1024 on)
            if self._stop.is_set():
                # Processes the solution left behind may hold the pipe, and write to it without end:
                # read what is there for at most one more interval, then stop.
                deadline = deadline or time.monotonic() + 0.05
                if not readable or time.monotonic() > deadline:
                    return
            if not readable:
                continue
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                return
            self._kept += chunk
            del self._kept[:-SOLUTION_OUTPUT_BYTES]

    def pass_on(self):
        """Write the kept end of the solution's output to this process's standard error, labelled."""
        self._stop.set()
        self._thread.join()
        if self._kept:
            sys.stderr.write("--- the solution's output (its end) ---\n" + self._kept.decode(errors="replace")
                             + "\n--- end of the solution's output ---\n")
            sys.stderr.flush()


def _check(solution, entry_point, result_fd):
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    # The checker is the PID namespace's init: the kernel drops signals from inside the namespace that
    # have no handler, so the solution cannot interrupt it with SIGINT (Python's KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    tests, helpers = _read_trusted_input()
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    output = _SolutionOutput()
    candidate = subprocess.Popen(
        [sys.executable, "-I", "-S", __file__, "serve", solution, entry_point,
         str(request_read), str(reply_write)],
        pass_fds=(request_read, reply_write), close_fds=True, stdin=subprocess.DEVNULL,
        stdout=output.write_fd, stderr=output.write_fd)
    for fd in (request_read, reply_write, output.write_fd):
        os.close(fd)

    def proxy(*args, **kwargs):
        send(request_write, {"args": encode(list(args)), "kwargs": encode(dict(kwargs))})
        reply = receive(reply_read)
        if reply is None:
            raise CandidateError("the candidate process exited before answering")
        if type(reply) is not dict or len(reply) != 1:
            raise CandidateError("malformed reply from the candidate process")
        if "error" in reply:
            raise CandidateError(str(reply["error"]))
        return decode(reply["ok"])

    namespace = {"__name__": "__check__", "__builtins__": __builtins__}
    helper_source = helpers
    if helper_source.strip():
        try:
            helper_code = _trusted_code(helper_source, "<helpers>")
        except SyntaxError:
            helper_code = None
        if helper_code is not None:
            exec(helper_code, namespace)
    namespace[entry_point] = proxy
    exec(_trusted_code(tests, "<tests>"), namespace)
    try:
        namespace["check"](proxy)
    finally:
        os.close(request_write)
        candidate.kill()
        candidate.wait()
        output.pass_on()
    sys.stdout.flush()
    os.write(result_fd, b"passed")


def main(argv):
    mode, args = argv[1], argv[2:]
    if mode == "run":
        _run(args[0], int(args[1]))
    elif mode == "serve":
        _serve(args[0], args[1], int(args[2]), int(args[3]))
    elif mode == "check":
        try:
            _check(args[0], args[1], int(args[2]))
        except BaseException:
            traceback.print_exc()
            sys.exit(1)
    else:
        raise SystemExit(f"unknown sandbox runner mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
