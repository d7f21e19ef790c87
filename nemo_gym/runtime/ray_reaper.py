"""Ray's processes of a cluster this process started end with it, however it ends (issue 37).

`ray.init` starts the GCS, the raylet and its helpers as children armed to die with the process that started
them, but the raylet's own children, the dashboard agent and the runtime-env agent, only notice it is gone by
polling, and then spend about a minute trying to report that to the dead GCS, still listening. After `kill -9`
of `ng_run` they lived for 61 s.

So the process that starts a local cluster also starts a reaper (`start_reaper`): a small process in its own
session (a signal to `ng_run`'s process group does not reach it) that remembers the session's processes, the
ones `ray.init` started and, every `REFRESH_S`, their descendants, each by pid and start time (a reused pid is
never killed). When the process that started Ray ends (a pidfd where the kernel has them, else re-parenting), or
when it sends SIGTERM (`stop_reaper`, after `ray.shutdown()`), the reaper SIGKILLs whatever of them is still alive
and exits. Nothing outside that tree is touched: other Ray sessions on the machine, or a cluster the stack only
joined, are left alone.

Run as `python -m nemo_gym.runtime.ray_reaper <owner pid> <pid>:<start time> ...`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Iterable, Optional

REFRESH_S = 2.0  # new processes of the session are noticed this often; its owner's end at once (pidfd)
KILL_WAIT_S = 5.0

Proc = tuple[int, float]  # pid, start time (psutil's create_time)


def children_now() -> set[Proc]:
    """This process's live children, as (pid, start time)."""
    import psutil

    found = set()
    for child in psutil.Process().children():
        try:
            found.add((child.pid, child.create_time()))
        except psutil.Error:
            pass
    return found


def start_reaper(roots: Iterable[Proc]) -> Optional[subprocess.Popen]:
    """Start the reaper of the processes `roots` (and their descendants) for this process; None if there is
    nothing to watch or it cannot start."""
    roots = sorted(set(roots))
    if not roots:
        return None
    from nemo_gym import PARENT_DIR

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PARENT_DIR), env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "-m", "nemo_gym.runtime.ray_reaper", str(os.getpid())]
    argv += [f"{pid}:{start!r}" for pid, start in roots]
    try:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        return None


def stop_reaper(reaper: Optional[subprocess.Popen], timeout: float = KILL_WAIT_S + 5.0) -> None:
    """Ray was shut down: the reaper kills what is left of the session now, and exits."""
    if reaper is None or reaper.poll() is not None:
        return
    reaper.send_signal(signal.SIGTERM)
    try:
        reaper.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


# ------------------------------------------------------------------------------------------ reaper side


class _Reap(Exception):
    pass


def _raise_reap(signum, frame) -> None:
    raise _Reap()


def _same(pid: int, start: float):
    """The live process `pid` if it is still the one that started at `start`, else None."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc if proc.create_time() == start and proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def _with_descendants(known: set[Proc]) -> set[Proc]:
    """`known` plus the live descendants of those still alive (one pass over the process table)."""
    import psutil

    children: dict[int, list] = {}
    for proc in psutil.process_iter(["ppid"]):
        children.setdefault(proc.info["ppid"], []).append(proc)
    found = set(known)
    todo = [pid for pid, start in known if _same(pid, start) is not None]
    while todo:
        for child in children.get(todo.pop(), ()):
            try:
                entry = (child.pid, child.create_time())
            except psutil.Error:
                continue
            if entry not in found:
                found.add(entry)
                todo.append(child.pid)
    return found


def _wait_for_owner(owner: int, known: set[Proc]) -> set[Proc]:
    """Track the session's processes until the owner has gone (or `_Reap` is raised); return them."""
    from nemo_gym.runtime.supervisor_watch import _open_pidfd

    try:
        pidfd = _open_pidfd(owner)
    except ProcessLookupError:
        return known
    poller = None
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
    try:
        while os.getppid() == owner:
            known = _with_descendants(known)
            if poller is not None:
                if poller.poll(REFRESH_S * 1000):
                    break
            else:
                time.sleep(REFRESH_S)
    except _Reap:
        pass
    return known


def reap(known: set[Proc]) -> int:
    """SIGKILL every process of `known` (and its descendants) that is still the same process; wait until they
    are gone (bounded). Returns how many were killed."""
    procs = [p for p in (_same(pid, start) for pid, start in _with_descendants(known)) if p is not None]
    for proc in procs:
        try:
            proc.kill()
        except Exception:
            pass
    import psutil

    psutil.wait_procs(procs, timeout=KILL_WAIT_S)
    return len(procs)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _raise_reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    owner = int(argv[0])
    known: set[Proc] = set()
    for item in argv[1:]:
        pid, _, start = item.partition(":")
        known.add((int(pid), float(start)))
    try:
        known = _wait_for_owner(owner, known)
    except _Reap:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # from here on, finish the job
    killed = reap(known)
    if killed and os.getppid() != owner:
        sys.stderr.write(f"ng_run (pid {owner}) is gone: stopped the {killed} Ray processes it had started.\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - runs as its own process
    sys.exit(main(sys.argv[1:]))
