"""Child processes that die with the process that started them (docs/design.md, decision 15).

`PR_SET_PDEATHSIG` (Linux) makes the kernel send a signal to a child when its parent dies, SIGKILL of the parent
included. Two traps, both handled here:

- It fires when the parent *thread* that forked the child exits, not the parent process. A server restarted by
  `ng_run`'s supervision thread, or started by a `RunHelper` driven from a worker thread, would be killed as soon
  as that thread ends. `popen_dying_with_parent` therefore forks from the main thread, or else from one
  long-lived daemon thread of this module that only ends with the process.
- It reaches only the direct child. What the child starts (uvicorn workers, worker pools, a wrapper's real
  program) is not covered: the server side watches its supervisor and kills its whole process group
  (runtime/supervisor_watch.py), and once that watcher runs it clears the signal set here, so the server is not
  killed before it could take its group along.

The race between fork and `prctl` (the parent dies in between, so the signal is never sent) is closed by
checking, after `prctl`, that the parent is still the one that forked.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from typing import Any, Callable, Optional

PR_SET_PDEATHSIG = 1

_spawner_lock = threading.Lock()
_spawner_queue: "Optional[queue.Queue]" = None


def set_parent_death_signal(sig: int) -> bool:
    """`prctl(PR_SET_PDEATHSIG, sig)` for the calling process (0 clears it). False where not supported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except Exception:
        return False


def die_with_parent_preexec(parent_pid: Optional[int] = None, sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` for `subprocess.Popen`: the child gets `sig` when the forking thread exits; if the parent
    `parent_pid` (default: the calling process) is already gone when the signal is armed, the child exits."""
    expected = os.getpid() if parent_pid is None else parent_pid

    def preexec() -> None:  # pragma: no cover - runs in the forked child
        set_parent_death_signal(sig)
        if os.getppid() != expected:
            os._exit(1)

    return preexec


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """`preexec_fn` without arguments (kept for runtime/ray_actors.py): SIGKILL when the forking thread exits."""
    set_parent_death_signal(signal.SIGKILL)


def _spawner_loop(jobs: "queue.Queue") -> None:
    while True:
        func, done = jobs.get()
        try:
            done["result"] = func()
        except BaseException as exc:  # handed back to the caller's thread
            done["error"] = exc
        done["event"].set()


def _run_in_spawner(func: Callable[[], Any]) -> Any:
    global _spawner_queue
    with _spawner_lock:
        if _spawner_queue is None:
            _spawner_queue = queue.Queue()
            threading.Thread(
                target=_spawner_loop, args=(_spawner_queue,), name="nemo_gym-spawner", daemon=True
            ).start()
        jobs = _spawner_queue
    done: dict[str, Any] = {"event": threading.Event()}
    jobs.put((func, done))
    done["event"].wait()
    if "error" in done:
        raise done["error"]
    return done["result"]


def popen_dying_with_parent(args: Any, **kwargs: Any) -> subprocess.Popen:
    """`subprocess.Popen(args, **kwargs)` whose child is SIGKILLed when this process dies, however it dies.

    Forks from the main thread, or else from this module's long-lived spawner thread (see the module docstring),
    so the child does not die with a short-lived thread. A `preexec_fn` in kwargs is run after arming the signal."""
    extra = kwargs.pop("preexec_fn", None)
    arm = die_with_parent_preexec()

    def preexec() -> None:  # pragma: no cover - runs in the forked child
        arm()
        if extra is not None:
            extra()

    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(args, preexec_fn=preexec, **kwargs)
    return _run_in_spawner(lambda: subprocess.Popen(args, preexec_fn=preexec, **kwargs))
