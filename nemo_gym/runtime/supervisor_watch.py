"""Server side of "no orphans" (docs/design.md, decision 15): a server dies with its `ng_run`, and takes along
everything it started.

`ng_run` starts each server in its own session (process group) and passes its own pid in
`NEMO_GYM_SUPERVISOR_PID`. `watch_supervisor()`, called once when the server starts, runs a daemon thread that
waits for that process to end (a pidfd where the kernel has them, else polling every second whether the pid
is alive and still this process's parent) and then SIGKILLs the server's whole process group: the server, its
uvicorn workers, worker pools, anything else it started that stayed in the group. A process that is not the
leader of its group (it was not started by `ng_run`) kills only itself.

Once the watcher runs, the parent-death signal `ng_run` armed for this process (runtime/parent_death.py) is
cleared: that signal would kill the server alone, before the watcher could kill the group.

Without `NEMO_GYM_SUPERVISOR_PID` (a server started by hand, a test) this does nothing.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from typing import Optional

SUPERVISOR_PID_ENV_VAR_NAME = "NEMO_GYM_SUPERVISOR_PID"
POLL_INTERVAL_S = 1.0

_lock = threading.Lock()
_thread: Optional[threading.Thread] = None


def supervisor_pid_from_env() -> Optional[int]:
    value = os.environ.get(SUPERVISOR_PID_ENV_VAR_NAME, "").strip()
    try:
        pid = int(value)
    except ValueError:
        return None
    return pid if pid > 1 else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _open_pidfd(pid: int) -> Optional[int]:
    """A pidfd for `pid` (readable once it exits), None where unsupported; ProcessLookupError if it is gone."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError:  # kernel before 5.3, seccomp, ...
        return None


def _wait_for_exit(pid: int, is_parent: bool, pidfd: Optional[int]) -> None:
    """Return once the supervisor process has ended."""
    poller = None
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
    while True:
        if poller is not None:
            if poller.poll(POLL_INTERVAL_S * 1000):
                return
        else:
            time.sleep(POLL_INTERVAL_S)
        if is_parent and os.getppid() != pid:  # re-parented: the supervisor is gone
            return
        if not is_parent and not _pid_alive(pid):
            return


def _kill_own_group(pid: int) -> None:
    label = os.environ.get("NEMO_GYM_CONFIG_PATH", "")
    prefix = f"({label}) " if label else ""
    try:
        sys.stderr.write(
            f"{prefix}ng_run (pid {pid}) is gone: stopping this server (pid {os.getpid()}) and every process it "
            f"started.\n"
        )
        sys.stderr.flush()
    except Exception:
        pass
    me = os.getpid()
    try:
        leader = os.getpgid(0) == me
    except OSError:
        leader = False
    try:
        if leader:
            os.killpg(me, signal.SIGKILL)
        os.kill(me, signal.SIGKILL)
    finally:
        os._exit(1)


def _watch(pid: int, is_parent: bool, pidfd: Optional[int]) -> None:
    try:
        _wait_for_exit(pid, is_parent, pidfd)
    except Exception:  # never let a broken watcher leave the server running unsupervised without a word
        while _pid_alive(pid) and (not is_parent or os.getppid() == pid):
            time.sleep(POLL_INTERVAL_S)
    _kill_own_group(pid)


def watch_supervisor() -> bool:
    """Start the watcher thread (once; later calls do nothing). Returns whether a watcher runs.

    No-op (False) when `NEMO_GYM_SUPERVISOR_PID` is unset or not a pid. If the supervisor is already gone, the
    process group is killed at once."""
    global _thread
    pid = supervisor_pid_from_env()
    if pid is None:
        return False
    with _lock:
        if _thread is not None:
            return True
        is_parent = os.getppid() == pid
        try:
            pidfd = _open_pidfd(pid)
        except ProcessLookupError:
            _kill_own_group(pid)
            return False  # not reached
        if is_parent and os.getppid() != pid:  # the supervisor died meanwhile (the pidfd may name a new process)
            _kill_own_group(pid)
        if not is_parent and not _pid_alive(pid):
            _kill_own_group(pid)
        _thread = threading.Thread(
            target=_watch, args=(pid, is_parent, pidfd), name="nemo_gym-supervisor-watch", daemon=True
        )
        _thread.start()
        # The watcher now kills the whole group; the parent-death SIGKILL would kill this process alone, first.
        from nemo_gym.runtime.parent_death import set_parent_death_signal

        set_parent_death_signal(0)
        return True
