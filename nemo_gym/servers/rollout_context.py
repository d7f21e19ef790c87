"""Which rollout a request belongs to: the `/ng-rollout/<rollout id>` path prefix (NeMo Gym v0.5 rollout correlation).

A rollout id is `"<task index>-<rollout index>"` (with `-a<N>` for the N-th retry). When the global
`observability_enabled: true` is set, calls made for a rollout carry `/ng-rollout/<id>` in front of their path, so
a model server can file every model call under the rollout it served (`model_call_capture_dir`). Servers strip
the prefix with `RolloutContextMiddleware` and run the request inside `rollout_context(id)`, so the id is at
hand (`current_rollout_id()`) for the calls the handler makes in turn. No headers are used: the prefix survives
any client, SDK or proxy that keeps the URL. Everything here is inert unless observability is on, except the
middleware, which always accepts prefixed paths (a prefixed call never 404s).
"""

from __future__ import annotations

import contextvars
import re
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Optional

from nemo_gym.config.types import MODEL_SERVER_TYPE, RESOURCES_SERVER_TYPE, ROLLOUT_PATH_PREFIX

__all__ = [
    "ROLLOUT_PATH_PREFIX",
    "OBSERVABILITY_ENABLED_KEY_NAME",
    "RolloutContextMiddleware",
    "rollout_context",
    "current_rollout_id",
    "maybe_rollout_id_from_run_body",
    "rollout_path_prefix",
    "apply_rollout_prefix",
    "split_rollout_prefix",
    "strip_raw_prefix",
    "unprefixed_scope",
    "observability_enabled",
    "MODEL_CALL_PATHS",
    "prefixed_url_path",
]

OBSERVABILITY_ENABLED_KEY_NAME = "observability_enabled"
_ATTEMPT_INDEX_KEY = "_ng_attempt_index"
_ID_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_PREFIX = f"/{ROLLOUT_PATH_PREFIX}/"

_current: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("nemo_gym_rollout_id", default=None)


def current_rollout_id() -> Optional[str]:
    """The rollout id of the request being handled (None outside a rollout)."""
    return _current.get()


@contextmanager
def rollout_context(rollout_id: Optional[str]) -> Iterator[Optional[str]]:
    """Run the block with `current_rollout_id()` = `rollout_id` (None leaves the current one unchanged)."""
    if rollout_id is None:
        yield _current.get()
        return
    token = _current.set(rollout_id)
    try:
        yield rollout_id
    finally:
        _current.reset(token)


def _field(body: Any, name: str) -> Any:
    if isinstance(body, Mapping):
        return body.get(name)
    value = getattr(body, name, None)
    if value is None:
        extra = getattr(body, "model_extra", None) or {}
        value = extra.get(name)
    return value


def maybe_rollout_id_from_run_body(body: Any) -> Optional[str]:
    """`"<task>-<rollout>"` (`"<task>-<rollout>-a<N>"` on retry N > 0) from a `/run` body or result (dict or
    pydantic model with the row's `_ng_task_index` / `_ng_rollout_index`); None if an index is missing."""
    task = _field(body, "_ng_task_index")
    rollout = _field(body, "_ng_rollout_index")
    if task is None or rollout is None:
        return None
    rollout_id = f"{task}-{rollout}"
    attempt = _field(body, _ATTEMPT_INDEX_KEY)
    if isinstance(attempt, int) and attempt > 0:
        rollout_id += f"-a{attempt}"
    return rollout_id if _ID_CHARS.match(rollout_id) else None


def rollout_path_prefix(rollout_id: Optional[str]) -> str:
    """`/ng-rollout/<id>`, or `""` for None."""
    return "" if rollout_id is None else f"/{ROLLOUT_PATH_PREFIX}/{rollout_id}"


def apply_rollout_prefix(base_url: str, rollout_id: Optional[str]) -> str:
    """Insert the rollout prefix before the path of `base_url` (`http://h:p/v1` -> `http://h:p/ng-rollout/<id>/v1`);
    unchanged for None or when already prefixed."""
    if rollout_id is None or _PREFIX in base_url:
        return base_url
    scheme, sep, rest = base_url.partition("://")
    if not sep:
        scheme, rest = "", base_url
    host, slash, path = rest.partition("/")
    path = f"{rollout_path_prefix(rollout_id)}/{path}" if slash else rollout_path_prefix(rollout_id)
    return f"{scheme}{sep}{host}{path}"


def split_rollout_prefix(path: str) -> tuple[Optional[str], str]:
    """`("<id>", "/<rest>")` for `/ng-rollout/<id>/<rest>`, else `(None, path)`."""
    if not path.startswith(_PREFIX):
        return None, path
    rollout_id, slash, rest = path[len(_PREFIX) :].partition("/")
    if not rollout_id or not _ID_CHARS.match(rollout_id):
        return None, path
    return rollout_id, "/" + rest


# The model-server routes whose calls carry the rollout id (the ones a model server captures).
MODEL_CALL_PATHS = frozenset({"/v1/responses", "/v1/chat/completions", "/v1/messages"})
_VERIFY_PATH = "/verify"


def prefixed_url_path(server_type: Optional[str], url_path: str, body: Any = None) -> str:
    """The path `ServerClient` sends a call to, with observability on: `/ng-rollout/<id>` in front for a call to a
    resources server (`resources_servers`) while a rollout id is current (for `/verify` also the id of the body's
    indices), and for a call to a model server (`responses_api_models`) on one of `MODEL_CALL_PATHS` while one is
    current; any other call, or an already prefixed path, unchanged."""
    path = url_path if url_path.startswith("/") else "/" + url_path
    if path.startswith(_PREFIX):
        return url_path
    if server_type == RESOURCES_SERVER_TYPE:
        rollout_id = _current.get()
        if rollout_id is None and body is not None and path.partition("?")[0] == _VERIFY_PATH:
            rollout_id = maybe_rollout_id_from_run_body(body)
    elif server_type == MODEL_SERVER_TYPE and path.partition("?")[0] in MODEL_CALL_PATHS:
        rollout_id = _current.get()
    else:
        return url_path
    return url_path if rollout_id is None else rollout_path_prefix(rollout_id) + path


def strip_raw_prefix(scope: dict, rest: str) -> bytes:
    """The request target without the rollout prefix, as sent (percent-escapes kept); the prefix is plain ASCII."""
    raw = scope.get("raw_path")
    prefix = scope["path"][: len(scope["path"]) - len(rest)].encode("ascii")
    if isinstance(raw, bytes) and raw.startswith(prefix):
        return raw[len(prefix) :]
    return rest.encode("utf-8")


def unprefixed_scope(scope: dict) -> Optional[tuple[str, dict]]:
    """`(rollout id, the scope with the prefix taken off path and raw_path)` for an HTTP request to
    `/ng-rollout/<id>/<rest>`; None for any other request (the common case costs one `startswith`)."""
    if scope["type"] != "http" or not scope["path"].startswith(_PREFIX):
        return None
    rollout_id, rest = split_rollout_prefix(scope["path"])
    if rollout_id is None:
        return None
    return rollout_id, dict(scope, path=rest, raw_path=strip_raw_prefix(scope, rest))


def observability_enabled(global_config: Any = None) -> bool:
    """The global `observability_enabled` flag (this process's global config when none is given)."""
    from nemo_gym.config.values import truthy

    if global_config is None:
        try:
            from nemo_gym.config.global_config import get_global_config_dict

            global_config = get_global_config_dict()
        except Exception:
            return False
    try:
        return truthy(global_config.get(OBSERVABILITY_ENABLED_KEY_NAME, False))
    except Exception:
        return False


class RolloutContextMiddleware:
    """Pure ASGI: a request to `/ng-rollout/<id>/<rest>` is served as `/<rest>` inside `rollout_context(id)`.

    `strip_prefix=False` keeps the path as it came (agents route `/ng-rollout/{rollout_id}/v1/responses` themselves)
    and only makes the id current, so the calls the handler makes carry it too."""

    # Only prefixed paths are touched, and those are never hot routes (serving/hot_routes.py).
    hot_routes_transparent = True

    def __init__(self, app: Any, strip_prefix: bool = True) -> None:
        self.app = app
        self.strip_prefix = strip_prefix

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        unprefixed = unprefixed_scope(scope)
        if unprefixed is None:
            await self.app(scope, receive, send)
            return
        rollout_id, stripped = unprefixed
        if self.strip_prefix:
            scope = stripped
        with rollout_context(rollout_id):
            await self.app(scope, receive, send)
