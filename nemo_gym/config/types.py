"""Pydantic models for the config: server references, server blocks, datasets and CLI parameters.

The names match NeMo Gym v0.2 (`nemo_gym.config_types`, a re-export of this module) so environment code
written for it imports unchanged. Everything that turns a pydantic error into a user-facing message also lives here, so
every command reports config mistakes the same way (a `NeMoGymConfigError` naming the key and the fix).
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal, Mapping, Optional, Union

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from nemo_gym.errors import NeMoGymConfigError, closest_match
from nemo_gym.config.values import truthy

__all__ = [
    "SERVER_TYPES",
    "MODEL_SERVER_TYPE",
    "RESOURCES_SERVER_TYPE",
    "AGENT_SERVER_TYPE",
    "ModelServerRef",
    "ResourcesServerRef",
    "AgentServerRef",
    "is_server_ref",
    "Domain",
    "GitlabIdentifier",
    "HuggingFaceIdentifier",
    "GitlabDatasetSource",
    "HuggingFaceDatasetSource",
    "DatasetConfig",
    "BenchmarkDatasetConfig",
    "parse_dataset_config",
    "BaseServerConfig",
    "RestartPolicy",
    "BaseRunServerConfig",
    "BaseRunServerInstanceConfig",
    "ServerImplConfig",
    "ResourcesServerImplConfig",
    "ResponsesAPIModelServerInstanceConfig",
    "ResourcesServerInstanceConfig",
    "ResponsesAPIAgentServerInstanceConfig",
    "SERVER_INSTANCE_CONFIG_BY_TYPE",
    "ServerInstanceSpec",
    "format_validation_errors",
    "validate_server_config",
    "wants_help",
    "BaseNeMoGymCLIConfig",
    "ROLLOUT_PATH_PREFIX",
    "AggregateMetricsRequest",
    "AggregateMetrics",
]


# --------------------------------------------------------------------------------------------------
# Server types and references
# --------------------------------------------------------------------------------------------------

SERVER_TYPES: tuple[str, ...] = ("responses_api_models", "resources_servers", "responses_api_agents")
ServerTypeName = Literal["responses_api_models", "resources_servers", "responses_api_agents"]

MODEL_SERVER_TYPE = "responses_api_models"
RESOURCES_SERVER_TYPE = "resources_servers"
AGENT_SERVER_TYPE = "responses_api_agents"


class ModelServerRef(BaseModel):
    """Points at a model server block by its server id (`{type: responses_api_models, name: ...}`)."""

    type: Literal["responses_api_models"]
    name: str


class ResourcesServerRef(BaseModel):
    """Points at a resources server block by its server id."""

    type: Literal["resources_servers"]
    name: str


class AgentServerRef(BaseModel):
    """Points at an agent server block by its server id."""

    type: Literal["responses_api_agents"]
    name: str


ServerRef = Union[ModelServerRef, ResourcesServerRef, AgentServerRef]


def is_server_ref(value: Any) -> bool:
    """True for a mapping that looks like a server reference: `type` is a server type and the only
    other key is `name`. Why so strict: agent blocks hold other dicts with a `type` key (datasets)."""
    if not isinstance(value, (Mapping, DictConfig)):
        return False
    keys = set(value.keys())
    return "type" in keys and keys <= {"type", "name"} and value.get("type") in SERVER_TYPES


# --------------------------------------------------------------------------------------------------
# Domains and datasets
# --------------------------------------------------------------------------------------------------


class Domain(str, Enum):
    """What a resources server trains; required on every resources server block."""

    MATH = "math"
    CODING = "coding"
    AGENT = "agent"
    KNOWLEDGE = "knowledge"
    INSTRUCTION_FOLLOWING = "instruction_following"
    LONG_CONTEXT = "long_context"
    SAFETY = "safety"
    GAMES = "games"
    TRANSLATION = "translation"
    E2E = "e2e"
    RLHF = "rlhf"
    OTHER = "other"


DatasetLicense = Literal[
    "Apache 2.0",
    "MIT",
    "Creative Commons Attribution 4.0 International",
    "Creative Commons Attribution-ShareAlike 4.0 International",
    "NVIDIA Internal Use Only, Do Not Distribute",
    "TBD",
    "GNU General Public License v3.0",
    # Added in NeMo Gym v0.5.
    "CC BY-SA 4.0",
    "CC BY-NC 3.0",
    "NVIDIA Evaluation Dataset License Agreement",
]

# `benchmark` (NeMo Gym v0.5): evaluation data made by the dataset's `prepare_script` (see BenchmarkDatasetConfig).
DatasetType = Literal["train", "validation", "example", "benchmark"]


class GitlabIdentifier(BaseModel):
    """A dataset stored in the GitLab/MLflow model registry."""

    dataset_name: str
    version: str
    artifact_fpath: str


class HuggingFaceIdentifier(BaseModel):
    """A dataset on the Hugging Face hub. Without `artifact_fpath` the split named by the dataset's
    `type` is loaded with `datasets.load_dataset`."""

    repo_id: str
    artifact_fpath: Optional[str] = None


class GitlabDatasetSource(GitlabIdentifier):
    """`source: {type: gitlab, ...}` (NeMo Gym v0.5's spelling of `gitlab_identifier`)."""

    type: Literal["gitlab"]


class HuggingFaceDatasetSource(HuggingFaceIdentifier):
    """`source: {type: huggingface, ...}` (NeMo Gym v0.5's spelling of `huggingface_identifier`)."""

    type: Literal["huggingface"]


DatasetSource = Annotated[Union[GitlabDatasetSource, HuggingFaceDatasetSource], Field(discriminator="type")]


class DatasetConfig(BaseModel):
    """One `datasets` entry on an agent block."""

    name: str
    type: DatasetType
    jsonl_fpath: str
    num_repeats: int = Field(default=1, ge=1)
    # Where the file comes from: `source` (v0.5) or the older `gitlab_identifier` / `huggingface_identifier`
    # (still accepted; a `source` is mirrored into the matching identifier, so code reading those keeps working).
    source: Optional[DatasetSource] = None
    gitlab_identifier: Optional[GitlabIdentifier] = None
    huggingface_identifier: Optional[HuggingFaceIdentifier] = None
    license: Optional[DatasetLicense] = None

    @model_validator(mode="after")
    def _license_required_for_training_data(self) -> "DatasetConfig":
        # Train/validation data gets redistributed with trained models, so its license must be known.
        if self.type in ("train", "validation") and self.license is None:
            raise ValueError(f"A license is required for {self.name}")
        return self

    @model_validator(mode="after")
    def _one_source_style(self) -> "DatasetConfig":
        if self.source is None:
            return self
        if self.gitlab_identifier is not None or self.huggingface_identifier is not None:
            raise ValueError(
                f"Dataset {self.name} has both `source` and `gitlab_identifier`/`huggingface_identifier`; keep only "
                "`source` (the identifiers are the older spelling of the same thing)."
            )
        fields = self.source.model_dump(exclude={"type"})
        if isinstance(self.source, GitlabDatasetSource):
            object.__setattr__(self, "gitlab_identifier", GitlabIdentifier(**fields))
        else:
            object.__setattr__(self, "huggingface_identifier", HuggingFaceIdentifier(**fields))
        return self


class BenchmarkDatasetConfig(DatasetConfig):
    """The dataset of a benchmark definition (`benchmarks/<name>/config.yaml`, NeMo Gym v0.5).

    Its JSONL is not committed: `prepare_script` (a dotted module path, e.g. `benchmarks.arithmetic.prepare`, or the
    file's path as NeMo Gym v0.5's own configs write it, `benchmarks/arithmetic/prepare.py`, read as the same module)
    has a `prepare(**args)` that writes it and returns its path, which must be `jsonl_fpath` (`ng_prepare_benchmark`).
    `prompt_config` (a prompt template YAML) renders each row's input at collation, so the data stays prompt-free;
    `num_repeats` copies each row that many times at collation."""

    type: Literal["benchmark"] = "benchmark"
    prepare_script: str
    prompt_config: Optional[str] = None

    @field_validator("prepare_script")
    @classmethod
    def _script_path_as_module(cls, value: str) -> str:
        if not value.endswith(".py"):
            return value
        parts = [p for p in value[: -len(".py")].replace("\\", "/").split("/") if p and p != "."]
        return ".".join(parts)


def parse_dataset_config(raw: Any) -> DatasetConfig:
    """A `datasets` entry as its model: `BenchmarkDatasetConfig` for `type: benchmark`, else `DatasetConfig`.
    Raises pydantic's ValidationError."""
    if isinstance(raw, Mapping) and raw.get("type") == "benchmark":
        return BenchmarkDatasetConfig.model_validate(dict(raw))
    return DatasetConfig.model_validate(raw)


# --------------------------------------------------------------------------------------------------
# Server configs (what a server class validates its own block into)
# --------------------------------------------------------------------------------------------------


class BaseServerConfig(BaseModel):
    """Where a server listens."""

    host: str
    port: int


class RestartPolicy(BaseModel):
    """How `ng_run` restarts a server process that exits or stops answering `/health` after the stack was ready
    (global `restart_policy`, or per server inside its implementation block; per-server keys win). A server
    that fails while the stack starts is never restarted: `ng_run` exits with its error."""

    model_config = ConfigDict(extra="forbid")

    max_restarts: int = Field(
        default=5, ge=0, description="Restarts allowed within window_s; one more crash marks the server failed."
    )
    window_s: float = Field(default=600.0, gt=0, description="Seconds over which restarts are counted.")
    backoff_s: float = Field(
        default=0.5, ge=0, description="Wait before the first restart in the window; doubled for each further one."
    )
    backoff_max_s: float = Field(default=30.0, ge=0, description="Cap of the wait before a restart.")
    health_check_interval_s: float = Field(default=10.0, gt=0, description="How often a ready server's /health is checked.")
    health_check_timeout_s: float = Field(default=10.0, gt=0, description="How long one /health check may take.")
    health_check_failures: int = Field(
        default=6, ge=1, description="Consecutive failed /health checks after which the server is killed and restarted."
    )


class BaseRunServerConfig(BaseServerConfig):
    """The implementation-level fields every server block may carry. Extra keys are kept: the
    server's own config class (a subclass) validates them."""

    model_config = ConfigDict(extra="allow")

    entrypoint: str
    num_workers: Optional[int] = None
    domain: Optional[Domain] = None
    datasets: Optional[list[DatasetConfig]] = None
    # Our extensions, not in NeMo Gym v0.2: per-server venv isolation (runtime/venvs.py) and "this server needs
    # Ray" (runtime/ray.py).
    venv_mode: Optional[Literal["shared", "isolated"]] = None
    ray: bool = False
    # Overrides of the global `restart_policy` for this server (runtime/launcher.py).
    restart_policy: Optional[RestartPolicy] = None
    # How many processes serve this block (Ray Serve's name; docs/design.md, decision 22). Replica 0 listens on
    # `port`, replica i on `replica_ports[i]` (ng_run reserves them and writes the list into the config its
    # children and the head server see; a list written in the config is used as is).
    num_replicas: int = Field(default=1, ge=1)
    replica_ports: Optional[list[int]] = None
    # Run the replicas as Ray actors with these options (Ray's names; docs/design.md, decision 24), where to
    # place them, and how often Ray restarts one (default: restart_policy.max_restarts; -1 = without limit).
    ray_actor_options: Optional[dict[str, Any]] = None
    scheduling_strategy: Optional[Literal["SPREAD", "DEFAULT"]] = None
    max_restarts: Optional[int] = Field(default=None, ge=-1)
    # The largest request body this server reads (bytes); larger ones are answered 413 before they are buffered
    # (nemo_gym/serving/limits.py). None: the global `max_request_body_bytes`, else 32 MiB.
    max_request_body_bytes: Optional[int] = Field(default=None, ge=1)
    # The largest request line and headers (bytes; else 431), how long they may take to arrive once begun and how
    # long a body may stop arriving (seconds; else 408), and how long a client may read nothing of an answer
    # (seconds; else the connection is closed). None: the global keys of these names, else 64 KiB, 60 s, 60 s and
    # 60 s (nemo_gym/serving/limits.py).
    max_request_head_bytes: Optional[int] = Field(default=None, ge=1)
    request_head_timeout_s: Optional[float] = Field(default=None, gt=0)
    request_body_timeout_s: Optional[float] = Field(default=None, gt=0)
    response_send_timeout_s: Optional[float] = Field(default=None, gt=0)


class BaseRunServerInstanceConfig(BaseRunServerConfig):
    """A server's resolved config plus `name`, the server id (its top-level block key)."""

    name: str


# --------------------------------------------------------------------------------------------------
# Block-shape models: {server_type: {impl: {entrypoint, ...}}}
# --------------------------------------------------------------------------------------------------


class ServerImplConfig(BaseRunServerConfig):
    """The implementation-level dict as it appears in YAML: host and port may still be missing
    (filled from `default_host` and the port allocator), everything else as in `BaseRunServerConfig`."""

    host: Optional[str] = None
    port: Optional[int] = None


class ResourcesServerImplConfig(ServerImplConfig):
    @model_validator(mode="after")
    def _domain_required(self) -> "ResourcesServerImplConfig":
        if self.domain is None:
            raise ValueError("A domain is required for resources servers.")
        return self


class ResponsesAPIModelServerInstanceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    responses_api_models: dict[str, ServerImplConfig] = Field(min_length=1, max_length=1)


class ResourcesServerInstanceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resources_servers: dict[str, ResourcesServerImplConfig] = Field(min_length=1, max_length=1)


class ResponsesAPIAgentServerInstanceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    responses_api_agents: dict[str, ServerImplConfig] = Field(min_length=1, max_length=1)


ServerInstanceConfig = Union[
    ResponsesAPIModelServerInstanceConfig,
    ResourcesServerInstanceConfig,
    ResponsesAPIAgentServerInstanceConfig,
]

SERVER_INSTANCE_CONFIG_BY_TYPE: dict[str, type[BaseModel]] = {
    "responses_api_models": ResponsesAPIModelServerInstanceConfig,
    "resources_servers": ResourcesServerInstanceConfig,
    "responses_api_agents": ResponsesAPIAgentServerInstanceConfig,
}


@dataclass
class ServerInstanceSpec:
    """One top-level server block: `<server_id>: {<server_type>: {<impl>: config}}`.

    `config` is the implementation-level DictConfig, interpolations unresolved (it keeps its parent,
    so absolute `${...}` references still resolve against the whole global config)."""

    server_id: str
    server_type: str
    impl: str
    config: DictConfig

    @property
    def dir_relpath(self) -> str:
        """The implementation directory relative to the repo root, e.g. `resources_servers/mcqa`."""
        return f"{self.server_type}/{self.impl}"


# --------------------------------------------------------------------------------------------------
# Turning pydantic errors into messages people can act on
# --------------------------------------------------------------------------------------------------


def _loc_str(loc: tuple) -> str:
    return ".".join(str(part) for part in loc)


def format_validation_errors(err: ValidationError | list[dict], *, key_prefix: str = "") -> list[str]:
    """One line per pydantic error: `<dotted key>: <message> (got <value>)`.

    Literal errors at the same location are merged into one "Must be one of: ..." line, which is
    what a user needs when they mistyped a domain or license."""
    errors = err.errors() if isinstance(err, ValidationError) else err
    lines: list[str] = []
    seen_literal_locs: set[tuple] = set()
    for e in errors:
        loc = tuple(e.get("loc", ()))
        key = ".".join(p for p in (key_prefix, _loc_str(loc)) if p)
        etype = e.get("type", "")
        if etype in ("literal_error", "enum"):
            if loc in seen_literal_locs:
                continue
            seen_literal_locs.add(loc)
            expected = (e.get("ctx") or {}).get("expected", "")
            msg = f"Must be one of: {expected}" if expected else e.get("msg", "")
        elif etype == "missing":
            msg = "Field required"
        else:
            msg = e.get("msg", "")
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            elif msg.startswith("Assertion failed, "):
                msg = msg[len("Assertion failed, ") :]
        line = f"{key}: {msg}" if key else msg
        if etype not in ("missing",) and "input" in e and not isinstance(e["input"], (dict, list)):
            line += f" (got {e['input']!r})"
        lines.append(line)
    return lines


def validate_server_config(
    config_cls: type[BaseModel], data: Mapping[str, Any], *, server_id: str, key_path: str | None = None
) -> BaseModel:
    """Validate a server's resolved block into its config class, naming the server and field on error.

    `key_path` is the dotted path of the implementation dict (`my_server.resources_servers.my_impl`);
    it turns a missing field into the exact `+...=` override that fixes it."""
    try:
        return config_cls.model_validate(dict(data))
    except ValidationError as err:
        prefix = key_path or server_id
        problems = []
        for e in err.errors():
            loc = _loc_str(tuple(e.get("loc", ())))
            if e.get("type") == "missing":
                problems.append(
                    f"missing required field `{loc}`: add it to the block or pass `+{prefix}.{loc}=...`"
                )
        problems.extend(
            line for line in format_validation_errors(err) if not line.endswith(": Field required")
        )
        head = f"Server `{server_id}` has an invalid config ({config_cls.__name__}): {problems[0] if problems else err}"
        if len(problems) > 1:
            body = "\n".join(f"  - {p}" for p in problems)
            head += f" (and {len(problems) - 1} more problem(s), listed below)\n{body}"
        raise NeMoGymConfigError(head) from None


# --------------------------------------------------------------------------------------------------
# CLI command parameters
# --------------------------------------------------------------------------------------------------

HELP_KEYS = ("h", "help")
HELP_WIDTH = 100  # fixed, so help reads the same in every terminal and in files



def wants_help(cfg_or_overrides: Any) -> bool:
    """True when the user asked for a command's help with `+h=true` / `+help=true`.

    Accepts the global config (DictConfig or dict) or the raw list of CLI overrides, so a command
    can answer `+h=true` before parsing a config that might not even load."""
    if cfg_or_overrides is None:
        return False
    if isinstance(cfg_or_overrides, (DictConfig, Mapping)):
        for key in HELP_KEYS:
            try:
                value = cfg_or_overrides.get(key)
            except Exception:  # an unresolvable interpolation is not a request for help
                value = None
            if value is not None and truthy(value):
                return True
        return False
    if isinstance(cfg_or_overrides, str):
        cfg_or_overrides = [cfg_or_overrides]
    for item in cfg_or_overrides:
        text = str(item).strip().lstrip("+")
        if text in ("-h", "--help"):
            return True
        if "=" not in text:
            continue
        key, value = text.split("=", 1)
        if key.strip() in HELP_KEYS and truthy(value.strip().strip("'\"")):
            return True
    return False


def _type_name(annotation: Any) -> str:
    """A short readable type for the help table: `str`, `Optional[int]`, `Literal['a', 'b']`."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        inner = " | ".join(_type_name(a) for a in non_none)
        return f"Optional[{inner}]" if len(non_none) < len(args) else inner
    if origin is Literal:
        return "Literal[" + ", ".join(repr(a) for a in args) + "]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        if args:
            return f"{name}[{', '.join(_type_name(a) for a in args)}]"
        return name
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def _default_text(field: Any) -> str:
    if field.is_required():
        return "[required]"
    if field.default_factory is not None:
        try:
            return f"[default: {field.default_factory()!r}]"
        except Exception:
            return "[default: <factory>]"
    value = field.default
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _parameter_rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) per parameter; a nested model's fields get rows of their own, as the
    dotted keys they are passed with (`head_server.port`)."""
    rows = []
    for name, field in model.model_fields.items():
        shown = prefix + (field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows.extend(_parameter_rows(annotation, f"{shown}."))
            continue
        rows.append((shown, _type_name(annotation), _default_text(field), field.description or ""))
    return rows


class BaseNeMoGymCLIConfig(BaseModel):
    """Base for each command's parameters. Parameters are top-level keys of the global config,
    passed on the CLI as `+name=value`. Subclasses document themselves with their docstring and
    `Field(description=...)`; `+h=true` prints both."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    # The whole config the parameters were read from: commands that also need server blocks or the head server
    # read it here, so `run(config)` gets everything in one argument.
    _global_config: Any = PrivateAttr(default=None)

    @property
    def global_config(self) -> Any:
        """The global config `from_global_config` read these parameters from (None when built directly)."""
        return self._global_config

    @classmethod
    def parameter_keys(cls) -> dict[str, str]:
        """Map every accepted config key (field name and alias) to the field name."""
        keys: dict[str, str] = {}
        for name, field in cls.model_fields.items():
            keys[name] = name
            if field.alias:
                keys[field.alias] = name
            if isinstance(field.validation_alias, str):
                keys[field.validation_alias] = name
        return keys

    @classmethod
    def description(cls) -> str:
        """The subclass's docstring, cleaned up ("" when it has none of its own)."""
        import inspect

        if not cls.__doc__ or (cls.__doc__ == BaseNeMoGymCLIConfig.__doc__ and cls is not BaseNeMoGymCLIConfig):
            return ""
        return inspect.cleandoc(cls.__doc__)

    @classmethod
    def parameter_rows(cls) -> list[tuple[str, str, str, str]]:
        """(key, type, default, description) per parameter, nested ones as dotted keys (`head_server.port`)."""
        return _parameter_rows(cls)

    @classmethod
    def parameter_table(cls) -> list[str]:
        """The parameters as a table: name (as `+name`), type, default, description."""
        rows = cls.parameter_rows()
        if not rows:
            return ["This command has no parameters of its own (it reads the global config)."]
        name_w = max(len("Parameter"), *(len(r[0]) + 1 for r in rows))
        type_w = max(len("Type"), *(len(r[1]) for r in rows))
        default_w = max(len("Default"), *(len(r[2]) for r in rows))
        header = f"{'Parameter':<{name_w}}  {'Type':<{type_w}}  {'Default':<{default_w}}  Description"
        lines = ["Parameters (pass as +name=value):", header, "-" * len(header)]
        desc_col = name_w + type_w + default_w + 6
        # Descriptions go beside the row while that leaves them room, else on indented lines of their own.
        beside = HELP_WIDTH - desc_col >= 40
        for shown, type_name, default, desc in rows:
            row = f"{'+' + shown:<{name_w}}  {type_name:<{type_w}}  {default:<{default_w}}"
            if beside:
                desc_lines = _wrap(desc, HELP_WIDTH - desc_col)
                lines.append(f"{row}  {desc_lines[0]}")
                lines.extend(" " * desc_col + extra for extra in desc_lines[1:])
            else:
                lines.append(row.rstrip())
                lines.extend(f"      {extra}" for extra in _wrap(desc, HELP_WIDTH - 6) if extra)
        return lines

    @classmethod
    def help_text(cls, command_name: str) -> str:
        """The command's description followed by a table of its parameters."""
        lines = [f"Usage: {command_name} [+name=value ...]", ""]
        doc = cls.description()
        if doc:
            lines += [doc, ""]
        lines += cls.parameter_table()
        lines += ["", "Global options: +config_paths=[a.yaml,b.yaml] and any key of the global config."]
        return "\n".join(lines).rstrip() + "\n"

    @classmethod
    def from_global_config(cls, cfg: Any = None):
        """Validate this command's parameters from the global config (other keys are ignored).

        Missing or invalid parameters raise `NeMoGymConfigError` with the `+key=...` to pass and,
        when the user passed a near-miss key, a "did you mean"."""
        if cfg is None:
            from nemo_gym.config.global_config import get_global_config_dict

            cfg = get_global_config_dict()
        keys = cls.parameter_keys()
        data: dict[str, Any] = {}
        for key in keys:
            if key not in cfg:
                continue
            try:
                value = cfg[key]
                if isinstance(value, (DictConfig, ListConfig)):
                    value = OmegaConf.to_container(value, resolve=True)
            except Exception as exc:  # resolution errors name the key
                raise NeMoGymConfigError(f"Cannot read parameter `{key}`: {exc}") from None
            data[key] = value
        try:
            parsed = cls.model_validate(data)
        except ValidationError as err:
            raise NeMoGymConfigError(cls._explain(err, list(cfg.keys()))) from None
        parsed._global_config = cfg
        return parsed

    @classmethod
    def _explain(cls, err: ValidationError, passed_keys: list) -> str:
        field_keys = cls.parameter_keys()
        unknown = [str(k) for k in passed_keys if str(k) not in field_keys]
        problems: list[str] = []
        for e in err.errors():
            loc = tuple(e.get("loc", ()))
            top = str(loc[0]) if loc else ""
            field = cls.model_fields.get(field_keys.get(top, top))
            shown = (field.alias if field and field.alias else top) if top else ""
            if e.get("type") == "missing" and len(loc) == 1:
                msg = f"missing required parameter `+{shown}=...`"
                close = closest_match(shown, unknown, cutoff=0.7)
                if close:
                    msg += f" (you passed `+{close}`: did you mean `+{shown}`?)"
                if field is not None and field.description:
                    msg += f": {field.description}"
            else:
                detail = format_validation_errors([e])
                key, _, reason = (detail[0] if detail else f"{shown}: invalid").partition(": ")
                msg = f"invalid parameter `+{key}`: {reason}"
            problems.append(msg)
        # The first line names the (first) parameter at fault; further problems follow, one per line.
        first = problems[0].rstrip(".")
        if len(problems) == 1:
            return f"{first}. Pass +h=true for help."
        body = "\n".join(f"  - {p}" for p in problems)
        return f"{first} (and {len(problems) - 1} more problem(s), listed below). Pass +h=true for help.\n{body}"


# --------------------------------------------------------------------------------------------------
# NeMo Gym v0.5: `/aggregate_metrics` bodies and the rollout-id path prefix
# --------------------------------------------------------------------------------------------------

# Calls made for one rollout may carry `/ng-rollout/<rollout id>` in front of their path
# (`nemo_gym.servers.rollout_context`).
ROLLOUT_PATH_PREFIX = "ng-rollout"


class AggregateMetricsRequest(BaseModel):
    """`POST /aggregate_metrics` body: the verify responses of a collection (each with `_ng_task_index`,
    `_ng_rollout_index`, `reward` and whatever else the verifier returned), usually without the big
    `response` / `responses_create_params` payloads."""

    verify_responses: list[dict[str, Any]] = Field(default_factory=list)


class AggregateMetrics(BaseModel):
    """`POST /aggregate_metrics` answer: per-task rows, per-agent metrics and the few metrics worth printing."""

    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)
