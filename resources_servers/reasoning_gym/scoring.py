"""Running reasoning-gym's scorers in worker processes with a hard time limit.

Why not call the scorer in the server: some scorers hand the model's answer to sympy, and an answer such as
`x**(9**9**9)` makes that run for hours inside one C call that holds the GIL. In the server process it would freeze
every request; in a thread it could not be interrupted either. So each score is computed in a worker process, and a
worker that has not answered within the time limit is killed (SIGKILL) and replaced; only that one call fails.

    pool = ScoringPool(num_workers=2, timeout_s=10.0)
    score = await pool.score("leg_counting", "146", {"question": ..., "answer": "146", "metadata": {...}})
    # raises ScoreTimeout / ScorerCrashed / ScorerError

Workers are fresh interpreters (forking a server that already runs threads is unsafe) talking to the server over a
socket pair. They start on first use, import reasoning-gym once, keep one scorer per task, serve one call at a
time, and exit when the server does (their socket closes). Calls beyond `num_workers` wait in a dedicated thread
pool, so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["ScoringPool", "ScoreTimeout", "ScorerCrashed", "ScorerError", "score_in_this_process", "serve"]

START_TIMEOUT_S = 180.0  # importing reasoning-gym (matplotlib, sympy, ...) in a new worker; not part of a call's limit
_READY = "ready"
REPO_ROOT = Path(__file__).resolve().parents[2]  # holds resources_servers/: the worker imports this module


class ScoreTimeout(TimeoutError):
    """The scorer did not finish within the time limit; its worker was killed."""


class ScorerCrashed(RuntimeError):
    """The worker died during the call (out of memory, a crash in C code, killed from outside)."""


class ScorerError(RuntimeError):
    """The scorer raised. The message is `<ExceptionType>: <message>` from the worker."""


@functools.lru_cache(maxsize=None)
def _scorer(task_name: str) -> Callable[[Optional[str], dict[str, Any]], float]:
    """The task's `score_answer`, bound to a dataset with the task's default configuration (what
    `reasoning_gym.get_score_answer_fn` returns). Built once per task: some take a second to build."""
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task_name)


def score_in_this_process(task_name: str, answer: Optional[str], entry: dict[str, Any]) -> float:
    """The task's own score for `answer` given the row `entry` (`question`, `answer`, `metadata`)."""
    return float(_scorer(task_name)(answer, entry))


def serve(fd: int) -> None:
    """Worker side, on the socket `fd`: answer `(task_name, answer, entry)` with `("ok", score)` or
    `("error", text)` until the socket closes (the server stopped, or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the server; the worker ends when its socket does
    import reasoning_gym  # noqa: F401  (imported before "ready" so the import never counts against a call)

    conn = Connection(fd)
    conn.send(_READY)
    while True:
        try:
            task_name, answer, entry = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", score_in_this_process(task_name, answer, entry))
        except Exception as exc:  # noqa: BLE001 - reported to the caller; the worker stays usable
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except OSError:
            return


class _Worker:
    """One worker process and the server's end of its socket."""

    def __init__(self) -> None:
        server_end, worker_end = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        # A fresh interpreter (not fork: the server runs threads), not multiprocessing's spawn either (it would
        # re-import the server's main script). -P: the working folder must not shadow the `reasoning_gym` package.
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-c", f"from {__name__} import serve; serve({worker_end.fileno()})"],
            pass_fds=(worker_end.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        worker_end.close()
        self.conn = Connection(server_end.detach())
        try:
            ready = self.conn.recv() if self.conn.poll(START_TIMEOUT_S) else None
        except (EOFError, OSError):
            ready = None
        if ready != _READY:
            self.kill()
            raise ScorerCrashed(f"a scoring worker did not start within {START_TIMEOUT_S:g} s")

    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, args: tuple, timeout_s: float) -> tuple[str, Any]:
        self.conn.send(args)
        if not self.conn.poll(timeout_s):
            raise ScoreTimeout(f"the scorer did not finish within {timeout_s:g} s")
        return self.conn.recv()  # EOFError when the worker died: poll() also wakes up on a closed socket

    def kill(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)
        self.conn.close()


class ScoringPool:
    """`num_workers` scoring processes, each limited to `timeout_s` per call. Usable from any event loop."""

    def __init__(self, num_workers: int = 2, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self._threads = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="reasoning-gym-scoring")
        # One slot per worker; None = not started yet (or killed): started by the next call that takes the slot.
        self._slots: "queue.SimpleQueue[Optional[_Worker]]" = queue.SimpleQueue()
        for _ in range(num_workers):
            self._slots.put(None)

    async def score(self, task_name: str, answer: Optional[str], entry: dict[str, Any]) -> float:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self._score_blocking, task_name, answer, entry)

    def _score_blocking(self, task_name: str, answer: Optional[str], entry: dict[str, Any]) -> float:
        worker = self._slots.get()
        try:
            if worker is not None and not worker.alive():  # died while idle
                worker.kill()
                worker = None
            if worker is None:
                worker = _Worker()
            status, value = worker.call((task_name, answer, entry), self.timeout_s)
        except ScoreTimeout:
            worker.kill()
            worker = None
            raise
        except (EOFError, OSError) as exc:
            if worker is not None:
                worker.kill()
            worker = None
            raise ScorerCrashed(f"the scoring worker died during the call ({type(exc).__name__})") from exc
        finally:
            self._slots.put(worker)
        if status != "ok":
            raise ScorerError(value)
        return value

    def close(self) -> None:
        """Stop the idle workers (one busy with a call stays until it is done). A later call starts new ones."""
        idle = []
        while True:
            try:
                idle.append(self._slots.get_nowait())
            except queue.Empty:
                break
        for worker in idle:
            if worker is not None:
                worker.kill()
            self._slots.put(None)
