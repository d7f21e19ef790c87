"""Which command-line keys mean something, so that a misspelled one fails instead of being silently ignored.

Every key of the global config is a valid override in general, which is why `+num_repeat=3` used to "work" and
collect one rollout per task. A command now refuses a top-level key unless it is one of:

- a parameter of the command (a field or alias of its config model), or of a command whose keys it accepts without
  using them: `ng_run` takes those of `ng_collect_rollouts` and `ng_e2e_collect_rollouts`, because job scripts pass
  one `+key=value` list to both (`Command.accepts_keys_of`);
- a global key the framework itself reads (`GlobalKeys` below, the reserved keys, the policy_* keys);
- a top-level key of the config files, env.yaml or the command's initial config (server blocks, your own keys);
- a key that a `${...}` interpolation of the merged config refers to (`${policy_base_url}`).

Keys one level down are checked by `nemo_gym.config.block_keys` once the top level is fine: a misspelled field of
a server block (in a config file or on the command line) or of `head_server` / `restart_policy` is refused with a
did-you-mean; other nested keys are free. `++key=value` (at any depth) is the explicit way to add a key nemo_gym
does not know, so it is never refused; `~key` deletes and fails on its own when the key is absent; `+h` / `+help`
always work.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Optional

from pydantic import BaseModel, Field, field_validator

from nemo_gym.config import ports
from nemo_gym.config.global_config import (
    DEFAULT_HEAD_SERVER_PORT,
    DEFAULT_HOST,
    DEFAULT_VENV_MODE,
    NEMO_GYM_RESERVED_TOP_LEVEL_KEYS,
    POLICY_API_KEY_KEY_NAME,
    POLICY_BASE_URL_KEY_NAME,
    POLICY_MODEL_NAME_KEY_NAME,
)
from nemo_gym.config.overrides import Override
from nemo_gym.config.types import HELP_KEYS, BaseNeMoGymCLIConfig, RestartPolicy
from nemo_gym.errors import NeMoGymConfigError, did_you_mean
from nemo_gym.serving.host_check import parse_allowed_hosts
from nemo_gym.serving.limits import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    DEFAULT_MAX_REQUEST_HEAD_BYTES,
    DEFAULT_REQUEST_BODY_TIMEOUT_S,
    DEFAULT_REQUEST_HEAD_TIMEOUT_S,
    DEFAULT_RESPONSE_SEND_TIMEOUT_S,
)

__all__ = ["HeadServerKeys", "GlobalKeys", "FRAMEWORK_KEYS", "referenced_keys", "check_known_keys"]

class HeadServerKeys(BaseModel):
    """`head_server.host` / `head_server.port`: where the head server of a stack listens."""

    host: str = Field(default=DEFAULT_HOST, description="Host the head server listens on.")
    port: int = Field(default=DEFAULT_HEAD_SERVER_PORT, description="Port of the head server.")


class GlobalKeys(BaseNeMoGymCLIConfig):
    """The top-level keys of the global config that nemo_gym itself reads (any command accepts them).

    The defaults shown are those `ng_run` applies; a test keeps them equal to the constants the code uses."""

    config_paths: list[str] = Field(
        default_factory=list,
        description="YAML files to merge, later ones win; a relative path is tried in the current folder, then the "
        "install folder. Files may list more files under their own config_paths.",
    )
    default_host: str = Field(default=DEFAULT_HOST, description="Host of every server block that sets none.")
    use_absolute_ip: bool = Field(default=False, description="Use this machine's IP address as default_host.")
    head_server: HeadServerKeys = Field(
        default_factory=HeadServerKeys,
        description="Where the head server listens: +head_server.host=..., +head_server.port=...",
    )
    port_range_low: int = Field(default=ports.DEFAULT_PORT_RANGE_LOW, description="Lowest port chosen for a server.")
    port_range_high: int = Field(default=ports.DEFAULT_PORT_RANGE_HIGH, description="Highest port chosen for a server.")
    disallowed_ports: list[int] = Field(default_factory=list, description="Ports never chosen for a server.")
    error_on_almost_servers: bool = Field(
        default=True, description="Fail when a block looks like a server but does not validate (false: skip it)."
    )
    venv_mode: Literal["shared", "isolated"] = Field(
        default=DEFAULT_VENV_MODE,
        description="shared: every server runs in this Python; isolated: each in its own venv built with uv from "
        "its requirements.txt (a server block may set its own venv_mode).",
    )
    venv_install_framework: bool = Field(default=True, description="Install this nemo_gym into isolated venvs.")
    skip_venv_if_present: bool = Field(default=False, description="Reuse an isolated venv that exists as it is.")
    pip_install_verbose: bool = Field(default=False, description="Show the output of venv installs.")
    uv_pip_set_python: bool = Field(default=False, description="Accepted for NeMo Gym v0.2 configs; not used.")
    uv_cache_dir: Optional[str] = Field(
        default=None, description="uv's cache folder (null = cache/uv in the working folder)."
    )
    uv_venv_dir: Optional[str] = Field(
        default=None, description="Folder for isolated venvs (null = the working folder)."
    )
    ray: bool = Field(default=False, description="Start (or join) Ray even when no server block asks for it.")
    ray_head_node_address: Optional[str] = Field(
        default=None, description="Join this Ray cluster instead of starting one."
    )
    ray_bind_host: Optional[str] = Field(
        default=None,
        description="Where servers run as Ray actors listen: an address, or node_ip (the node's address as Ray knows "
        "it). null = node_ip when joining a cluster (ray_head_node_address given), else 127.0.0.1.",
    )
    ray_node_ip_address: Optional[str] = Field(
        default=None,
        description="Node address of a Ray cluster started here (other machines can then join it). "
        "null = 127.0.0.1: Ray listens on loopback only.",
    )
    ray_num_cpus: Optional[int] = Field(default=None, description="CPUs of a Ray cluster started here.")
    ray_num_gpus: Optional[int] = Field(default=None, description="GPUs of a Ray cluster started here.")
    dry_run: bool = Field(default=False, description="Build the server environments, start nothing, exit.")
    stop_stale_stack: bool = Field(
        default=False, description="ng_run: stop a stack left behind by a dead ng_run that holds this stack's ports."
    )
    ready_timeout_s: float = Field(default=600.0, gt=0, description="How long to wait for every server's /health.")
    restart_policy: RestartPolicy = Field(
        default_factory=RestartPolicy,
        description="Restarting servers that exit or stop answering /health once the stack is ready: "
        "+restart_policy.max_restarts=N (0 = never restart), window_s, backoff_s, backoff_max_s, "
        "health_check_interval_s, health_check_timeout_s, health_check_failures. A server block may set its own "
        "(`<server>.<type>.<impl>.restart_policy`).",
    )
    uvicorn_logging_show_200_ok: bool = Field(default=False, description="Log successful requests of servers.")
    uvicorn_timeout_worker_healthcheck: int = Field(
        default=30, description="Seconds a multi-worker server waits for its workers to come up."
    )
    http_client_transport: Optional[str] = Field(
        default=None,
        description="Transport of the shared HTTP client: lean (default), aiohttp or httpx (null = $NEMO_GYM_HTTP_CLIENT_TRANSPORT, "
        "else lean).",
    )
    http_client_max_response_body_bytes: int = Field(
        default=256 * 1024 * 1024,
        description="The largest response body the HTTP client reads from another server or a backend; a larger "
        "one fails the call (not retried).",
    )
    global_aiohttp_connector_limit: int = Field(default=102400, description="Connections of the HTTP client in total.")
    global_aiohttp_connector_limit_per_host: int = Field(
        default=1024, description="Connections of the HTTP client per host."
    )
    global_aiohttp_client_request_debug: bool = Field(default=False, description="Log every HTTP client request.")
    max_request_body_bytes: int = Field(
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        description="The largest request body a server reads; larger ones are answered 413 (a server block may "
        "set its own).",
    )
    max_request_head_bytes: int = Field(
        default=DEFAULT_MAX_REQUEST_HEAD_BYTES,
        description="The largest request line and headers a server reads; larger ones are answered 431 (a server "
        "block may set its own).",
    )
    request_head_timeout_s: float = Field(
        default=DEFAULT_REQUEST_HEAD_TIMEOUT_S,
        description="Seconds a server waits for a request's headers once they began; then 408 (a server block may "
        "set its own).",
    )
    request_body_timeout_s: float = Field(
        default=DEFAULT_REQUEST_BODY_TIMEOUT_S,
        description="Seconds a request's body may stop arriving before the server answers 408 (a server block may "
        "set its own).",
    )
    response_send_timeout_s: float = Field(
        default=DEFAULT_RESPONSE_SEND_TIMEOUT_S,
        description="Seconds a client may read nothing of an answer (the socket full) before the server closes the "
        "connection (a server block may set its own).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="More names the stack's servers answer to in Host / Origin, besides loopback, their own address "
        "and the config's hosts (a list: node1.example.com, 10.0.0.5, *.example.com); '*' allows any host (no DNS "
        "rebinding protection). Others get 421 (Host) or 403 (Origin).",
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _allowed_hosts(cls, value: Any) -> list[str]:
        return parse_allowed_hosts(value)  # ValueError names the entry that is not a host

    judge_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds one LLM judge call of a resources server may take; then it is a judge failure "
        "(judge_failed: rerun, then the failures file). A resources server block may set its own.",
    )
    observability_enabled: bool = Field(
        default=False,
        description="Calls made for a rollout carry /ng-rollout/<rollout id> in their path, and model servers write "
        "each model call to model_call_capture_dir (NeMo Gym v0.5).",
    )
    verbose: bool = Field(default=False, description="Log at DEBUG level (NeMo Gym v0.5; `gym -v`).")
    nemo_gym_log_dir: Optional[str] = Field(
        default=None,
        description="Also write each server's output to <dir>/<server id>.log (appended across restarts; relative "
        "to the working folder).",
    )
    model_endpoint_readiness_timeout_seconds: float = Field(
        default=600.0,
        description="Once the servers are healthy, wait up to this long for every upstream endpoint the model "
        "servers name (their *base_url keys) to answer; <= 0 skips the wait.",
    )
    model_call_capture_dir: Optional[str] = Field(
        default=None,
        description="Absolute folder where model servers write <rollout id>.capture.jsonl (needed with "
        "observability_enabled); the collector adds each rollout's calls as ng_model_call_capture.",
    )


POLICY_KEYS = (POLICY_BASE_URL_KEY_NAME, POLICY_API_KEY_KEY_NAME, POLICY_MODEL_NAME_KEY_NAME)

FRAMEWORK_KEYS: frozenset[str] = frozenset(
    {*GlobalKeys.parameter_keys(), *NEMO_GYM_RESERVED_TOP_LEVEL_KEYS, *POLICY_KEYS, *HELP_KEYS}
)

# `${name}`, `${name.sub}`, `${name[0]}`; a name followed by `:` is a resolver (`${oc.env:HOME}`), not a key.
_INTERPOLATION_RE = re.compile(r"\$\{\s*([A-Za-z_][\w\-]*)(?:\.[\w\-]+)*\s*(:?)")
_SELECT_RE = re.compile(r"\$\{\s*oc\.select\s*:\s*([A-Za-z_][\w\-]*)")


def referenced_keys(node: Any) -> set[str]:
    """Top-level keys that `${...}` interpolations anywhere in `node` (plain dicts and lists) refer to."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, str) and "${" in item:
            found.update(m.group(1) for m in _INTERPOLATION_RE.finditer(item) if not m.group(2))
            found.update(_SELECT_RE.findall(item))
    return found


def _config_file_keys(global_config: Any, cwd: Path) -> set[str]:
    """Top-level keys of env.yaml and of every file `parse_global_config` loaded (its `config_paths`)."""
    from nemo_gym.config.global_config import _find_env_yaml, _load_yaml_file, _resolve_config_path

    keys: set[str] = set()
    env_path = _find_env_yaml(cwd)
    if env_path is not None:
        keys.update(str(k) for k in _load_yaml_file(env_path, "env.yaml").keys())
    for path_str in global_config.get("config_paths") or ():
        path = _resolve_config_path(str(path_str), cwd, "config_paths")
        keys.update(str(k) for k in _load_yaml_file(path, "config_paths").keys())
    return keys


def _unknown(overrides: Iterable[Override], known: set[str]) -> list[Override]:
    """The overrides whose top-level key is not in `known` (`++` and `~` overrides are never unknown)."""
    return [ov for ov in overrides if ov.kind in ("add", "set") and ov.key_path[0] not in known]


def check_known_keys(
    overrides: list[Override],
    *,
    command_name: str,
    parameters: Iterable[str],
    global_config: Any = None,
    initial_config: Optional[Mapping[str, Any]] = None,
    cwd: Optional[Path] = None,
    more_parameters: Optional[Callable[[], Iterable[str]]] = None,
) -> None:
    """Raise `NeMoGymConfigError` naming every unknown top-level key (with a did-you-mean), before the command runs.

    `parameters` are the command's own keys; `global_config` is the merged config (None for commands that read no
    config files), whose files, env.yaml and interpolations make more keys known. `more_parameters` gives keys the
    command accepts without using them (`ng_run` takes `ng_collect_rollouts`'s); listing them costs imports, so it
    is called only when a key is not known otherwise."""
    known = {*parameters, *FRAMEWORK_KEYS, *(initial_config or {})}
    unknown = _unknown(overrides, known)
    if unknown and more_parameters is not None:
        known |= set(more_parameters())
        unknown = _unknown(unknown, known)
    if unknown and global_config is not None:
        from omegaconf import OmegaConf

        known |= referenced_keys(OmegaConf.to_container(global_config, resolve=False))
        known |= _config_file_keys(global_config, Path(cwd) if cwd is not None else Path.cwd())
        unknown = _unknown(unknown, known)
    if not unknown:
        _check_nested(overrides, command_name, global_config, cwd)
        return
    candidates = sorted(known - set(HELP_KEYS))
    problems = []
    for ov in dict((ov.key_path[0], ov) for ov in unknown).values():
        prefix = "+" if ov.kind == "add" else ""
        spelled = f"{prefix}{ov.key_path[0]}"
        problems.append(f"`{spelled}`.{did_you_mean(spelled, [prefix + k for k in candidates])}")
    if global_config is None:
        what = f"a parameter of {command_name} or a global key"
    else:
        what = f"a parameter of {command_name}, a global key, or a key of the config files"
    if len(problems) == 1:
        head = f"unknown key {problems[0]} It is not {what}. "
    else:
        head = f"unknown keys (each is not {what}):\n" + "".join(f"  - {p}\n" for p in problems)
    raise NeMoGymConfigError(
        f"{head}`{command_name} +h=true` lists the parameters. To pass a key nemo_gym does not know, write it "
        f"with ++ (e.g. `++{unknown[0].key}=...`)."
    )


def _check_nested(overrides: list[Override], command_name: str, global_config: Any, cwd: Optional[Path]) -> None:
    """The keys one level down: server blocks (config files and command line) against their server's config class,
    `head_server` / `restart_policy` against their models (`nemo_gym.config.block_keys`)."""
    from nemo_gym.config.block_keys import check_nested_keys

    check_nested_keys(global_config, overrides, command_name=command_name, cwd=cwd)
