"""How config values written as text (CLI overrides, env vars, YAML) read as Python values."""

from collections.abc import Mapping
from typing import Any

from nemo_gym.errors import NeMoGymConfigError

TRUE_STRINGS = frozenset({"1", "true", "yes", "on"})


def truthy(value: Any) -> bool:
    """`true`/`1`/`yes`/`on` (any case) and truthy non-strings are true; every other string is false."""
    if isinstance(value, str):
        return value.strip().lower() in TRUE_STRINGS
    return bool(value)


def config_get(cfg: Any, key: str, default: Any = None) -> Any:
    """`cfg.get(key)` for dicts and DictConfigs, where a missing config, a null value and an interpolation that
    does not resolve all read as `default`: code that only reads an optional setting must not fail on them."""
    if cfg is None:
        return default
    try:
        value = cfg.get(key, default)
    except Exception:
        return default
    return default if value is None else value


def is_mapping(value: Any) -> bool:
    """True for a dict-like config block: a `Mapping` or an OmegaConf `DictConfig`."""
    if isinstance(value, Mapping):
        return True
    try:
        from omegaconf import DictConfig
    except ImportError:  # pragma: no cover
        return False
    return isinstance(value, DictConfig)


def byte_count(cfg: Any, key: str, default: int, *, limits: str) -> int:
    """The positive whole number of bytes under `key` (absent, null or empty: `default`). Anything else is a
    `NeMoGymConfigError` naming the key, what it limits (`limits`) and the default, since a size limit read wrong
    would either refuse everything or let memory grow without bound."""
    value = config_get(cfg, key, default)
    if isinstance(value, str):
        text = value.strip()
        value = int(text) if text.isdigit() else default if not text else None
    if type(value) is not int or value < 1:
        raise NeMoGymConfigError(
            f"`{key}` must be a positive whole number of bytes ({limits}), got {config_get(cfg, key)!r}. "
            f"Remove it for the default ({default} bytes)."
        )
    return value


def seconds(cfg: Any, key: str, default: float, *, limits: str) -> float:
    """The positive number of seconds under `key` (absent, null or empty: `default`); anything else is a
    `NeMoGymConfigError` naming the key, what it limits and the default, as `byte_count` does for sizes."""
    value = config_get(cfg, key, default)
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text) if text else default
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise NeMoGymConfigError(
            f"`{key}` must be a positive number of seconds ({limits}), got {config_get(cfg, key)!r}. "
            f"Remove it for the default ({default} s)."
        )
    return float(value)
