"""`ng_run`: start the head server and every server block as its own process, wait until all are healthy,
supervise them, and stop them all (and only them) on Ctrl-C, SIGTERM or a crash.

Why it looks like this:
- Ports are reserved (bound and listening) in this process and the socket is handed to the child, so no other
  process can take a port between choosing and serving (NeMo Gym v0.2 releases the port it chose and lets the
  child bind it later, which another process can win).
- Each child runs in its own session (process group), so a terminal Ctrl-C reaches only `ng_run`, which then
  stops the children in order (SIGINT, then SIGTERM, then SIGKILL) and kills whole groups: no orphans.
- Child output is read line by line and forwarded; the last lines are kept so a crash report can show them.
- Self-healing: once the stack is ready, a server that exits or stops answering `/health` is restarted on the
  same socket (this process keeps its copy of every listening socket, so while a server restarts, new
  connections wait in the kernel's accept queue instead of being refused) with bounded exponential backoff, per
  `restart_policy`. After `max_restarts` within `window_s` the server is marked failed (its socket is closed, so
  clients fail fast) and `ng_status` shows it; `ng_run` then exits 1 when stopped. A server that fails while the
  stack starts is not restarted: `ng_run` exits with its error.
- Replicas (docs/design.md, decision 22): a block with `num_replicas: N` (and no `ray_actor_options`) is started
  as N processes, each on its own reserved port and supervised on its own (`ServerProcess.replica`); the ports
  are written into the config as the block's `replica_ports`, so clients and the head server know every replica.
  With `num_replicas: 1` (the default) nothing of this happens.
- NeMo Gym v0.5 keys: `nemo_gym_log_dir` also writes each server's output to `<dir>/<server id>.log` (appended
  across restarts; a replica's to `<server id>[i].log`); `model_endpoint_readiness_timeout_seconds` (600; <= 0
  skips) waits, once the servers are healthy, for the upstream endpoints their model blocks name (`*base_url`),
  so a collection does not start against a vLLM that is still loading; `verbose` logs at DEBUG.
- Ray actors (decision 24): a block with `ray_actor_options` runs as `num_replicas` Ray actors
  (runtime/ray_actors.py), each running the same server command on the node Ray picked, on a port it bound
  there. Ray restarts them (`max_restarts`); this process polls their addresses for the head server. Ray is
  imported only when some block has `ray_actor_options` (or asks for Ray otherwise).
"""

from __future__ import annotations

import collections
import os
import socket
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from nemo_gym import EXTRA_ROOTS_ENV_VAR_NAME, PARENT_DIR
from nemo_gym.config.server_paths import ServerLocation, locate_server
from nemo_gym.config.types import RestartPolicy, ServerInstanceSpec
from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError
from nemo_gym.runtime.venvs import VenvBuildError

TAIL_LINES = 40
HEALTH_POLL_INTERVAL_S = 0.05
SUPERVISE_INTERVAL_S = 0.2
DEFAULT_READY_TIMEOUT_S = 600.0
DEFAULT_MODEL_ENDPOINT_READINESS_TIMEOUT_S = 600.0
MODEL_ENDPOINT_PROBE_TIMEOUT_S = 5.0
MODEL_ENDPOINT_PROBE_INTERVAL_S = 3.0
MODEL_SERVER_TYPE = "responses_api_models"
SIGINT_GRACE_S = 5.0
SIGTERM_GRACE_S = 3.0
RESTART_HEALTH_TIMEOUT_S = 1.0

# ServerProcess.state
STARTING, READY, WAITING, RESTARTING, FAILED = "starting", "ready", "waiting_to_restart", "restarting", "failed"


class ServerCrashed(RuntimeError):
    """A server process exited on its own. The message carries the last lines of its output."""


def instance_record(
    server: Any, *, host: Any, port: Any, url: Optional[str], pid: Optional[int], start_time: Any
) -> dict[str, Any]:
    """One replica's record on the head server's `/server_instances` (reference field names), for a local
    process (`ServerProcess`) and a Ray actor replica (`RayReplica`) alike: where it listens is passed in, the
    rest is read from the server's block and supervision state."""
    spec = server.spec
    return {
        "process_name": spec.server_id,
        "server_type": spec.server_type,
        "name": spec.impl,
        "dir_path": str(server.server_dir),
        "entrypoint": str(spec.config.get("entrypoint")),
        "host": host,
        "port": port,
        "url": url,
        "pid": pid,
        "config_path": spec.server_id,
        "start_time": start_time,
        "state": server.state,
        "restarts": server.restarts,
        "last_exit_code": server.last_exit_code,
        "last_exit_time": server.last_exit_time,
        "replica": server.replica,
        "num_replicas": server.num_replicas,
    }


@dataclass
class ServerProcess:
    spec: ServerInstanceSpec
    server_dir: Path
    host: str
    port: int
    popen: Optional[subprocess.Popen] = None
    start_time: float = 0.0
    ready: bool = False
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: Optional[threading.Thread] = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    # Kept open for the stack's lifetime: a restarted child serves the same socket, and connections made
    # meanwhile queue in it. Closed when the server is marked failed.
    sock: Optional[socket.socket] = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    state: str = STARTING
    restarts: int = 0
    restart_times: collections.deque = field(default_factory=collections.deque)
    last_exit_code: Optional[int] = None
    last_exit_time: Optional[float] = None
    next_restart_at: float = 0.0
    health_failures: int = 0
    kill_reason: Optional[str] = None
    # Which process of a `num_replicas` block this is (0 for a single-process server).
    replica: int = 0
    num_replicas: int = 1
    # The block's entrypoint as `locate_server` checked it (config/server_paths.py); the argv runs exactly this.
    entrypoint: str = ""

    @property
    def label(self) -> str:
        """The server id, with `[i]` for a replica of a block with several."""
        sid = self.spec.server_id
        return sid if self.num_replicas == 1 else f"{sid}[{self.replica}]"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def display(self) -> dict[str, Any]:
        """The instance record published on the head server's `/server_instances` (reference field names)."""
        return instance_record(
            self, host=self.host, port=self.port, url=self.url, pid=self.popen.pid if self.popen else None,
            start_time=self.start_time,
        )

    def exit_report(self) -> str:
        """Which server exited, with what code (and why, when `ng_run` killed it), and its last output lines."""
        code = self.popen.returncode if self.popen else None
        why = f" ({self.kill_reason})" if self.kill_reason else ""
        lines = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return (
            f"Server '{self.label}' ({self.spec.server_type}/{self.spec.impl}) exited with code {code}{why}.\n"
            f"  Last lines of its output:\n{lines}"
        )

    def crash_report(self) -> str:
        return f"{self.exit_report()}\n  Fix the error above, then run ng_run again."


def restart_delay(policy: RestartPolicy, recent_restarts: int) -> float:
    """Seconds to wait before the next restart, given how many restarts the window already holds."""
    return min(policy.backoff_max_s, policy.backoff_s * 2.0 ** min(recent_restarts, 60))


def restart_policy_for(global_config: Any, spec: ServerInstanceSpec) -> RestartPolicy:
    """The global `restart_policy` with the server block's own keys on top."""
    from nemo_gym.config.types import validate_server_config

    def as_dict(node: Any) -> dict:
        if node is None:
            return {}
        if isinstance(node, DictConfig):
            return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]
        return dict(node)

    merged = {**as_dict(global_config.get("restart_policy")), **as_dict(spec.config.get("restart_policy"))}
    return validate_server_config(
        RestartPolicy, merged, server_id=spec.server_id,
        key_path=f"{spec.server_id}.{spec.server_type}.{spec.impl}.restart_policy",
    )  # type: ignore[return-value]


class RunHelper:
    """Owns one running stack: head server, child processes, optional Ray, reserved sockets."""

    def __init__(self, global_config: Optional[DictConfig] = None, *, cwd: Optional[Path] = None, out=None):
        # None: `start(global_config_dict_parser_config)` builds it (NeMo Gym v0.5's in-process start).
        self.cfg = global_config
        self.cwd = Path(cwd or os.getcwd())
        self.out = out or sys.stdout
        self.servers: list[ServerProcess] = []
        self.ray_replicas: list = []  # RayReplica, for blocks with `ray_actor_options` (runtime/ray_actors.py)
        self.head = None
        self.ray_handle = None
        self._stop_requested = threading.Event()
        self._stop_supervision = threading.Event()
        self._supervisor: Optional[threading.Thread] = None
        self._print_lock = threading.Lock()
        self._shut_down = False

    @property
    def ready_timeout_s(self) -> float:
        return float(self.cfg.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S))

    # ----------------------------------------------------------------------------------------------- output
    def say(self, text: str) -> None:
        with self._print_lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _server_log_file(self, server: ServerProcess) -> Optional[Any]:
        """`<nemo_gym_log_dir>/<label>.log` opened for append, or None without `nemo_gym_log_dir`."""
        log_dir = self.cfg.get("nemo_gym_log_dir")
        if not log_dir:
            return None
        folder = Path(str(log_dir)).expanduser()
        if not folder.is_absolute():
            folder = self.cwd / folder
        folder.mkdir(parents=True, exist_ok=True)
        return open(folder / f"{server.label}.log", "a", encoding="utf-8")

    def _forward_output(self, server: ServerProcess) -> None:
        popen = server.popen  # this process's pipe, even once a restart has replaced `server.popen`
        assert popen is not None and popen.stdout is not None
        prefix = f"({server.spec.server_id}) "
        ours = f"({server.label}) "
        log_file = self._server_log_file(server)
        try:
            for raw in iter(popen.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                server.tail.append(line)
                if log_file is not None:
                    log_file.write(line + "\n")
                    log_file.flush()
                # Children prefix their own lines (with the server id; a replica's index is added here); output
                # from before that (venv, import errors) gets ours.
                self.say(ours + line[len(prefix):] if line.startswith(prefix) else ours + line)
        finally:
            if log_file is not None:
                log_file.close()
        popen.stdout.close()

    # ------------------------------------------------------------------------------------------------ start
    def prepare(self) -> None:
        from nemo_gym.config.global_config import find_server_instances, resolve_server_config

        specs = find_server_instances(self.cfg)
        default_host = str(self.cfg.get("default_host", "127.0.0.1"))
        for spec in specs:
            # Children resolve their own block; doing it here first turns an unset `${policy_base_url}` into one
            # clear error before anything starts, instead of a crash report from one child.
            resolved = resolve_server_config(self.cfg, spec.server_id)
            location = locate_server(spec, self.cwd)  # the folder and entrypoint, confined to the server roots
            server_dir = location.server_dir
            host = str(spec.config.get("host") or default_host)
            port = spec.config.get("port")
            if port is None:
                raise NeMoGymConfigError(f"Server '{spec.server_id}' has no port (the config was not allocated).")
            policy = restart_policy_for(self.cfg, spec)
            if resolved.get("ray_actor_options") is not None:
                self._prepare_ray_block(spec, resolved, location, host, int(port), policy)
                continue
            ports = self._replica_ports(spec, resolved, host, int(port))
            for replica, replica_port in enumerate(ports):
                self.servers.append(
                    ServerProcess(
                        spec=spec, server_dir=server_dir, host=host, port=replica_port, policy=policy,
                        replica=replica, num_replicas=len(ports), entrypoint=location.entrypoint,
                    )
                )
        self._reserve_explicit_ports()

    def _prepare_ray_block(
        self,
        spec: ServerInstanceSpec,
        resolved: dict,
        location: ServerLocation,
        host: str,
        port: int,
        policy: RestartPolicy,
    ) -> None:
        """One `RayReplica` per replica of a block with `ray_actor_options`; the actors pick their own ports, so
        the port the config allocated for the block is given back."""
        from nemo_gym.config.ports import release_port
        from nemo_gym.runtime.ray_actors import RayReplica

        key = f"{spec.server_id}.{spec.server_type}.{spec.impl}"
        n = resolved.get("num_replicas", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise NeMoGymConfigError(f"`{key}.num_replicas` must be an integer of at least 1, got {n!r}.")
        options = resolved.get("ray_actor_options")
        if not isinstance(options, dict):
            raise NeMoGymConfigError(
                f"`{key}.ray_actor_options` must be a mapping of Ray actor options (e.g. {{num_cpus: 1, "
                f"resources: {{verifier_node: 1}}}}), got {options!r}."
            )
        strategy = resolved.get("scheduling_strategy")
        if strategy is not None and strategy not in ("SPREAD", "DEFAULT"):
            raise NeMoGymConfigError(f"`{key}.scheduling_strategy` must be SPREAD or DEFAULT, got {strategy!r}.")
        max_restarts = resolved.get("max_restarts", policy.max_restarts)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < -1:
            raise NeMoGymConfigError(
                f"`{key}.max_restarts` must be an integer (-1: restart without limit), got {max_restarts!r}."
            )
        if resolved.get("replica_ports") is not None:
            raise NeMoGymConfigError(
                f"`{key}.replica_ports` cannot be used with `ray_actor_options`: each actor binds a free port on "
                f"its node. Remove one of the two."
            )
        release_port(host, port)
        for replica in range(n):
            self.ray_replicas.append(
                RayReplica(
                    spec=spec, server_dir=location.server_dir, entrypoint=location.entrypoint, replica=replica,
                    num_replicas=n, max_restarts=max_restarts,
                )
            )

    def _replica_ports(self, spec: ServerInstanceSpec, resolved: dict, host: str, port: int) -> list[int]:
        """The port of each replica of a block: `[port]` for one; for `num_replicas: N`, `port` then the block's
        `replica_ports[1:]` when written, else N - 1 ports reserved here. The full list is written back into the
        block (`replica_ports`), so the children's and the head server's config name every replica."""
        key = f"{spec.server_id}.{spec.server_type}.{spec.impl}"
        n = resolved.get("num_replicas", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise NeMoGymConfigError(f"`{key}.num_replicas` must be an integer of at least 1, got {n!r}.")
        if n == 1:
            return [port]
        given = resolved.get("replica_ports")
        if given is not None:
            if not isinstance(given, list) or len(given) != n or any(isinstance(p, bool) or not isinstance(p, int) for p in given):
                raise NeMoGymConfigError(
                    f"`{key}.replica_ports` must be a list of {n} port numbers (one per replica), got {given!r}."
                )
            if given[0] != port:
                raise NeMoGymConfigError(
                    f"`{key}.replica_ports[0]` ({given[0]}) must be the block's `port` ({port}): replica 0 listens there."
                )
            ports = [int(p) for p in given]
        else:
            from nemo_gym.config.ports import reserve_port

            low = int(self.cfg.get("port_range_low", 10001))
            high = int(self.cfg.get("port_range_high", 20000))
            disallowed = [int(p) for p in (self.cfg.get("disallowed_ports") or [])]
            ports = [port]
            for _ in range(n - 1):
                ports.append(reserve_port(host, low=low, high=high, disallowed=[*disallowed, *ports]))
        if len(set(ports)) != len(ports):
            raise NeMoGymConfigError(f"`{key}.replica_ports` lists a port twice: {ports}.")
        spec.config["replica_ports"] = ports
        return ports

    def _reserve_explicit_ports(self) -> None:
        """Ports written in the config were not reserved while parsing; hold them now so a busy one fails early
        and clearly, before anything starts."""
        from nemo_gym.config.ports import reserve_port, reserved_socket_exists

        for server in self.servers:
            if reserved_socket_exists(server.host, server.port):
                continue
            try:
                reserve_port(server.host, port=server.port)
            except NeMoGymConfigError as exc:
                raise NeMoGymConfigError(f"Server '{server.spec.server_id}': {exc}") from None

    def _python_commands(self) -> dict[str, list[str]]:
        """Per server, the interpreter argv. Isolated venvs are built in parallel threads."""
        from nemo_gym.runtime.venvs import server_python_command

        results: dict[str, Any] = {}

        def build(server: ServerProcess) -> None:
            try:
                results[server.spec.server_id] = server_python_command(
                    server.server_dir,
                    self.cfg,
                    server.spec.config,
                    log=lambda msg, sid=server.spec.server_id: self.say(f"({sid}) {msg}"),
                )
            except BaseException as exc:  # reported below, with the server named
                results[server.spec.server_id] = exc

        everything = [*self.servers, *self.ray_replicas]
        firsts = [s for s in everything if s.replica == 0]  # replicas share their block's interpreter
        threads = [threading.Thread(target=build, args=(s,), daemon=True) for s in firsts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for server in everything:
            value = results.get(server.spec.server_id)
            if isinstance(value, BaseException):
                raise value
        return results

    def _child_env(self, server: Any, config_yaml: str, fd: Optional[int]) -> dict[str, str]:
        from nemo_gym.config.global_config import (
            NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME,
            NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME,
            NEMO_GYM_LISTEN_FD_ENV_VAR_NAME,
        )

        env = dict(os.environ)
        path_parts = [str(server.server_dir), str(PARENT_DIR)]
        if env.get("PYTHONPATH"):
            path_parts.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(path_parts)
        env[NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME] = config_yaml
        env[NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME] = server.spec.server_id
        env["PYTHONUNBUFFERED"] = "1"
        # A server runs in its own folder; relative paths its config names (a benchmark's judge template, say
        # `benchmarks/hle/prompts/judge.txt`) are the user's, so the folder ng_run was started in joins the
        # search roots (`NEMO_GYM_EXTRA_ROOTS`, before the server's own folder and the install root).
        roots = [part for part in env.get(EXTRA_ROOTS_ENV_VAR_NAME, "").split(os.pathsep) if part.strip()]
        if str(self.cwd) not in roots:
            roots.append(str(self.cwd))
        env[EXTRA_ROOTS_ENV_VAR_NAME] = os.pathsep.join(roots)
        if self.cfg.get("uv_cache_dir"):
            env["UV_CACHE_DIR"] = str(self.cfg.get("uv_cache_dir"))
        if fd is not None:
            env[NEMO_GYM_LISTEN_FD_ENV_VAR_NAME] = str(fd)
        else:
            env.pop(NEMO_GYM_LISTEN_FD_ENV_VAR_NAME, None)
        from nemo_gym.runtime.supervisor_watch import SUPERVISOR_PID_ENV_VAR_NAME

        if isinstance(server, ServerProcess):  # watched by the server (supervisor_watch.py); not for Ray actors
            env[SUPERVISOR_PID_ENV_VAR_NAME] = str(os.getpid())
        else:
            env.pop(SUPERVISOR_PID_ENV_VAR_NAME, None)
        if server.num_replicas > 1:
            from nemo_gym.serving.sessions import REPLICA_ENV_VAR_NAME

            env[REPLICA_ENV_VAR_NAME] = str(server.replica)
        return env

    def start_ray(self) -> None:
        from nemo_gym.runtime.ray import start_or_join_ray_for_launch

        self.ray_handle = start_or_join_ray_for_launch(self.cfg)

    def reserve_head_port(self) -> None:
        """Hold the head server's port before anything starts, so a busy port is a clear error up front."""
        from nemo_gym.config.ports import reserve_port, reserved_socket_exists

        head_host = str(self.cfg.head_server.host)
        head_port = int(self.cfg.head_server.port)
        if reserved_socket_exists(head_host, head_port):
            return
        try:
            reserve_port(head_host, port=head_port)
        except NeMoGymConfigError as exc:
            raise NeMoGymConfigError(
                f"{exc} The head server needs {head_host}:{head_port}: is another ng_run running? "
                f"Stop it, or give this stack its own head port with +head_server.port=<port> "
                f"(and pass the same to ng_collect_rollouts / ng_status)."
            ) from None

    def start_head(self) -> None:
        from nemo_gym.config.global_config import mask_secrets
        from nemo_gym.runtime.head_server import HeadServer
        from nemo_gym.config.ports import take_reserved_socket
        from nemo_gym.serving.host_check import host_policy

        self.reserve_head_port()
        sock = take_reserved_socket(str(self.cfg.head_server.host), int(self.cfg.head_server.port))
        masked = OmegaConf.to_yaml(OmegaConf.create(mask_secrets(OmegaConf.to_container(self.cfg, resolve=False))))
        self.head = HeadServer(masked, self.instances, hosts=host_policy(self.cfg, str(self.cfg.head_server.host)))
        self.head.start(sock)

    def instances(self) -> list[dict[str, Any]]:
        """The head server's `/server_instances`: every local process, then every Ray actor replica."""
        return [*(s.display() for s in self.servers), *(r.display() for r in self.ray_replicas)]

    @property
    def n_servers(self) -> int:
        return len(self.servers) + len(self.ray_replicas)

    def start_servers(self) -> None:
        from nemo_gym.config.ports import take_reserved_socket

        commands = self._python_commands()
        config_yaml = OmegaConf.to_yaml(self.cfg)
        for server in self.servers:
            server.sock = take_reserved_socket(server.host, server.port)
            fd = server.sock.fileno() if server.sock is not None else None
            server.argv = [*commands[server.spec.server_id], server.entrypoint]
            server.env = self._child_env(server, config_yaml, fd)
            self._spawn(server)
        if self.ray_replicas:
            self._start_actors(commands, config_yaml)

    def _start_actors(self, commands: dict[str, list[str]], config_yaml: str) -> None:
        """One Ray actor per replica of each block with `ray_actor_options` (runtime/ray_actors.py)."""
        from nemo_gym.runtime.ray import connect_driver
        from nemo_gym.runtime.ray_actors import actor_options, bind_host_for, remote_actor_class

        assert self.ray_handle is not None, "blocks with ray_actor_options make start_ray start or join Ray"
        connect_driver(self.ray_handle)
        actor_cls = remote_actor_class()
        bind_host = bind_host_for(self.cfg, joined_cluster=not self.ray_handle.started)
        head_host = str(self.cfg.head_server.host)
        if bind_host != "127.0.0.1" and head_host in ("127.0.0.1", "localhost", "::1"):
            self.say(
                f"WARNING: the head server listens on {head_host}, so servers on other Ray nodes cannot ask it where "
                f"the replicas are. On a cluster, pass +head_server.host=<this node's address> (and "
                f"+default_host=<it> for servers that stay local); see docs/scale-out.md."
            )
        for replica in self.ray_replicas:
            argv = [*commands[replica.spec.server_id], replica.entrypoint]
            env = self._child_env(replica, config_yaml, None)
            block = replica.spec.config
            block = OmegaConf.to_container(block, resolve=True) if isinstance(block, DictConfig) else dict(block)
            options = actor_options(block, max_restarts=replica.max_restarts)
            try:
                replica.start(actor_cls, argv, env, bind_host, options)
            except Exception as exc:  # bad ray_actor_options: Ray's own message, with the block named
                key = f"{replica.spec.server_id}.{replica.spec.server_type}.{replica.spec.impl}.ray_actor_options"
                raise NeMoGymConfigError(f"`{key}`: Ray refused these actor options: {exc}") from None

    def _poll_actors(self) -> None:
        for replica in self.ray_replicas:
            replica.poll()

    def _spawn(self, server: ServerProcess) -> None:
        """Start (or restart) the server's process on its socket, with the argv and environment of the first start."""
        fd = server.sock.fileno() if server.sock is not None else None
        server.tail.clear()
        server.kill_reason = None
        server.health_failures = 0
        server.start_time = time.time()
        from nemo_gym.runtime.parent_death import popen_dying_with_parent

        # Dies with this process, even on SIGKILL (forked from a thread that lives as long as this process); the
        # server then kills its own process group (runtime/supervisor_watch.py): docs/design.md, decision 15.
        server.popen = popen_dying_with_parent(
            server.argv,
            cwd=server.server_dir,
            env=server.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(fd,) if fd is not None else (),
            start_new_session=True,
        )
        server.reader = threading.Thread(
            target=self._forward_output, args=(server,), name=f"out-{server.label}", daemon=True
        )
        server.reader.start()

    def check_children(self) -> None:
        for server in self.servers:
            if server.popen is not None and server.popen.poll() is not None:
                if server.reader is not None:
                    server.reader.join(timeout=2)
                raise ServerCrashed(server.crash_report())

    def wait_until_ready(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> float:
        """Poll every server's `/health` until all answer 200; a child that exits meanwhile is a crash."""
        import httpx

        from nemo_gym.runtime.status import health_client

        t0 = time.monotonic()
        last_progress = t0
        with health_client(timeout=httpx.Timeout(2.0, connect=0.5)) as client:
            while True:
                if self._stop_requested.is_set():
                    raise KeyboardInterrupt
                self.check_children()
                for server in self.servers:
                    if server.ready:
                        continue
                    try:
                        server.ready = client.get(server.url + "/health").status_code == 200
                    except httpx.HTTPError:
                        pass
                self._check_actors_starting()
                if all(s.ready for s in self.servers) and all(r.state == "ready" for r in self.ray_replicas):
                    for s in self.servers:
                        s.state = READY
                    self.start_supervision()
                    return time.monotonic() - t0
                now = time.monotonic()
                waiting = ", ".join(
                    [s.label for s in self.servers if not s.ready]
                    + [r.label for r in self.ray_replicas if r.state != "ready"]
                )
                if now - t0 > timeout_s:
                    raise ServerCrashed(f"Servers not ready after {timeout_s:.0f} s: {waiting}.")
                if now - last_progress > 15:
                    ready = sum(s.ready for s in self.servers) + sum(r.state == "ready" for r in self.ray_replicas)
                    self.say(f"{ready} / {self.n_servers} servers ready; waiting for {waiting}")
                    last_progress = now
                time.sleep(HEALTH_POLL_INTERVAL_S)

    def model_endpoints(self) -> list[tuple[str, str]]:
        """(config key, url) of every non-empty `*base_url` value (a string or a list) of the model server blocks."""
        from nemo_gym.config.global_config import find_server_instances

        found: list[tuple[str, str]] = []
        for spec in find_server_instances(self.cfg):
            if spec.server_type != MODEL_SERVER_TYPE:
                continue
            block = OmegaConf.to_container(spec.config, resolve=True)
            for key, value in block.items():
                if not str(key).endswith("base_url"):
                    continue
                where = f"{spec.server_id}.{spec.server_type}.{spec.impl}.{key}"
                values = value if isinstance(value, list) else [value]
                for i, url in enumerate(values):
                    if isinstance(url, str) and url.strip():
                        found.append((where + (f"[{i}]" if isinstance(value, list) else ""), url.strip()))
        return found

    def wait_for_model_endpoints(self) -> None:
        """Wait until every upstream model endpoint answers (v0.5's `model_endpoint_readiness_timeout_seconds`).

        Probes `GET <url>/models` (a url ending in /v1) or `GET <url>` every few seconds: any HTTP answer, or a TLS
        error, means up. A host name that does not resolve is reported and not waited for. Past the timeout:
        `NeMoGymConfigError` naming the url and its key (the caller stops the stack)."""
        import httpx

        from nemo_gym.runtime.status import health_client

        timeout_s = float(
            self.cfg.get("model_endpoint_readiness_timeout_seconds", DEFAULT_MODEL_ENDPOINT_READINESS_TIMEOUT_S)
        )
        if timeout_s <= 0:
            return
        pending = {url: key for key, url in reversed(self.model_endpoints())}  # first key naming a url wins
        if not pending:
            return
        t0 = time.monotonic()
        announced = False
        with health_client(timeout=MODEL_ENDPOINT_PROBE_TIMEOUT_S) as client:
            while True:
                for url, key in list(pending.items()):
                    probe = url.rstrip("/") + "/models" if url.rstrip("/").endswith("/v1") else url
                    try:
                        client.get(probe)
                    except httpx.HTTPError as exc:
                        if _caused_by(exc, "SSLError", "SSLCertVerificationError"):
                            del pending[url]  # TLS trouble: something is listening
                        elif _caused_by(exc, "gaierror"):
                            self.say(f"Warning: model endpoint {url} ({key}): its host does not resolve; not waited for.")
                            del pending[url]
                        continue
                    del pending[url]
                if not pending:
                    if announced:
                        self.say(f"Model endpoints ready ({time.monotonic() - t0:.1f} s).")
                    return
                if self._stop_requested.is_set():
                    raise KeyboardInterrupt
                if time.monotonic() - t0 > timeout_s:
                    url, key = next(iter(pending.items()))
                    raise NeMoGymConfigError(
                        f"model endpoint {url} (`{key}`) did not answer within {timeout_s:g} s "
                        f"(model_endpoint_readiness_timeout_seconds); the servers were stopped. Start the model "
                        "server or fix the url, raise the timeout, or set "
                        "+model_endpoint_readiness_timeout_seconds=0 to skip this wait."
                    )
                if not announced:
                    self.say("Waiting for model endpoints: " + ", ".join(f"{u} ({k})" for u, k in pending.items()))
                    announced = True
                deadline = time.monotonic() + MODEL_ENDPOINT_PROBE_INTERVAL_S
                while time.monotonic() < deadline and not self._stop_requested.is_set():
                    time.sleep(0.1)

    def _check_actors_starting(self) -> None:
        """While the stack starts, an actor whose server exited (or that Ray could not keep alive) is a crash:
        its report carries the server's last output lines when the actor could send them."""
        if not self.ray_replicas:
            return
        self._poll_actors()
        for replica in self.ray_replicas:
            if replica.state == "failed" or replica.restarts:
                lines = "\n".join(f"    {line}" for line in replica.info.get("tail") or []) or "    (see its output above)"
                why = replica.error or "its server process exited while the stack was starting"
                raise ServerCrashed(
                    f"Server '{replica.label}' (Ray actor, {replica.spec.server_type}/{replica.spec.impl}): {why}.\n"
                    f"  Last lines of its output:\n{lines}\n  Fix the error above, then run ng_run again."
                )

    def print_ready_table(self, seconds: float) -> None:
        from rich.console import Console
        from rich.table import Table

        n = self.n_servers
        self.say(f"All {n} / {n} servers ready! ({seconds:.2f} s)")
        table = Table(show_edge=False)
        columns = ["server", "kind", "implementation", "URL", "PID"] + (["Ray node"] if self.ray_replicas else [])
        for col in columns:
            table.add_column(col)
        local = [""] if self.ray_replicas else []
        for s in self.servers:
            table.add_row(s.label, s.spec.server_type, s.spec.impl, s.url, str(s.popen.pid if s.popen else ""), *local)
        for r in self.ray_replicas:
            node = str(r.info.get("node_id") or "")[:12]
            table.add_row(r.label, r.spec.server_type, r.spec.impl, str(r.url), str(r.info.get("pid")), node)
        head = f"http://{self.cfg.head_server.host}:{self.cfg.head_server.port}"
        table.add_row("head_server", "head", "-", head, str(os.getpid()), *local)
        console = Console(file=self.out, width=200 if self.ray_replicas else 140)
        with self._print_lock:
            console.print(table)
            self.out.flush()

    # ------------------------------------------------------------------------------------------------- stop
    def request_stop(self, *_: Any) -> None:
        self._stop_requested.set()

    def _signal_groups(self, sig: int) -> None:
        for server in self.servers:
            if server.popen is not None and server.popen.poll() is None:
                try:
                    os.killpg(server.popen.pid, sig)
                except ProcessLookupError:
                    pass

    def _wait_all(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for server in self.servers:
            if server.popen is None:
                continue
            remaining = max(0.0, deadline - time.monotonic())
            try:
                server.popen.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                return False
        return True

    def _reap_groups(self) -> None:
        """Kill anything left in the children's process groups (workers, grandchildren)."""
        for server in self.servers:
            if server.popen is None:
                continue
            try:
                os.killpg(server.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def shutdown(self) -> None:
        """Stop every server (SIGINT, then SIGTERM, then SIGKILL of their process groups), the Ray actors, the head
        server, and Ray if this process started it. Nothing is left running; calling it again does nothing."""
        if self._shut_down:
            return
        self._shut_down = True
        self._stop_supervision.set()  # no restarts while stopping
        if self._supervisor is not None:
            self._supervisor.join(timeout=30)
        started = [s for s in self.servers if s.popen is not None]
        if started:
            self.say(f"Stopping {len(started)} server(s)...")
            self._signal_groups(signal.SIGINT)
            if not self._wait_all(SIGINT_GRACE_S):
                self._signal_groups(signal.SIGTERM)
                if not self._wait_all(SIGTERM_GRACE_S):
                    self._signal_groups(signal.SIGKILL)
                    self._wait_all(5)
            self._reap_groups()
            for server in started:
                if server.reader is not None:
                    server.reader.join(timeout=2)
        for server in self.servers:
            self._close_socket(server)
        if self.ray_replicas:
            self.say(f"Stopping {len(self.ray_replicas)} Ray actor replica(s)...")
            from nemo_gym.runtime.ray_actors import stop_all

            stop_all(self.ray_replicas)
        if self.head is not None:
            self.head.stop()
        from nemo_gym.config.ports import release_all

        release_all()
        if self.ray_handle is not None:
            from nemo_gym.runtime.ray import shutdown_ray

            from nemo_gym.runtime.ray import disconnect_driver

            disconnect_driver(self.ray_handle)
            shutdown_ray(self.ray_handle)
            self.ray_handle = None

    # ---------------------------------------------------------------------------------------- self-healing
    @staticmethod
    def _close_socket(server: ServerProcess) -> None:
        if server.sock is not None:
            server.sock.close()
            server.sock = None

    @staticmethod
    def _kill_group(server: ServerProcess) -> None:
        if server.popen is not None:
            try:
                os.killpg(server.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _kill_unhealthy(self, server: ServerProcess, reason: str) -> None:
        """Kill a server that is alive but not serving; its exit is then handled (and restarted) like a crash."""
        if server.kill_reason is None:
            server.kill_reason = reason
            self.say(f"WARNING: server '{server.label}' {reason}: killing it (pid {server.popen.pid}).")
            self._kill_group(server)

    def _on_exit(self, server: ServerProcess, now: float) -> None:
        """A ready server's process exited: schedule its restart, or mark it failed once the budget is spent."""
        self._kill_group(server)  # workers or grandchildren left behind must not keep serving the socket
        if server.reader is not None:
            server.reader.join(timeout=2)
        server.last_exit_code = server.popen.returncode
        server.last_exit_time = time.time()
        policy = server.policy
        while server.restart_times and now - server.restart_times[0] > policy.window_s:
            server.restart_times.popleft()
        recent = len(server.restart_times)
        if recent >= policy.max_restarts:
            server.state = FAILED
            self._close_socket(server)  # clients now get a connection error at once instead of waiting
            self.say(
                f"ERROR: {server.exit_report()}\n  Restart budget spent ({recent} restart(s) within "
                f"{policy.window_s:g} s, restart_policy.max_restarts={policy.max_restarts}): server "
                f"'{server.label}' is marked failed and stays down (ng_status shows it). Fix the error "
                f"above, then run ng_run again."
            )
            return
        delay = restart_delay(policy, recent)
        server.restart_times.append(now)
        server.restarts += 1
        server.next_restart_at = now + delay
        server.state = WAITING
        self.say(
            f"WARNING: {server.exit_report()}\n  Restarting it on {server.url} in {delay:.1f} s "
            f"(restart {recent + 1} of at most {policy.max_restarts} within {policy.window_s:g} s)."
        )

    def _supervise_one(self, server: ServerProcess, client: Any, now: float) -> None:
        import httpx

        if server.state == FAILED:
            return
        if server.state == WAITING:
            if now >= server.next_restart_at:
                self._spawn(server)
                server.state = RESTARTING
            return
        if server.popen is not None and server.popen.poll() is not None:
            self._on_exit(server, now)
            return
        if server.state == RESTARTING:
            try:
                healthy = client.get(server.url + "/health").status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy:
                server.state = READY
                self.say(
                    f"Server '{server.label}' restarted and healthy again (pid {server.popen.pid}, "
                    f"{server.restarts} restart(s) so far)."
                )
            elif time.time() - server.start_time > self.ready_timeout_s:
                self._kill_unhealthy(server, f"did not answer /health within {self.ready_timeout_s:g} s of restarting")
            return
        if server.health_failures >= server.policy.health_check_failures:
            self._kill_unhealthy(
                server, f"stopped answering /health ({server.health_failures} checks in a row failed)"
            )

    def _health_monitor(self) -> None:
        """Daemon thread: check each ready server's `/health` on its policy's interval and count failures in a
        row. The supervisor loop acts on the count; a result is dropped if the process changed meanwhile."""
        import httpx

        from nemo_gym.runtime.status import health_client

        next_check: dict[str, float] = {}
        with health_client() as client:
            while not self._stop_supervision.wait(SUPERVISE_INTERVAL_S):
                for server in self.servers:
                    now = time.monotonic()
                    sid = server.label
                    if server.state != READY or server.popen is None:
                        next_check.pop(sid, None)
                        continue
                    due = next_check.setdefault(sid, now + server.policy.health_check_interval_s)
                    if now < due:
                        continue
                    next_check[sid] = now + server.policy.health_check_interval_s
                    popen = server.popen
                    try:
                        ok = client.get(
                            server.url + "/health", timeout=server.policy.health_check_timeout_s
                        ).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if server.popen is popen and server.state == READY:
                        server.health_failures = 0 if ok else server.health_failures + 1

    def failed_servers(self) -> list[Any]:
        return [s for s in [*self.servers, *self.ray_replicas] if s.state == FAILED]

    def _supervise_loop(self) -> None:
        from nemo_gym.runtime.status import health_client

        monitor = threading.Thread(target=self._health_monitor, name="nemo_gym-health", daemon=True)
        monitor.start()
        with health_client(timeout=RESTART_HEALTH_TIMEOUT_S) as client:
            while not self._stop_supervision.wait(SUPERVISE_INTERVAL_S):
                if self.ray_replicas:
                    self._watch_actors()
                now = time.monotonic()
                for server in self.servers:
                    try:
                        self._supervise_one(server, client, now)
                    except Exception as exc:  # e.g. the restart itself failed (OSError): stop trying, say why
                        server.state = FAILED
                        self._close_socket(server)
                        self.say(f"ERROR: could not restart server '{server.label}': {exc!r}; marked failed.")

    def _watch_actors(self) -> None:
        """Ray restarts actors; here their new addresses are picked up (for the head server) and changes said."""
        before = {id(r): (r.state, r.info.get("pid")) for r in self.ray_replicas}
        try:
            self._poll_actors()
        except Exception as exc:  # e.g. the connection to Ray is gone: say it, keep supervising the rest
            self.say(f"WARNING: could not poll the Ray actors: {exc!r}")
            return
        for r in self.ray_replicas:
            state, pid = before[id(r)]
            if r.state == state and r.info.get("pid") == pid:
                continue
            if r.state == "ready" and state != "ready":
                self.say(f"Server '{r.label}' (Ray actor) serves again on {r.url} (node {r.info.get('node_id')}, "
                         f"pid {r.info.get('pid')}, {r.restarts} restart(s) so far).")
            elif r.state == "restarting" and state == "ready":
                self.say(f"WARNING: server '{r.label}' (Ray actor) went away; Ray restarts it (max_restarts="
                         f"{r.max_restarts}).")
            elif r.state == "failed":
                self.say(f"ERROR: server '{r.label}' (Ray actor) is dead and Ray will not restart it "
                         f"({r.error}); ng_status shows it.")

    def start_supervision(self) -> None:
        """Restart servers that exit or hang, from a thread, until `shutdown` (see the module docstring). Started
        by `wait_until_ready` once every server is up, so whoever starts a stack gets it (ng_run, e2e collection)."""
        if self._supervisor is None:
            self._supervisor = threading.Thread(target=self._supervise_loop, name="nemo_gym-supervisor", daemon=True)
            self._supervisor.start()

    # ------------------------------------------------------------------------------------ the whole lifecycle
    def start(self, global_config_dict_parser_config: Any = None) -> None:
        """Start the stack and return once every server answers (NeMo Gym v0.5's in-process start, which trainers
        call as `RunHelper().start(GlobalConfigDictParserConfig(...))`; `ng_run` starts through it too).

        Without a config given to the constructor, it is built from `global_config_dict_parser_config` (with
        `skip_load_from_cli=True`, the caller's argv is not read) and installed as this process's global config,
        so `get_global_config_dict()` and the rollout helpers see it. With `dry_run: true` the servers'
        environments are built and nothing starts. Installs no signal handler: the caller owns those."""
        if self.cfg is None:
            from nemo_gym.config.global_config import build_global_config_dict

            self.cfg = build_global_config_dict(global_config_dict_parser_config)
        try:
            self._start()
        except BaseException:
            self.shutdown()  # an in-process caller gets the error, never a half-started stack
            raise

    def _start(self) -> None:
        if self.cfg.get("verbose"):
            import logging

            logging.basicConfig(level=logging.DEBUG)
            logging.getLogger().setLevel(logging.DEBUG)
        if not self.cfg.get("dry_run"):
            from nemo_gym.runtime.stale_stack import check_stale_stacks

            check_stale_stacks(self.cfg, say=self.say)
        self.prepare()
        if self.cfg.get("dry_run"):
            from nemo_gym.runtime.venvs import prebuild_all

            prebuild_all([*self.servers, *self.ray_replicas], self.cfg, cwd=self.cwd, log=self.say)
            self.say(f"Dry run: environments for {self.n_servers} server(s) are ready; nothing started.")
            return
        self.reserve_head_port()
        self.start_ray()
        # Servers first: they need only their config, and their start-up overlaps the head server's.
        self.start_servers()
        self.start_head()
        seconds = self.wait_until_ready(self.ready_timeout_s)
        self.wait_for_model_endpoints()
        self.print_ready_table(seconds)

    def poll(self) -> None:
        """Raise `RuntimeError` (a `ServerCrashed`) when the stack can no longer serve: the head server thread or
        the supervision thread ended, or a server spent its restart budget (the error names it, with its last
        output lines). A server that crashes and is restarted is not an error here (NeMo Gym v0.5 raises on any
        exit; ours restarts first, `restart_policy`)."""
        self._check_threads()
        failed = self.failed_servers()
        if failed:
            raise ServerCrashed(
                "Server(s) failed after spending their restart budget:\n"
                + "\n".join(self._failure_report(s) for s in failed)
            )

    @staticmethod
    def _failure_report(server: Any) -> str:
        if isinstance(server, ServerProcess):
            return server.exit_report()
        return f"Server '{server.label}' (Ray actor): {server.error or 'Ray will not restart it'}."

    def supervise(self) -> None:
        """Block until a stop is requested; servers are restarted meanwhile by the supervision thread. A server
        that spends its restart budget does not end the wait (ng_run keeps serving the others and exits 1)."""
        self.start_supervision()
        while not self._stop_requested.wait(SUPERVISE_INTERVAL_S):
            self._check_threads()

    def _check_threads(self) -> None:
        """`ServerCrashed` when the head server's or the supervision thread has stopped."""
        if self.head is not None and not self.head.is_alive():
            raise ServerCrashed("The head server thread stopped unexpectedly.")
        if self._supervisor is not None and not self._supervisor.is_alive():
            raise ServerCrashed("The supervision thread stopped unexpectedly.")

    def run_forever(self) -> None:
        """v0.5's loop after `start()`: serve until Ctrl-C (or `request_stop`), then stop everything."""
        try:
            self.supervise()
        except KeyboardInterrupt:
            pass
        finally:
            self.shutdown()


def _caused_by(exc: BaseException, *type_names: str) -> bool:
    """Whether an exception of one of these class names is in `exc`'s cause/context chain."""
    seen = set()
    current: Optional[BaseException] = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in type_names or any(t.__name__ in type_names for t in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_stack(global_config: DictConfig, *, out=None) -> int:
    """The body of `ng_run`. Returns the process exit code: 0 after a requested stop, 1 when a server had failed
    (restart budget spent). A server that crashes while the stack starts, or whose environment cannot be built,
    raises `NeMoGymStackError` (exit 1) after the full report was printed and the stack stopped."""
    helper = RunHelper(global_config, out=out)
    previous = {sig: signal.signal(sig, helper.request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        helper.start()
        if global_config.get("dry_run"):
            return 0
        helper.supervise()
        failed = helper.failed_servers()
        if failed:
            helper.say(f"ERROR: {len(failed)} server(s) had failed: {', '.join(s.label for s in failed)}.")
            return 1
        return 0
    except KeyboardInterrupt:
        return 0
    except ServerCrashed as exc:
        helper.say(f"ERROR: {exc}")
        # The report (with the server's last lines) is in the log above; the one-line error ends the output.
        raise NeMoGymStackError(f"{_first_line(exc)} The full report is above.") from None
    except VenvBuildError as exc:
        helper.say(f"ERROR: could not build a server environment.\n{exc}")
        raise NeMoGymStackError(f"could not build a server environment: {_first_line(exc)} Details above.") from None
    finally:
        helper.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
