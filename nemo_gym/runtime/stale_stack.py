"""A new `ng_run` that finds its ports held by a stack left behind names it and offers to stop it
(docs/design.md, decision 15).

Only when a port this stack needs (the head server's, or a port written in a server block) is taken: the
processes of this user that carry `NEMO_GYM_SUPERVISOR_PID` (set by `ng_run` for every server it starts) are
looked at. A server is *stale* when its `ng_run` is gone, or when that process is no longer its parent (a server
is always a direct child of its `ng_run`; a re-parented one was orphaned). Stale servers are grouped by the
`ng_run` that started them: one stale stack, with its pids, listening ports, server ids and config files.

Such a stack is stopped (SIGTERM to each server's process group, SIGKILL after a grace period) when the user
says so: at a prompt when stdin is a terminal, else with `+stop_stale_stack=true`. Without either, `ng_run`
stops with an error that names the stack and says how. A head server that answers on the head port belongs to
a live `ng_run`: that is never stopped from here; the error names its pid and config.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.runtime.supervisor_watch import SUPERVISOR_PID_ENV_VAR_NAME

STOP_KEY = "stop_stale_stack"
TERM_GRACE_S = 5.0
PORT_FREE_TIMEOUT_S = 10.0

Say = Callable[[str], None]


@dataclass
class StaleServer:
    pid: int
    server_id: str
    supervisor_pid: int
    ports: set[int] = field(default_factory=set)
    members: list[int] = field(default_factory=list)  # pids of its process group/descendants, itself included
    leads_group: bool = False


@dataclass
class StaleStack:
    supervisor_pid: int
    servers: list[StaleServer]
    config_paths: list[str]
    why: str

    @property
    def pids(self) -> list[int]:
        return sorted(p for s in self.servers for p in s.members)

    @property
    def ports(self) -> set[int]:
        return {p for s in self.servers for p in s.ports}

    def describe(self) -> str:
        configs = ", ".join(self.config_paths) or "(no config_paths)"
        rows = "\n".join(
            f"    - {s.server_id}: pid {s.pid}"
            + (f" (+{len(s.members) - 1} process(es) it started)" if len(s.members) > 1 else "")
            + (f", listening on port(s) {', '.join(map(str, sorted(s.ports)))}" if s.ports else "")
            for s in self.servers
        )
        return f"  stack of ng_run pid {self.supervisor_pid} ({self.why}), config: {configs}\n{rows}"


# ------------------------------------------------------------------------------------------------- ports


def wanted_ports(cfg: Any) -> list[tuple[str, int, str]]:
    """(host, port, who) of the head server and of every server block's port (and replica ports)."""
    from nemo_gym.config.global_config import find_server_instances

    head = cfg.get("head_server") or {}
    found = []
    if head.get("port") is not None:
        found.append((str(head.get("host", "127.0.0.1")), int(head.get("port")), "head server"))
    default_host = str(cfg.get("default_host", "127.0.0.1"))
    for spec in find_server_instances(cfg):
        host = str(spec.config.get("host") or default_host)
        ports = [spec.config.get("port"), *list(spec.config.get("replica_ports") or [])]
        for port in dict.fromkeys(p for p in ports if p is not None):
            try:
                found.append((host, int(port), f"server '{spec.server_id}'"))
            except (TypeError, ValueError):
                continue
    return found


def port_is_taken(host: str, port: int) -> bool:
    """Whether another process listens on host:port (ports this process holds and bad hosts count as free:
    the launcher's own checks report those)."""
    from nemo_gym.config import ports

    if ports.is_reserved(host, port):
        return False
    try:
        sock = ports._try_bind(host, port)
    except NeMoGymConfigError:
        return False
    if sock is None:
        return True
    sock.close()
    return False


# --------------------------------------------------------------------------------------------- processes


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _listening_ports(proc: Any) -> set[int]:
    import psutil

    try:
        conns = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else proc.connections("inet")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}


def _config_paths(env: dict[str, str]) -> list[str]:
    from nemo_gym.config.global_config import NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME

    text = env.get(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME)
    if not text:
        return []
    try:
        import yaml

        data = yaml.safe_load(text)
        paths = data.get("config_paths") if isinstance(data, dict) else None
        return [str(p) for p in paths] if isinstance(paths, list) else []
    except Exception:
        return []


def find_stale_stacks() -> list[StaleStack]:
    """Every stale stack of this user's processes (see the module docstring), oldest supervisor pid first."""
    import psutil

    from nemo_gym.config.global_config import NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME

    uid = os.getuid()
    me = os.getpid()
    tagged: dict[int, tuple[Any, dict[str, str]]] = {}
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            if proc.pid == me or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get(SUPERVISOR_PID_ENV_VAR_NAME) and env.get(NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME) is not None:
            tagged[proc.pid] = (proc, env)
    stacks: dict[int, StaleStack] = {}
    for pid, (proc, env) in tagged.items():
        try:
            ppid = proc.ppid()
            if ppid in tagged or proc.status() == psutil.STATUS_ZOMBIE:
                continue  # a worker of a server (counted with it), or already dead
            sup = int(env[SUPERVISOR_PID_ENV_VAR_NAME])
        except (psutil.Error, ValueError):
            continue
        if not _alive(sup):
            why = "that ng_run is gone"
        elif ppid != sup:
            why = f"pid {sup} is alive but no longer the servers' parent"
        else:
            continue  # a live stack
        try:
            members = [proc, *proc.children(recursive=True)]
            leads = os.getpgid(pid) == pid
            if leads:
                members += [p for p, _ in tagged.values() if p not in members and _pgid(p.pid) == pid]
        except (psutil.Error, OSError):
            continue
        server = StaleServer(
            pid=pid, server_id=env[NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME] or "?", supervisor_pid=sup,
            members=sorted({p.pid for p in members}), leads_group=leads,
        )
        for member in members:
            server.ports |= _listening_ports(member)
        stack = stacks.setdefault(sup, StaleStack(sup, [], _config_paths(env), why))
        stack.servers.append(server)
    for stack in stacks.values():
        stack.servers.sort(key=lambda s: s.server_id)
    return [stacks[k] for k in sorted(stacks)]


def _pgid(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def stop_stacks(stacks: list[StaleStack], *, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM every server's process group (or the process, if it leads none), SIGKILL what is left after
    `grace_s`; returns once all are gone (or after a further 5 s)."""
    servers = [s for stack in stacks for s in stack.servers]
    pids = {p for s in servers for p in s.members}

    def signal_all(sig: int) -> None:
        for s in servers:
            try:
                if s.leads_group:
                    os.killpg(s.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            for pid in s.members:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def remaining() -> list[int]:
        return [p for p in pids if _alive(p)]

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while remaining() and time.monotonic() < deadline:
        time.sleep(0.1)
    if remaining():
        signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while remaining() and time.monotonic() < deadline:
            time.sleep(0.1)


# ----------------------------------------------------------------------------------------------- head port


def _head_server_owner(host: str, port: int) -> Optional[dict[str, Any]]:
    """What a nemo_gym head server on host:port says about itself (with `config_paths`), or None."""
    import httpx

    url_host = f"[{host}]" if ":" in host else ("127.0.0.1" if host in ("0.0.0.0", "") else host)
    base = f"http://{url_host}:{port}"
    try:
        health = httpx.get(base + "/health", timeout=3).json()
    except Exception:
        return None
    if not isinstance(health, dict) or health.get("name") != "head_server":
        return None
    try:
        import yaml

        data = yaml.safe_load(httpx.get(base + "/global_config_dict_yaml?raw=true", timeout=3).text)
        health["config_paths"] = [str(p) for p in (data.get("config_paths") or [])] if isinstance(data, dict) else []
    except Exception:
        health["config_paths"] = []
    return health


# ------------------------------------------------------------------------------------------------- check


def _interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False


def check_stale_stacks(cfg: Any, *, say: Say = print, ask: Optional[Callable[[str], str]] = None) -> None:
    """Before `ng_run` reserves its ports: if one is taken by a stale stack, name it and stop it when allowed
    (prompt on a terminal, or `+stop_stale_stack=true`); else raise `NeMoGymConfigError` saying how. Ports
    taken by anything else are left to the launcher's usual error."""
    from nemo_gym.config.values import truthy

    taken = [(host, port, who) for host, port, who in wanted_ports(cfg) if port_is_taken(host, port)]
    if not taken:
        return
    stacks = find_stale_stacks()
    taken_ports = {port for _, port, _ in taken}
    blocking = [s for s in stacks if s.ports & taken_ports]
    head = next(((h, p) for h, p, who in taken if who == "head server"), None)
    if head is not None and not any(head[1] in s.ports for s in blocking):
        owner = _head_server_owner(*head)
        if owner is not None:
            pid = owner.get("pid")
            configs = ", ".join(owner.get("config_paths") or []) or "(no config_paths)"
            where = "" if pid is None or _alive(int(pid)) else " (not a process visible here: another container?)"
            raise NeMoGymConfigError(
                f"The head server port {head[0]}:{head[1]} is taken by a running ng_run (pid {pid}{where}, "
                f"nemo_gym {owner.get('version')}, config: {configs}). It is a live stack, not a stale one, so it is "
                f"not stopped from here. Stop it (Ctrl-C in its terminal, or `kill -INT {pid}`), or give this stack "
                f"its own head port with +head_server.port=<port> (and pass the same to ng_collect_rollouts / "
                f"ng_status)."
            )
    if not blocking:
        return
    held = ", ".join(f"{who} {host}:{port}" for host, port, who in taken if any(port in s.ports for s in blocking))
    text = (
        f"Found {len(stacks)} stale nemo_gym stack(s) (servers whose ng_run is gone, or is no longer their "
        f"parent) holding port(s) this stack needs ({held}):\n" + "\n".join(s.describe() for s in stacks)
    )
    pids = " ".join(str(p) for s in stacks for p in s.pids)
    stop = truthy(cfg.get(STOP_KEY, False))
    if not stop and (ask is not None or _interactive()):
        say(text)
        answer = (ask or input)(f"Stop the stale stack(s) now (pids {pids})? [y/N] ")
        stop = answer.strip().lower() in ("y", "yes")
    if not stop:
        raise NeMoGymConfigError(
            f"{text}\nRun again with +{STOP_KEY}=true to stop it first (SIGTERM, then SIGKILL, to each server's "
            f"process group), or stop it yourself: kill {pids}"
        )
    if ask is None and not _interactive():
        say(text)
    say(f"Stopping the stale stack(s): pids {pids} ...")
    stop_stacks(stacks)
    left = [p for s in stacks for p in s.pids if _alive(p)]
    deadline = time.monotonic() + PORT_FREE_TIMEOUT_S
    while time.monotonic() < deadline and any(port_is_taken(h, p) for h, p, _ in taken):
        time.sleep(0.1)
    if left:
        raise NeMoGymConfigError(
            f"Could not stop the stale stack: pid(s) {' '.join(map(str, left))} still run (another user's?). "
            f"Stop them yourself (kill -9 <pid>), then run ng_run again."
        )
    say("Stale stack stopped.")
