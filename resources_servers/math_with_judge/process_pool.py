"""A few worker processes that run a function under a hard time limit.

Why: math-verify guards its own parsing and comparison with `signal.alarm`, which only works in a process's main
thread and only interrupts Python bytecode (a long call inside C code finishes first). A server must not hang on
one pathological answer, so each check runs in a worker process: the worker's main thread lets math-verify's own
timeouts work, and if the worker has not answered within `timeout_s` it is killed (SIGKILL) and replaced. Only
that one call fails; the other workers and the server carry on.

    pool = HardTimeoutPool(num_workers=2, timeout_s=20.0, preload=["math_verify"])
    result = await pool.run(grade, expected, generated)  # raises WorkerTimeout / WorkerCrashed / WorkerError

`fn` and its arguments are pickled to the worker, so `fn` must be a module-level function of an importable module
(not of the script being run as `__main__`). A worker is a fresh interpreter (`subprocess`, not `fork`: forking a
server that already runs threads is unsafe) that imports only this module and `fn`'s, talking to the server over a
socket pair. Workers start lazily (the first call pays the start-up) and are killed at the latest when the server
exits: they also stop by themselves when their socket closes. Each worker serves one call at a time; calls beyond
`num_workers` wait their turn. The pool works from any event loop (the waiting happens in its own threads).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import queue
import socket
import subprocess
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional, Sequence

__all__ = ["HardTimeoutPool", "WorkerTimeout", "WorkerCrashed", "WorkerError"]

# Starting a worker imports its modules (sympy and friends): generous, and not part of a call's time limit.
DEFAULT_START_TIMEOUT_S = 120.0
_READY = "ready"


class WorkerTimeout(TimeoutError):
    """The call did not finish within the time limit; its worker was killed."""


class WorkerCrashed(RuntimeError):
    """The worker died during the call (killed from outside, out of memory, a crash in C code)."""


class WorkerError(RuntimeError):
    """`fn` raised in the worker. The message is `<ExceptionType>: <message>` from the worker."""


def serve(fd: int, preload: str = "") -> None:
    """Worker side: import the `preload` modules (comma-separated), then answer `(fn, args)` with
    `("ok", result)` or `("error", text)` until the socket closes."""
    import importlib

    conn = Connection(fd)
    try:
        for module in filter(None, preload.split(",")):
            importlib.import_module(module)
        conn.send(_READY)
        while True:
            try:
                fn, args = conn.recv()
            except EOFError:  # the server closed the pool or exited
                return
            try:
                reply = ("ok", fn(*args))
            except Exception as exc:  # noqa: BLE001 - reported to the caller; the worker stays usable
                reply = ("error", f"{type(exc).__name__}: {exc}")
            try:
                conn.send(reply)
            except (BrokenPipeError, ConnectionResetError):
                return
            except Exception as exc:  # an unpicklable result
                conn.send(("error", f"the result could not be sent back: {type(exc).__name__}: {exc}"))
    except (KeyboardInterrupt, BrokenPipeError, ConnectionResetError):  # Ctrl-C on the process group
        return


class _Worker:
    def __init__(self, start_timeout_s: float, preload: Sequence[str]) -> None:
        ours, theirs = socket.socketpair()
        command = f"import sys; from {__name__} import serve; serve(int(sys.argv[1]), sys.argv[2])"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", command, str(theirs.fileno()), ",".join(preload)],
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
            raise WorkerCrashed(f"worker process did not start (exit code {self.process.returncode})")

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

    def call(self, fn: Callable, args: tuple, timeout_s: float) -> Any:
        try:
            self.conn.send((fn, args))
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise WorkerCrashed(f"worker process is gone ({exc})") from None
        if not self.conn.poll(timeout_s):
            raise WorkerTimeout(f"no answer within {timeout_s:g} s")
        try:
            status, value = self.conn.recv()
        except (EOFError, OSError):
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            raise WorkerCrashed(f"worker process died (exit code {self.process.returncode})") from None
        if status == "error":
            raise WorkerError(value)
        return value


class HardTimeoutPool:
    def __init__(
        self,
        num_workers: int = 1,
        timeout_s: float = 20.0,
        *,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        preload: Sequence[str] = (),
    ) -> None:
        if num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.preload = tuple(preload)  # modules a new worker imports before it counts as started
        # One slot per worker; a slot holds a live worker or None (started on its next use).
        self._slots: "queue.Queue[list[Optional[_Worker]]]" = queue.Queue()
        self._all_slots: list[list[Optional[_Worker]]] = []
        for _ in range(num_workers):
            slot: list[Optional[_Worker]] = [None]
            self._slots.put(slot)
            self._all_slots.append(slot)
        self._threads: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(_close_at_exit, weakref.ref(self))

    async def run(self, fn: Callable, *args: Any, timeout_s: Optional[float] = None) -> Any:
        """`fn(*args)` in a worker process; at most `timeout_s` (default: the pool's) once the worker has it."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        if self._closed:
            raise RuntimeError("the pool is closed")
        if getattr(fn, "__module__", None) == "__main__":
            raise ValueError(f"{fn!r} is defined in the __main__ script: a worker cannot import it")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), self.run_blocking, fn, args, limit)

    def run_blocking(self, fn: Callable, args: tuple, timeout_s: float) -> Any:
        """The same, blocking the calling thread."""
        if self._closed:
            raise RuntimeError("the pool is closed")
        slot = self._slots.get()
        try:
            if slot[0] is not None and not slot[0].alive():  # died while idle
                slot[0].kill()
                slot[0] = None
            if slot[0] is None:
                slot[0] = _Worker(self.start_timeout_s, self.preload)
            worker = slot[0]
            try:
                return worker.call(fn, args, timeout_s)
            except (WorkerTimeout, WorkerCrashed):
                worker.kill()  # a timed-out worker may still be busy: kill it, start a fresh one next time
                slot[0] = None
                raise
        finally:
            self._slots.put(slot)

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (for tests and debugging)."""
        return [slot[0].process.pid for slot in self._all_slots if slot[0] is not None and slot[0].alive()]

    def close(self) -> None:
        """Kill every worker. Calls still waiting fail; the pool cannot be used afterwards."""
        self._closed = True
        for slot in self._all_slots:
            if slot[0] is not None:
                slot[0].kill()
                slot[0] = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="hard-timeout-pool")
            return self._threads


def _close_at_exit(pool_ref: "weakref.ref[HardTimeoutPool]") -> None:
    pool = pool_ref()
    if pool is not None and not pool._closed:
        pool.close()
