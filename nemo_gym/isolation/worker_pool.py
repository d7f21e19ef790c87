"""A pool of worker processes that run a named function with a hard time limit per call.

Why: verifiers hand model output to libraries (sympy, math-verify, task scorers) that can run for hours on an
adversarial answer, often inside one C call that holds the GIL. In the server process that would freeze every
request, and a thread cannot be interrupted. So each call runs in a worker process; a worker that has not answered
within the time limit, or that dies, is killed (SIGKILL) and replaced. Only that one call fails; the other workers
and the server carry on.

    pool = WorkerPool(num_workers=2, timeout_s=20.0, preload=["math_verify"])
    result = await pool.run(grade, expected, generated)  # or pool.run("package.module:grade", ...)
    # raises WorkerTimeout / WorkerCrashed / WorkerError

What runs is named, not pickled: `module:qualname`, taken from a module-level function or given as a string, so the
worker imports the module itself (never the server's `__main__` script). Arguments and results travel pickled.
Server-specific state, such as a cache of scorers, belongs in the named function's module: it lives as long as the
worker does.

A worker is a fresh interpreter (`subprocess`, not `fork`: forking a server that already runs threads is unsafe;
not multiprocessing's spawn either: it re-imports the server's main script) with the server's `sys.path`, talking
to the server over a socket pair. Workers start lazily (the first call on a slot pays the start-up, which is not
part of the call's time limit) and stop when the pool is closed, when the server exits (atexit), or by themselves
when their socket closes (the server died). Each worker serves one call at a time; calls beyond `num_workers` wait
their turn in the pool's own threads, so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional, Sequence, Union

__all__ = ["WorkerPool", "WorkerTimeout", "WorkerCrashed", "WorkerError", "function_name"]

# Starting a worker imports its preload modules (sympy, reasoning-gym, ...): generous, and not part of a call's limit.
DEFAULT_START_TIMEOUT_S = 180.0
_READY = "ready"


class WorkerTimeout(TimeoutError):
    """The call did not finish within the time limit; its worker was killed."""


class WorkerCrashed(RuntimeError):
    """The worker died during the call (killed from outside, out of memory, a crash in C code), or did not start."""


class WorkerError(RuntimeError):
    """The function raised in the worker. The message is `<ExceptionType>: <message>` from the worker."""


def function_name(fn: Union[str, Callable]) -> str:
    """`module:qualname` for a module-level function (what a worker can import), checked; a string is taken as is."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"{fn!r}: expected 'package.module:function'")
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname:
        raise ValueError(f"{fn!r} has no module or name: a worker cannot import it")
    if module == "__main__":
        raise ValueError(f"{fn!r} is defined in the __main__ script: a worker cannot import it")
    if "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(f"{fn!r} is not a module-level function: a worker cannot import it")
    return f"{module}:{qualname}"


def _resolve(name: str, cache: dict[str, Callable]) -> Callable:
    if name not in cache:
        import importlib

        module_name, qualname = name.split(":", 1)
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        cache[name] = target
    return cache[name]


def serve(fd: int, preload: str = "") -> None:
    """Worker side, on the socket `fd`: import the `preload` modules (comma-separated), say "ready", then answer
    `(name, args)` with `("ok", result)` or `("error", text)` until the socket closes."""
    import importlib

    # Ctrl-C on the process group is for the server; the worker ends when its socket does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    for module in filter(None, preload.split(",")):
        importlib.import_module(module)  # before "ready", so a slow import never counts against a call
    conn.send(_READY)
    functions: dict[str, Callable] = {}
    while True:
        try:
            name, args = conn.recv()
        except (EOFError, OSError):  # the pool was closed, or the server exited
            return
        try:
            reply = ("ok", _resolve(name, functions)(*args))
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the worker stays usable
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return
        except Exception as exc:  # an unpicklable result
            conn.send(("error", f"the result could not be sent back: {type(exc).__name__}: {exc}"))


class _Worker:
    """One worker process and the server's end of its socket."""

    def __init__(self, start_timeout_s: float, preload: Sequence[str]) -> None:
        ours, theirs = socket.socketpair()
        # The worker imports what the server can import: the server's sys.path, and -P so the working folder is not
        # put first (a folder named like a package, e.g. resources_servers/reasoning_gym, must not shadow it).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = f"import sys; from {__name__} import serve; serve(int(sys.argv[1]), sys.argv[2])"
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-c", command, str(theirs.fileno()), ",".join(preload)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        try:
            ready = self.conn.poll(start_timeout_s) and self.conn.recv() == _READY
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.kill()
            raise WorkerCrashed(
                f"a worker process did not start within {start_timeout_s:g} s (exit code {self.process.returncode})"
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a SIGKILLed process not reaped in 10 s
            pass
        self.conn.close()

    def call(self, name: str, args: tuple, timeout_s: float) -> Any:
        try:
            self.conn.send((name, args))
            # poll() also wakes up when the worker dies (the socket closes): recv() then raises EOFError.
            answered = self.conn.poll(timeout_s)
            if answered:
                status, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            raise WorkerCrashed(
                f"the worker process died during the call ({type(exc).__name__}, exit code {self.process.returncode})"
            ) from None
        if not answered:
            raise WorkerTimeout(f"did not finish within {timeout_s:g} s")
        if status == "error":
            raise WorkerError(value)
        return value


class WorkerPool:
    """`num_workers` worker processes, each call limited to `timeout_s` once a worker has it. Usable from any event
    loop (`run`) or thread (`run_blocking`)."""

    def __init__(
        self,
        num_workers: int = 1,
        timeout_s: float = 20.0,
        *,
        preload: Sequence[str] = (),
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.preload = tuple(preload)  # modules a new worker imports before it counts as started
        self.start_timeout_s = start_timeout_s
        # One slot per worker; a slot holds a live worker or None (started by the next call that takes the slot).
        # Taking a slot from the queue is what limits the pool to one call per worker.
        self._slots: "queue.Queue[list[Optional[_Worker]]]" = queue.Queue()
        self._all_slots: list[list[Optional[_Worker]]] = []
        for _ in range(num_workers):
            slot: list[Optional[_Worker]] = [None]
            self._slots.put(slot)
            self._all_slots.append(slot)
        self._threads: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(_close_at_exit, weakref.ref(self))  # a weakref: the pool may be collected before exit

    async def run(self, fn: Union[str, Callable], *args: Any, timeout_s: Optional[float] = None) -> Any:
        """`fn(*args)` in a worker process, within `timeout_s` (default: the pool's). Cancelling the awaiting task
        does not stop the call: it finishes, or times out, in its worker."""
        name = function_name(fn)  # checked here, so a bad function fails in the caller, not in a worker
        if self._closed:
            raise RuntimeError("the pool is closed")
        limit = self.timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), self.run_blocking, name, args, limit)

    def run_blocking(self, fn: Union[str, Callable], args: tuple = (), timeout_s: Optional[float] = None) -> Any:
        """The same, blocking the calling thread."""
        name = function_name(fn)
        limit = self.timeout_s if timeout_s is None else timeout_s
        if self._closed:
            raise RuntimeError("the pool is closed")
        slot = self._slots.get()
        try:
            if self._closed:
                raise RuntimeError("the pool is closed")
            if slot[0] is not None and not slot[0].alive():  # died while idle
                slot[0].kill()
                slot[0] = None
            if slot[0] is None:
                slot[0] = _Worker(self.start_timeout_s, self.preload)
            worker = slot[0]
            try:
                return worker.call(name, tuple(args), limit)
            except (WorkerTimeout, WorkerCrashed):
                worker.kill()  # a timed-out worker may still be busy: kill it; the next call starts a fresh one
                slot[0] = None
                raise
        finally:
            self._slots.put(slot)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for tests and debugging)."""
        return [slot[0].process.pid for slot in self._all_slots if slot[0] is not None and slot[0].alive()]

    def close(self) -> None:
        """Kill every worker; calls in progress fail with WorkerCrashed. The pool cannot be used afterwards."""
        self._closed = True
        for slot in self._all_slots:
            worker = slot[0]
            if worker is not None:
                worker.kill()
                slot[0] = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> ThreadPoolExecutor:
        # Threads of its own (not the loop's default executor), one per worker: waiting calls never starve
        # other users of the default executor.
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="worker-pool")
            return self._threads


def _close_at_exit(pool_ref: "weakref.ref[WorkerPool]") -> None:
    pool = pool_ref()
    if pool is not None and not pool._closed:
        pool.close()
