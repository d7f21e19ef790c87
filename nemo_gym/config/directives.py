"""NeMo Gym v0.5's config directives: build one block from another after the files are merged.

- `key: ${inherit_from:a.b}` takes the value at `a.b` and deletes `a.b` (a move; v0.2's `${swap_key:a.b}`).
- `key: ${copy:a.b}` takes a copy of the value at `a.b` and keeps `a.b`.
- A mapping with `_inherit_from: a.b` (or `_copy: a.b`) is the mapping at `a.b` with the block's own keys merged
  over it (recursively); `_inherit_from` deletes `a.b`, `_copy` keeps it.
- `_swap_key: a.b` in a mapping is `_inherit_from: a.b` under the name NeMo Gym's later benchmark configs use
  (`aime24_math_with_judge_resources_server: {_swap_key: math_with_judge, ...}`).
- `_delete_key: "k1, k2"` in a mapping removes those keys after the merge (each must exist).

A benchmark config, for instance, reuses a generic resources server block and repoints one field:
`aime24_math_with_judge_resources_server: {_inherit_from: math_with_judge, resources_servers: {...}}`.
Sources are looked up in the config as merged (before any directive ran), and a source that itself uses a
directive is resolved first. The caller may pass an `alias` that spells a source's missing first key another way
(our old resources-server ids, `legacy_ids`). A path that does not exist, or a cycle, is an
`InheritPathNotFoundError` that names the key and the path.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Optional

from nemo_gym.errors import InheritPathNotFoundError

__all__ = [
    "INHERIT_FROM_RESOLVER_NAME",
    "COPY_RESOLVER_NAME",
    "apply_config_directives",
    "deep_merge",
    "directive_literal",
    "lookup_path",
]

INHERIT_FROM_RESOLVER_NAME = "inherit_from"
COPY_RESOLVER_NAME = "copy"
_INHERIT_KEY, _SWAP_KEY, _COPY_KEY, _DELETE_KEY = "_inherit_from", "_swap_key", "_copy", "_delete_key"
_MOVES = ((_INHERIT_KEY, True), (_SWAP_KEY, True), (_COPY_KEY, False))  # key -> whether the source is deleted
_DIRECTIVE_KEYS = (*(key for key, _ in _MOVES), _DELETE_KEY)
_PREFIXES = {"${" + INHERIT_FROM_RESOLVER_NAME + ":": True, "${" + COPY_RESOLVER_NAME + ":": False}


def directive_literal(name: str):
    """An OmegaConf resolver that gives the directive back as written, so early resolution leaves it for us."""
    return lambda path: "${" + name + ":" + str(path) + "}"


def _string_directive(value: Any) -> Optional[tuple[str, bool]]:
    """(source path, move?) of a `${inherit_from:...}` / `${copy:...}` string, else None."""
    if not isinstance(value, str) or not value.endswith("}"):
        return None
    for prefix, move in _PREFIXES.items():
        if value.startswith(prefix):
            return value[len(prefix) : -1].strip(), move
    return None


def _has_directive(node: Any) -> bool:
    if _string_directive(node) is not None:
        return True
    if isinstance(node, dict):
        return any(k in node for k in _DIRECTIVE_KEYS) or any(map(_has_directive, node.values()))
    if isinstance(node, list):
        return any(map(_has_directive, node))
    return False


def _lookup(root: Any, path: str) -> tuple[bool, Any]:
    return lookup_path(root, [p for p in path.split(".") if p])


def lookup_path(root: Any, parts: list[str]) -> tuple[bool, Any]:
    """(found, value) at the key path `parts` of plain dicts and lists (a list index as a digit string)."""
    node = root
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def deep_merge(base: Any, over: Any) -> Any:
    """`over`'s keys merged over `base`'s, recursively for mappings (lists and values of `over` replace)."""
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = deep_merge(base[key], value) if key in base else value
        return merged
    return over


# `alias(config, first_key)`: the key a missing first key of a source path stands for, or None.
Alias = Callable[[Mapping, str], Optional[str]]


class _Resolver:
    def __init__(self, data: dict, alias: Optional[Alias]) -> None:
        self.frozen = copy.deepcopy(data)
        self.alias = alias
        self.moved: list[str] = []
        self.active: list[str] = []

    def spelled(self, path: str) -> str:
        """`path` with its first key replaced by the caller's alias when only the alias is in the config."""
        parts = [p for p in path.split(".") if p]
        if self.alias is None or not parts or _lookup(self.frozen, path)[0]:
            return path
        other = self.alias(self.frozen, parts[0])
        return ".".join([other, *parts[1:]]) if other else path

    def source(self, path: str, where: str) -> Any:
        """The resolved value at `path` (its own directives applied first)."""
        if path in self.active:
            chain = " -> ".join([*self.active, path])
            raise InheritPathNotFoundError(f"`{where}` takes `{path}`, which leads back to itself ({chain}).")
        found, value = _lookup(self.frozen, path)
        if not found:
            raise InheritPathNotFoundError(
                f"`{where}` takes `{path}`, but `{path}` is not in the config. Check the spelling, or load the file "
                "that defines it via config_paths."
            )
        self.active.append(path)
        try:
            return self.resolve(copy.deepcopy(value), path)
        finally:
            self.active.pop()

    def resolve(self, node: Any, where: str) -> Any:
        directive = _string_directive(node)
        if directive is not None:
            path, move = directive
            path = self.spelled(path)
            if move:
                self.moved.append(path)
            return self.source(path, where)
        if isinstance(node, list):
            return [self.resolve(item, f"{where}[{i}]") for i, item in enumerate(node)]
        if not isinstance(node, dict):
            return node
        own = {k: v for k, v in node.items() if k not in _DIRECTIVE_KEYS}
        result: Any = {k: self.resolve(v, f"{where}.{k}" if where else str(k)) for k, v in own.items()}
        for key, move in _MOVES:
            if key in node:
                path = self.spelled(str(node[key]).strip())
                base = self.source(path, f"{where}.{key}" if where else key)
                if not isinstance(base, dict):
                    raise InheritPathNotFoundError(f"`{where}.{key}: {path}`: `{path}` is not a mapping to build on.")
                if move:
                    self.moved.append(path)
                result = deep_merge(base, result)
        if _DELETE_KEY in node:
            for name in [n.strip() for n in str(node[_DELETE_KEY]).split(",") if n.strip()]:
                if name not in result:
                    raise InheritPathNotFoundError(
                        f"`{where}.{_DELETE_KEY}` removes `{name}`, but the block has no such key "
                        f"(it has: {', '.join(sorted(map(str, result))) or 'none'})."
                    )
                del result[name]
        return result


def apply_config_directives(data: dict, alias: Optional[Alias] = None) -> None:
    """Apply every directive of the merged config `data` in place (a no-op without any)."""
    if not _has_directive(data):
        return
    resolver = _Resolver(data, alias)
    resolved = resolver.resolve(data, "")
    data.clear()
    data.update(resolved)
    for path in resolver.moved:
        parts = [p for p in path.split(".") if p]
        found, parent = _lookup(data, ".".join(parts[:-1]))
        if found and isinstance(parent, dict):
            parent.pop(parts[-1], None)
