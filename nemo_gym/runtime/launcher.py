"""`ng_run`: start the head server and every server block as its own process, wait until all are healthy,
supervise them, and stop them all (and only them) on Ctrl-C, SIGTERM or a crash.

Why it looks like this:
- Ports are reserved (bound and listening) in this process and the socket is handed to the child, so no other
  process can take a port between choosing and serving (NeMo Gym v0.2 releases the port it chose and lets the
  child bind it later, which another process can win).
- Each child runs in its own session (process group), so a terminal Ctrl-C reaches only `ng_run`, which then
  stops the children in order (SIGINT, then SIGTERM, then SIGKILL) and kills whole groups: no orphans.
- Child output is read line by line and forwarded; the last lines are kept so a crash report can show them.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from nemo_gym import PARENT_DIR
from nemo_gym.config.types import ServerInstanceSpec
from nemo_gym.errors import NeMoGymConfigError, did_you_mean
from nemo_gym.runtime.venvs import VenvBuildError

TAIL_LINES = 40
HEALTH_POLL_INTERVAL_S = 0.05
SUPERVISE_INTERVAL_S = 0.2
DEFAULT_READY_TIMEOUT_S = 600.0
SIGINT_GRACE_S = 5.0
SIGTERM_GRACE_S = 3.0


class ServerCrashed(RuntimeError):
    """A server process exited on its own. The message carries the last lines of its output."""


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

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def display(self) -> dict[str, Any]:
        """The instance record published on the head server's `/server_instances` (reference field names)."""
        return {
            "process_name": self.spec.server_id,
            "server_type": self.spec.server_type,
            "name": self.spec.impl,
            "dir_path": str(self.server_dir),
            "entrypoint": str(self.spec.config.get("entrypoint")),
            "host": self.host,
            "port": self.port,
            "url": self.url,
            "pid": self.popen.pid if self.popen else None,
            "config_path": self.spec.server_id,
            "start_time": self.start_time,
        }

    def crash_report(self) -> str:
        code = self.popen.returncode if self.popen else None
        lines = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return (
            f"Server '{self.spec.server_id}' ({self.spec.server_type}/{self.spec.impl}) exited with code {code}.\n"
            f"  Last lines of its output:\n{lines}\n"
            f"  Fix the error above, then run ng_run again."
        )


def resolve_server_dir(spec: ServerInstanceSpec, cwd: Path) -> Path:
    """Prefer `<cwd>/<type>/<impl>` when it is a server folder (has requirements.txt or pyproject.toml), else the
    installed one under PARENT_DIR, as the reference does; a folder that exists only in one place is used as is."""
    rel = Path(spec.server_type) / spec.impl
    candidates = [cwd / rel, PARENT_DIR / rel]
    for candidate in candidates:
        if (candidate / "requirements.txt").exists() or (candidate / "pyproject.toml").exists():
            return candidate
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    looked = ", ".join(str(c) for c in dict.fromkeys(candidates))
    existing = {d.name for c in candidates if c.parent.is_dir() for d in c.parent.iterdir() if d.is_dir()}
    raise NeMoGymConfigError(
        f"Server '{spec.server_id}': no folder for implementation '{spec.impl}' of {spec.server_type}."
        f"{did_you_mean(spec.impl, sorted(existing))} Looked in: {looked}. Check the implementation name under `{spec.server_id}.{spec.server_type}` "
        f"or create the folder (ng_init_resources_server scaffolds one)."
    )


def check_entrypoint(spec: ServerInstanceSpec, server_dir: Path) -> str:
    entrypoint = str(spec.config.get("entrypoint", ""))
    if not entrypoint or Path(entrypoint).is_absolute():
        raise NeMoGymConfigError(
            f"Server '{spec.server_id}': `entrypoint` must be a path relative to {server_dir}, got {entrypoint!r}."
        )
    if not (server_dir / entrypoint).is_file():
        raise NeMoGymConfigError(
            f"Server '{spec.server_id}': entrypoint {entrypoint!r} not found in {server_dir}."
        )
    return entrypoint


class RunHelper:
    """Owns one running stack: head server, child processes, optional Ray, reserved sockets."""

    def __init__(self, global_config: DictConfig, *, cwd: Optional[Path] = None, out=None):
        self.cfg = global_config
        self.cwd = Path(cwd or os.getcwd())
        self.out = out or sys.stdout
        self.servers: list[ServerProcess] = []
        self.head = None
        self.ray_handle = None
        self._stop_requested = threading.Event()
        self._print_lock = threading.Lock()

    # ----------------------------------------------------------------------------------------------- output
    def say(self, text: str) -> None:
        with self._print_lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _forward_output(self, server: ServerProcess) -> None:
        assert server.popen is not None and server.popen.stdout is not None
        prefix = f"({server.spec.server_id}) "
        for raw in iter(server.popen.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            server.tail.append(line)
            # Children prefix their own lines; output from before that (venv, import errors) gets ours.
            self.say(line if line.startswith(prefix) else prefix + line)
        server.popen.stdout.close()

    # ------------------------------------------------------------------------------------------------ start
    def prepare(self) -> None:
        from nemo_gym.config.global_config import find_server_instances, resolve_server_config

        specs = find_server_instances(self.cfg)
        default_host = str(self.cfg.get("default_host", "127.0.0.1"))
        for spec in specs:
            # Children resolve their own block; doing it here first turns an unset `${policy_base_url}` into one
            # clear error before anything starts, instead of a crash report from one child.
            resolve_server_config(self.cfg, spec.server_id)
            server_dir = resolve_server_dir(spec, self.cwd)
            check_entrypoint(spec, server_dir)
            host = str(spec.config.get("host") or default_host)
            port = spec.config.get("port")
            if port is None:
                raise NeMoGymConfigError(f"Server '{spec.server_id}' has no port (the config was not allocated).")
            self.servers.append(ServerProcess(spec=spec, server_dir=server_dir, host=host, port=int(port)))
        self._reserve_explicit_ports()

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

        threads = [threading.Thread(target=build, args=(s,), daemon=True) for s in self.servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for server in self.servers:
            value = results.get(server.spec.server_id)
            if isinstance(value, BaseException):
                raise value
        return results

    def _child_env(self, server: ServerProcess, config_yaml: str, fd: Optional[int]) -> dict[str, str]:
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
        if self.cfg.get("uv_cache_dir"):
            env["UV_CACHE_DIR"] = str(self.cfg.get("uv_cache_dir"))
        if fd is not None:
            env[NEMO_GYM_LISTEN_FD_ENV_VAR_NAME] = str(fd)
        else:
            env.pop(NEMO_GYM_LISTEN_FD_ENV_VAR_NAME, None)
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

        self.reserve_head_port()
        sock = take_reserved_socket(str(self.cfg.head_server.host), int(self.cfg.head_server.port))
        masked = OmegaConf.to_yaml(OmegaConf.create(mask_secrets(OmegaConf.to_container(self.cfg, resolve=False))))
        self.head = HeadServer(masked, lambda: [s.display() for s in self.servers])
        self.head.start(sock)

    def start_servers(self) -> None:
        from nemo_gym.config.ports import take_reserved_socket

        commands = self._python_commands()
        config_yaml = OmegaConf.to_yaml(self.cfg)
        for server in self.servers:
            sock = take_reserved_socket(server.host, server.port)
            fd = sock.fileno() if sock is not None else None
            entrypoint = str(server.spec.config.get("entrypoint"))
            argv = [*commands[server.spec.server_id], entrypoint]
            server.start_time = time.time()
            server.popen = subprocess.Popen(
                argv,
                cwd=server.server_dir,
                env=self._child_env(server, config_yaml, fd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(fd,) if fd is not None else (),
                start_new_session=True,
            )
            if sock is not None:
                # The child holds its own copy now; ours would keep the port open after the child dies.
                sock.close()
            server.reader = threading.Thread(
                target=self._forward_output, args=(server,), name=f"out-{server.spec.server_id}", daemon=True
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

        t0 = time.monotonic()
        last_progress = t0
        with httpx.Client(timeout=httpx.Timeout(2.0, connect=0.5), trust_env=False) as client:
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
                if all(s.ready for s in self.servers):
                    return time.monotonic() - t0
                now = time.monotonic()
                if now - t0 > timeout_s:
                    waiting = ", ".join(s.spec.server_id for s in self.servers if not s.ready)
                    raise ServerCrashed(f"Servers not ready after {timeout_s:.0f} s: {waiting}.")
                if now - last_progress > 15:
                    ready = sum(s.ready for s in self.servers)
                    waiting = ", ".join(s.spec.server_id for s in self.servers if not s.ready)
                    self.say(f"{ready} / {len(self.servers)} servers ready; waiting for {waiting}")
                    last_progress = now
                time.sleep(HEALTH_POLL_INTERVAL_S)

    def print_ready_table(self, seconds: float) -> None:
        from rich.console import Console
        from rich.table import Table

        n = len(self.servers)
        self.say(f"All {n} / {n} servers ready! ({seconds:.2f} s)")
        table = Table(show_edge=False)
        for col in ("server", "kind", "implementation", "URL", "PID"):
            table.add_column(col)
        for s in self.servers:
            table.add_row(s.spec.server_id, s.spec.server_type, s.spec.impl, s.url, str(s.popen.pid if s.popen else ""))
        head = f"http://{self.cfg.head_server.host}:{self.cfg.head_server.port}"
        table.add_row("head_server", "head", "-", head, str(os.getpid()))
        console = Console(file=self.out, width=140)
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
        if self.head is not None:
            self.head.stop()
        from nemo_gym.config.ports import release_all

        release_all()
        if self.ray_handle is not None:
            from nemo_gym.runtime.ray import shutdown_ray

            shutdown_ray(self.ray_handle)
            self.ray_handle = None

    def supervise(self) -> None:
        """Block until a stop is requested (returns) or a child dies (raises ServerCrashed)."""
        while not self._stop_requested.wait(SUPERVISE_INTERVAL_S):
            self.check_children()
            if self.head is not None and not self.head.is_alive():
                raise ServerCrashed("The head server thread stopped unexpectedly.")


def run_stack(global_config: DictConfig, *, out=None) -> int:
    """The body of `ng_run`. Returns the process exit code: 0 after a requested stop, 1 after a crash."""
    helper = RunHelper(global_config, out=out)
    previous = {sig: signal.signal(sig, helper.request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        helper.prepare()
        if global_config.get("dry_run"):
            from nemo_gym.runtime.venvs import prebuild_all

            prebuild_all(helper.servers, global_config, cwd=helper.cwd, log=helper.say)
            helper.say(f"Dry run: environments for {len(helper.servers)} server(s) are ready; nothing started.")
            return 0
        helper.reserve_head_port()
        helper.start_ray()
        # Servers first: they need only their config, and their start-up overlaps the head server's.
        helper.start_servers()
        helper.start_head()
        seconds = helper.wait_until_ready(float(global_config.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S)))
        helper.print_ready_table(seconds)
        helper.supervise()
        return 0
    except KeyboardInterrupt:
        return 0
    except ServerCrashed as exc:
        helper.say(f"ERROR: {exc}")
        return 1
    except VenvBuildError as exc:
        helper.say(f"ERROR: could not build a server environment.\n{exc}")
        return 1
    finally:
        helper.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
