"""How config values written as text (CLI overrides, env vars, YAML) read as Python values."""

from typing import Any

TRUE_STRINGS = frozenset({"1", "true", "yes", "on"})


def truthy(value: Any) -> bool:
    """`true`/`1`/`yes`/`on` (any case) and truthy non-strings are true; every other string is false."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_STRINGS
    return bool(value)
