"""Server blocks with `ray_actor_options` run as Ray actors, one per replica (docs/design.md, decision 24).

Each actor (`ServerActor`) starts the server exactly as `ng_run` starts a local one - the same interpreter
command, entrypoint, config and environment, handed an already-listening socket - but on the node Ray chose. It
binds that socket on the node's address (or loopback; `ray_bind_host`), port 0, so it always gets a free port,
and reports `host:port`, node id and pid through `info()`. If the server process exits, the actor exits too, so
Ray restarts it (`max_restarts`) on a new port; `ng_run` polls every actor (`RayReplica.poll`) and the head
server then serves the new address in `/server_instances`, where `ServerClient` finds it.

Why a process under the actor rather than uvicorn inside the actor: the server keeps its own interpreter (an
isolated venv), its own signal handling, multi-worker uvicorn and `NEMO_GYM_*` environment, exactly as on one
machine; a crash of the server cannot take the Ray worker with it unnoticed; and killing the actor kills the
server's whole process group.

`ray` is imported only by code that runs when some block asks for actors.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

NODE_IP = "node_ip"  # `ray_bind_host` value: the address Ray knows this node by
READY_TIMEOUT_S = 600.0
TAIL_LINES = 40


# The server dies with the actor's process, even when Ray kills that with SIGKILL (runtime/parent_death.py).
from nemo_gym.runtime.parent_death import _die_with_parent  # noqa: E402


class ServerActor:
    """One replica of a server block: runs the server's process on this node and reports where it listens."""

    def __init__(self, argv: list[str], cwd: str, env: dict[str, str], bind_host: str, label: str):
        import ray

        self.label = label
        self.tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
        self.node_id = ray.get_runtime_context().get_node_id()
        host = ray.util.get_node_ip_address() if bind_host == NODE_IP else bind_host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(2048)
        self.host, self.port = host, self.sock.getsockname()[1]
        fd = self.sock.fileno()
        os.set_inheritable(fd, True)
        from nemo_gym.config.global_config import NEMO_GYM_LISTEN_FD_ENV_VAR_NAME

        env = {**env, NEMO_GYM_LISTEN_FD_ENV_VAR_NAME: str(fd)}
        # Its own process group (stopped as a whole), and it dies with this actor's process.
        self.popen = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(fd,), start_new_session=True, preexec_fn=_die_with_parent,
        )
        self.start_time = time.time()
        self.healthy = False
        self.stopping = False
        threading.Thread(target=self._forward, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _forward(self) -> None:
        """The server's output goes to this actor's stdout (Ray forwards it to `ng_run`) and into a tail."""
        assert self.popen.stdout is not None
        own = f"({self.label.split('[')[0]}) "  # the server prefixes its lines with its id; the label replaces it
        for raw in iter(self.popen.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.tail.append(line)
            print(f"({self.label}) {line[len(own):] if line.startswith(own) else line}", flush=True)

    def _watch(self) -> None:
        """Health until the first 200, then wait for the process: when it exits, this actor exits, and Ray
        restarts it (or marks it dead once `max_restarts` is spent)."""
        import httpx

        url = f"http://{'[' + self.host + ']' if ':' in self.host else self.host}:{self.port}/health"
        with httpx.Client(trust_env=False, timeout=httpx.Timeout(2.0, connect=0.5)) as client:
            while self.popen.poll() is None and not self.healthy:
                try:
                    self.healthy = client.get(url).status_code == 200
                except httpx.HTTPError:
                    pass
                if not self.healthy:
                    time.sleep(0.05)
        code = self.popen.wait()
        if self.stopping:
            return
        time.sleep(0.2)  # let the reader thread print the last lines
        print(f"({self.label}) server process {self.popen.pid} exited with code {code}; the actor exits so Ray "
              f"restarts it", flush=True)
        sys.stdout.flush()
        os._exit(1)

    def info(self) -> dict[str, Any]:
        return {
            "host": self.host, "port": self.port, "pid": self.popen.pid, "node_id": self.node_id,
            "healthy": self.healthy, "start_time": self.start_time,
            "exit_code": self.popen.poll(), "tail": list(self.tail) if self.popen.poll() is not None else [],
        }

    def stop(self) -> None:
        """Stop the server's process group (SIGINT, then SIGKILL) before the actor is killed."""
        self.stopping = True
        try:
            os.killpg(self.popen.pid, signal.SIGINT)
            self.popen.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------------------------------ ng_run side


def bind_host_for(global_config: Any, joined_cluster: bool) -> str:
    """Where actor servers listen: `ray_bind_host` when set (an address, or `node_ip`); else the node's address
    when other machines can be in the cluster (`ray_head_node_address` given, or `ng_run` started it on a
    `ray_node_ip_address`), else loopback (Ray started by ng_run on loopback)."""
    from nemo_gym.runtime.ray import local_node_ip

    given = global_config.get("ray_bind_host")
    if given:
        return str(given)
    return NODE_IP if joined_cluster or local_node_ip(global_config) else "127.0.0.1"


def actor_options(block: dict, *, max_restarts: int) -> dict[str, Any]:
    """`.options(...)` of one replica's actor from the block's `ray_actor_options` and `scheduling_strategy`."""
    options = dict(block.get("ray_actor_options") or {})
    options.setdefault("num_cpus", 0)  # the server process is not Ray's to count unless the block says so
    strategy = block.get("scheduling_strategy")
    if strategy:
        options["scheduling_strategy"] = str(strategy)
    options["max_restarts"] = int(max_restarts)
    options["max_concurrency"] = 4  # info() must answer while stop() or another call runs
    options["name"] = None
    return {k: v for k, v in options.items() if v is not None}


@dataclass
class RayReplica:
    """One replica actor as `ng_run` sees it; `display()` is its record in the head server's `/server_instances`."""

    spec: Any
    server_dir: Any
    replica: int
    num_replicas: int
    max_restarts: int
    entrypoint: str = ""  # as `locate_server` checked it (config/server_paths.py); the actor runs exactly this
    handle: Any = None
    info: dict = field(default_factory=dict)
    state: str = "starting"
    restarts: int = 0
    pending: Any = None
    pending_since: float = 0.0
    last_exit_code: Optional[int] = None
    last_exit_time: Optional[float] = None
    error: Optional[str] = None

    @property
    def label(self) -> str:
        sid = self.spec.server_id
        return sid if self.num_replicas == 1 else f"{sid}[{self.replica}]"

    @property
    def url(self) -> Optional[str]:
        host, port = self.info.get("host"), self.info.get("port")
        if not host or not port:
            return None
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    def start(self, actor_cls: Any, argv: list[str], env: dict[str, str], bind_host: str, options: dict) -> None:
        self.handle = actor_cls.options(**options).remote(argv, str(self.server_dir), env, bind_host, self.label)

    def poll(self) -> None:
        """Ask the actor for its address without blocking: a restarted actor reports a new pid and port, a dead
        one (restarts spent) is `failed`."""
        import ray

        if self.state == "failed" or self.handle is None:
            return
        if self.pending is None:
            self.pending = self.handle.info.remote()
            self.pending_since = time.monotonic()
        ready, _ = ray.wait([self.pending], timeout=0)
        if not ready:
            if time.monotonic() - self.pending_since > 2.0 and self.state == "ready":
                self.state = "restarting"
            return
        ref, self.pending = self.pending, None
        try:
            info = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._on_actor_error(exc)
            return
        old_pid = self.info.get("pid")
        if old_pid is not None and info["pid"] != old_pid:
            self.restarts += 1
            self.last_exit_time = time.time()
        self.info = info
        self.state = "ready" if info["healthy"] else ("restarting" if self.restarts else "starting")

    def _on_actor_error(self, exc: Exception) -> None:
        """The actor died; Ray restarts it unless `max_restarts` is spent (then it stays dead)."""
        self.last_exit_time = time.time()
        if self.info:
            self.last_exit_code = 1
        if self._actor_state() == "DEAD":
            self.state = "failed"
            self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        else:
            self.state = "restarting"

    def _actor_state(self) -> Optional[str]:
        try:
            import ray

            table = ray._private.state.state.actor_table(self.handle._actor_id.hex())  # GCS; no dashboard needed
            return str(table.get("State")) if table else None
        except Exception:
            return None

    def display(self) -> dict[str, Any]:
        from nemo_gym.runtime.launcher import instance_record

        info = self.info
        record = instance_record(
            self, host=info.get("host"), port=info.get("port"), url=self.url if self.state != "failed" else None,
            pid=info.get("pid"), start_time=info.get("start_time"),
        )
        return {**record, "node_id": info.get("node_id"), "ray_actor": True}



def stop_all(replicas: list[RayReplica], timeout: float = 10.0) -> None:
    """Stop every replica's server (all at once), then kill the actors for good (no restart)."""
    import ray

    handles = [r.handle for r in replicas if r.handle is not None]
    refs = []
    for handle in handles:
        try:
            refs.append(handle.stop.remote())
        except Exception:
            pass
    try:
        ray.wait(refs, num_returns=len(refs), timeout=timeout)
    except Exception:
        pass
    for handle in handles:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:
            pass


def remote_actor_class() -> Any:
    import ray

    return ray.remote(ServerActor)
