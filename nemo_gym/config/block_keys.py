"""Misspelled keys INSIDE a server block or a framework section, refused with a did-you-mean before anything starts.

`known_keys.check_known_keys` refuses an unknown top-level key. This module looks one level further down:

- a server block (`<id>.<server type>.<implementation>.<key>`, from a YAML file, env.yaml or a command-line
  override) is checked against the fields of the server's config class. The class is found WITHOUT importing the
  server: its entrypoint (`app.py`) is parsed with `ast`, the class whose `config:` annotation names the config
  model is followed through its bases (same file, files of the same repo, `nemo_gym` itself), and the fields are the
  annotated attributes (plus `Field(alias=...)`). Model-typed fields whose class is found the same way (server
  references, `restart_policy`, `datasets` entries, a config class of the same file) are checked one level further.
- the framework's own nested sections (`head_server`, `restart_policy`) are checked against their models.

Why only close matches: the config models of NeMo Gym v0.2/v0.5 allow extra keys in a server block
(`BaseRunServerConfig` is `extra="allow"`), and shipped configs use that: `verified`, `verified_url`,
`description`, `value` are read by tooling, environments keep their own settings there. So in a server block (and
in any YAML section) an unknown key is refused only when it is a likely misspelling of a field: the same word up
to case and `_`/`-`, or one edit away (insert, delete, substitute, swap two neighbours) for a key of 4+ characters,
two edits for 8+. A key nothing resembles is kept, as before. On the command line a framework section with a fixed
set of keys (`+head_server.prot=...`) is strict: any key it does not have is refused, as at the top level.

Left free (never checked): anything under a field typed `dict`/`Any`/a union/a class that cannot be read
statically (a model's request params, `ray_actor_options`, dataset `source`), keys starting with `_` (config
directives such as `_inherit_from`), and a server whose config class cannot be found statically (its block is not
checked at all rather than checked against half of its fields). `++key=value` on the command line is never refused,
at any depth.
"""

from __future__ import annotations

import ast
import functools
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from pydantic import BaseModel

__all__ = [
    "KeySchema",
    "KeyProblem",
    "close_field",
    "schema_from_model",
    "server_config_schema",
    "nested_key_problems",
    "check_nested_keys",
    "nested_key_errors",
    "format_problems",
]

SERVER_TYPES = ("responses_api_models", "resources_servers", "responses_api_agents")
# Conventional fields of a resources server block that tooling reads but no config class declares (NeMo Gym v0.2
# spec, section 2.1; v0.5 listings read domain/description/value).
CONVENTIONAL_FIELDS = {"resources_servers": frozenset({"verified", "verified_url", "description", "value"})}
# An unknown key is a typo of a field when it is this close (see `close_field`).
_MIN_LEN_ONE_EDIT = 4
_MIN_LEN_TWO_EDITS = 8


# ------------------------------------------------------------------------------------------------ closeness


def _edit_distance(a: str, b: str, limit: int = 3) -> int:
    """Levenshtein distance with adjacent swaps counted as one edit (optimal string alignment); > limit is capped."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return min(prev[len(b)], limit + 1)


def _norm(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def close_field(name: str, fields: Iterable[str]) -> Optional[str]:
    """The field `name` is most likely a misspelling of, or None: same up to case/`_`/`-`, else within one edit
    (name of 4+ characters) or two (8+)."""
    name = str(name)
    candidates = sorted(str(f) for f in fields if str(f) != name)
    for f in candidates:
        if _norm(f) == _norm(name) and _norm(name):
            return f
    if len(name) < _MIN_LEN_ONE_EDIT:
        return None
    allowed = 2 if len(name) >= _MIN_LEN_TWO_EDITS else 1
    best, best_d = None, allowed + 1
    for f in candidates:
        if len(f) < _MIN_LEN_ONE_EDIT:
            continue
        d = _edit_distance(name.lower(), f.lower(), limit=allowed)
        if d < best_d:
            best, best_d = f, d
    return best


# ------------------------------------------------------------------------------------------------ schemas


@dataclass
class KeySchema:
    """The keys a mapping may hold: `fields`; `nested[f]` / `items[f]` the schema of field f's mapping / list items.
    `closed`: the model keeps no extra keys (pydantic's default `ignore`, or `forbid`)."""

    name: str
    fields: frozenset[str]
    nested: dict[str, "KeySchema"] = field(default_factory=dict)
    items: dict[str, "KeySchema"] = field(default_factory=dict)
    closed: bool = True
    defined_in: str = ""

    def with_fields(self, extra: Iterable[str]) -> "KeySchema":
        return KeySchema(self.name, self.fields | frozenset(extra), self.nested, self.items, self.closed, self.defined_in)


def _unwrap(annotation: Any) -> tuple[str, Any]:
    """("model", cls) / ("list", cls) for `X`, `Optional[X]`, `Annotated[X, ...]`, `list[X]`; else ("free", None)."""
    for _ in range(4):
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin is typing.Union or str(origin) == "types.UnionType" or type(annotation).__name__ == "UnionType":
            if len(args) != 1:
                return "free", None
            annotation = args[0]
        elif origin in (list, tuple, typing.Sequence) and len(args) >= 1:
            kind, cls = _unwrap(args[0])
            return ("list", cls) if kind == "model" else ("free", None)
        else:
            break
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model", annotation
    return "free", None


@functools.lru_cache(maxsize=None)
def schema_from_model(cls: type[BaseModel], _depth: int = 0) -> KeySchema:
    """The schema of a pydantic model (fields and their aliases; model-typed fields nested)."""
    names: set[str] = set()
    nested: dict[str, KeySchema] = {}
    items: dict[str, KeySchema] = {}
    for name, info in cls.model_fields.items():
        names.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
        if _depth >= 3:
            continue
        kind, sub = _unwrap(info.annotation)
        if kind == "model":
            nested[name] = schema_from_model(sub, _depth + 1)
        elif kind == "list":
            items[name] = _list_item_schema(sub, _depth + 1)
    closed = cls.model_config.get("extra") != "allow"
    return KeySchema(cls.__name__, frozenset(names), nested, items, closed, "nemo_gym")


def _list_item_schema(cls: type[BaseModel], depth: int) -> KeySchema:
    from nemo_gym.config.types import BenchmarkDatasetConfig, DatasetConfig

    schema = schema_from_model(cls, depth)
    if cls is DatasetConfig:  # `type: benchmark` entries are BenchmarkDatasetConfig (parse_dataset_config)
        schema = schema.with_fields(schema_from_model(BenchmarkDatasetConfig, depth).fields)
    return schema


@functools.lru_cache(maxsize=None)
def _framework_table() -> dict[str, KeySchema]:
    """Config classes of nemo_gym a server's config class may name, by class name, read from light pydantic models
    so that no server module is imported (`tests/unit/test_known_keys_nested.py` keeps these equal to the real
    classes)."""
    from nemo_gym.config import types as t

    run = schema_from_model(t.BaseRunServerInstanceConfig)
    table = {
        cls.__name__: schema_from_model(cls)
        for cls in (
            t.BaseServerConfig, t.BaseRunServerConfig, t.BaseRunServerInstanceConfig, t.ServerImplConfig,
            t.ModelServerRef, t.ResourcesServerRef, t.AgentServerRef, t.DatasetConfig, t.RestartPolicy,
        )
    }
    table["BaseResourcesServerConfig"] = run.with_fields({"expose_tools_over_mcp"})
    table["BaseResourcesServerConfig"].name = "BaseResourcesServerConfig"
    for name in ("BaseResponsesAPIAgentConfig", "BaseResponsesAPIModelConfig"):
        table[name] = KeySchema(name, run.fields, run.nested, run.items, run.closed, run.defined_in)
    table["BaseModel"] = KeySchema("BaseModel", frozenset())
    return table


# ------------------------------------------------------------------------------------------------ static reading


class _Unknown(Exception):
    """A class (or base) that cannot be read statically: the block it belongs to is not checked."""


@dataclass
class _Module:
    path: Path
    package: str  # dotted module name of the file ("" when unknown), for relative imports
    classes: dict[str, ast.ClassDef]
    imports: dict[str, tuple[str, str, int]]  # local name -> (module, attribute, level)
    star_imports: list[tuple[str, int]]


def _parse_module(path: Path, module_name: str) -> Optional[_Module]:
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _parse_module_cached(path, module_name, stamp)


@functools.lru_cache(maxsize=256)
def _parse_module_cached(path: Path, module_name: str, _stamp: int) -> Optional[_Module]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    classes: dict[str, ast.ClassDef] = {}
    imports: dict[str, tuple[str, str, int]] = {}
    stars: list[tuple[str, int]] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    stars.append((node.module or "", node.level))
                else:
                    imports[alias.asname or alias.name] = (node.module or "", alias.name, node.level)
    package = module_name if path.name == "__init__.py" else module_name.rpartition(".")[0]
    return _Module(path, package, classes, imports, stars)


class _Reader:
    """Reads config classes out of source files, following imports into files under `roots` and nemo_gym."""

    def __init__(self, roots: Iterable[Path]):
        import nemo_gym

        self.roots = [Path(r) for r in roots]
        self.framework_root = Path(nemo_gym.__file__).resolve().parent.parent
        self._building: set[tuple[Path, str]] = set()

    def module_file(self, module: str) -> Optional[tuple[Path, str]]:
        parts = module.split(".")
        roots = [self.framework_root] if parts[0] == "nemo_gym" else self.roots
        for root in roots:
            base = root.joinpath(*parts)
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate, module
        return None

    def _absolute(self, mod: _Module, module: str, level: int) -> str:
        if not level:
            return module
        package = mod.package.split(".") if mod.package else []
        if level - 1 > len(package):
            return module
        base = package[: len(package) - (level - 1)] if level > 1 else package
        return ".".join([*base, module] if module else base)

    def resolve(self, mod: _Module, name: str, depth: int = 0) -> tuple[str, Any]:
        """("schema", KeySchema) for a class readable statically; raises _Unknown otherwise."""
        if depth > 6:
            raise _Unknown(name)
        if name in mod.classes:
            return "schema", self.class_schema(mod, mod.classes[name], depth)
        if name in mod.imports:
            module, attr, level = mod.imports[name]
            module = self._absolute(mod, module, level)
            if module.split(".")[0] in ("nemo_gym", "pydantic") and attr in _framework_table():
                return "schema", _framework_table()[attr]
            if module.split(".")[0] == "pydantic":
                raise _Unknown(name)
            found = self.module_file(module)
            if found is None:
                raise _Unknown(name)
            other = _parse_module(*found)
            if other is None:
                raise _Unknown(name)
            return self.resolve(other, attr, depth + 1)
        for module, level in mod.star_imports:
            found = self.module_file(self._absolute(mod, module, level))
            other = _parse_module(*found) if found else None
            if other is not None and (name in other.classes or name in other.imports):
                return self.resolve(other, name, depth + 1)
        raise _Unknown(name)

    def class_schema(self, mod: _Module, node: ast.ClassDef, depth: int = 0) -> KeySchema:
        key = (mod.path, node.name)
        if key in self._building:
            raise _Unknown(node.name)
        self._building.add(key)
        try:
            return self._class_schema(mod, node, depth)
        finally:
            self._building.discard(key)

    def _class_schema(self, mod: _Module, node: ast.ClassDef, depth: int) -> KeySchema:
        fields: set[str] = set()
        nested: dict[str, KeySchema] = {}
        items: dict[str, KeySchema] = {}
        closed: Optional[bool] = None
        for base in node.bases:
            name = _dotted(base)
            if name is None:
                raise _Unknown(node.name)
            last = name.rpartition(".")[2]
            if "." in name and last in _framework_table():  # `pydantic.BaseModel`, `types.BaseRunServerConfig`
                schema = _framework_table()[last]
            else:
                _, schema = self.resolve(mod, name, depth + 1)
            fields |= schema.fields
            nested.update(schema.nested)
            items.update(schema.items)
            closed = schema.closed if closed is None else (closed and schema.closed)
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and any(_dotted(t) == "model_config" for t in stmt.targets):
                extra = _extra_setting(stmt.value)
                if extra is not None:
                    closed = extra != "allow"
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            name = stmt.target.id
            text = ast.unparse(stmt.annotation)
            if name.startswith("_") or name == "model_config" or "ClassVar" in text:
                continue
            fields.add(name)
            fields.update(_aliases(stmt.value))
            nested.pop(name, None)
            items.pop(name, None)
            kind, schema = self._annotation_schema(mod, stmt.annotation, depth)
            if kind == "model":
                nested[name] = schema
            elif kind == "list":
                items[name] = schema
        return KeySchema(node.name, frozenset(fields), nested, items, True if closed is None else closed, str(mod.path))

    def _annotation_schema(self, mod: _Module, ann: ast.expr, depth: int) -> tuple[str, Optional[KeySchema]]:
        """Like `_unwrap`, on source: the schema of a model-typed field, or ("free", None)."""
        for _ in range(4):
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
                try:
                    ann = ast.parse(ann.value, mode="eval").body
                except SyntaxError:
                    return "free", None
                continue
            if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
                parts = [p for p in (ann.left, ann.right) if not (isinstance(p, ast.Constant) and p.value is None)]
                if len(parts) != 1:
                    return "free", None
                ann = parts[0]
                continue
            if isinstance(ann, ast.Subscript):
                head = (_dotted(ann.value) or "").split(".")[-1]
                args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                if head == "Optional":
                    ann = args[0]
                    continue
                if head == "Annotated":
                    ann = args[0]
                    continue
                if head == "Union":
                    rest = [a for a in args if not (isinstance(a, ast.Constant) and a.value is None) and _dotted(a) != "None"]
                    if len(rest) != 1:
                        return "free", None
                    ann = rest[0]
                    continue
                if head in ("list", "List", "Sequence", "tuple", "Tuple") and args:
                    kind, schema = self._annotation_schema(mod, args[0], depth)
                    return ("list", schema) if kind == "model" else ("free", None)
                return "free", None
            break
        name = _dotted(ann)
        if name is None or depth > 4:
            return "free", None
        try:
            _, schema = self.resolve(mod, name, depth + 1)
        except _Unknown:
            return "free", None
        if not schema.fields or schema.name == "BaseModel":
            return "free", None
        if schema.defined_in and Path(schema.defined_in).is_relative_to(self.framework_root / "nemo_gym"):
            return "free", None  # nemo_gym's request models (judge params ...) stay free-form, as the reference's
        return "model", schema

    def server_config(self, entrypoint: Path, module_name: str) -> Optional[KeySchema]:
        """The schema of the config class of the server that `entrypoint` runs, or None."""
        mod = _parse_module(entrypoint, module_name)
        if mod is None:
            return None
        try:
            return self._server_config_in(mod, 0)
        except _Unknown:
            return None

    def _server_config_in(self, mod: _Module, depth: int, only: Optional[str] = None) -> Optional[KeySchema]:
        # The server class: the last class of the file that annotates `config:` (the most derived one, by convention).
        for node in reversed(list(mod.classes.values())):
            if only is not None and node.name != only:
                continue
            ann = _config_annotation(node)
            if ann is not None:
                name = _dotted(ann if not (isinstance(ann, ast.Constant) and isinstance(ann.value, str))
                               else ast.parse(ann.value, mode="eval").body)
                if name is None:
                    raise _Unknown("config")
                return self.resolve(mod, name, depth + 1)[1]
        # A thin entrypoint that runs a server class defined elsewhere: `SomeServer.run_webserver()`.
        if depth < 3:
            for name in _run_webserver_targets(mod.path):
                if name in mod.imports:
                    module, attr, level = mod.imports[name]
                    found = self.module_file(self._absolute(mod, module, level))
                    other = _parse_module(*found) if found else None
                    if other is not None and attr in other.classes:
                        return self._server_config_in(other, depth + 1, only=attr)
        return None


def _config_annotation(node: ast.ClassDef) -> Optional[ast.expr]:
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "config":
            return stmt.annotation
    return None


def _run_webserver_targets(path: Path) -> tuple[str, ...]:
    try:
        return _run_webserver_targets_cached(path, path.stat().st_mtime_ns)
    except OSError:
        return ()


@functools.lru_cache(maxsize=64)
def _run_webserver_targets_cached(path: Path, _stamp: int) -> tuple[str, ...]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return ()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_webserver":
            name = _dotted(node.func.value)
            if name:
                out.append(name)
    return tuple(dict.fromkeys(out))


def _dotted(node: ast.expr) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _extra_setting(value: ast.expr) -> Optional[str]:
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg == "extra" and isinstance(kw.value, ast.Constant):
                return str(kw.value.value)
    if isinstance(value, ast.Dict):
        for k, v in zip(value.keys, value.values):
            if isinstance(k, ast.Constant) and k.value == "extra" and isinstance(v, ast.Constant):
                return str(v.value)
    return None


def _aliases(value: Optional[ast.expr]) -> set[str]:
    out: set[str] = set()
    if isinstance(value, ast.Call) and (_dotted(value.func) or "").split(".")[-1] == "Field":
        for kw in value.keywords:
            if kw.arg in ("alias", "validation_alias") and isinstance(kw.value, ast.Constant):
                if isinstance(kw.value.value, str):
                    out.add(kw.value.value)
    return out


def server_config_schema(server_type: str, impl: str, entrypoint: str, cwd: Path) -> Optional[KeySchema]:
    """The keys a `<server_type>.<impl>` block with this entrypoint may hold, from its config class read statically
    (plus the conventional metadata fields of its kind); None when the class cannot be read."""
    from nemo_gym.config.server_paths import check_entrypoint, find_server_dir, server_roots
    from nemo_gym.errors import NeMoGymConfigError

    cwd = Path(cwd)
    roots = server_roots(cwd)
    try:  # the launcher's folder and entrypoint, confined to the server roots
        server_dir = find_server_dir(impl, server_type, impl, cwd)
        check_entrypoint(impl, "entrypoint", entrypoint, server_dir)
    except NeMoGymConfigError:
        return None
    path = server_dir / entrypoint
    if path.suffix != ".py":
        return None
    root = server_dir.parent.parent
    module_name = ".".join([server_type, impl, *Path(entrypoint).with_suffix("").parts])
    schema = _Reader([root, *roots]).server_config(path.resolve(), module_name)
    if schema is None:
        return None
    return schema.with_fields({"name", *CONVENTIONAL_FIELDS.get(server_type, ())})


# ------------------------------------------------------------------------------------------------ checking


@dataclass(frozen=True)
class KeyProblem:
    """One unknown key: the full dotted path, where it was written, and the field it most likely meant."""

    path: str
    source: str  # "the command line (`+a.b=1`)", "/abs/file.yaml", "the merged config"
    suggestion: Optional[str]  # the full dotted path it most likely meant
    section: str  # "server `x` (XConfig, resources_servers/x/app.py)" / "`head_server` (keys: host, port)"
    cli_prefix: Optional[str] = None  # "+" / "" when given on the command line
    in_server: bool = False

    def line(self) -> str:
        if self.cli_prefix is not None:
            hint = f" Did you mean `{self.cli_prefix}{self.suggestion}`?" if self.suggestion else ""
            return f"`{self.cli_prefix}{self.path}` (command line): not a key of {self.section}.{hint}"
        hint = f" Did you mean `{self.suggestion.rpartition('.')[2]}`?" if self.suggestion else ""
        return f"`{self.path}` in {self.source}: not a key of {self.section}.{hint}"


def _shown(path: str, cwd: Path) -> str:
    """A source file as short as it can be said: relative to the working folder or the install folder."""
    from nemo_gym import PARENT_DIR

    for root in (cwd, Path(PARENT_DIR)):
        try:
            return str(Path(path).resolve().relative_to(Path(root).resolve()))
        except (ValueError, OSError):
            continue
    return path


def _walk(value: Any, schema: KeySchema, path: str, section: str, strict: bool, out: list[tuple[str, str, Optional[str]]]):
    """Collect (path, section, suggestion) of every unknown key of mapping `value` under `schema`."""
    if not isinstance(value, Mapping):
        return
    for key, sub in value.items():
        key = str(key)
        full = f"{path}.{key}"
        if key.startswith("_"):
            continue
        if key in schema.fields:
            if key in schema.nested:
                _walk(sub, schema.nested[key], full, f"`{full}` ({schema.nested[key].name})", strict, out)
            elif key in schema.items and isinstance(sub, list):
                for i, item in enumerate(sub):
                    _walk(item, schema.items[key], f"{full}.{i}", f"`{full}` entries ({schema.items[key].name})",
                          False, out)
            continue
        close = close_field(key, schema.fields)
        if close is not None:
            out.append((full, section, f"{path}.{close}"))
        elif strict and schema.closed:
            out.append((full, section, None))


def _global_sections() -> dict[str, KeySchema]:
    """Top-level framework keys whose value has a fixed set of keys (`head_server`, `restart_policy`)."""
    from nemo_gym.config.known_keys import GlobalKeys

    return schema_from_model(GlobalKeys).nested


def _plain(cfg: Any) -> dict:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]
    return dict(cfg or {})


def _has_path(data: Any, parts: list[str]) -> bool:
    node = data
    for part in parts:
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _source_files(data: Mapping, cwd: Path) -> list[tuple[str, Any]]:
    """(path, contents) of every YAML file the config was built from, lowest precedence first (env.yaml last)."""
    from nemo_gym.config.global_config import _find_env_yaml, _load_yaml_file, _resolve_config_path
    from omegaconf import OmegaConf

    out: list[tuple[str, Any]] = []
    paths = data.get("config_paths") or []
    for path_str in paths if isinstance(paths, list) else []:
        try:
            path = _resolve_config_path(str(path_str), cwd, "config_paths")
            out.append((str(path), OmegaConf.to_container(_load_yaml_file(path, "config_paths"), resolve=False)))
        except Exception:
            continue
    try:
        env_path = _find_env_yaml(cwd)
        if env_path is not None:
            out.append((str(env_path), OmegaConf.to_container(_load_yaml_file(env_path, "env.yaml"), resolve=False)))
    except Exception:
        pass
    return out


def nested_key_problems(
    global_config: Any,
    overrides: Iterable[Any] = (),
    *,
    cwd: Optional[Path] = None,
    servers: bool = True,
    framework_sections: bool = True,
    cli_sections: bool = True,
) -> list[KeyProblem]:
    """Every misspelled nested key of the merged config (server blocks, `head_server`, `restart_policy`) and of the
    command-line overrides, each named with where it was written. `++` overrides are never problems.
    `cli_sections=False` leaves out the command-line keys of `head_server` / `restart_policy` (for a caller that
    already ran `check_known_keys`, which checks those)."""
    from nemo_gym.config.global_config import find_server_instances
    from nemo_gym.config.overrides import overrides_to_dict

    cwd = Path(cwd) if cwd is not None else Path.cwd()
    overrides = [ov for ov in overrides if not isinstance(ov, str)]
    forced = [ov.key_path for ov in overrides if ov.kind == "force_add"]
    given = [ov for ov in overrides if ov.kind in ("add", "set")]
    data = _plain(global_config) if global_config is not None else {}
    found: list[tuple[str, str, Optional[str]]] = []
    server_paths: set[str] = set()

    if servers and data:
        try:
            specs = find_server_instances(global_config)
        except Exception:
            specs = []
        for spec in specs:
            impl_cfg = (data.get(spec.server_id) or {}).get(spec.server_type, {}).get(spec.impl)
            if not isinstance(impl_cfg, Mapping):
                continue
            schema = server_config_schema(spec.server_type, spec.impl, str(impl_cfg.get("entrypoint") or ""), cwd)
            if schema is None:
                continue
            section = f"server `{spec.server_id}` ({schema.name}, {_shown(schema.defined_in, cwd)})"
            _walk(impl_cfg, schema, f"{spec.server_id}.{spec.server_type}.{spec.impl}", section, False, found)
            server_paths.add(f"{spec.server_id}.{spec.server_type}.{spec.impl}")
    sections = _global_sections() if framework_sections else {}
    if data:
        for key, schema in sections.items():
            if isinstance(data.get(key), Mapping):
                _walk(data[key], schema, key, f"`{key}` (keys: {', '.join(sorted(schema.fields))})", False, found)
    # The command line, strict where the section has a fixed set of keys.
    cli_found: list[tuple[str, str, Optional[str]]] = []
    for ov in given if cli_sections else ():
        top = ov.key_path[0]
        if top in sections:
            schema = sections[top]
            _walk(overrides_to_dict([ov])[top], schema, top, f"`{top}` (keys: {', '.join(sorted(schema.fields))})",
                  True, cli_found)

    problems: dict[str, KeyProblem] = {}
    files = _source_files(data, cwd) if found else []
    for path, section, suggestion in cli_found + found:
        parts = path.split(".")
        if any(tuple(parts[: len(fp)]) == fp for fp in forced):
            continue  # `++` at or above this key: the explicit way to add an unknown key
        if path in problems:
            continue
        in_server = ".".join(parts[:3]) in server_paths
        ov = next((o for o in reversed(given) if _has_path(overrides_to_dict([o]), parts)), None)
        if ov is not None and not cli_sections and parts[0] in sections:
            continue
        if ov is not None:
            prefix = "+" if ov.kind == "add" else ""
            problems[path] = KeyProblem(path, f"the command line (`{ov.text.strip()}`)", suggestion, section, prefix,
                                        in_server)
            continue
        source = next((f for f, content in reversed(files) if _has_path(content, parts)), None)
        problems[path] = KeyProblem(path, source or "the merged config", suggestion, section, None, in_server)
    return list(problems.values())


def format_problems(problems: list[KeyProblem], command_name: str = "") -> str:
    """The error message for `problems`, in the style of the top-level unknown-key message."""
    tail = []
    if any(p.cli_prefix is None and p.in_server for p in problems):
        tail.append("If the server really reads a key of that name, declare it as a field of its config class.")
    cli = next((p for p in problems if p.cli_prefix is not None), None)
    if cli is not None:
        tail.append(f"To pass a key nemo_gym does not know, write it with ++ (e.g. `++{cli.path}=...`).")
    if len(problems) == 1:
        return " ".join([f"unknown key {problems[0].line()}", *tail])
    body = "".join(f"  - {p.line()}\n" for p in problems)
    return f"unknown keys (likely typos):\n{body}" + " ".join(tail)


def check_nested_keys(global_config: Any, overrides: Iterable[Any] = (), *, command_name: str = "ng",
                      cwd: Optional[Path] = None, **kwargs: Any) -> None:
    """Raise `NeMoGymConfigError` naming every misspelled nested key (see `nested_key_problems`)."""
    from nemo_gym.errors import NestedKeyTypoError

    problems = nested_key_problems(global_config, overrides, cwd=cwd, **kwargs)
    if problems:
        raise NestedKeyTypoError(format_problems(problems, command_name))


def nested_key_errors(global_config: Any, overrides: Iterable[Any] = (), *, command_name: str = "ng",
                      cwd: Optional[Path] = None, **kwargs: Any) -> list:
    """`check_nested_keys` as a list of errors (empty, or one error naming every problem), for `ng_validate`."""
    from nemo_gym.errors import NestedKeyTypoError

    problems = nested_key_problems(global_config, overrides, cwd=cwd, **kwargs)
    return [NestedKeyTypoError(format_problems(problems, command_name))] if problems else []
