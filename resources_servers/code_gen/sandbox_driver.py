"""The test driver that runs *inside* the sandbox (standard library only; copied there as `driver.py`).

It never sees an expected output: it runs the model's program on the inputs the trusted side sends, one test at a
time, and reports what the program did. Judging happens outside (`harness.py`), so nothing the program does in
here can fake a pass.

Protocol: one JSON object per line on stdin (requests) and stdout (replies).

    -> {"op": "init", "mode": "stdio" | "call", "fn_name": str | null, "timeout": secs, "max_output": bytes,
        "sweep": bool}
    <- {"ok": true} | {"ok": false, "compile_error": "<traceback>"}
    -> {"op": "run", "stdin": "<text>"}            (stdio mode)
    -> {"op": "run", "args": [...]}                (call mode: positional arguments)
    <- {"status": "ok" | "timeout" | "error", "time": secs, "stdout": "...", "return": "<json text>" | null,
        "error": "<why, e.g. the traceback>"}
    -> {"op": "exit"}  (or end of input)

Each test runs in a fresh child forked from the driver (the solution is compiled once): its stdin, stdout and
stderr are pipes the driver services while it waits, its own process group, a wall-clock `timeout` after which
the group is killed. With `sweep` (the sandbox has a PID namespace or a dedicated uid) every other process of
the sandbox user is killed after each test too, so nothing a test started in the background survives into the
next one.
"""

import builtins
import io
import json
import os
import select
import signal
import sys
import time
import traceback

SOLUTION_FILE = "solution.py"

# Names a solution may use without importing them, as on judges with a Python prelude (LeetCode-style code often
# writes `List[int]` or `deque()` without imports). Module names, then `from <module> import *` for these.
PRELUDE_MODULES = (
    "bisect", "collections", "copy", "functools", "heapq", "itertools", "math", "operator", "random", "re",
    "string", "sys",
)
PRELUDE_STAR_IMPORTS = ("typing", "collections", "heapq", "bisect", "itertools", "functools")

STDERR_KEEP = 16 * 1024


def _exit(code=None):
    raise SystemExit(code)


def _prelude() -> dict:
    namespace: dict = {}
    for name in PRELUDE_STAR_IMPORTS:
        module = __import__(name)
        public = getattr(module, "__all__", None) or [attr for attr in dir(module) if not attr.startswith("_")]
        for attr in public:
            if hasattr(module, attr):
                namespace[attr] = getattr(module, attr)
    for name in PRELUDE_MODULES:
        namespace[name] = __import__(name)
    return namespace


def _find_function(namespace: dict, fn_name: str):
    """`Solution().<fn_name>` when the code defines class Solution with that method, else a top-level function."""
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, fn_name):
        return getattr(solution(), fn_name)
    function = namespace.get(fn_name)
    if callable(function):
        return function
    raise NameError(f"no function {fn_name!r}: define it at the top level or as a method of class Solution")


def _child(compiled, prelude: dict, mode: str, fn_name, args, fds) -> None:
    """The test process: never returns."""
    stdin_r, stdout_w, stderr_w, result_w = fds
    code = 1
    try:
        os.setpgid(0, 0)
        os.dup2(stdin_r, 0)
        os.dup2(stdout_w, 1)
        os.dup2(stderr_w, 2)
        for fd in (stdin_r, stdout_w, stderr_w):
            os.close(fd)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace", line_buffering=True
        )
        sys.argv = [SOLUTION_FILE]
        namespace = dict(prelude)
        namespace.update({"__name__": "__main__", "__file__": SOLUTION_FILE, "__builtins__": builtins})
        exec(compiled, namespace)
        if mode == "call":
            value = _find_function(namespace, fn_name)(*args)
            try:
                text = json.dumps(value)
            except (TypeError, ValueError) as err:
                raise TypeError(f"the return value is not JSON-serializable: {err}") from None
            data = text.encode()
            while data:
                data = data[os.write(result_w, data) :]
        code = 0
    except SystemExit as exit_:
        if exit_.code is None or exit_.code == 0:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code & 0xFF or 1
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException as err:  # noqa: BLE001 - the program's own failure
        try:
            tb = err.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next  # show the program's frames, not the driver's
            traceback.print_exception(type(err), err, tb)
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - e.g. the reader is gone
                code = code or 1
        os._exit(code)


def _kill_leftovers(pid: int, sweep: bool) -> None:
    """Kill the test's process group and, with `sweep`, every other process of this user (never this one). Call
    after the test process itself has been reaped."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if sweep:
        for _ in range(200):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                break
            _reap()
            time.sleep(0.001)
    _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_test(compiled, prelude: dict, config: dict, request: dict) -> dict:
    mode = config["mode"]
    timeout = float(config["timeout"])
    cap = int(config["max_output"])
    sweep = bool(config.get("sweep"))
    stdin_data = request.get("stdin", "").encode() if mode == "stdio" else b""
    args = request.get("args", []) if mode == "call" else None

    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    result_r, result_w = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        for fd in (stdin_w, stdout_r, stderr_r, result_r):
            os.close(fd)
        _child(compiled, prelude, mode, config.get("fn_name"), args, (stdin_r, stdout_w, stderr_w, result_w))
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    for fd in (stdin_r, stdout_w, stderr_w, result_w):
        os.close(fd)

    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    buffers = {stdout_r: bytearray(), stderr_r: bytearray(), result_r: bytearray()}
    open_readers = set(buffers)
    for fd in buffers:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLIN)
    pending = memoryview(stdin_data)
    if pending:
        os.set_blocking(stdin_w, False)
        poller.register(stdin_w, select.POLLOUT)
    else:
        os.close(stdin_w)
        stdin_w = None

    deadline = started + timeout
    exited = timed_out = too_much = False
    status = 0
    elapsed = 0.0
    drain_deadline = 0.0
    while (open_readers or not exited) and not too_much:
        now = time.perf_counter()
        limit = drain_deadline if exited else deadline
        if now >= limit:
            timed_out = not exited
            break
        for fd, _events in poller.poll(max(1, int((limit - now) * 1000))):
            if fd == pidfd:
                _, status = os.waitpid(pid, 0)
                elapsed = time.perf_counter() - started
                exited = True
                poller.unregister(pidfd)
                _kill_leftovers(pid, sweep)  # background processes would keep the pipes open
                drain_deadline = time.perf_counter() + 1.0
            elif fd == stdin_w:
                try:
                    pending = pending[os.write(fd, pending[: 1 << 16]) :]
                except BlockingIOError:
                    continue
                except BrokenPipeError:
                    pending = memoryview(b"")
                if not pending:
                    poller.unregister(fd)
                    os.close(fd)
                    stdin_w = None
            elif fd in open_readers:
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    poller.unregister(fd)
                    open_readers.discard(fd)
                    continue
                buffer = buffers[fd]
                buffer += chunk
                if fd == stderr_r:
                    if len(buffer) > STDERR_KEEP:
                        del buffer[: len(buffer) - STDERR_KEEP]
                elif len(buffer) > cap:
                    too_much = True
    if not exited:
        elapsed = time.perf_counter() - started
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, status = os.waitpid(pid, 0)
        _kill_leftovers(pid, sweep)
    for fd in (pidfd, stdout_r, stderr_r, result_r, stdin_w):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    stdout, stderr, result = (bytes(buffers[fd]) for fd in (stdout_r, stderr_r, result_r))
    reply = {"time": round(elapsed, 6), "stdout": stdout[:cap].decode(errors="replace"), "return": None}
    stderr_text = stderr.decode(errors="replace").strip()
    if timed_out:
        reply.update(status="timeout", error=f"wall-clock time limit of {timeout:g} s exceeded")
    elif too_much:
        reply.update(status="error", error=f"output limit exceeded (more than {cap} bytes)")
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            reply.update(status="timeout", error=f"CPU time limit exceeded ({signal.Signals(sig).name})")
        elif sig == signal.SIGXFSZ:
            reply.update(status="error", error="file size limit exceeded")
        else:
            reply.update(status="error", error=f"killed by {signal.Signals(sig).name}\n{stderr_text}".strip())
    elif os.waitstatus_to_exitcode(status) != 0:
        reply.update(status="error", error=stderr_text or f"exit code {os.waitstatus_to_exitcode(status)}")
    elif mode == "call" and not result:
        reply.update(status="error", error=stderr_text or "the program exited before the function returned")
    else:
        reply.update(status="ok", error=None)
        if mode == "call":
            reply["return"] = result.decode(errors="replace")
    return reply


def _send(obj: dict) -> None:
    data = json.dumps(obj, ensure_ascii=False).encode("utf-8", errors="replace") + b"\n"
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def main() -> None:
    protocol_in = io.BufferedReader(io.FileIO(0, "r", closefd=False))
    os.set_blocking(1, True)
    builtins.exit = builtins.quit = _exit  # `site` (not loaded with -S) would have defined these
    try:  # non-dumpable: test processes (same uid) cannot ptrace this one or open its fds through /proc
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001
        pass
    config = None
    compiled = None
    prelude: dict = {}
    for line in iter(protocol_in.readline, b""):
        request = json.loads(line)
        op = request.get("op")
        if op == "init":
            config = request
            try:
                with open(SOLUTION_FILE, "rb") as f:
                    compiled = compile(f.read(), SOLUTION_FILE, "exec")
            except BaseException:  # noqa: BLE001 - SyntaxError, ValueError (null bytes), ...
                _send({"ok": False, "compile_error": traceback.format_exc(limit=0)})
                continue
            prelude = _prelude()
            _send({"ok": True})
        elif op == "run" and compiled is not None:
            _send(run_test(compiled, prelude, config, request))
        else:
            break


if __name__ == "__main__":
    main()
