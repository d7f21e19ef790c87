"""Build and validate the global config: one flat dict shared by every command and server.

Sources, lowest precedence first: the YAML files in `config_paths` (later files win), `env.yaml`,
a programmatic initial dict, the CLI overrides. Then `${swap_key:...}` moves, reserved-key
defaults, server-block and server-reference validation, the almost-server report, and a reserved
(bound and listening) port for every server without one. Interpolations stay unresolved: each
server child resolves its own block.

Every mistake is a `NeMoGymConfigError` whose message names the file, line or key and the fix,
because a config typo should never end in a traceback.
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Optional

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import GrammarParseError, OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_gym import PARENT_DIR, WORKING_DIR
from nemo_gym.config.types import (
    SERVER_INSTANCE_CONFIG_BY_TYPE,
    SERVER_TYPES,
    BaseServerConfig,
    ServerInstanceSpec,
    format_validation_errors,
    is_server_ref,
    validate_server_config,
)
from nemo_gym.config.directives import (
    COPY_RESOLVER_NAME,
    INHERIT_FROM_RESOLVER_NAME,
    apply_config_directives,
    directive_literal,
    lookup_path,
)
from nemo_gym.config.legacy_ids import fold_alias_fragments, resources_server_alias
from nemo_gym.errors import NeMoGymConfigError, closest_match, did_you_mean
from nemo_gym.config.overrides import Override, apply_overrides, overrides_to_dict, parse_overrides
from nemo_gym.config import ports as _ports
from nemo_gym.config.values import truthy

__all__ = [
    "NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME",
    "NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME",
    "NEMO_GYM_LISTEN_FD_ENV_VAR_NAME",
    "CONFIG_PATHS_KEY_NAME",
    "ENTRYPOINT_KEY_NAME",
    "DEFAULT_HOST_KEY_NAME",
    "HEAD_SERVER_KEY_NAME",
    "DISALLOWED_PORTS_KEY_NAME",
    "HEAD_SERVER_DEPS_KEY_NAME",
    "PYTHON_VERSION_KEY_NAME",
    "PIP_INSTALL_VERBOSE_KEY_NAME",
    "USE_ABSOLUTE_IP",
    "USE_ABSOLUTE_IP_KEY_NAME",
    "UV_PIP_SET_PYTHON_KEY_NAME",
    "SKIP_VENV_IF_PRESENT_KEY_NAME",
    "HF_TOKEN_KEY_NAME",
    "RAY_HEAD_NODE_ADDRESS_KEY_NAME",
    "PORT_RANGE_LOW_KEY_NAME",
    "PORT_RANGE_HIGH_KEY_NAME",
    "DRY_RUN_KEY_NAME",
    "UV_CACHE_DIR_KEY_NAME",
    "UV_VENV_DIR_KEY_NAME",
    "VENV_MODE_KEY_NAME",
    "ERROR_ON_ALMOST_SERVERS_KEY_NAME",
    "NEMO_GYM_RESERVED_TOP_LEVEL_KEYS",
    "POLICY_BASE_URL_KEY_NAME",
    "POLICY_API_KEY_KEY_NAME",
    "POLICY_MODEL_NAME_KEY_NAME",
    "POLICY_MODEL_KEY_NAME",
    "TASK_INDEX_KEY_NAME",
    "ROLLOUT_INDEX_KEY_NAME",
    "RESPONSES_CREATE_PARAMS_KEY_NAME",
    "RESPONSE_KEY_NAME",
    "AGENT_REF_KEY_NAME",
    "DEFAULT_HOST",
    "DEFAULT_HEAD_SERVER_PORT",
    "DEFAULT_VENV_MODE",
    "SWAP_KEY_RESOLVER_NAME",
    "SECRET_MASK",
    "is_secret_key",
    "mask_secrets",
    "mask_url_credentials",
    "head_server_deps",
    "running_python_version",
    "parse_global_config",
    "GlobalConfigDictParserConfig",
    "GlobalConfigDictParser",
    "reset_global_config_dict_cache",
    "set_global_config_dict",
    "load_config_from_env_yaml_text",
    "get_global_config_dict",
    "build_global_config_dict",
    "find_server_instances",
    "blocks_without_entrypoint",
    "get_first_server_config_dict",
    "resolve_server_config",
    "load_server_config",
    "get_head_server_config",
    "find_open_port",
    "dump_config_yaml",
]


# --------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------

NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME = "NEMO_GYM_CONFIG_DICT"
NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME = "NEMO_GYM_CONFIG_PATH"
NEMO_GYM_LISTEN_FD_ENV_VAR_NAME = "NEMO_GYM_LISTEN_FD"

CONFIG_PATHS_KEY_NAME = "config_paths"
ENTRYPOINT_KEY_NAME = "entrypoint"
DEFAULT_HOST_KEY_NAME = "default_host"
HEAD_SERVER_KEY_NAME = "head_server"
DISALLOWED_PORTS_KEY_NAME = "disallowed_ports"
HEAD_SERVER_DEPS_KEY_NAME = "head_server_deps"
PYTHON_VERSION_KEY_NAME = "python_version"
PIP_INSTALL_VERBOSE_KEY_NAME = "pip_install_verbose"
USE_ABSOLUTE_IP = "use_absolute_ip"
USE_ABSOLUTE_IP_KEY_NAME = USE_ABSOLUTE_IP
UV_PIP_SET_PYTHON_KEY_NAME = "uv_pip_set_python"
SKIP_VENV_IF_PRESENT_KEY_NAME = "skip_venv_if_present"
HF_TOKEN_KEY_NAME = "hf_token"
RAY_HEAD_NODE_ADDRESS_KEY_NAME = "ray_head_node_address"
PORT_RANGE_LOW_KEY_NAME = "port_range_low"
PORT_RANGE_HIGH_KEY_NAME = "port_range_high"
DRY_RUN_KEY_NAME = "dry_run"
UV_CACHE_DIR_KEY_NAME = "uv_cache_dir"
UV_VENV_DIR_KEY_NAME = "uv_venv_dir"
VENV_MODE_KEY_NAME = "venv_mode"  # ours: shared | isolated (nemo_gym/runtime/venvs.py)
ERROR_ON_ALMOST_SERVERS_KEY_NAME = "error_on_almost_servers"

NEMO_GYM_RESERVED_TOP_LEVEL_KEYS = [
    CONFIG_PATHS_KEY_NAME,
    ENTRYPOINT_KEY_NAME,
    DEFAULT_HOST_KEY_NAME,
    HEAD_SERVER_KEY_NAME,
    DISALLOWED_PORTS_KEY_NAME,
    HEAD_SERVER_DEPS_KEY_NAME,
    PYTHON_VERSION_KEY_NAME,
    PIP_INSTALL_VERBOSE_KEY_NAME,
    USE_ABSOLUTE_IP,
    UV_PIP_SET_PYTHON_KEY_NAME,
    SKIP_VENV_IF_PRESENT_KEY_NAME,
    HF_TOKEN_KEY_NAME,
    RAY_HEAD_NODE_ADDRESS_KEY_NAME,
    PORT_RANGE_LOW_KEY_NAME,
    PORT_RANGE_HIGH_KEY_NAME,
    DRY_RUN_KEY_NAME,
    UV_CACHE_DIR_KEY_NAME,
    UV_VENV_DIR_KEY_NAME,
    VENV_MODE_KEY_NAME,
    ERROR_ON_ALMOST_SERVERS_KEY_NAME,
]

POLICY_BASE_URL_KEY_NAME = "policy_base_url"
POLICY_API_KEY_KEY_NAME = "policy_api_key"
POLICY_MODEL_NAME_KEY_NAME = "policy_model_name"
POLICY_MODEL_KEY_NAME = "policy_model"

# Row keys used by rollout collection and data preparation.
TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
RESPONSES_CREATE_PARAMS_KEY_NAME = "responses_create_params"
RESPONSE_KEY_NAME = "response"
AGENT_REF_KEY_NAME = "agent_ref"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HEAD_SERVER_PORT = 11000
DEFAULT_VENV_MODE = "shared"

SWAP_KEY_RESOLVER_NAME = "swap_key"
_SWAP_KEY_PREFIX = "${" + SWAP_KEY_RESOLVER_NAME + ":"


def _register_resolvers() -> None:
    # Registered so that anything resolving `${swap_key:a.b}` early gets the literal back; the
    # actual move happens in `_apply_swap_keys` after merging.
    if OmegaConf.has_resolver(SWAP_KEY_RESOLVER_NAME):
        return
    import omegaconf

    # OmegaConf 2.4 renamed register_new_resolver to register_resolver (2.3's register_resolver is
    # the old string-only API).
    major_minor = tuple(int(x) for x in omegaconf.__version__.split(".")[:2])
    register = OmegaConf.register_resolver if major_minor >= (2, 4) else OmegaConf.register_new_resolver
    register(SWAP_KEY_RESOLVER_NAME, lambda path: f"{_SWAP_KEY_PREFIX}{path}}}")
    for name in (INHERIT_FROM_RESOLVER_NAME, COPY_RESOLVER_NAME):  # v0.5's directives (config/directives.py)
        if not OmegaConf.has_resolver(name):
            register(name, directive_literal(name))


_register_resolvers()


# --------------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------------

SECRET_MASK = "****"
# The last word of a key name that makes its value secret (`api_key`, `apiKey`, `Authorization`, `db-password`).
_SECRET_WORDS = {
    "key", "apikey", "token", "secret", "secrets", "password", "passwords", "passwd", "passphrase", "passphrases",
    "credential", "credentials", "authorization", "cookie",
}
# `keys` and `tokens` name lists and counts as often as credentials (`sort_keys`, `max_output_tokens`): secret only
# after a word that says they are credentials (`api_keys`, `accessTokens`).
_PLURALS_NEEDING_QUALIFIER = {"keys", "tokens", "apikeys"}
_CREDENTIAL_QUALIFIERS = {"api", "access", "auth", "bearer", "refresh", "secret", "private", "ssh", "signing", "client"}
# Tokenizer settings end in `token` but hold a vocabulary item, not a credential (`eos_token: </s>`).
_TOKENIZER_TOKEN_WORDS = {"eos", "bos", "pad", "unk", "sep", "cls", "mask", "stop", "start", "end", "special"}
_KEY_SPLIT_RE = re.compile(r"[_\-.\s]+")
_CAMEL_BOUNDARY_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")  # apiKey, APIKey -> api Key
# `scheme://userinfo@`: userinfo runs to the last `@` before the path, so a password holding `@` is masked whole.
_URL_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s]+)@")


def _key_words(name: str) -> list[str]:
    """`openaiApiKey` / `OPENAI-API-KEY` / `openai_api_key` -> ["openai", "api", "key"]."""
    return [word for word in _KEY_SPLIT_RE.split(_CAMEL_BOUNDARY_RE.sub("_", name).lower()) if word]


def is_secret_key(name: Any) -> bool:
    """A key is secret when the last word of its name (split on `_`, `-`, `.` and camelCase) is key, apikey, token,
    secret(s), password(s), passwd, passphrase(s), credential(s), authorization or cookie: `api_key`, `apiKey`,
    `hf_token`, `Authorization`, `credentials` are. The plurals `keys` / `tokens` only after api, access, auth,
    ...: `api_keys` is, `max_output_tokens`, `sort_keys` are not; nor are `key_count` or `eos_token`."""
    if not isinstance(name, str) or not name:
        return False
    words = _key_words(name)
    if not words:
        return False
    last, before = words[-1], (words[-2] if len(words) > 1 else "")
    if last in _PLURALS_NEEDING_QUALIFIER:
        return last == "apikeys" or before in _CREDENTIAL_QUALIFIERS
    if last == "token" and before in _TOKENIZER_TOKEN_WORDS:
        return False
    return last in _SECRET_WORDS


def mask_url_credentials(text: str) -> str:
    """`https://user:pass@host/path` -> `https://user:****@host/path` (a bare `token@` becomes `****@`), for every
    URL in `text`; host and path stay readable. Userinfo made of `${...}` is left alone: unresolved, it holds no
    secret, and masking it would break the interpolation."""

    def masked(match: re.Match) -> str:
        userinfo = match.group("userinfo")
        if "${" in userinfo:
            return match.group(0)
        user, colon, _ = userinfo.partition(":")
        return f"{match.group('scheme')}{user}:{SECRET_MASK}@" if colon else f"{match.group('scheme')}{SECRET_MASK}@"

    return _URL_USERINFO_RE.sub(masked, text) if "@" in text else text


def mask_secrets(obj: Any) -> Any:
    """Deep copy of `obj` (dict/list/DictConfig/ListConfig) with secret values replaced by `****`: values under a
    secret key (every leaf of a mapping or list under one: `credentials: {user: ..., id: ...}`, `api_keys: [...]`)
    and the password of every URL in a string value.

    DictConfig input gives a DictConfig back (interpolations kept); plain input gives plain output."""
    if isinstance(obj, (DictConfig, ListConfig)):
        masked = _mask(OmegaConf.to_container(obj, resolve=False))
        return OmegaConf.create(masked)
    return _mask(obj)


def _mask(obj: Any, secret: bool = False) -> Any:
    if isinstance(obj, Mapping):
        return {key: _mask(value, secret or is_secret_key(key)) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_mask(item, secret) for item in obj]
    if secret and obj is not None and not isinstance(obj, bool):  # `use_api_key: true` hides nothing
        return SECRET_MASK
    if isinstance(obj, str):
        return mask_url_credentials(obj)
    return copy.deepcopy(obj)


# --------------------------------------------------------------------------------------------------
# Loading files
# --------------------------------------------------------------------------------------------------


class DuplicateKeyError(yaml.YAMLError):
    """The same key twice in one YAML mapping: PyYAML keeps the last silently, so a server block defined twice
    in one file would lose the first without a word."""

    def __init__(self, key: Any, first_line: int, second_line: int):
        super().__init__(f"duplicate key `{key}` (line {first_line} and line {second_line})")
        self.key, self.first_line, self.second_line = key, first_line, second_line


# YAML 1.2-style floats, as OmegaConf.load reads them: `1e-3` and `1E5` are floats (YAML 1.1, PyYAML's default,
# wants a dot and a signed exponent and reads them as strings).
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"  # dates stay strings, as OmegaConf reads them
_YAML12_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


@functools.lru_cache(maxsize=1)
def _yaml_loader():
    """PyYAML's safe loader reading floats and dates as OmegaConf does (above), so files read the same as with
    OmegaConf.load, and refusing duplicate keys in any mapping."""

    class Base(yaml.SafeLoader):
        pass

    Base.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_FLOAT_TAG, _TIMESTAMP_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Base.add_implicit_resolver(_FLOAT_TAG, _YAML12_FLOAT, list("-+0123456789."))
    base = Base

    class Loader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node, deep=False):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, (str, int, float, bool)) and key in first_line:
                    raise DuplicateKeyError(key, first_line[key], line)
                first_line.setdefault(key, line)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _parse_yaml_text(text: str, source: str) -> dict:
    """Parse YAML text into a dict; syntax errors name the source, line and column."""
    try:
        data = yaml.load(text, Loader=_yaml_loader())
    except DuplicateKeyError as err:
        raise NeMoGymConfigError(
            f"{source}: the key `{err.key}` is defined twice in one mapping (line {err.first_line} and line "
            f"{err.second_line}); YAML would keep only the second. Rename one of them or merge the two."
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or _first_line(err)
        context = getattr(err, "context", None)
        detail = f"{context}; {problem}" if context else problem
        raise NeMoGymConfigError(f"YAML syntax error in {source}{where}: {detail}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise NeMoGymConfigError(
            f"{source} must hold a mapping of keys to values at the top level, not a {type(data).__name__}."
        )
    return data


def _load_yaml_file(path: Path, listed_by: str) -> DictConfig:
    """Load one YAML file as a DictConfig; syntax errors name the file, line and column."""
    try:
        text = path.read_text()
    except OSError as err:
        raise NeMoGymConfigError(f"Cannot read config file {path} ({listed_by}): {err.strerror or err}") from None
    data = _parse_yaml_text(text, str(path))
    try:
        return OmegaConf.create(data)
    except GrammarParseError as err:
        raise NeMoGymConfigError(
            f"Bad interpolation in {path} at `{getattr(err, 'full_key', '?')}`: {_first_line(err)}"
        ) from None
    except (OmegaConfBaseException, ValueError, TypeError) as err:
        raise NeMoGymConfigError(f"Cannot load config file {path}: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _find_env_yaml(cwd: Path) -> Optional[Path]:
    """`./env.yaml` if present, else `PARENT_DIR/env.yaml`."""
    for candidate in (cwd / "env.yaml", PARENT_DIR / "env.yaml"):
        if candidate.is_file():
            return candidate
    return None


def _resolve_config_path(path_str: str, cwd: Path, listed_by: str) -> Path:
    """Absolute paths as is; relative ones against cwd first, then the install dir (PARENT_DIR)."""
    path = Path(os.path.expanduser(path_str))
    if path.is_absolute():
        if path.is_file():
            return path
        tried = [path]
    else:
        tried = [cwd / path, PARENT_DIR / path]
        for candidate in tried:
            if candidate.is_file():
                return candidate
    looked = " and ".join(str(p) for p in dict.fromkeys(tried))
    raise NeMoGymConfigError(
        f"Config file `{path_str}` not found (listed by {listed_by}); looked for {looked}. "
        "Check the path in config_paths (relative paths are tried against the current directory, "
        "then the nemo_gym install directory)."
    )


def _as_path_list(value: Any, source: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, (str, int, float, bool)) or not isinstance(value, (list, tuple)):
        raise NeMoGymConfigError(
            f"config_paths must be a list, e.g. +config_paths=[a.yaml] (got {value!r} from {source}). "
            'Quote it for the shell: "+config_paths=[a.yaml,b.yaml]".'
        )
    out = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise NeMoGymConfigError(
                f"config_paths entries must be file paths (strings); got {item!r} from {source}."
            )
        out.append(item.strip())
    return out


def _explain_resolution_error(err: BaseException, where: str = "") -> str:
    """Turn an OmegaConf resolution error into a sentence that says what to pass."""
    full_key = getattr(err, "full_key", None) or where
    text = str(err)
    first = _first_line(err)
    m = re.search(r"Interpolation key '([^']+)' not found", text)
    if m:
        key = m.group(1)
        return (
            f"Cannot resolve `${{{key}}}` used at `{full_key}`: `{key}` is not set. "
            f"Pass `+{key}=...` on the command line or put it in env.yaml."
        )
    m = re.search(r"Environment variable '([^']+)' not found", text)
    if m:
        var = m.group(1)
        return (
            f"Cannot resolve `{full_key}`: environment variable `{var}` is not set. "
            f"Export it, or give a default with `${{oc.env:{var},<default>}}`."
        )
    m = re.search(r"Missing mandatory value: ?(\S+)", text)
    if m:
        missing = m.group(1)
        if type(err).__name__ == "MissingMandatoryValue":
            missing = full_key
        return f"`{missing}` is required but was left unset (`???`). Pass `+{missing}=...`."
    m = re.search(r"Unsupported interpolation type (\S+)", text)
    if m:
        return f"Cannot resolve `{full_key}`: unknown resolver `{m.group(1)}` in an interpolation."
    return f"Cannot resolve `{full_key}`: {first}"


# --------------------------------------------------------------------------------------------------
# swap_key
# --------------------------------------------------------------------------------------------------


def _delete_path(data: Any, path: list[str]) -> None:
    found, parent = lookup_path(data, path[:-1])
    if found and isinstance(parent, dict):
        parent.pop(path[-1], None)


def _apply_swap_keys(data: dict) -> None:
    """Replace every `${swap_key:a.b}` string by a deep copy of the value at `a.b` (looked up in a
    frozen copy of the config) and delete `a.b`. Used to rename/move a block, e.g.
    `policy_model: ${swap_key:my_judge_model}`."""
    frozen = copy.deepcopy(data)
    sources: list[list[str]] = []

    def visit(node: Any, where: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in list(items):
            here = f"{where}.{key}" if where else str(key)
            if isinstance(value, str) and value.startswith(_SWAP_KEY_PREFIX) and value.endswith("}"):
                src = value[len(_SWAP_KEY_PREFIX) : -1].strip()
                path = [p for p in src.split(".") if p]
                found, moved = lookup_path(frozen, path)
                if not found:
                    raise NeMoGymConfigError(
                        f"`{here}: {value}` moves `{src}`, but `{src}` is not in the config. "
                        "Check the spelling or load the file that defines it via config_paths."
                    )
                node[key] = copy.deepcopy(moved)
                sources.append(path)
            else:
                visit(value, here)

    visit(data, "")
    for path in sources:
        _delete_path(data, path)


# --------------------------------------------------------------------------------------------------
# Server blocks
# --------------------------------------------------------------------------------------------------


def _is_reserved(key: Any) -> bool:
    return key in NEMO_GYM_RESERVED_TOP_LEVEL_KEYS


def _looks_like_server_block(value: Any) -> bool:
    """A top-level dict with a server-type key whose implementation dict has an `entrypoint`:
    a server, or an almost-server if it then fails validation."""
    if not isinstance(value, Mapping) or not _has_server_type_key(value):
        return False
    for server_type in SERVER_TYPES:
        impls = value.get(server_type)
        if isinstance(impls, Mapping):
            for impl_cfg in impls.values():
                if isinstance(impl_cfg, Mapping) and ENTRYPOINT_KEY_NAME in impl_cfg:
                    return True
    return False


def blocks_without_entrypoint(cfg: Any) -> list[str]:
    """`<id>.<server type>.<implementation>` of every top-level block shaped like a server but with no
    `entrypoint`. As in v0.2 such a block is not a server (it is never started), which is what a user who forgot
    the line does not expect: `ng_run` names these blocks in its warnings and errors."""
    data = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    out: list[str] = []
    for sid, value in (data or {}).items():
        if _is_reserved(sid) or not _has_server_type_key(value) or _looks_like_server_block(value):
            continue
        for server_type in SERVER_TYPES:
            impls = value.get(server_type)
            if isinstance(impls, Mapping):
                out.extend(f"{sid}.{server_type}.{impl}" for impl, c in impls.items() if isinstance(c, Mapping))
    return out


def no_entrypoint_hint(path: str) -> str:
    return f"`{path}` has no `entrypoint`, so it is not a server; add `entrypoint: app.py` (its script) to it"


def _warn_blocks_defined_twice(file_cfgs: list[tuple[Path, DictConfig]]) -> None:
    """Warn, naming both files, when two config files define the same top-level server block: the later one is
    merged over the earlier, which is what an override file wants and a copy-paste slip does not."""
    first_file: dict[str, Path] = {}
    for path, file_cfg in file_cfgs:
        for key, value in OmegaConf.to_container(file_cfg, resolve=False).items():
            if _is_reserved(key) or not _has_server_type_key(value):
                continue
            if str(key) in first_file:
                sys.stderr.write(
                    f"warning: server block `{key}` is defined in {first_file[key]} and again in {path}; the "
                    f"second is merged over the first.\n"
                )
            else:
                first_file[str(key)] = path


def _has_server_type_key(value: Any) -> bool:
    return isinstance(value, (Mapping, DictConfig)) and any(t in value for t in SERVER_TYPES)


def _check_server_kinds(data: Mapping) -> None:
    """A top-level block keyed by a misspelled server kind (`resources_serverz:`) would start nothing and say
    nothing: refuse it with the kind it most likely meant."""
    problems = []
    for name, value in data.items():
        if _is_reserved(name) or not isinstance(value, Mapping) or _has_server_type_key(value):
            continue
        for kind, impls in value.items():
            close = closest_match(str(kind), SERVER_TYPES, cutoff=0.75)
            if close and isinstance(impls, Mapping):
                problems.append(f"`{name}.{kind}`: unknown server kind. Did you mean `{close}`?")
    if problems:
        raise NeMoGymConfigError(
            "\n".join(problems) + f"\nServer kinds are {', '.join(f'`{t}`' for t in SERVER_TYPES)}: a server block "
            "is `<server id>: {<server kind>: {<implementation>: {entrypoint: app.py, ...}}}`."
        )


def _missing_paths(node: Any, where: str) -> list[str]:
    out: list[str] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            out.extend(_missing_paths(value, f"{where}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_missing_paths(value, f"{where}.{i}"))
    elif node == "???":
        out.append(where)
    return out


def _lenient_resolved_impl(full: DictConfig, server_id: str, server_type: str, impl: str) -> dict:
    """The implementation dict with each first-level value resolved when possible (unresolvable
    interpolations such as an unset `${policy_base_url}` are kept verbatim: not our concern yet)."""
    node = full[server_id][server_type][impl]
    out: dict = {}
    for key in node.keys():
        raw = node._get_node(key)
        try:
            value = node[key]
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
        except Exception:
            value = OmegaConf.to_container(raw, resolve=False) if isinstance(raw, (DictConfig, ListConfig)) else raw._value()
        out[str(key)] = value
    return out


def _validate_block(full: DictConfig, server_id: str, block: Mapping) -> list[str]:
    """Validate one server block's shape; returns problems (empty when it is a valid server)."""
    type_keys = [k for k in block.keys() if k in SERVER_TYPES]
    other_keys = [k for k in block.keys() if k not in SERVER_TYPES]
    problems: list[str] = []
    if len(type_keys) != 1:
        problems.append(f"has {len(type_keys)} server-type keys ({', '.join(type_keys)}); a block needs exactly one")
    if other_keys:
        problems.append(
            f"unexpected key(s) next to the server type: {', '.join(map(str, other_keys))} "
            f"(fields go under {server_id} -> <server_type> -> <implementation>)"
        )
    if problems:
        return problems
    server_type = type_keys[0]
    impls = block[server_type]
    if not isinstance(impls, Mapping) or len(impls) != 1:
        count = len(impls) if isinstance(impls, Mapping) else 0
        return [f"{server_type}: must hold exactly one implementation, found {count}"]
    impl = next(iter(impls))
    if not isinstance(impls[impl], Mapping):
        return [f"{server_type} -> {impl}: must be a mapping of fields"]
    resolved = _lenient_resolved_impl(full, server_id, server_type, impl)
    model = SERVER_INSTANCE_CONFIG_BY_TYPE[server_type]
    try:
        model.model_validate({server_type: {impl: resolved}})
    except ValidationError as err:
        return [_arrow_loc(line) for line in format_validation_errors(err)]
    return []


def _arrow_loc(line: str) -> str:
    """`a.b.c: msg` -> `a -> b -> c: msg` (the reference's almost-server bullet format)."""
    loc, sep, msg = line.partition(": ")
    return f"{' -> '.join(loc.split('.'))}{sep}{msg}" if sep else line


def _almost_server_banner(almost: dict[str, list[str]]) -> str:
    lines = ["", "=" * 80, "Configuration Warnings: Almost-Servers Detected", "=" * 80]
    for name, problems in almost.items():
        lines += ["", f"Almost-Server Detected: '{name}'", "  This server configuration failed validation:"]
        lines += [f"    - {p}" for p in problems]
        lines.append("  This server will NOT be started.")
    lines += ["", "=" * 80, ""]
    text = "\n".join(lines)
    if sys.stderr.isatty():
        text = f"\033[33m{text}\033[0m"
    return text


def _server_refs_in(impl_cfg: Mapping) -> Iterable[tuple[str, Mapping]]:
    for field_name, value in impl_cfg.items():
        if is_server_ref(value):
            yield str(field_name), value


def _existing_of_type(data: Mapping, server_type: str, valid: Iterable[str]) -> list[str]:
    return [sid for sid in valid if server_type in data[sid]]


def _check_refs(data: dict, full: DictConfig, valid: list[str], almost: dict[str, list[str]]) -> None:
    """Every `{type, name}` directly inside a server's implementation dict must name a server of
    that type."""
    types_by_id = {sid: next(t for t in SERVER_TYPES if t in data[sid]) for sid in valid}
    for sid in valid:
        server_type = types_by_id[sid]
        impl, impl_cfg = next(iter(data[sid][server_type].items()))
        for field_name, ref in _server_refs_in(impl_cfg):
            ref_type = ref.get("type")
            where = f"{sid}.{server_type}.{impl}.{field_name}"
            if "name" not in ref or ref.get("name") in (None, "", "???"):
                raise NeMoGymConfigError(
                    f"Server reference `{where}` has type {ref_type} but no `name`. "
                    f"Pass `+{where}.name=<server id>`."
                )
            name = ref["name"]
            if isinstance(name, str) and "${" in name:
                try:
                    name = full[sid][server_type][impl][field_name]["name"]
                except Exception as err:
                    raise NeMoGymConfigError(_explain_resolution_error(err, f"{where}.name")) from None
            if types_by_id.get(name) == ref_type:
                continue
            alias = resources_server_alias(data, name)
            if alias is not None and types_by_id.get(alias) == ref_type:
                impl_cfg[field_name]["name"] = alias  # the other spelling of its id (legacy_ids)
                continue
            existing = _existing_of_type(data, ref_type, valid)
            msg = f"Server `{sid}` refers to {ref_type} server `{name}` (at `{where}`), "
            if name in types_by_id:
                msg += f"but `{name}` is a {types_by_id[name]} server, not one of {ref_type}. "
            elif name in almost:
                msg += f"but `{name}` failed validation: {'; '.join(almost[name])}. "
            elif name in data and blocks_without_entrypoint({name: data[name]}):
                path = blocks_without_entrypoint({name: data[name]})[0]
                msg += f"but `{name}` is not a server block: `{path}` has no `entrypoint`; add `entrypoint: app.py`. "
            elif name in data:
                msg += (
                    f"but `{name}` is not a server block (a server is "
                    f"`{name}: {{{ref_type}: {{<implementation>: {{entrypoint: app.py, ...}}}}}}`). "
                )
            else:
                msg += "which does not exist. "
            msg += f"Existing {ref_type} servers: {', '.join(existing) if existing else '(none)'}."
            hint = did_you_mean(str(name), existing)
            if hint:
                msg += hint
            elif not existing and name not in almost and name not in data:
                msg += " Load a config that defines one via +config_paths=[...]."
            raise NeMoGymConfigError(msg)


# --------------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------------


def _installed_version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _head_server_deps() -> tuple[str, ...]:
    deps = []
    for dist, spec in (("ray", "ray[default]"), ("openai", "openai")):
        version = _installed_version(dist)
        if version:
            deps.append(f"{spec}=={version}")
    return tuple(deps)


def head_server_deps() -> list[str]:
    """Pins every server venv gets, so Ray and the OpenAI schema match the parent process."""
    return list(_head_server_deps())


def running_python_version() -> str:
    v = sys.version_info
    return f"{v.major}.{v.minor}.{v.micro}"


def _absolute_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as err:
        raise NeMoGymConfigError(
            f"use_absolute_ip=true but this machine's hostname does not resolve ({err}). "
            "Set +default_host=<ip> instead."
        ) from None



def _apply_defaults(data: dict, config_paths: list[str]) -> None:
    data[CONFIG_PATHS_KEY_NAME] = config_paths
    if truthy(data.get(USE_ABSOLUTE_IP, False)):
        data[DEFAULT_HOST_KEY_NAME] = _absolute_ip()
    data.setdefault(DEFAULT_HOST_KEY_NAME, DEFAULT_HOST)
    if HEAD_SERVER_KEY_NAME not in data or data[HEAD_SERVER_KEY_NAME] is None:
        data[HEAD_SERVER_KEY_NAME] = {"host": data[DEFAULT_HOST_KEY_NAME], "port": DEFAULT_HEAD_SERVER_PORT}
    elif isinstance(data[HEAD_SERVER_KEY_NAME], dict):
        data[HEAD_SERVER_KEY_NAME].setdefault("host", data[DEFAULT_HOST_KEY_NAME])
        data[HEAD_SERVER_KEY_NAME].setdefault("port", DEFAULT_HEAD_SERVER_PORT)
    data.setdefault(PORT_RANGE_LOW_KEY_NAME, _ports.DEFAULT_PORT_RANGE_LOW)
    data.setdefault(PORT_RANGE_HIGH_KEY_NAME, _ports.DEFAULT_PORT_RANGE_HIGH)
    data.setdefault(DRY_RUN_KEY_NAME, False)
    data.setdefault(SKIP_VENV_IF_PRESENT_KEY_NAME, False)
    data[PYTHON_VERSION_KEY_NAME] = running_python_version()  # forced: venvs must match us
    data[HEAD_SERVER_DEPS_KEY_NAME] = head_server_deps()  # forced: Ray/openai must match us
    data.setdefault(UV_CACHE_DIR_KEY_NAME, str(WORKING_DIR / "cache" / "uv"))
    data.setdefault(UV_VENV_DIR_KEY_NAME, str(WORKING_DIR))
    data.setdefault(ERROR_ON_ALMOST_SERVERS_KEY_NAME, True)
    data.setdefault(VENV_MODE_KEY_NAME, DEFAULT_VENV_MODE)


def _select(full: DictConfig, key: str, default: Any = None) -> Any:
    try:
        value = OmegaConf.select(full, key, default=default, throw_on_missing=True)
    except Exception as err:
        raise NeMoGymConfigError(_explain_resolution_error(err, key)) from None
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    return value


def _as_int(value: Any, key: str) -> int:
    """A port number read from the config (`key` names it in the error)."""
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise NeMoGymConfigError(f"`{key}` must be an integer port number, got {value!r}.") from None
    if isinstance(value, bool) or not 0 <= port <= 65535:
        raise NeMoGymConfigError(f"`{key}` must be a port number from 0 to 65535, got {value!r}.")
    return port


# --------------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------------


def parse_global_config(
    overrides: Optional[list[str]] = None,
    *,
    initial_global_config_dict: Optional[Mapping | DictConfig] = None,
    cwd: Optional[Path] = None,
    allocate_ports: bool = True,
    env_yaml_path: Optional[Path] = None,
    load_env_yaml: bool = True,
) -> DictConfig:
    """Build, validate and return the global config (interpolations unresolved).

    `overrides` are CLI overrides (`+k=v`, `++k=v`, `k=v`, `~k`). With `allocate_ports`, every
    server block without `port` gets a port reserved (bound and held) on its host; the launcher
    takes the socket with `ports.take_reserved_socket(host, port)`."""
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    parsed: list[Override] = parse_overrides(overrides)
    sets = [ov for ov in parsed if not ov.is_delete]

    # env.yaml, the initial dict and the CLI decide which files to load.
    env_path: Optional[Path] = None
    if load_env_yaml:
        env_path = Path(env_yaml_path) if env_yaml_path is not None else _find_env_yaml(cwd)
        if env_path is not None and not env_path.is_file():
            raise NeMoGymConfigError(f"env.yaml not found at {env_path}.")
    env_cfg = _load_yaml_file(env_path, "env.yaml") if env_path is not None else OmegaConf.create({})
    initial_cfg = _create_initial(initial_global_config_dict)

    head = OmegaConf.merge(env_cfg, initial_cfg)
    try:
        apply_overrides(head, sets)
    except GrammarParseError as err:
        raise NeMoGymConfigError(f"Bad interpolation in an override: {_first_line(err)}") from None
    if any(ov.key_path[0] == CONFIG_PATHS_KEY_NAME for ov in sets):
        source = "the command line"
    elif CONFIG_PATHS_KEY_NAME in initial_cfg:
        source = "the initial config dict"
    else:
        source = f"env.yaml ({env_path})"
    try:
        top_paths = head.get(CONFIG_PATHS_KEY_NAME)
    except Exception as err:
        raise NeMoGymConfigError(_explain_resolution_error(err, CONFIG_PATHS_KEY_NAME)) from None
    queue: list[tuple[str, str]] = [(p, source) for p in _as_path_list(top_paths, source)]

    # Breadth-first, de-duplicated (by the string and by the file it resolves to).
    loaded: list[str] = []
    file_cfgs: list[tuple[Path, DictConfig]] = []
    seen_strings: set[str] = set()
    seen_files: set[Path] = set()
    while queue:
        path_str, listed_by = queue.pop(0)
        if path_str in seen_strings:
            continue
        seen_strings.add(path_str)
        path = _resolve_config_path(path_str, cwd, listed_by)
        real = path.resolve()
        if real in seen_files:
            continue
        seen_files.add(real)
        file_cfg = _load_yaml_file(path, listed_by)
        loaded.append(path_str)
        file_cfgs.append((path, file_cfg))
        if CONFIG_PATHS_KEY_NAME in file_cfg:
            try:
                nested = file_cfg.get(CONFIG_PATHS_KEY_NAME)
            except Exception as err:
                raise NeMoGymConfigError(f"In {path}: {_explain_resolution_error(err, CONFIG_PATHS_KEY_NAME)}") from None
            queue.extend((p, f"config_paths in {path}") for p in _as_path_list(nested, str(path)))

    _warn_blocks_defined_twice(file_cfgs)

    # Merge: files (later win) < env.yaml < initial dict < CLI (applied in order, with deletions).
    merged = OmegaConf.create({})
    for path, file_cfg in file_cfgs:
        merged = _merge(merged, file_cfg, str(path))
    merged = _merge(merged, env_cfg, f"env.yaml ({env_path})")
    merged = _merge(merged, initial_cfg, "the initial config dict")
    try:
        apply_overrides(merged, parsed)
    except GrammarParseError as err:
        raise NeMoGymConfigError(f"Bad interpolation in an override: {_first_line(err)}") from None

    data = OmegaConf.to_container(merged, resolve=False)
    _apply_swap_keys(data)
    fold_alias_fragments(data)
    apply_config_directives(data, alias=resources_server_alias)
    _apply_defaults(data, loaded)
    return _validate_and_allocate(data, allocate_ports=allocate_ports)


def _create_initial(initial: Optional[Mapping | DictConfig]) -> DictConfig:
    if initial is None:
        return OmegaConf.create({})
    if isinstance(initial, DictConfig):
        return copy.deepcopy(initial)
    try:
        return OmegaConf.create(dict(initial))
    except OmegaConfBaseException as err:
        raise NeMoGymConfigError(f"Invalid initial config dict: {_first_line(err)}") from None


def _merge(base: DictConfig, other: DictConfig, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(base, other)
    except (OmegaConfBaseException, TypeError, ValueError) as err:
        key = getattr(err, "full_key", None)
        where = f" at `{key}`" if key else ""
        raise NeMoGymConfigError(
            f"Cannot merge {source} into the config{where}: {_first_line(err)} "
            "(a key is a mapping in one file and a list or value in another)."
        ) from None


def _validate_and_allocate(data: dict, *, allocate_ports: bool) -> DictConfig:
    try:
        full = OmegaConf.create(data)
    except GrammarParseError as err:
        raise NeMoGymConfigError(
            f"Bad interpolation at `{getattr(err, 'full_key', '?')}`: {_first_line(err)}"
        ) from None

    _check_server_kinds(data)
    candidates = [k for k, v in data.items() if not _is_reserved(k) and _looks_like_server_block(v)]
    if candidates:  # with no server at all, ng_run's "nothing to start" names these blocks itself
        for path in blocks_without_entrypoint(data):
            sys.stderr.write(f"warning: {no_entrypoint_hint(path)}.\n")
    for sid in candidates:
        missing = _missing_paths(data[sid], str(sid))
        if missing:
            # A path through a list cannot be set with an override (`a.0.b=...` would make a dict).
            overridable = [m for m in missing if not any(part.isdigit() for part in m.split("."))]
            how = f"Pass {' '.join(f'+{m}=...' for m in overridable)}" if overridable else "Set them"
            raise NeMoGymConfigError(
                f"Server `{sid}` has required value(s) left unset (`???`): "
                f"{', '.join(f'`{m}`' for m in missing)}. {how} (or set them in a config file)."
            )

    valid: list[str] = []
    almost: dict[str, list[str]] = {}
    for sid in candidates:
        problems = _validate_block(full, sid, data[sid])
        if problems:
            almost[str(sid)] = problems
        else:
            valid.append(sid)

    # The almost-server report comes before reference checks: a broken block is the root cause
    # when another server's reference to it fails.
    if almost:
        banner = _almost_server_banner(almost)
        sys.stderr.write(banner)
        sys.stderr.flush()
        if truthy(_select(full, ERROR_ON_ALMOST_SERVERS_KEY_NAME, True)):
            details = "\n".join(
                f"  {name}:\n" + "\n".join(f"    - {p}" for p in problems) for name, problems in almost.items()
            )
            # The first line names the first broken server and its first problem, so a one-line reader sees it.
            first, first_problems = next(iter(almost.items()))
            more = sum(len(p) for p in almost.values()) - 1
            also = f" (and {more} more problem(s), below)" if more else ""
            error = NeMoGymConfigError(
                f"Found {len(almost)} almost-server(s) with validation errors. Server `{first}`: "
                f"{first_problems[0]}{also}. These blocks look like servers but fail validation, so they would "
                f"not be started. Fix them, or pass +error_on_almost_servers=false to start the other servers "
                f"anyway.\n{details}"
            )
            error.already_reported = banner
            raise error

    _check_refs(data, full, valid, almost)

    default_host = _select(full, DEFAULT_HOST_KEY_NAME, DEFAULT_HOST)
    head_port = _select(full, f"{HEAD_SERVER_KEY_NAME}.port", DEFAULT_HEAD_SERVER_PORT)
    low = _as_int(_select(full, PORT_RANGE_LOW_KEY_NAME), PORT_RANGE_LOW_KEY_NAME)
    high = _as_int(_select(full, PORT_RANGE_HIGH_KEY_NAME), PORT_RANGE_HIGH_KEY_NAME)

    disallowed: list[int] = []
    user_disallowed = _select(full, DISALLOWED_PORTS_KEY_NAME, None) or []
    if not isinstance(user_disallowed, list):
        raise NeMoGymConfigError("disallowed_ports must be a list of ports, e.g. +disallowed_ports=[8000]")
    disallowed.extend(_as_int(p, DISALLOWED_PORTS_KEY_NAME) for p in user_disallowed)
    if head_port is not None:
        disallowed.append(_as_int(head_port, f"{HEAD_SERVER_KEY_NAME}.port"))

    needs_port: list[tuple[dict, str, str]] = []
    for sid in valid:
        server_type = next(t for t in SERVER_TYPES if t in data[sid])
        impl, impl_cfg = next(iter(data[sid][server_type].items()))
        key = f"{sid}.{server_type}.{impl}"
        if impl_cfg.get("host") is None:
            impl_cfg["host"] = default_host
            host = default_host
        else:
            host = _select(full, f"{key}.host", default_host)
        if impl_cfg.get("port") is None:
            needs_port.append((impl_cfg, str(host), key))
        else:
            port = _select(full, f"{key}.port")
            disallowed.append(_as_int(port, f"{key}.port"))

    if allocate_ports:
        for impl_cfg, host, key in needs_port:
            port = _ports.reserve_port(host, low=low, high=high, disallowed=disallowed)
            impl_cfg["port"] = port
            disallowed.append(port)

    data[DISALLOWED_PORTS_KEY_NAME] = list(dict.fromkeys(disallowed))
    return OmegaConf.create(data)


# --------------------------------------------------------------------------------------------------
# The cached config of this process
# --------------------------------------------------------------------------------------------------

_GLOBAL_CONFIG_DICT: Optional[DictConfig] = None


class GlobalConfigDictParserConfig(BaseModel):
    """Options of `get_global_config_dict` and `GlobalConfigDictParser.parse` (NeMo Gym v0.2/v0.5's names, which
    trainers build to start a stack in their own process).

    `NO_MODEL_GLOBAL_CONFIG_DICT` is for configs read without a model (data preparation, benchmark discovery):
    merged under one, it fills the policy keys with empty strings and adds a `policy_model` block, so
    `${policy_base_url}` references resolve and agents' `model_server: policy_model` references validate."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    dotenv_path: Optional[Path] = None
    initial_global_config_dict: Optional[Any] = None
    skip_load_from_cli: bool = False
    skip_load_from_dotenv: bool = False
    hide_secrets: bool = False

    NO_MODEL_GLOBAL_CONFIG_DICT: ClassVar[DictConfig] = OmegaConf.create(
        {
            POLICY_BASE_URL_KEY_NAME: "",
            POLICY_API_KEY_KEY_NAME: "",
            POLICY_MODEL_NAME_KEY_NAME: "",
            POLICY_MODEL_KEY_NAME: {"responses_api_models": {"dummy_model": {ENTRYPOINT_KEY_NAME: "app.py"}}},
        }
    )


class GlobalConfigDictParser(BaseModel):
    """NeMo Gym v0.5's parser object, as callers use it: `parse(GlobalConfigDictParserConfig(...))` builds a config
    (CLI overrides unless `skip_load_from_cli`, env.yaml unless `skip_load_from_dotenv`, then the initial dict and
    the files it names), `parse_no_environment(initial)` builds one from the dict alone. A thin layer over
    `parse_global_config`: the result is neither cached nor installed as this process's config (that is
    `get_global_config_dict`), and the ports it gives servers are free ports, not held for a launcher."""

    def parse(self, parse_config: Optional[GlobalConfigDictParserConfig] = None) -> DictConfig:
        options = parse_config or GlobalConfigDictParserConfig()
        held_before = set(_ports.reserved_ports())
        try:
            cfg = _parse_with(options, None, None, allocate_ports=True)
        finally:
            for host, port in set(_ports.reserved_ports()) - held_before:
                _ports.release_port(host, port)
        return mask_secrets(cfg) if options.hide_secrets else cfg

    def parse_no_environment(self, initial_global_config_dict: Optional[Mapping | DictConfig] = None) -> DictConfig:
        return self.parse(
            GlobalConfigDictParserConfig(
                initial_global_config_dict=initial_global_config_dict,
                skip_load_from_cli=True,
                skip_load_from_dotenv=True,
            )
        )

    def parse_global_config_dict_from_cli(self) -> DictConfig:
        """This command line's `+key=value` overrides alone, as a config (no files read, nothing validated)."""
        return OmegaConf.create(overrides_to_dict(parse_overrides(_default_cli_overrides())))


def reset_global_config_dict_cache() -> None:
    """Forget the cached config (tests)."""
    global _GLOBAL_CONFIG_DICT
    _GLOBAL_CONFIG_DICT = None


def loaded_global_config_dict() -> Optional[DictConfig]:
    """This process's global config if it was built already (never builds it: no argv parsing, no files)."""
    return _GLOBAL_CONFIG_DICT


def set_global_config_dict(cfg: DictConfig | Mapping) -> None:
    """Install `cfg` as this process's global config (the launcher and tests use this)."""
    global _GLOBAL_CONFIG_DICT
    _GLOBAL_CONFIG_DICT = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(dict(cfg))


def load_config_from_env_yaml_text(text: str) -> DictConfig:
    """Parse the YAML handed to a server child in `NEMO_GYM_CONFIG_DICT` (no validation)."""
    data = _parse_yaml_text(text, NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME)
    try:
        return OmegaConf.create(data)
    except OmegaConfBaseException as err:
        raise NeMoGymConfigError(f"{NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME}: {_first_line(err)}") from None


def _default_cli_overrides() -> list[str]:
    # When argv is pytest's own (`pytest ...`, `python -m pytest ...`), it holds pytest's arguments, not overrides.
    # (Not PYTEST_CURRENT_TEST: processes a test starts inherit it, and a script run by a test reads its own argv.)
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if program is not None and (program.name in ("pytest", "py.test") or program.parent.name == "pytest"):
        return []
    return sys.argv[1:]


def get_global_config_dict(
    global_config_dict_parser_config: Optional[GlobalConfigDictParserConfig] = None,
    global_config_dict_parser_cls: Optional[type] = None,
    *,
    overrides: Optional[list[str]] = None,
    initial_global_config_dict: Optional[Mapping | DictConfig] = None,
    allocate_ports: bool = True,
) -> DictConfig:
    """The global config of this process, built once and cached.

    In a server child (`NEMO_GYM_CONFIG_DICT` set) it is the YAML handed down by `ng_run`, taken as
    is. Otherwise it is parsed from `overrides` (default: `sys.argv[1:]`), or, as in NeMo Gym v0.5, by
    `global_config_dict_parser_cls().parse(...)` when the caller passes its own subclass of `GlobalConfigDictParser`."""
    global _GLOBAL_CONFIG_DICT
    options = global_config_dict_parser_config or GlobalConfigDictParserConfig()
    if _GLOBAL_CONFIG_DICT is None:
        env_text = os.environ.get(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME)
        if env_text is not None:
            _GLOBAL_CONFIG_DICT = load_config_from_env_yaml_text(env_text)
        elif global_config_dict_parser_cls not in (None, GlobalConfigDictParser):
            _GLOBAL_CONFIG_DICT = global_config_dict_parser_cls().parse(options)
        else:
            _GLOBAL_CONFIG_DICT = _parse_with(options, overrides, initial_global_config_dict, allocate_ports)
    if options.hide_secrets:
        return mask_secrets(_GLOBAL_CONFIG_DICT)
    return _GLOBAL_CONFIG_DICT


def build_global_config_dict(global_config_dict_parser_config: Optional[GlobalConfigDictParserConfig] = None) -> DictConfig:
    """Parse a new global config from these options (never the cached one) and install it as this process's.

    For code that starts a stack in its own process (`RunHelper().start(...)`, NeMo Gym v0.5's in-process start):
    a trainer may build several configs in one process, and its argv is not ours when `skip_load_from_cli`."""
    global _GLOBAL_CONFIG_DICT
    options = global_config_dict_parser_config or GlobalConfigDictParserConfig()
    _GLOBAL_CONFIG_DICT = _parse_with(options, None, None, allocate_ports=True)
    return _GLOBAL_CONFIG_DICT


def _parse_with(
    options: GlobalConfigDictParserConfig,
    overrides: Optional[list[str]],
    initial_global_config_dict: Optional[Mapping | DictConfig],
    allocate_ports: bool,
) -> DictConfig:
    if overrides is None:
        overrides = [] if options.skip_load_from_cli else _default_cli_overrides()
    initial = initial_global_config_dict
    if initial is None:
        initial = options.initial_global_config_dict
    # A `dotenv_path` that does not exist is skipped, as NeMo Gym does (trainers pass a path that is often absent).
    dotenv_given = options.dotenv_path is not None
    dotenv_exists = dotenv_given and Path(options.dotenv_path).is_file()
    return parse_global_config(
        overrides,
        initial_global_config_dict=initial,
        allocate_ports=allocate_ports,
        env_yaml_path=options.dotenv_path if dotenv_exists else None,
        load_env_yaml=not options.skip_load_from_dotenv and (dotenv_exists or not dotenv_given),
    )


# --------------------------------------------------------------------------------------------------
# Reading server blocks
# --------------------------------------------------------------------------------------------------


def find_server_instances(cfg: Optional[DictConfig] = None) -> list[ServerInstanceSpec]:
    """The top-level server blocks (`id -> type -> impl -> {entrypoint, ...}`), in config order.
    Blocks that fail validation (almost-servers let through by `error_on_almost_servers=false`)
    are skipped: they are never started."""
    cfg = _as_dictconfig(cfg)
    specs: list[ServerInstanceSpec] = []
    for sid in cfg.keys():
        if _is_reserved(sid):
            continue
        node = cfg._get_node(sid)
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing() or node._is_interpolation():
            continue
        raw = OmegaConf.to_container(node, resolve=False)
        if not _looks_like_server_block(raw):
            continue
        if _validate_block(cfg, str(sid), raw):
            continue
        server_type = next(t for t in SERVER_TYPES if t in raw)
        impl = next(iter(raw[server_type]))
        specs.append(ServerInstanceSpec(str(sid), server_type, str(impl), node[server_type][impl]))
    return specs


def _as_dictconfig(cfg: Any) -> DictConfig:
    """This process's config for None; plain dicts (e.g. fetched from the head server) are wrapped."""
    if cfg is None:
        return get_global_config_dict()
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.create(dict(cfg))


def _server_ids(cfg: DictConfig) -> list[str]:
    return [s.server_id for s in find_server_instances(cfg)]


def _unknown_server(cfg: DictConfig, server_id: str) -> NeMoGymConfigError:
    existing = _server_ids(cfg)
    msg = f"No server named `{server_id}` in the config. Existing servers: {', '.join(existing) or '(none)'}."
    msg += did_you_mean(server_id, existing)
    return NeMoGymConfigError(msg)


def _block_id(cfg: DictConfig, server_id: str) -> str:
    """`server_id`, or the id of the resources server it is the other spelling of (`legacy_ids`)."""
    return resources_server_alias(cfg, server_id) or server_id


def get_first_server_config_dict(cfg: Optional[DictConfig], server_id: str) -> DictConfig:
    """The implementation-level dict of block `server_id` (`cfg[id] -> first -> first`), unresolved."""
    cfg = _as_dictconfig(cfg)
    server_id = _block_id(cfg, server_id)
    if server_id not in cfg:
        raise _unknown_server(cfg, server_id)
    node = cfg[server_id]
    try:
        for _ in range(2):
            node = node[next(iter(node.keys()))]
    except (StopIteration, AttributeError, TypeError, KeyError):
        raise NeMoGymConfigError(
            f"`{server_id}` is not a server block (expected {server_id} -> <server_type> -> <implementation>)."
        ) from None
    if not isinstance(node, DictConfig):
        raise NeMoGymConfigError(f"`{server_id}` is not a server block.")
    return node


def resolve_server_config(cfg: Optional[DictConfig], server_id: str) -> dict:
    """The resolved implementation-level dict of `server_id` as plain Python, plus `name`."""
    server_id = _block_id(_as_dictconfig(cfg), server_id)
    node = get_first_server_config_dict(cfg, server_id)
    try:
        out = OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as err:
        raise NeMoGymConfigError(f"Server `{server_id}`: {_explain_resolution_error(err)}") from None
    out["name"] = server_id
    return out


def load_server_config(config_cls: type[BaseModel], server_id: Optional[str] = None, cfg: Optional[DictConfig] = None):
    """Resolve block `server_id` (default: `NEMO_GYM_CONFIG_PATH`) and validate it into the
    server's config class; a missing field names the server, the field and the override."""
    cfg = get_global_config_dict() if cfg is None else cfg
    if server_id is None:
        server_id = os.environ.get(NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME)
        if not server_id:
            raise NeMoGymConfigError(
                f"No server id: {NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME} is not set (start servers with ng_run)."
            )
    server_id = _block_id(cfg, server_id)
    data = resolve_server_config(cfg, server_id)
    block = cfg[server_id]
    server_type = next(iter(block.keys()))
    impl = next(iter(block[server_type].keys()))
    return validate_server_config(config_cls, data, server_id=server_id, key_path=f"{server_id}.{server_type}.{impl}")


def get_head_server_config(cfg: Optional[DictConfig] = None) -> BaseServerConfig:
    """Host and port of the head server (defaults 127.0.0.1:11000)."""
    cfg = get_global_config_dict() if cfg is None else cfg
    host = _select(cfg, f"{HEAD_SERVER_KEY_NAME}.host", None) or _select(cfg, DEFAULT_HOST_KEY_NAME, DEFAULT_HOST)
    port = _select(cfg, f"{HEAD_SERVER_KEY_NAME}.port", DEFAULT_HEAD_SERVER_PORT)
    return BaseServerConfig(host=host, port=_as_int(port, f"{HEAD_SERVER_KEY_NAME}.port"))


def find_open_port(
    disallowed_ports: Optional[Iterable[int]] = None,
    port_range_low: int = _ports.DEFAULT_PORT_RANGE_LOW,
    port_range_high: int = _ports.DEFAULT_PORT_RANGE_HIGH,
    host: str = DEFAULT_HOST,
) -> int:
    """A free port, released before returning (reference API, for code that hands the number to a
    process of its own). Prefer `ports.reserve_port`, which keeps the port held."""
    port = _ports.reserve_port(host, low=port_range_low, high=port_range_high, disallowed=disallowed_ports or ())
    _ports.release_port(host, port)
    return port


# --------------------------------------------------------------------------------------------------
# Dumping
# --------------------------------------------------------------------------------------------------


def dump_config_yaml(cfg: Optional[DictConfig] = None, *, resolve: bool = True, mask: bool = True) -> str:
    """The config as YAML: resolved (`ng_dump_config`) or not (what server children receive), with
    secrets masked or not. Unresolvable interpolations raise NeMoGymConfigError naming the key."""
    cfg = get_global_config_dict() if cfg is None else cfg
    if isinstance(cfg, Mapping) and not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(dict(cfg))
    try:
        data = OmegaConf.to_container(cfg, resolve=resolve)
    except OmegaConfBaseException as err:
        raise NeMoGymConfigError(_explain_resolution_error(err)) from None
    if mask:
        data = _mask(data)
    return OmegaConf.to_yaml(OmegaConf.create(data))
