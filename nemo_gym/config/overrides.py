"""Hydra-style command-line overrides, parsed without Hydra.

Grammar (what users type after `ng_run` and friends):

    +key=value      add            ++key=value   add or override      key=value   set
    ~key            delete         ~key=value    delete if the current value equals `value`
    a.b.c=value     nested keys    key=          empty string

Values: int, float (incl. inf/nan), bool (true/false, any case), null, '...' / "..." quoted strings
(quotes removed; \\' \\" and \\\\ unescaped), lists `[a,b,[c]]`, dicts `{a:1,b:[x]}`, bare strings
(surrounding spaces trimmed) and `${...}` interpolations kept verbatim, even with `:`, `,` or braces
inside (`${oc.env:HOME,/tmp}`).

Why no Hydra: it costs ~0.5 s of import per command and its errors are hard to read. We keep its
surface syntax but give every override "set" semantics: the reference applied overrides to an empty
config and merged that last, so `+`, `++` and plain differ only in Hydra's own checks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Optional

from nemo_gym.errors import NeMoGymConfigError

OverrideKind = Literal["add", "force_add", "set", "delete"]

_KEY_PART_RE = re.compile(r"^[A-Za-z0-9_\-@/]+$")
_INT_RE = re.compile(r"^[+-]?(?:0|[1-9](?:_?[0-9])*)$")
_DIGITS = r"[0-9](?:_?[0-9])*"
# Hydra's float: needs a decimal point or an exponent (so `007` stays a string, `1e3` is a float).
_FLOAT_RE = re.compile(
    rf"^[+-]?(?:(?:(?:{_DIGITS})?\.[0-9]+|{_DIGITS}\.)(?:[eE][+-]?[0-9]+)?|{_DIGITS}[eE][+-]?[0-9]+)$"
)
_SPECIAL_FLOATS = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan, "+nan": math.nan, "-nan": math.nan}


@dataclass
class Override:
    """One parsed override. `key` is dotted (`a.b.c`); `value` is a plain Python value (nested
    lists/dicts allowed). For deletions `has_value` tells whether `~key=value` gave a value."""

    text: str
    kind: OverrideKind
    key: str
    value: Any = None
    has_value: bool = True

    @property
    def key_path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))

    @property
    def is_delete(self) -> bool:
        return self.kind == "delete"

    @property
    def cli_form(self) -> str:
        """How to spell this key on the command line (used in messages)."""
        return {"add": "+", "force_add": "++", "set": "", "delete": "~"}[self.kind] + self.key


class _SyntaxError(Exception):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.message = message
        self.pos = pos


def _error(text: str, message: str, pos: Optional[int] = None) -> NeMoGymConfigError:
    msg = f"Bad override `{text}`: {message}"
    if pos is not None:
        msg += f"\n    {text}\n    {' ' * pos}^"
    return NeMoGymConfigError(msg)


# --------------------------------------------------------------------------------------------------
# Value parser: a small recursive-descent parser over the text after `=`.
# --------------------------------------------------------------------------------------------------


class _ValueParser:
    def __init__(self, text: str):
        self.s = text
        self.i = 0

    # -- helpers -----------------------------------------------------------------------------------
    def _peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def _skip_ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def _scan_interpolation(self) -> None:
        """Advance past `${...}` (self.i at `$`), honouring nested braces and quoted args."""
        start = self.i
        self.i += 2
        depth = 1
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in "'\"":
                end = self.s.find(c, self.i + 1)
                if end == -1:
                    raise _SyntaxError("unclosed quote inside interpolation", self.i)
                self.i = end + 1
                continue
            if c == "\\":
                self.i += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            self.i += 1
        raise _SyntaxError("unclosed interpolation: missing `}` for `${`", start)

    # -- grammar -----------------------------------------------------------------------------------
    def parse_top(self) -> Any:
        self._skip_ws()
        if self.i >= len(self.s):
            return ""
        value = self._element(stops=",", top=True)
        self._skip_ws()
        if self.i < len(self.s):
            c = self.s[self.i]
            if c == ",":
                raise _SyntaxError(
                    "ambiguous value with an unbracketed `,`: write a list as `key=[a,b]` "
                    "or quote the string: `key='a,b'`",
                    self.i,
                )
            raise _SyntaxError(f"unexpected `{c}` after the value", self.i)
        return value

    def _element(self, stops: str, top: bool = False) -> Any:
        self._skip_ws()
        c = self._peek()
        if c == "[":
            value = self._list()
        elif c == "{":
            value = self._dict()
        elif c in ("'", '"'):
            value = self._quoted()
        else:
            return self._bare(stops, top)
        self._skip_ws()
        return value

    def _list(self) -> list:
        start = self.i
        self.i += 1
        items: list = []
        self._skip_ws()
        if self._peek() == "]":
            self.i += 1
            return items
        while True:
            self._skip_ws()
            if self._peek() in (",", "]"):
                raise _SyntaxError("empty list element", self.i)
            if self.i >= len(self.s):
                raise _SyntaxError("missing closing `]` for this list", start)
            items.append(self._element(stops=",]"))
            if self._closed_after_element("]", "list", start):
                return items

    def _dict(self) -> dict:
        start = self.i
        self.i += 1
        out: dict = {}
        self._skip_ws()
        if self._peek() == "}":
            self.i += 1
            return out
        while True:
            self._skip_ws()
            if self.i >= len(self.s):
                raise _SyntaxError("missing closing `}` for this dict", start)
            key_pos = self.i
            if self._peek() in ("'", '"'):
                key = self._quoted()
            else:
                j = self.i
                while j < len(self.s) and self.s[j] not in ":,}{[]":
                    j += 1
                key = self.s[self.i : j].strip()
                self.i = j
            if not key:
                raise _SyntaxError("empty dict key", key_pos)
            self._skip_ws()
            if self._peek() != ":":
                raise _SyntaxError(f"expected `:` after dict key `{key}` (write `{{{key}:value}}`)", self.i)
            self.i += 1
            self._skip_ws()
            if self._peek() in (",", "}"):
                value: Any = ""
            else:
                value = self._element(stops=",}")
            out[str(key)] = value
            if self._closed_after_element("}", "dict", start):
                return out

    def _closed_after_element(self, closer: str, kind: str, start: int) -> bool:
        """After a list or dict element: step over `,` (False) or the closing bracket (True); else a syntax error."""
        self._skip_ws()
        c = self._peek()
        if c == ",":
            self.i += 1
            return False
        if c == closer:
            self.i += 1
            return True
        if c == "":
            raise _SyntaxError(f"missing closing `{closer}` for this {kind}", start)
        raise _SyntaxError(f"expected `,` or `{closer}` in {kind}, found `{c}`", self.i)

    def _quoted(self) -> str:
        quote = self.s[self.i]
        start = self.i
        self.i += 1
        out: list[str] = []
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "\\" and self.i + 1 < len(self.s) and self.s[self.i + 1] in ("\\", "'", '"'):
                out.append(self.s[self.i + 1])
                self.i += 2
                continue
            if c == quote:
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        raise _SyntaxError(f"unclosed quote {quote}", start)

    def _bare(self, stops: str, top: bool) -> Any:
        start = self.i
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "$" and self.s.startswith("${", self.i):
                self._scan_interpolation()
                continue
            if c in stops:
                break
            if not top and c in "[{":
                raise _SyntaxError(f"unexpected `{c}` inside a value (quote the value to use it literally)", self.i)
            self.i += 1
        raw = self.s[start : self.i].strip()
        if not top and raw == "":
            raise _SyntaxError("empty element", start)
        return _convert_primitive(raw)


def _convert_primitive(raw: str) -> Any:
    """Type a bare token the way Hydra does: null, bool, int, float, else string."""
    if "${" in raw:
        return raw
    low = raw.lower()
    if low == "null":
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    if _INT_RE.match(raw):
        return int(raw.replace("_", ""))
    if low in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[low]
    if _FLOAT_RE.match(raw):
        return float(raw.replace("_", ""))
    return raw


def parse_value(text: str) -> Any:
    """Parse an override value on its own (bad syntax raises `NeMoGymConfigError`)."""
    try:
        return _parse_value(text)
    except _SyntaxError as err:
        raise _error(text, err.message, err.pos) from None


def _parse_value(text: str) -> Any:
    return _ValueParser(text).parse_top()


# --------------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------------


def parse_override(text: str) -> Override:
    """Parse one override string; bad syntax raises `NeMoGymConfigError` pointing at the problem."""
    if not isinstance(text, str):
        raise _error(str(text), "an override must be a string")
    stripped = text.strip()
    if stripped.startswith("++"):
        kind: OverrideKind = "force_add"
        prefix_len = 2
    elif stripped.startswith("+"):
        kind, prefix_len = "add", 1
    elif stripped.startswith("~"):
        kind, prefix_len = "delete", 1
    else:
        kind, prefix_len = "set", 0
    lead = len(text) - len(text.lstrip())
    body = stripped[prefix_len:]
    eq = body.find("=")
    key = (body if eq == -1 else body[:eq]).strip()
    if eq == -1 and kind != "delete":
        if stripped.startswith("-"):
            raise _error(text, "command-line flags are not overrides; pass parameters as `+name=value`")
        raise _error(text, f"missing `=`: write `+{key}=value` to set it (or `~{key}` to delete it)")
    if not key:
        raise _error(text, "missing key before `=`", lead + prefix_len)
    parts = key.split(".")
    offset = lead + prefix_len
    for part in parts:
        if not part:
            raise _error(text, f"empty key segment in `{key}`", offset)
        if not _KEY_PART_RE.match(part):
            bad = next((i for i, ch in enumerate(part) if not _KEY_PART_RE.match(ch)), 0)
            raise _error(
                text, f"invalid character `{part[bad]}` in key `{key}` (keys use letters, digits, `_`, `-`)",
                offset + bad,
            )
        offset += len(part) + 1
    if eq == -1:
        return Override(text=text, kind=kind, key=key, value=None, has_value=False)
    value_text = body[eq + 1 :]
    value_offset = lead + prefix_len + eq + 1
    try:
        value = _parse_value(value_text)
    except _SyntaxError as err:
        raise _error(text, err.message, value_offset + err.pos) from None
    return Override(text=text, kind=kind, key=key, value=value, has_value=True)


def parse_overrides(texts: Optional[Iterable[str]]) -> list[Override]:
    """Parse a list of overrides (e.g. `sys.argv[1:]`), in order."""
    return [parse_override(t) for t in (texts or [])]


def _set_nested(target: dict, path: tuple[str, ...], value: Any) -> None:
    node = target
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


def overrides_to_dict(overrides: Iterable[Override]) -> dict:
    """The nested dict of all set overrides (later ones win). Deletions are not included: they
    apply to the final merged config (see `deletions` and `apply_overrides`)."""
    out: dict = {}
    for ov in overrides:
        if ov.is_delete:
            _pop_nested(out, ov.key_path)
        else:
            _set_nested(out, ov.key_path, ov.value)
    return out


def _pop_nested(target: dict, path: tuple[str, ...]) -> None:
    node = target
    for part in path[:-1]:
        node = node.get(part)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


def deletions(overrides: Iterable[Override]) -> list[Override]:
    """The `~key` overrides, in order."""
    return [ov for ov in overrides if ov.is_delete]


def apply_overrides(cfg, overrides: Iterable[Override | str]):
    """Apply overrides, in order, to an OmegaConf DictConfig (mutated and returned).

    A dict value merges into an existing dict (like the reference, which merged the CLI config
    last); anything else replaces. `~key` deletes and fails naming the key when it is absent.
    Order matters, so `~a +a.b=1` leaves `a: {b: 1}`."""
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        for ov in overrides:
            if isinstance(ov, str):
                ov = parse_override(ov)
            if ov.is_delete:
                _delete_key(cfg, ov)
                continue
            node = cfg
            for part in ov.key_path[:-1]:
                child = node._get_node(part) if part in node else None
                if not _is_plain_dict_node(child):
                    node[part] = {}
                node = node[part]
            last = ov.key_path[-1]
            existing = node._get_node(last) if last in node else None
            if isinstance(ov.value, dict) and _is_plain_dict_node(existing):
                node[last] = OmegaConf.merge(existing, ov.value)
            else:
                node[last] = ov.value
    return cfg


def _is_plain_dict_node(node) -> bool:
    from omegaconf import DictConfig

    return (
        isinstance(node, DictConfig)
        and not node._is_missing()
        and not node._is_none()
        and not node._is_interpolation()
    )


def _delete_key(cfg, ov: Override) -> None:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    node = cfg
    for part in ov.key_path[:-1]:
        child = node._get_node(part) if part in node else None
        if not _is_plain_dict_node(child):
            node = None
            break
        node = child
    last = ov.key_path[-1]
    if node is None or last not in node:
        raise NeMoGymConfigError(
            f"Cannot apply `{ov.text.strip()}`: key `{ov.key}` is not in the config, so there is nothing to delete."
        )
    if ov.has_value:
        current = node._get_node(last)
        if isinstance(current, (DictConfig, ListConfig)):
            current_value = OmegaConf.to_container(current, resolve=False)
        else:
            current_value = current._value()
        if current_value != ov.value:
            raise NeMoGymConfigError(
                f"Cannot apply `{ov.text.strip()}`: `{ov.key}` is {current_value!r}, not {ov.value!r}. "
                f"Use `~{ov.key}` to delete it whatever its value."
            )
    del node[last]
