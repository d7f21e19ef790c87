"""Ray only when a server asks for it.

- `ng_run` (parent): `start_or_join_ray_for_launch(cfg)`. With `ray_head_node_address` set, it only remembers
  the address (children join it). Otherwise it starts a local cluster only if some server block says
  `ray: true` (or the global config does), and writes the GCS address into `ray_head_node_address` before
  the config is serialized for the children, so they all join that one cluster. A stack that needs no
  Ray never imports it (importing ray alone costs about a second; a cluster start about nine).
- Server process (child): `initialize_ray()` joins `ray_head_node_address` when set; without one it does
  nothing unless this server (or the global config) asks for Ray, in which case it starts a local cluster.
- `ensure_ray()`: for code that decides at run time that it needs Ray: joins the configured address, or
  starts a local cluster (in that process) and records its address.

A block with `ray_actor_options` counts as asking for Ray: `ng_run` then also becomes a driver of the cluster
(`connect_driver`) and starts the block's replicas as actors (runtime/ray_actors.py). `LocalCluster` starts a
multi-node cluster on this machine, on loopback, for tests and benchmarks.

A cluster started here is private to this machine unless the config names a node address (issue 37): its node
address is loopback, so the GCS, the raylet, the agents, the core workers of every driver and actor listen on
127.0.0.1 only, and there is no dashboard. Ray turns a loopback `_node_ip_address` into the machine's address
on Linux unless `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, so that is set in this process's environment, which the
servers and Ray's processes inherit (they join the cluster on loopback too). `ray_node_ip_address` names another
address (other machines can then join the cluster; docs/scale-out.md). The session's processes are stopped with
this process, however it ends, by a reaper (runtime/ray_reaper.py).

`ray` is imported inside functions only.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

from nemo_gym.config.values import config_get, is_mapping, truthy

RAY_ADDRESS_KEY = "ray_head_node_address"
RAY_FLAG_KEY = "ray"
RAY_ACTOR_OPTIONS_KEY = "ray_actor_options"
RAY_NODE_IP_KEY = "ray_node_ip_address"

# Every node of a cluster on one machine on loopback (Ray otherwise uses the machine's network address).
LOOPBACK_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}

# Keys of the global config that are never server blocks (kept local so this module needs no other import).
_NOT_SERVER_KEYS = frozenset(
    {
        "config_paths", "entrypoint", "default_host", "head_server", "disallowed_ports", "head_server_deps",
        "python_version", "pip_install_verbose", "use_absolute_ip", "uv_pip_set_python", "skip_venv_if_present",
        "hf_token", RAY_ADDRESS_KEY, "ray_bind_host", RAY_NODE_IP_KEY, "port_range_low", "port_range_high", "dry_run",
        "uv_cache_dir", "uv_venv_dir",
    }
)

_started_here = False  # did this process start the Ray cluster it is connected to?
_reaper = None  # the reaper of the cluster this process started (runtime/ray_reaper.py)
_before_loopback: Optional[tuple] = None  # (environment values, Ray's flag) `_on_loopback` replaced
_lock = threading.Lock()


@dataclass
class RayHandle:
    """What `start_or_join_ray_for_launch` did: `started` is True only when this process started the cluster."""

    address: str
    started: bool
    joined_here: bool = False  # `connect_driver` connected this process (so only it disconnects it)


# ------------------------------------------------------------------------------------------- detection


def _server_impl_configs(global_config: Any):
    """Yield `(server_id, impl_config)` for every block shaped `id -> type -> impl -> {entrypoint, ...}`."""
    if global_config is None:
        return
    try:
        keys = list(global_config.keys())
    except Exception:
        return
    for server_id in keys:
        if server_id in _NOT_SERVER_KEYS:
            continue
        block = config_get(global_config, server_id)
        if not is_mapping(block):
            continue
        for type_value in list(block.values()) if hasattr(block, "values") else []:
            if not is_mapping(type_value):
                continue
            for impl_value in list(type_value.values()):
                if is_mapping(impl_value) and "entrypoint" in impl_value:
                    yield str(server_id), impl_value


def server_config_wants_ray(server_config: Any) -> bool:
    """`ray: true`, or `ray_actor_options` (the block runs as Ray actors: runtime/ray_actors.py)."""
    return truthy(config_get(server_config, RAY_FLAG_KEY, False)) or wants_ray_actors(server_config)


def wants_ray_actors(server_config: Any) -> bool:
    return config_get(server_config, RAY_ACTOR_OPTIONS_KEY) is not None


def any_ray_actors(global_config: Any) -> bool:
    return any(wants_ray_actors(cfg) for _, cfg in _server_impl_configs(global_config))


def server_wants_ray(global_config: Any) -> bool:
    """True when the global config has `ray: true` or any server block's implementation config does."""
    if truthy(config_get(global_config, RAY_FLAG_KEY, False)):
        return True
    return any(server_config_wants_ray(cfg) for _, cfg in _server_impl_configs(global_config))


def _this_server_wants_ray(global_config: Any) -> bool:
    """Child side: the global flag, or the block named by NEMO_GYM_CONFIG_PATH."""
    if truthy(config_get(global_config, RAY_FLAG_KEY, False)):
        return True
    server_id = os.environ.get("NEMO_GYM_CONFIG_PATH")
    if not server_id:
        return False
    return any(sid == server_id and server_config_wants_ray(cfg) for sid, cfg in _server_impl_configs(global_config))


# ------------------------------------------------------------------------------------------------- ray


def _ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-report network traffic or prompt
    import ray

    return ray


def _set_address(global_config: Any, address: str) -> None:
    """Write the address into the (possibly struct-mode or read-only) config."""
    if global_config is None:
        return
    try:
        from omegaconf import DictConfig, OmegaConf, open_dict

        if isinstance(global_config, DictConfig):
            readonly = OmegaConf.is_readonly(global_config)
            if readonly:
                OmegaConf.set_readonly(global_config, False)
            try:
                with open_dict(global_config):
                    global_config[RAY_ADDRESS_KEY] = address
            finally:
                if readonly:
                    OmegaConf.set_readonly(global_config, True)
            return
    except ImportError:  # pragma: no cover
        pass
    try:
        global_config[RAY_ADDRESS_KEY] = address
    except TypeError:
        pass


def _keep_signal_handlers():
    """ray.init replaces the SIGTERM handler of the main thread; the caller's (e.g. ng_run's) must survive."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}


def _restore_signal_handlers(saved) -> None:
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_node_ip(global_config: Any) -> Optional[str]:
    """The node address a cluster started here gets: `ray_node_ip_address`, or None for loopback."""
    given = config_get(global_config, RAY_NODE_IP_KEY)
    return None if not given or is_loopback(str(given)) else str(given)


def _on_loopback(ray: Any) -> None:
    """Make Ray take loopback as this node's address (see the module docstring), here and in every process
    started from here, until `_off_loopback`."""
    global _before_loopback
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)  # read when ray was imported
    env = {key: os.environ.get(key) for key in LOOPBACK_RAY_ENV}
    _before_loopback = (env, getattr(constants, "ENABLE_RAY_CLUSTER", None))
    os.environ.update(LOOPBACK_RAY_ENV)
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def _off_loopback() -> None:
    """The cluster is stopped: a process that goes on (a trainer that ran the stack in-process) may join a real
    cluster later, under its own address."""
    global _before_loopback
    if _before_loopback is None:
        return
    env, flag = _before_loopback
    _before_loopback = None
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    constants = getattr(getattr(sys.modules.get("ray"), "_private", None), "ray_constants", None)
    if constants is not None and flag is not None:
        constants.ENABLE_RAY_CLUSTER = flag


def _start_local(global_config: Any, *, log_to_driver: bool) -> str:
    """Start a fresh local cluster in this process, on loopback unless `ray_node_ip_address` says otherwise,
    with a reaper that stops its processes when this process ends; return its GCS address."""
    global _started_here, _reaper
    from nemo_gym.runtime.ray_reaper import children_now, start_reaper

    ray = _ray()
    kwargs: dict[str, Any] = {
        "address": "local",  # never pick up RAY_ADDRESS or an unrelated running cluster
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": log_to_driver,
        "configure_logging": True,
    }
    node_ip = local_node_ip(global_config)
    if node_ip is None:
        _on_loopback(ray)
    else:
        kwargs["_node_ip_address"] = node_ip
    num_cpus = config_get(global_config, "ray_num_cpus")
    if num_cpus is not None:
        kwargs["num_cpus"] = int(num_cpus)
    num_gpus = config_get(global_config, "ray_num_gpus")
    if num_gpus is not None:
        kwargs["num_gpus"] = int(num_gpus)
    saved = _keep_signal_handlers()
    before = children_now()
    try:
        ray.init(**kwargs)
    finally:
        _restore_signal_handlers(saved)
    _started_here = True
    _reaper = start_reaper(children_now() - before)  # the processes ray.init started: this session's
    return str(ray.get_runtime_context().gcs_address)


def _join(address: str, *, log_to_driver: bool = True) -> str:
    ray = _ray()
    saved = _keep_signal_handlers()
    try:
        ray.init(
            address=address,
            ignore_reinit_error=True,
            logging_level=logging.WARNING,
            log_to_driver=log_to_driver,
        )
    finally:
        _restore_signal_handlers(saved)
    return address


def ray_is_initialized() -> bool:
    """Without importing ray: a process that never imported it cannot be connected."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _current_address() -> Optional[str]:
    if not ray_is_initialized():
        return None
    import ray

    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return None


# ----------------------------------------------------------------------------------------- parent side


def start_or_join_ray_for_launch(global_config: Any) -> Optional[RayHandle]:
    """`ng_run`: decide whether this stack has Ray, before the config is serialized for the children.

    - `ray_head_node_address` set: remember it, start nothing (children join it).
    - some server (or the global config) has `ray: true`: start a local cluster here and write its GCS address
      into `ray_head_node_address`.
    - otherwise: None, and ray is not even imported.
    """
    address = config_get(global_config, RAY_ADDRESS_KEY)
    if address:
        return RayHandle(address=str(address), started=False)
    if not server_wants_ray(global_config):
        return None
    with _lock:
        current = _current_address()
        if current is not None:  # already connected (e.g. embedded use): share that cluster
            _set_address(global_config, current)
            return RayHandle(address=current, started=False)
        # The parent runs no tasks; with actors, their servers' output is forwarded to it.
        address = _start_local(global_config, log_to_driver=any_ray_actors(global_config))
    _set_address(global_config, address)
    return RayHandle(address=address, started=True)


def connect_driver(handle: RayHandle) -> None:
    """`ng_run` with actor blocks: be a driver of the stack's cluster (it started it, or joins it now), so it can
    create the actors, which then share its fate (they stop when `ng_run` stops)."""
    with _lock:
        if _current_address() is None:
            _join(handle.address, log_to_driver=True)
            handle.joined_here = True


def disconnect_driver(handle: Optional[RayHandle]) -> None:
    """Leave a cluster `connect_driver` joined (one it started is stopped by `shutdown_ray`). A process that was
    connected already, e.g. a trainer that initialized Ray and started the stack in-process, stays connected."""
    if handle is not None and handle.joined_here and not handle.started and ray_is_initialized():
        import ray

        ray.shutdown()


def shutdown_ray(handle: Optional[RayHandle]) -> None:
    """Stop the cluster if (and only if) this process started it."""
    global _started_here, _reaper
    if handle is None or not handle.started:
        return
    if ray_is_initialized():
        import ray

        ray.shutdown()
    _started_here = False
    from nemo_gym.runtime.ray_reaper import stop_reaper

    stop_reaper(_reaper)  # whatever ray.shutdown() left behind
    _reaper = None
    _off_loopback()


# ------------------------------------------------------------------------------------------ child side


def _load_global_config(global_config_dict: Any) -> Any:
    if global_config_dict is not None:
        return global_config_dict
    try:
        from nemo_gym.config.global_config import get_global_config_dict
    except ImportError:
        get_global_config_dict = None
    if get_global_config_dict is not None:
        return get_global_config_dict()
    text = os.environ.get("NEMO_GYM_CONFIG_DICT")
    if not text:
        return None
    from omegaconf import OmegaConf

    return OmegaConf.create(text)


def initialize_ray(global_config_dict: Any = None) -> Optional[str]:
    """Server-process side (reference name). Returns the GCS address Ray is connected to, or None.

    No-op when Ray is already initialized. Joins `ray_head_node_address` when set. Without an address it
    starts a local cluster only if this server (its block's `ray: true`) or the global config asks for Ray;
    otherwise ray is not imported at all.
    """
    return _connect(global_config_dict, only_if_wanted=True)


def ensure_ray(global_config_dict: Any = None) -> str:
    """For code that needs Ray now, whatever the config says: join the configured address, else start a local
    cluster in this process (and record its address in the config). Returns the GCS address."""
    return _connect(global_config_dict, only_if_wanted=False)


def _connect(global_config_dict: Any, *, only_if_wanted: bool) -> Optional[str]:
    """The cluster this process is on, else the configured one, else a new local one (recorded in the config).
    With `only_if_wanted`, no new cluster unless this server or the global config asks for Ray (None then)."""
    with _lock:
        current = _current_address()
        if current is not None:
            return current
        cfg = _load_global_config(global_config_dict)
        address = config_get(cfg, RAY_ADDRESS_KEY)
        if address:
            return _join(str(address))
        if only_if_wanted and not _this_server_wants_ray(cfg):
            return None
        address = _start_local(cfg, log_to_driver=True)
        _set_address(cfg, address)
        return address


def started_ray_here() -> bool:
    return _started_here


# ------------------------------------------------------------------------------ a multi-node cluster here

_LOCAL_CLUSTER = """
import json, sys
from ray.cluster_utils import Cluster
spec = json.loads(sys.argv[1])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": spec["head_cpus"], "include_dashboard": False})
try:
    ids = [cluster.add_node(num_cpus=n["num_cpus"], resources=n.get("resources") or {}).node_id for n in spec["nodes"]]
    print("CLUSTER " + json.dumps({"address": cluster.address, "head": cluster.head_node.node_id, "nodes": ids}),
          flush=True)
    sys.stdin.read()  # until the owner closes it
finally:
    cluster.shutdown()
"""


class LocalCluster:
    """A multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and `nodes` worker raylets,
    each `{"num_cpus": n, "resources": {...}}`), for tests and benchmarks. It runs in a child process, so the
    caller does not import Ray, and all nodes are on loopback. `address`, `head_node_id`, `node_ids` (in the
    order of `nodes`), `pid` (of the process whose children are the raylets); `close()` stops it."""

    def __init__(self, nodes: list[dict], head_cpus: int = 1, timeout_s: float = 300.0):
        import json
        import subprocess

        spec = json.dumps({"head_cpus": head_cpus, "nodes": nodes})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LOCAL_CLUSTER, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env={**os.environ, **LOOPBACK_RAY_ENV},
        )
        self.pid = self.proc.pid
        timer = threading.Timer(timeout_s, self.proc.kill)
        timer.start()
        try:
            line = ""
            for line in self.proc.stdout:  # type: ignore[union-attr]
                if line.startswith("CLUSTER "):
                    break
        finally:
            timer.cancel()
        if not line.startswith("CLUSTER "):
            self.close()
            raise RuntimeError("the local Ray cluster did not start")
        info = json.loads(line[len("CLUSTER "):])
        self.address: str = info["address"]
        self.head_node_id: str = info["head"]
        self.node_ids: list[str] = info["nodes"]

    def close(self) -> None:
        import subprocess

        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
