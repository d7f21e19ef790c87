"""Requests to any URL (external APIs) over the process's shared aiohttp session: NeMo Gym v0.5's
`server_utils.request` and the global-client functions around it.

Servers call other servers of the stack by id with `ServerClient`; for everything else (a search API, a judge
service outside the stack) v0.5 servers use `await request("POST", url, json=...)`, which returns aiohttp's
`ClientResponse` (read it with `await get_response_json(resp)` / `await resp.json()`, check it with
`await raise_for_status(resp)`). The session is the one `ServerClient`'s transport owns on the running event loop
(so `global_aiohttp_connector_limit*` bound both); under `http_client_transport: httpx`, which has no aiohttp
session, this module keeps one of its own per loop with the same limits.

Retries (v0.5's contract, not `nemo_gym.http.retry`'s policy): a dropped connection (`ServerDisconnectedError`) or
a socket error (`ClientOSError`, which includes "connection refused") is retried every 0.5 s for as long as it
lasts; any other exception is retried the same way forever for internal calls (`_internal=True`) and at most
`MAX_NUM_TRIES` times in all for external ones; HTTP statuses are never retried (the caller sees the response).
A warning is logged on the first retry and every `_LOG_EVERY` after, so an endless retry is never silent.

`json=` bodies are serialized with orjson (pydantic models with `exclude_unset=True`); a `User-Agent` naming
nemo-gym is sent unless the caller gives one (the shared session sends none by default).

Setting the client up (v0.5's names, which trainers call before collecting): `GlobalAIOHTTPAsyncClientConfig` reads
the client's keys out of a global config; `set_global_aiohttp_client(cfg)` makes the running loop's client from it
(and sizes the clients of later loops the same way); `is_global_aiohttp_client_setup()` says whether the running loop
has one already. v0.5 kept one client per process; an aiohttp session belongs to one event loop, so here there is one
per loop, and "set up" means "set up on the running loop".
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import traceback
from typing import Any, Optional

import aiohttp
from pydantic import BaseModel, model_validator

from nemo_gym import __version__
from nemo_gym.config.values import config_get, is_mapping, truthy
from nemo_gym.http import client as _client
from nemo_gym.http.client import ServerClient, close_global_client, encode_json_body
from nemo_gym.http.transports import close_session_of_closed_loop, existing_global_aiohttp_session

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_NUM_TRIES",
    "RETRY_SLEEP_SECONDS",
    "request",
    "setup_server_client",
    "get_global_aiohttp_client",
    "GlobalAIOHTTPAsyncClientConfig",
    "set_global_aiohttp_client",
    "is_global_aiohttp_client_setup",
    "is_global_aiohttp_client_request_debug_enabled",
    "global_aiohttp_client_exit",
]

MAX_NUM_TRIES = 3
RETRY_SLEEP_SECONDS = 0.5
DEBUG_KEY_NAME = "global_aiohttp_client_request_debug"
_LOG_EVERY = 20
_USER_AGENT = f"nemo-gym/{__version__}"
_ALWAYS_RETRIED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)

# The config `setup_server_client` loaded or `set_global_aiohttp_client` was given (None: this process's own config
# when it has one, else the defaults).
_configured: Any = None
# Sessions of our own, for loops whose shared transport has no aiohttp session (`http_client_transport: httpx`).
_own_sessions: dict[int, tuple[asyncio.AbstractEventLoop, aiohttp.ClientSession]] = {}
_own_lock = threading.Lock()


def _process_config() -> Any:
    """The global config to size the client from: the one `setup_server_client` loaded or
    `set_global_aiohttp_client` was given, else this server process's own (handed down by `ng_run`), else None
    (the defaults)."""
    if _configured is not None:
        return _configured
    from nemo_gym.config.global_config import NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, get_global_config_dict

    if os.environ.get(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME) is None:
        return None
    try:
        return get_global_config_dict()
    except Exception:  # an unreadable config is reported where it is used for real, not here
        logger.debug("could not read the global config for the global aiohttp client", exc_info=True)
        return None


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """`global_aiohttp_client_request_debug: true` in the global config: failed requests are logged with their
    traceback and request."""
    return truthy(config_get(_process_config(), DEBUG_KEY_NAME, False))


class GlobalAIOHTTPAsyncClientConfig(BaseModel):
    """The global config keys the global aiohttp client is made from (NeMo Gym v0.5); validate it from a whole
    global config (`model_validate(global_config_dict)`, a dict or a `DictConfig`): other keys are ignored.
    The TCP keepalive keys are accepted and not applied (our connector keeps aiohttp's defaults)."""

    global_aiohttp_connector_limit: int = _client.DEFAULT_CONNECTOR_LIMIT
    global_aiohttp_connector_limit_per_host: int = _client.DEFAULT_CONNECTOR_LIMIT_PER_HOST
    global_aiohttp_client_request_debug: bool = False
    global_aiohttp_tcp_keepalive_idle_seconds: int = 60
    global_aiohttp_tcp_keepalive_interval_seconds: int = 10
    global_aiohttp_tcp_keepalive_probes: int = 3

    @model_validator(mode="before")
    @classmethod
    def _only_our_keys(cls, data: Any) -> Any:
        # A whole global config: read just these keys, so its other values (interpolations, secrets) stay unread.
        if is_mapping(data) and not isinstance(data, dict):
            missing = object()
            picked = {name: config_get(data, name, missing) for name in cls.model_fields}
            return {name: value for name, value in picked.items() if value is not missing}
        return data


def _running_loop(caller: str) -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{caller} needs a running event loop (an aiohttp session belongs to one loop): call it from async "
            "code, e.g. inside a route handler or under asyncio.run()."
        ) from None


def is_global_aiohttp_client_setup() -> bool:
    """Whether the running event loop has its global aiohttp client already (made by `set_global_aiohttp_client`,
    `get_global_aiohttp_client`, `request` or a `ServerClient` call on this loop). False outside a running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    if existing_global_aiohttp_session() is not None:
        return True
    with _own_lock:
        entry = _own_sessions.get(id(loop))
    return entry is not None and entry[0] is loop and not entry[1].closed


def set_global_aiohttp_client(cfg: GlobalAIOHTTPAsyncClientConfig) -> aiohttp.ClientSession:
    """Make the running loop's global aiohttp client from `cfg` (connector `limit` and `limit_per_host`, the
    request-debug flag) and return it; clients made later on other loops are sized the same way. Refused when
    the loop has one already (as v0.5 refuses a second client): check `is_global_aiohttp_client_setup()` first,
    or close it with `await global_aiohttp_client_exit()`."""
    global _configured
    _running_loop("set_global_aiohttp_client()")
    if not isinstance(cfg, GlobalAIOHTTPAsyncClientConfig):
        cfg = GlobalAIOHTTPAsyncClientConfig.model_validate(cfg)
    if is_global_aiohttp_client_setup():
        raise RuntimeError(
            "set_global_aiohttp_client(): this event loop has a global aiohttp client already. Call it only when "
            "is_global_aiohttp_client_setup() is False, or close the client first with "
            "`await global_aiohttp_client_exit()`."
        )
    _configured = cfg.model_dump()
    return get_global_aiohttp_client()


def get_global_aiohttp_client(
    global_config_dict_parser_config: Any = None, global_config_dict_parser_cls: Any = None
) -> aiohttp.ClientSession:
    """The process-wide `aiohttp.ClientSession` of the running event loop, created on first use from the global
    config (connector limits). Call it from async code: an aiohttp session belongs to one loop. The two
    parameters are accepted for v0.2/v0.5 call sites and not used (the config comes from `setup_server_client`,
    `set_global_aiohttp_client` or the server process)."""
    loop = _running_loop("get_global_aiohttp_client()")
    cfg = _process_config()
    session = _client.get_global_aiohttp_session(cfg)
    if session is not None:
        return session
    with _own_lock:
        entry = _own_sessions.get(id(loop))
        if entry is not None and entry[0] is loop and not entry[1].closed:
            return entry[1]
        limit = int(config_get(cfg, "global_aiohttp_connector_limit", _client.DEFAULT_CONNECTOR_LIMIT))
        per_host = int(
            config_get(cfg, "global_aiohttp_connector_limit_per_host", _client.DEFAULT_CONNECTOR_LIMIT_PER_HOST)
        )
        _forget_closed_loops()
        session = _client.build_transport("aiohttp", limit, per_host).session
        _own_sessions[id(loop)] = (loop, session)
        return session


def _forget_closed_loops() -> None:
    """Let go of the sessions of loops closed without closing them (see `close_session_of_closed_loop`): when the
    next loop makes its own, and at exit. Call with `_own_lock` held or at exit."""
    for key, (other_loop, other) in list(_own_sessions.items()):
        if other_loop.is_closed():
            del _own_sessions[key]
            close_session_of_closed_loop(other)


atexit.register(_forget_closed_loops)


def setup_server_client(head_server_config: Any = None) -> ServerClient:
    """A `ServerClient` over the global config fetched from the head server (`head_server_config`, default: this
    process's `head_server`, else 127.0.0.1:11000), which also becomes the config the global aiohttp client is
    sized from. Inside a running event loop the global client is created now if absent; otherwise on first use."""
    global _configured
    server_client = ServerClient.load_from_global_config(head_server_config)
    _configured = server_client.global_config_dict
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return server_client
    get_global_aiohttp_client()
    return server_client


def _prepare(kwargs: dict) -> dict:
    """kwargs for `ClientSession.request`: `json=` as orjson bytes with its content type, a default User-Agent."""
    headers = dict(kwargs.pop("headers", None) or {})
    lower = {str(k).lower() for k in headers}
    if "json" in kwargs:
        body = kwargs.pop("json")
        if body is not None:
            kwargs["data"] = encode_json_body(body)
            if "content-type" not in lower:
                headers["Content-Type"] = "application/json"
    if "user-agent" not in lower:
        headers["User-Agent"] = _USER_AGENT
    kwargs["headers"] = headers
    return kwargs


async def request(method: str, url: Any, _internal: bool = False, **kwargs: Any) -> aiohttp.ClientResponse:
    """`method` `url` through the global aiohttp session; returns the (unread) `aiohttp.ClientResponse` for any
    status. `kwargs` are `aiohttp.ClientSession.request`'s (`json=`, `params=`, `headers=`, `cookies=`,
    `timeout=`, ...). Retries as the module docstring says; the last exception of an external call is raised."""
    session = get_global_aiohttp_client()
    kwargs = _prepare(kwargs)
    debug = is_global_aiohttp_client_request_debug_enabled()
    failures = 0
    counted = 0
    while True:
        try:
            return await session.request(method, url, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            if not isinstance(exc, _ALWAYS_RETRIED) and not _internal:
                counted += 1
                if counted >= MAX_NUM_TRIES:
                    if debug:
                        logger.warning("%s %s failed after %d tries; giving up", method, url, counted, exc_info=exc)
                    raise
            if debug:
                logger.warning(
                    "%s %s failed (try %d): %s: %s; request kwargs: %r\n%s",
                    method, url, failures, type(exc).__name__, exc, kwargs, traceback.format_exc(),
                )
            elif failures == 1 or failures % _LOG_EVERY == 0:
                logger.warning(
                    "%s %s failed (%s: %s); retrying every %.1f s (%d failure(s) so far)",
                    method, url, type(exc).__name__, exc, RETRY_SLEEP_SECONDS, failures,
                )
            await asyncio.sleep(RETRY_SLEEP_SECONDS)


def global_aiohttp_client_exit() -> Optional["asyncio.Task[None]"]:
    """Close the global aiohttp client(s). Inside a running loop the close of that loop's client is scheduled and
    the task returned (await it to wait for it); outside, every client whose loop is not running is closed now.
    A later request creates a new client."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:

        async def close_running() -> None:
            with _own_lock:
                entry = _own_sessions.pop(id(loop), None)
            if entry is not None:
                await entry[1].close()
            await close_global_client()

        return loop.create_task(close_running())
    with _own_lock:
        _forget_closed_loops()
        entries = list(_own_sessions.values())
        _own_sessions.clear()
    for other_loop, session in entries:
        if session.closed or other_loop.is_closed() or other_loop.is_running():
            continue
        try:
            other_loop.run_until_complete(session.close())
        except Exception:  # pragma: no cover - best effort
            logger.debug("closing an aiohttp session failed", exc_info=True)
    _client.close_idle_global_clients()
    return None
