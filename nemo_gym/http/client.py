"""HTTP client that servers use to call each other by server id.

`ServerClient` turns a server id (a top-level block name of the global config) into
`http://{host}:{port}` and sends requests with one shared `aiohttp.ClientSession` per event loop.

Responses (docs/design.md, decision 1): `get` / `post` / `request` return a `ServerResponse`, the body already read,
with v0.2's aiohttp contract: `resp.status`, `resp.ok`, `resp.reason`, `resp.headers`, `resp.cookies`
(`SimpleCookie`), `await resp.json()`, `await resp.read()`, `await resp.text()`, `resp.raise_for_status()`; and,
without awaiting, `resp.status_code`, `resp.content` (bytes), `resp.server_name`, `resp.attempts`. The helpers
`await raise_for_status(resp)` and `await get_response_json(resp)` take a `ServerResponse`, an
`aiohttp.ClientResponse` or an `httpx.Response`.

Behaviour (NeMo Gym v0.2 compatible):

- **Addressing**: host/port sit three levels under `global_config_dict[server_id]`
  (`server_id -> server_type -> impl -> {host, port}`); resolved base URLs are cached per server id.
- **Replicas** (docs/design.md, decision 22; not in v0.2): a block with `replica_ports` (written by `ng_run` for
  `num_replicas` > 1) has one process per port. A call that carries this server's session cookie (name ending
  in `___<server_id>`) goes to the replica whose index the cookie's payload holds (`_replica`, read without
  checking the signature), so a rollout's calls stay where its session state is; any other call goes to the
  replica with the fewest requests in flight from this client, ties broken round-robin. Servers with one
  replica take none of this path.
- **Ray actor replicas** (decision 24): a block with `ray_actor_options` has replicas whose addresses only
  `ng_run` knows (each actor bound a free port on its node, a new one after a restart); they are read from the
  head server's `/server_instances` on first use and again when a replica fails to answer. A replica that
  refused or dropped a connection is left out of the choice for a couple of seconds (failover); a call pinned
  by its session cookie stays with its replica (its new address, after a restart).
- **Rollout id** (NeMo Gym v0.5; inert unless the global `observability_enabled: true`): calls made while a
  rollout id is current go to `/ng-rollout/<id><path>` where `servers/rollout_context.prefixed_url_path` says so
  (resources servers; model servers' three dialect routes), so model servers can capture them per rollout.
- **Bodies**: `json=` may be a pydantic model (dumped with `exclude_unset=True`) or plain data; it is
  serialized to bytes (orjson for plain data, pydantic's Rust serializer for models; nested models inside
  plain data go through orjson's `default` hook) and sent as content with `Content-Type: application/json`.
- **Cookies** are never stored by the client (no jar shared between rollouts). Pass them per call
  (`dict`, `httpx.Cookies` or `http.cookies.SimpleCookie`); they are sent as one `Cookie` header. A response's
  `.cookies` holds the `Set-Cookie`s of that response only.
- **Retries**: `nemo_gym.http.retry` decides (bounded by `max_attempts`, default 4; jittered backoff;
  `Retry-After` honoured up to `max_retry_after`). A request counts as idempotent when its method is (GET,
  PUT, ...) or the call says `idempotent=True`; a POST such as a tool call is not, so it is retried only on
  failures that mean it never ran (connection refused, 429, 503), never on a 500, a disconnect or a timeout.
  After the last attempt the last response is returned, or the last exception is raised with the server id,
  URL and attempt count in its message (attributes `server_name`, `url`, `attempts`).
- **Response size**: a response body is read no further than `http_client_max_response_body_bytes` (global
  config; default 256 MiB), whichever transport runs: a declared `Content-Length` over it fails before anything
  is read, any other body as its bytes arrive; the connection is closed. The error (`ResponseTooLargeError`, an
  `httpx.TransportError`) names the server, URL, the size seen and the key; it is not retried.
- **Timeouts**: default connect 10 s, read/write/pool unbounded. A rollout's `/run` can legitimately take
  hours (long agentic episodes), and the reference had no client timeout at all; a bounded connect timeout
  still turns a dead host into a prompt, retryable error. Override per client
  (`timeout=`) or per call (`timeout=`; a float applies to connect, read, write and pool).

Transport (benchmark: `perf/client_concurrency.py`): httpx's default httpcore pool rescans its waiting
queue against every connection on each request and each release, which is quadratic in queued requests and
stalls at ~16k in flight. We use aiohttp's public API directly, as v0.2 did: one `aiohttp.ClientSession` over one
`aiohttp.TCPConnector` (`limit = global_aiohttp_connector_limit`, default 102400; `limit_per_host =
global_aiohttp_connector_limit_per_host`, default 1024), whose waiters queue is O(1) per request. httpx clients
that share it (`NeMoGymAsyncOpenAI`, the vLLM model server) go through `AiohttpTransport`, our httpx transport
over that session. Set `http_client_transport: httpx` (config) or `NEMO_GYM_HTTP_CLIENT_TRANSPORT=httpx` (env) to
use an httpcore pool sized from the same two keys instead. The config key wins over the env var. A final transport
error is raised as the httpx exception type that says the same thing (`ConnectError`, `ReadTimeout`, ...), the
aiohttp error as its `__cause__`.

There is one session/transport per event loop per process, created lazily by the first request on that loop with the
config of the `ServerClient` that made it. It is closed when the loop shuts down its async generators
(`asyncio.run`, uvicorn and pytest-asyncio 1.x do), at interpreter exit if the loop is still usable, or explicitly
with `await close_global_client()`. The state of a loop closed without that (pytest-asyncio 0.24, a hand-made loop)
is let go of quietly when the next loop makes its own.
Modules: `nemo_gym.http.response` (the response, its errors and helpers, body and cookie encoding, capped body
reads), `nemo_gym.http.transports` (the transport choice and the per-loop shared state), `nemo_gym.http.replicas`
(replica routing); this one holds `ServerClient` and re-exports the names of the others, so every name that was
importable from here still is.

"""

from __future__ import annotations

import asyncio
from time import monotonic as _monotonic
import logging
from typing import Any, Mapping, Optional, Union

import httpx
import orjson
from yarl import URL

from nemo_gym.config.types import SERVER_TYPES
from nemo_gym.config.values import config_get, is_mapping
from nemo_gym.errors import did_you_mean
from nemo_gym.http.lean_client import LeanClient
from nemo_gym.http.replicas import _REPLICA_GONE_ERRORS, REPLICA_DOWN_S, REPLICA_REFRESH_S, Replicas
from nemo_gym.http.response import (  # noqa: F401  (re-exported: importable from here as before)
    _JSON_HEADERS,
    DEFAULT_MAX_RESPONSE_BODY_BYTES,
    MAX_RESPONSE_BODY_KEY,
    CookiesLike,
    NeMoGymHTTPError,
    ResponseTooLargeError,
    ServerResponse,
    _attr,
    _http_error,
    _ORJSON_OPTS,
    _orjson_default,
    _read_body,
    _request_info,
    _status_of,
    encode_cookie_header,
    encode_json_body,
    get_response_json,
    max_response_body_bytes,
    raise_for_status,
    read_aiohttp_body,
    read_httpx_body,
)
from nemo_gym.http.head_view import HeadServerView, head_base_url
from nemo_gym.http.stack_health import StackHealth
from nemo_gym.http.retry import (  # noqa: F401  (re-exported)
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_MAX,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_RETRY_AFTER,
    RETRY_EXCEPTIONS,
    RETRY_STATUSES,
    RetryingClient,
    RetryPolicy,
    is_idempotent_method,
)
from nemo_gym.http.transports import (  # noqa: F401  (re-exported)
    DEFAULT_CONNECTOR_LIMIT,
    DEFAULT_CONNECTOR_LIMIT_PER_HOST,
    DEFAULT_TIMEOUT,
    DEFAULT_TRANSPORT,
    TRANSPORT_CONFIG_KEY,
    TRANSPORT_ENV_VAR,
    TRANSPORTS,
    AiohttpTransport,
    CappedHTTPTransport,
    _client_timeout,
    _close_all_at_exit,
    _get_state,
    _LoopState,
    _make_httpx_transport,
    _new_session,
    _NullCookieJar,
    _remap_aiohttp_error,
    _transport_name,
    aiohttp_exchange,
    build_transport,
    close_global_client,
    close_idle_global_clients,
    get_global_aiohttp_session,
    get_global_client,
    get_global_transport,
)
from nemo_gym.servers.rollout_context import observability_enabled, prefixed_url_path

logger = logging.getLogger(__name__)

__all__ = [
    "ServerClient",
    "ServerResponse",
    "AiohttpTransport",
    "NeMoGymHTTPError",
    "ResponseTooLargeError",
    "raise_for_status",
    "get_response_json",
    "get_global_client",
    "get_global_transport",
    "build_transport",
    "close_global_client",
    "DEFAULT_TIMEOUT",
    "DEFAULT_MAX_ATTEMPTS",
    "RETRY_STATUSES",
    "RETRY_EXCEPTIONS",
    "MAX_RESPONSE_BODY_KEY",
    "DEFAULT_MAX_RESPONSE_BODY_BYTES",
]

_NO_TIMEOUT_OVERRIDE: Any = object()


# --------------------------------------------------------------------------------------------------------
# Helpers of ServerClient


def _get_field(obj: Any, name: str) -> Any:
    if is_mapping(obj):
        return obj.get(name)
    return getattr(obj, name, None)


def _known_server_ids(cfg: Any) -> list[str]:
    ids = []
    try:
        items = list(cfg.items())
    except Exception:
        return ids
    for key, block in items:
        try:
            if not is_mapping(block):
                continue
            for _server_type, impls in block.items():
                if is_mapping(impls) and any(is_mapping(v) for v in impls.values()):
                    ids.append(str(key))
                    break
        except Exception:  # unresolved interpolation etc.
            continue
    return ids


def _coerce_timeout(timeout: Any) -> dict:
    if isinstance(timeout, httpx.Timeout):
        return timeout.as_dict()
    if hasattr(timeout, "sock_read") and hasattr(timeout, "total"):  # an aiohttp.ClientTimeout (reference code)
        read = timeout.sock_read if timeout.sock_read is not None else timeout.total
        connect = timeout.sock_connect if timeout.sock_connect is not None else timeout.connect
        return httpx.Timeout(connect=connect, read=read, write=read, pool=timeout.connect).as_dict()
    return httpx.Timeout(timeout).as_dict()



def _head_base_url(head: Any) -> str:
    """`http://host:port` of the head server described by `head` (`host`/`port` as attributes or keys; default
    127.0.0.1:11000)."""
    return head_base_url(_get_field(head, "host"), _get_field(head, "port"))


def _request_body(json: Any, content: Union[bytes, str, None], data: Union[bytes, str, None]) -> Optional[bytes]:
    """The bytes a call sends: `json` encoded (`encode_json_body`), else `content` or `data` (str as UTF-8)."""
    if json is not None:
        return encode_json_body(json)
    raw = content if content is not None else data
    return raw.encode() if isinstance(raw, str) else raw


def _request_headers(json: Any, headers: Optional[Mapping[str, str]], cookies: CookiesLike) -> dict[str, str]:
    """A call's headers: JSON's content type (with `json`), the caller's `headers`, its `cookies` as one header."""
    header_map = dict(_JSON_HEADERS) if json is not None else {}
    if headers:
        header_map.update(headers)
    if cookies:
        cookie_header = encode_cookie_header(cookies)
        if cookie_header:
            header_map["Cookie"] = cookie_header
    return header_map


# --------------------------------------------------------------------------------------------------------
# One call's sender: what each attempt sends, by transport (the retry policy calls it)


class _Send:
    """One `ServerClient.request` call: the request each attempt sends (`__call__`, per transport in the
    subclasses) and its name in log lines (`label`). `replica` is -1 unless the server has several replicas;
    then `failover` is what the retry policy calls (the fields after `replica` serve it)."""

    __slots__ = (
        "server_name", "method", "url", "headers", "body", "debug", "replica",
        "client", "replicas", "cookies", "url_path",
    )

    def __init__(
        self, server_name: str, method: str, url: URL, headers: dict, body: Optional[bytes], debug: bool
    ) -> None:
        self.server_name = server_name
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.debug = debug
        self.replica = -1
        self.client = None

    async def __call__(self) -> ServerResponse:  # pragma: no cover - every subclass sends
        raise NotImplementedError

    async def stop_if_failed(self) -> None:
        """Before a retry: raise `StackServerFailed` when the head server says this server has failed for good
        (ng_run spent its restart budget), instead of spending the remaining attempts on it."""
        health = self.client.stack_health() if self.client is not None else None
        if health is not None:
            await health.raise_if_failed(self.server_name)

    def label(self) -> str:
        replica = self.replica
        where = f"{self.method} {self.url} (server `{self.server_name}`"
        return where + (f", replica {replica})" if replica >= 0 else ")")

    async def failover(self) -> ServerResponse:
        """Send to the chosen replica. One that refused or dropped the connection is out for a moment, and a
        retry goes to the replica chosen again (the same one when the session cookie pins it, at its new
        address)."""
        try:
            return await self()
        except _REPLICA_GONE_ERRORS:
            replicas = self.replicas
            replicas.mark_down(self.replica)
            if replicas.dynamic:
                await self.client._refresh_actor_replicas(self.server_name, replicas)
            replicas.in_flight[self.replica] -= 1
            self.replica = replica = replicas.choose(self.cookies)
            replicas.in_flight[replica] += 1
            self.url = replicas.url(replica, self.url_path)
            raise


class _LeanSend(_Send):
    """Through the lean client (plain-http calls, the default transport)."""

    __slots__ = ("lean", "timeout")

    async def __call__(self) -> ServerResponse:
        url, method = self.url, self.method
        answer = await self.lean.request(
            method, url.host, url.port, url.raw_path_qs, self.headers, self.body, self.timeout
        )
        return ServerResponse(answer.status, answer.reason, answer.headers, answer.body, url, method, self.server_name)


class _AiohttpSend(_Send):
    """Through the shared aiohttp session directly."""

    __slots__ = ("session", "params", "timeout", "max_body")

    async def __call__(self) -> ServerResponse:
        method = self.method
        resp = await self.session.request(
            method, self.url, data=self.body, headers=self.headers, params=self.params, timeout=self.timeout,
            allow_redirects=False,
        )
        try:
            content = await read_aiohttp_body(resp, self.max_body, method)
        finally:
            resp.release()
        return ServerResponse(resp.status, resp.reason, resp.headers, content, resp.url, method, self.server_name)


class _HttpxSend(_Send):
    """Through an httpx transport (`http_client_transport: httpx`, or one passed to the client)."""

    __slots__ = ("transport", "params", "timeout", "max_body")

    async def __call__(self) -> ServerResponse:
        method = self.method
        request = httpx.Request(
            method, str(self.url), params=self.params, headers=self.headers, content=self.body,
            extensions={"timeout": self.timeout},
        )
        response = await self.transport.handle_async_request(request)
        try:
            body = await read_httpx_body(response, self.max_body, request.url, method)
        finally:
            await response.aclose()
        wrapped = ServerResponse.from_httpx(response, URL(str(request.url)), method, body)
        wrapped.server_name = self.server_name
        return wrapped


class ServerClient(RetryingClient):
    """Calls other servers of the stack by server id.

    `head_server_config`: anything with `host`/`port` (attributes or keys) - the head server (used by
    `load_from_global_config` and kept for reference compatibility). `global_config_dict`: the global config
    (dict or DictConfig); `None` means this process's config (`nemo_gym.config.global_config.get_global_config_dict()`),
    loaded on first use.
    """

    def __init__(
        self,
        head_server_config: Any = None,
        global_config_dict: Any = None,
        *,
        timeout: Union[float, httpx.Timeout, None] = DEFAULT_TIMEOUT,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.retry_policy = RetryPolicy(int(max_attempts), float(backoff_base), float(backoff_max), float(max_retry_after))
        self.head_server_config = head_server_config
        self._global_config_dict = global_config_dict
        self._stack_health: Optional[StackHealth] = None
        self._head_view: Optional[HeadServerView] = None
        self._timeout_dict = _coerce_timeout(timeout)
        self.timeout = httpx.Timeout(**self._timeout_dict)
        self._base_urls: dict[str, str] = {}
        self._urls: dict[tuple[str, str], URL] = {}  # parsed URLs per (server, path): parsing is costly
        # Servers with several replicas only (empty for most stacks, so the check per request is one test).
        self._replicas: dict[str, Replicas] = {}
        self._client_timeout = _client_timeout(self._timeout_dict)
        # A transport of your own (tests: httpx.MockTransport; benchmarks); None = the shared one per loop.
        self._transport = transport
        # The cap on response bodies read through `transport` (the shared transports read their loop's own).
        self._max_body = max_response_body_bytes(global_config_dict)
        # `observability_enabled: true`: calls made for a rollout carry its id (`_rollout_url_path`). True until the
        # config is read, then the flag itself, so with observability off a request pays one attribute check.
        self._rollout_prefixing = True
        self._observability_known = False
        self._server_types: dict[str, Optional[str]] = {}
        if global_config_dict is not None:
            self._read_observability(global_config_dict)

    # -- config -------------------------------------------------------------------------------------------

    @property
    def global_config_dict(self) -> Any:
        if self._global_config_dict is None:
            from nemo_gym.config.global_config import get_global_config_dict

            self._global_config_dict = get_global_config_dict()
        return self._global_config_dict

    @global_config_dict.setter
    def global_config_dict(self, value: Any) -> None:
        self._global_config_dict = value
        self._max_body = max_response_body_bytes(value)
        self._base_urls.clear()
        self._urls.clear()
        self._replicas.clear()
        self._server_types.clear()
        self._stack_health = self._head_view = None  # made again from the new config on first use
        self._rollout_prefixing, self._observability_known = True, False
        if value is not None:
            self._read_observability(value)

    def _read_observability(self, cfg: Any) -> None:
        self._rollout_prefixing = observability_enabled(cfg)
        self._observability_known = True

    def _rollout_url_path(self, server_name: str, url_path: str, body: Any) -> str:
        """`url_path` with the current rollout's `/ng-rollout/<id>` prefix where it belongs
        (`servers/rollout_context.prefixed_url_path`); unchanged while observability is off."""
        if not self._observability_known:
            self._read_observability(self.global_config_dict)
            if not self._rollout_prefixing:
                return url_path
        server_type = self._server_types.get(server_name, False)
        if server_type is False:
            server_type = self._server_type(server_name)
            self._server_types[server_name] = server_type
        return prefixed_url_path(server_type, url_path, body)

    def _server_type(self, server_name: str) -> Optional[str]:
        """`resources_servers`, `responses_api_models`, ... : the kind of block `server_name` is, or None."""
        try:
            block = self.global_config_dict[server_name]
            return next((t for t in SERVER_TYPES if t in block), None) if is_mapping(block) else None
        except Exception:  # unknown server: the request itself says so
            return None

    def base_url(self, server_name: str) -> str:
        """`http://host:port` of a server id (cached). For Ray actor replicas: the first one with an address."""
        url = self._base_urls.get(server_name)
        if url is None:
            url = self._resolve_base_url(server_name)
            n_actors = self._ray_actor_replicas(server_name)
            if n_actors:
                bases = self._fetch_actor_bases(server_name, n_actors)
                self._replicas[server_name] = replicas = Replicas(server_name, bases, dynamic=True)
                replicas.refreshed_at = _monotonic()
                url = next((b for b in bases if b is not None), url)
            else:
                bases = self._resolve_replica_urls(server_name, url)
                if len(bases) > 1:
                    self._replicas[server_name] = Replicas(server_name, bases)
                else:
                    self._replicas.pop(server_name, None)
            self._base_urls[server_name] = url
        return url

    def _ray_actor_replicas(self, server_name: str) -> int:
        """How many Ray actor replicas serve this server (0: it is not run as Ray actors)."""
        try:
            from nemo_gym.config.global_config import get_first_server_config_dict

            cfg = get_first_server_config_dict(self.global_config_dict, server_name)
        except Exception:
            return 0
        if cfg is None or cfg.get("ray_actor_options") is None:
            return 0
        return int(cfg.get("num_replicas") or 1)

    def _head_url(self) -> str:
        return _head_base_url(self.head_server_config or config_get(self.global_config_dict, "head_server") or {})

    def _fetch_actor_bases(self, server_name: str, n: int) -> list[Optional[str]]:
        """Each replica's base URL as the head server lists it now (None: no address, e.g. restarting)."""
        bases: list[Optional[str]] = [None] * n
        instances = self.head_view().instances(max_age=0) or []
        for inst in instances:
            if inst.get("process_name") != server_name or inst.get("state") not in ("ready", "restarting"):
                continue
            replica = int(inst.get("replica") or 0)
            if 0 <= replica < n and inst.get("url") and inst.get("state") == "ready":
                bases[replica] = str(inst["url"])
        return bases

    async def _refresh_actor_replicas(self, server_name: str, replicas: Replicas) -> None:
        """Re-read the addresses of a server's Ray actor replicas (in a thread: the call is blocking)."""
        if _monotonic() - replicas.refreshed_at < REPLICA_REFRESH_S:
            return
        replicas.refreshed_at = _monotonic()
        bases = await asyncio.to_thread(self._fetch_actor_bases, server_name, len(replicas))
        replicas.update(bases)

    def replicas(self, server_name: str) -> Optional[Replicas]:
        """The replicas of a server with several (`replica_ports` in its block), else None."""
        self.base_url(server_name)
        return self._replicas.get(server_name)

    def _resolve_replica_urls(self, server_name: str, base: str) -> list[str]:
        """Base URLs of every replica: `base` with each of the block's `replica_ports` (just `[base]` without)."""
        try:
            from nemo_gym.config.global_config import get_first_server_config_dict

            ports = get_first_server_config_dict(self.global_config_dict, server_name).get("replica_ports")
        except Exception:
            return [base]
        if not ports or len(ports) < 2:
            return [base]
        host = base.rsplit(":", 1)[0]
        return [base, *(f"{host}:{int(port)}" for port in list(ports)[1:])]

    def _build_url(self, server_name: str, url_path: str) -> URL:
        base = self.base_url(server_name)
        path = url_path if not url_path or url_path.startswith("/") else "/" + url_path
        url = URL(base + path)
        if len(self._urls) >= 4096:  # paths with ids in them: keep the cache bounded
            self._urls.clear()
        self._urls[(server_name, url_path)] = url
        return url

    def _resolve_base_url(self, server_name: str) -> str:
        cfg = self.global_config_dict
        block = None
        try:
            if server_name in cfg:
                block = cfg[server_name]
        except Exception:
            block = None
        if block is None or not is_mapping(block):
            known = _known_server_ids(cfg)
            raise ValueError(
                f"Unknown server `{server_name}`: no such server id in the global config."
                f"{did_you_mean(str(server_name), known)} "
                f"Known server ids: {', '.join(sorted(known)) or '(none)'}."
            )
        impl_cfg = None
        try:
            from nemo_gym.config.global_config import get_first_server_config_dict

            impl_cfg = get_first_server_config_dict(cfg, server_name)
        except Exception:
            impl_cfg = None
        if impl_cfg is None:
            for _server_type, impls in block.items():
                if is_mapping(impls):
                    for _impl, c in impls.items():
                        if is_mapping(c):
                            impl_cfg = c
                            break
                if impl_cfg is not None:
                    break
        host = impl_cfg.get("host") if impl_cfg is not None else None
        port = impl_cfg.get("port") if impl_cfg is not None else None
        if host is None or port is None:
            raise ValueError(
                f"Server `{server_name}` has no host/port in the global config (expected "
                f"`{server_name}.<server_type>.<impl>.host/port`). Start the stack with `ng_run` so ports are "
                f"assigned, or set them explicitly."
            )
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in str(host) and not str(host).startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{int(port)}"

    def head_view(self) -> HeadServerView:
        """The head server's `/server_instances` as this client sees it (made on first use), shared by the failed-
        server checks (`stack_health`) and the Ray actor replica addresses."""
        view = self._head_view
        if view is None:
            view = self._head_view = HeadServerView(self._head_url())
        return view

    def stack_health(self) -> Optional[StackHealth]:
        """The head server's view of which servers have failed for good, for the servers of this stack (made on
        first use; None without a head server). Consulted only before a retry."""
        health = self._stack_health
        if health is None and self.head_server_config is not None:
            host = _get_field(self.head_server_config, "host") or "127.0.0.1"
            port = _get_field(self.head_server_config, "port") or 11000
            servers = {name: "" for name in _known_server_ids(self._global_config_dict)}
            health = self._stack_health = StackHealth(str(host), int(port), servers, view=self.head_view())
        return health

    @classmethod
    def load_from_global_config(cls, head_server_config: Any = None, **kwargs: Any) -> "ServerClient":
        """Fetch the global config from the head server and build a client from it.

        `head_server_config` defaults to `head_server` of this process's config (127.0.0.1:11000).
        """
        if head_server_config is None:
            try:
                from nemo_gym.config.global_config import get_global_config_dict

                head_server_config = get_global_config_dict().get("head_server")
            except Exception:
                head_server_config = None
            if head_server_config is None:
                head_server_config = {"host": "127.0.0.1", "port": 11000}
        host = _get_field(head_server_config, "host") or "127.0.0.1"
        port = _get_field(head_server_config, "port") or 11000
        url = _head_base_url(head_server_config) + "/global_config_dict_yaml"
        try:
            response = httpx.get(url, timeout=httpx.Timeout(30.0, connect=10.0), trust_env=False)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ValueError(
                f"Could not reach the NeMo Gym head server at {host}:{port} ({exc}). Is it running? Start the "
                f"stack with `ng_run`, or point to it with `+head_server.host=<host> +head_server.port=<port>`."
            ) from exc
        if response.status_code >= 400:
            raise ValueError(
                f"The head server at {host}:{port} answered {url} with HTTP {response.status_code}: "
                f"{response.text[:500]}"
            )
        global_config_dict = _parse_config_body(response.content)
        return cls(head_server_config=head_server_config, global_config_dict=global_config_dict, **kwargs)

    # -- requests -----------------------------------------------------------------------------------------

    async def get(self, server_name: str, url_path: str, **kwargs: Any) -> ServerResponse:
        return await self.request(server_name, url_path, "GET", **kwargs)

    async def post(self, server_name: str, url_path: str, **kwargs: Any) -> ServerResponse:
        return await self.request(server_name, url_path, "POST", **kwargs)

    async def request(
        self,
        server_name: str,
        url_path: str,
        method: str = "GET",
        *,
        json: Any = None,
        content: Union[bytes, str, None] = None,
        data: Union[bytes, str, None] = None,
        cookies: CookiesLike = None,
        headers: Optional[Mapping[str, str]] = None,
        params: Any = None,
        timeout: Any = _NO_TIMEOUT_OVERRIDE,
        max_attempts: Optional[int] = None,
        idempotent: Optional[bool] = None,
    ) -> ServerResponse:
        """Send `method` to `url_path` of server `server_name` and return the fully read `ServerResponse`.

        Retries as described in the module docstring; `max_attempts` overrides the client's bound for one
        call, `idempotent` whether repeating it is harmless (default: by method). The response is returned for
        every status (use `raise_for_status`)."""
        if self._rollout_prefixing:  # observability on (or the config not read yet)
            url_path = self._rollout_url_path(server_name, url_path, json)
        url = self._urls.get((server_name, url_path))
        if url is None:
            url = self._build_url(server_name, url_path)  # also learns whether the server has replicas
        send = self._sender(
            server_name, method, url, _request_headers(json, headers, cookies), _request_body(json, content, data),
            params, timeout,
        )
        send.client = self
        if idempotent is None:
            idempotent = is_idempotent_method(method)
        replicas = self._replicas.get(server_name) if self._replicas else None
        if replicas is None:
            outcome = await self.retry_policy.run(
                send, idempotent=idempotent, label=send.label, max_attempts=max_attempts, before_retry=send.stop_if_failed
            )
        else:  # several processes serve it: the session's one, else the least loaded
            outcome = await self._run_on_replicas(send, replicas, url_path, cookies, idempotent, max_attempts)
        if outcome.error is not None:
            self._raise_final(outcome.error, send, outcome.attempts)
        response = outcome.result
        response.attempts = outcome.attempts
        if send.debug and response.status >= 400:
            logger.warning(
                "%s %s (server `%s`) -> HTTP %s after %d attempt(s); request body: %r; response body: %r",
                method, send.url, server_name, response.status, outcome.attempts, send.body, response.content,
            )
        return response

    def _sender(
        self, server_name: str, method: str, url: URL, headers: dict, body: Optional[bytes], params: Any,
        timeout: Any,
    ) -> _Send:
        """What sends this call: the lean client for plain-http calls without query parameters (the default
        transport), else the shared aiohttp session, else an httpx transport (the client's own, or the shared one
        under `http_client_transport: httpx`)."""
        override = None if timeout is _NO_TIMEOUT_OVERRIDE else _coerce_timeout(timeout)
        own = self._transport
        if own is not None:
            send: Any = _HttpxSend(server_name, method, url, headers, body, False)
            send.transport, send.max_body = own, self._max_body
        else:
            state = _get_state(self._global_config_dict)
            lean = state.lean
            if lean is not None and params is None and url.scheme == "http" and method != "HEAD":
                send = _LeanSend(server_name, method, url, headers, body, state.debug)
                send.lean = lean
                send.timeout = self._timeout_dict if override is None else override
                return send
            session = state.session
            if session is not None:
                send = _AiohttpSend(server_name, method, url, headers, body, state.debug)
                send.session, send.params, send.max_body = session, params, state.max_body
                send.timeout = self._client_timeout if override is None else _client_timeout(override)
                return send
            send = _HttpxSend(server_name, method, url, headers, body, state.debug)
            send.transport, send.max_body = state.transport, state.max_body
        send.params = params
        send.timeout = override or self._timeout_dict
        return send

    async def _run_on_replicas(
        self, send: _Send, replicas: Replicas, url_path: str, cookies: CookiesLike, idempotent: bool,
        max_attempts: Optional[int],
    ) -> Any:
        """Run `send` on the replica its session cookie pins, else the least loaded, failing over to another
        when one is gone (`_Send.failover`); counts this client's requests in flight to each."""
        if replicas.dynamic and replicas.stale():
            await self._refresh_actor_replicas(send.server_name, replicas)
        send.replica = replica = replicas.choose(cookies)
        send.url = replicas.url(replica, url_path)
        send.client, send.replicas, send.cookies, send.url_path = self, replicas, cookies, url_path
        replicas.in_flight[replica] += 1
        try:
            return await self.retry_policy.run(
                send.failover, idempotent=idempotent, label=send.label, max_attempts=max_attempts,
                before_retry=send.stop_if_failed,
            )
        finally:
            replicas.in_flight[send.replica] -= 1

    def _raise_final(self, error: Exception, send: _Send, attempts: int) -> None:
        """Raise the error of a call's last attempt: transport errors (aiohttp's as the httpx error saying the
        same) with the server id, URL and attempt count in the message (`_final_error`); others as they are."""
        final = error
        if not isinstance(final, httpx.TransportError):
            final = _remap_aiohttp_error(final, None) or final
        if isinstance(final, httpx.TransportError):
            raise self._final_error(final, send.server_name, send.method, send.url, attempts, send.debug) from error
        raise error

    @staticmethod
    def _final_error(
        exc: httpx.TransportError, server_name: str, method: str, url: Any, attempts: int, debug: bool
    ) -> httpx.TransportError:
        if isinstance(exc, ResponseTooLargeError):  # its own message: the size seen and the key to raise
            new: httpx.TransportError = exc.named(method=method, url=url, server_name=server_name, attempts=attempts)
            if debug:
                logger.warning("%s", new, exc_info=exc)
            return new
        detail = str(exc)
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        message = f"{method} {url} (server `{server_name}`) failed {tries}: {type(exc).__name__}"
        if detail and detail != type(exc).__name__:
            message += f": {detail}"
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            message += ". Is that server running and reachable at this address?"
        try:
            new = type(exc)(message)
        except Exception:  # pragma: no cover - unusual subclass signature
            new = httpx.TransportError(message)
        new.server_name = server_name  # type: ignore[attr-defined]
        new.url = str(url)  # type: ignore[attr-defined]
        new.attempts = attempts  # type: ignore[attr-defined]
        if debug:
            logger.warning("%s", message, exc_info=exc)
        return new


def _parse_config_body(body: bytes) -> Any:
    """The head server body: a JSON string literal holding YAML (reference behaviour), or raw YAML."""
    text: Any
    try:
        text = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8")
    if isinstance(text, str):
        try:
            from omegaconf import OmegaConf

            return OmegaConf.create(text)
        except ImportError:  # pragma: no cover
            import yaml

            return yaml.safe_load(text)
    # A JSON object was served directly.
    try:
        from omegaconf import OmegaConf

        return OmegaConf.create(text)
    except ImportError:  # pragma: no cover
        return text



def get_server_url(server_name: str) -> str:
    """`http://host:port` of server id `server_name` in this process's global config (an unknown id is a
    `ValueError` listing the known ones)."""
    return ServerClient(head_server_config=None, global_config_dict=None).base_url(server_name)
