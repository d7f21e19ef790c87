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
(`asyncio.run`, uvicorn, pytest-asyncio all do), at interpreter exit if the loop is still usable, or explicitly
with `await close_global_client()`.
"""

from __future__ import annotations

import asyncio
from time import monotonic as _monotonic
import atexit
import http.cookiejar
import inspect
import logging
import os
import threading
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any, AsyncIterator, Mapping, Optional, Union

import aiohttp
import httpx
import orjson
from yarl import URL

from nemo_gym.config.types import SERVER_TYPES
from nemo_gym.config.values import config_get, is_mapping
from nemo_gym.errors import did_you_mean
from nemo_gym.http.lean_client import LeanClient
from nemo_gym.serving.sessions import replica_of_cookie
from nemo_gym.http.retry import (
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
from nemo_gym.servers.rollout_context import observability_enabled, prefixed_url_path

logger = logging.getLogger(__name__)

__all__ = [
    "ServerClient",
    "ServerResponse",
    "AiohttpTransport",
    "NeMoGymHTTPError",
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
]

DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=None, pool=None)

DEFAULT_CONNECTOR_LIMIT = 102400
DEFAULT_CONNECTOR_LIMIT_PER_HOST = 1024
TRANSPORT_ENV_VAR = "NEMO_GYM_HTTP_CLIENT_TRANSPORT"
TRANSPORT_CONFIG_KEY = "http_client_transport"
TRANSPORTS = ("lean", "aiohttp", "httpx")
# `lean`: ServerClient's plain-http calls go through `LeanClient`; the rest, and httpx users, through aiohttp.
DEFAULT_TRANSPORT = "lean"

_JSON_HEADERS = {"Content-Type": "application/json"}
_NO_TIMEOUT_OVERRIDE: Any = object()


# --------------------------------------------------------------------------------------------------------
# The response, errors and response helpers


def _request_info(url: Any, method: str) -> Any:
    """An `aiohttp.RequestInfo` for errors (v0.2 code reads `e.request_info`)."""
    import aiohttp
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    url = url if isinstance(url, URL) else URL(str(url or ""))
    return aiohttp.RequestInfo(url, method or "", CIMultiDictProxy(CIMultiDict()), url)


class NeMoGymHTTPError(httpx.HTTPStatusError, aiohttp.ClientResponseError):
    """An HTTP error status from another server.

    `response_content` is the response body as text (the exception middleware relays it), `status` /
    `status_code` the status, `server_name` the server id (when known), `attempts` how many tries were made,
    `response` the response it was raised for. Subclasses `httpx.HTTPStatusError` and
    `aiohttp.ClientResponseError` (so `except ClientResponseError as e: e.status` works as in v0.2).
    """

    def __init__(
        self,
        message: str,
        *,
        response: Any = None,
        response_content: str = "",
        server_name: Optional[str] = None,
        attempts: Optional[int] = None,
        status: Optional[int] = None,
        method: str = "",
        url: Any = None,
    ) -> None:
        Exception.__init__(self, message)
        self.response = response  # type: ignore[assignment]
        self._request = response._request if isinstance(response, httpx.Response) else None
        self.response_content = response_content
        self.server_name = server_name
        self.attempts = attempts
        if status is None:
            status = _status_of(response) if response is not None else 0
        self.status = status
        self.status_code = status
        self.message = message
        self.headers = getattr(response, "headers", None)
        self.history = ()
        self._method = method
        self._url = url
        self.args = (message,)

    @property
    def request(self) -> Any:  # httpx's attribute; None when the response did not come from httpx
        return self._request

    @request.setter
    def request(self, value: Any) -> None:
        self._request = value

    @property
    def request_info(self) -> Any:  # aiohttp's attribute, built on first use
        return _request_info(self._url, self._method)

    @request_info.setter
    def request_info(self, value: Any) -> None:
        pass

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class ServerResponse:
    """A fully read response from `ServerClient`, with NeMo Gym v0.2's (aiohttp's) contract.

    aiohttp-style: `status`, `reason`, `ok`, `headers` (a case-insensitive `multidict`), `cookies` (a
    `SimpleCookie` of this response's `Set-Cookie`s), `url`, `method`, `content_type`, `charset`,
    `await read()`, `await text()`, `await json()`, `raise_for_status()`, `release()`, `close()`,
    `async with`. Plus, without awaiting: `status_code`, `reason_phrase` and `content`/`body` (the bytes),
    and `server_name` / `attempts` (which server answered, after how many tries). The body is already in
    memory, so nothing here does I/O and releasing is a no-op.
    """

    __slots__ = ("status", "reason", "headers", "_body", "url", "method", "server_name", "attempts", "_cookies")

    def __init__(
        self,
        status: int,
        reason: Optional[str],
        headers: Any,
        body: bytes,
        url: Any = None,
        method: str = "",
        server_name: Optional[str] = None,
        attempts: int = 1,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._body = body
        self.url = url
        self.method = method
        self.server_name = server_name
        self.attempts = attempts
        self._cookies: Optional[SimpleCookie] = None

    @classmethod
    def from_httpx(cls, response: httpx.Response, url: Any = None, method: str = "") -> "ServerResponse":
        """Wrap a read `httpx.Response` (the `httpx` transport, or a transport a test passed in)."""
        from multidict import CIMultiDict, CIMultiDictProxy

        headers = CIMultiDictProxy(CIMultiDict(response.headers.multi_items()))
        return cls(response.status_code, response.reason_phrase, headers, response.content, url, method)

    # -- without awaiting -----------------------------------------------------------------------------------

    @property
    def status_code(self) -> int:
        return self.status

    @property
    def reason_phrase(self) -> str:
        return self.reason or ""

    @property
    def ok(self) -> bool:
        return self.status < 400

    @property
    def content(self) -> bytes:
        return self._body

    @property
    def body(self) -> bytes:
        return self._body

    @property
    def real_url(self) -> Any:
        return self.url

    @property
    def history(self) -> tuple:
        return ()

    @property
    def content_type(self) -> str:
        value = self.headers.get("content-type") or "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    @property
    def charset(self) -> Optional[str]:
        _, _, params = (self.headers.get("content-type") or "").partition(";")
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset":
                return value.strip().strip('"') or None
        return None

    @property
    def cookies(self) -> SimpleCookie:
        if self._cookies is None:
            jar: SimpleCookie = SimpleCookie()
            for header in self.headers.getall("set-cookie", ()):
                try:
                    jar.load(header)
                except Exception:  # a malformed Set-Cookie is skipped, as aiohttp does
                    continue
            self._cookies = jar
        return self._cookies

    @property
    def request_info(self) -> Any:
        return _request_info(self.url, self.method)

    def get_encoding(self) -> str:
        return self.charset or "utf-8"

    def raise_for_status(self) -> None:
        if self.status >= 400:
            raise _http_error(self, self._body)

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass

    # -- awaited, as in aiohttp -----------------------------------------------------------------------------

    async def read(self) -> bytes:
        return self._body

    async def text(self, encoding: Optional[str] = None, errors: str = "strict") -> str:
        return self._body.decode(encoding or self.get_encoding(), errors)

    async def json(self, *, encoding: Optional[str] = None, loads: Any = None, content_type: Any = None) -> Any:
        """The body parsed as JSON (orjson unless `loads` is given); an empty body is None, as in aiohttp. The
        content type is not checked (`content_type` is accepted for compatibility)."""
        body = self._body
        if not body.strip():
            return None
        if loads is not None:
            return loads(body.decode(encoding or self.get_encoding()))
        return orjson.loads(body)

    async def __aenter__(self) -> "ServerResponse":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<ServerResponse({self.url}) [{self.status} {self.reason or ''}]>"


def _status_of(response: Any) -> int:
    status = getattr(response, "status", None)
    if not isinstance(status, int):
        status = getattr(response, "status_code", 0)
    return int(status)


async def _read_body(response: Any) -> bytes:
    """The body of a ServerResponse, an `aiohttp.ClientResponse`, an `httpx.Response` or any response with
    `.content` bytes (e.g. an `httpx2.Response` from starlette's TestClient)."""
    if isinstance(response, ServerResponse):
        return response._body
    if isinstance(response, httpx.Response):
        try:
            return response.content
        except httpx.ResponseNotRead:
            return await response.aread()
    if not isinstance(response, aiohttp.ClientResponse):
        content = getattr(response, "content", None)
        if isinstance(content, (bytes, bytearray)):
            return bytes(content)
    body = response.read()  # aiohttp.ClientResponse (reads once, then serves the cached body)
    return await body if inspect.isawaitable(body) else body


def _attr(obj: Any, name: str, kind: Any, default: Any = None) -> Any:
    """`obj.name` when it is of `kind`, else `default` (test doubles answer every attribute with a mock)."""
    value = getattr(obj, name, None)
    return value if isinstance(value, kind) else default


def _http_error(response: Any, body: bytes) -> NeMoGymHTTPError:
    text = body.decode("utf-8", errors="replace") if isinstance(body, (bytes, bytearray)) else str(body)
    status = _status_of(response)
    server_name = _attr(response, "server_name", str)
    attempts = _attr(response, "attempts", int)
    if isinstance(response, httpx.Response):
        request = response._request  # None for hand-built responses
        method, url = (request.method, request.url) if request is not None else ("", None)
        reason = response.reason_phrase
    else:
        method, url = _attr(response, "method", str, ""), _attr(response, "url", (str, URL))
        reason = _attr(response, "reason", str, "")
    where = f"{method} {url}" if method and url is not None else "request"
    if server_name:
        where += f" (server `{server_name}`)"
    tries = f" after {attempts} attempts" if attempts and attempts > 1 else ""
    preview = text if len(text) <= 2000 else text[:2000] + "...[truncated]"
    message = f"{where} failed with HTTP {status} {reason}{tries}: {preview}"
    return NeMoGymHTTPError(
        message,
        response=response,
        response_content=text,
        server_name=server_name,
        attempts=attempts,
        status=status,
        method=method,
        url=url,
    )


async def raise_for_status(response: Any) -> None:
    """Raise `NeMoGymHTTPError` (body text attached as `response_content`) unless `response.ok` (else: the status
    is below 400); the body is read first. Takes a
    `ServerResponse`, an `aiohttp.ClientResponse` or an `httpx.Response`."""
    ok = getattr(response, "ok", None)  # v0.5 reads `.ok` (aiohttp's and ours); httpx has none
    if not isinstance(ok, bool):
        ok = _status_of(response) < 400
    if ok:
        return
    raise _http_error(response, await _read_body(response))


async def get_response_json(response: Any) -> Any:
    """Parse the body as JSON with orjson (`ServerResponse`, `aiohttp.ClientResponse` or `httpx.Response`)."""
    return orjson.loads(await _read_body(response))


# --------------------------------------------------------------------------------------------------------
# Body and cookie encoding


def _orjson_default(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    if dump is not None:
        return dump(mode="json", exclude_unset=True)
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(obj, (DictConfig, ListConfig)):
            return OmegaConf.to_container(obj, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def encode_json_body(obj: Any) -> bytes:
    """Bytes of a JSON body: pydantic models with `exclude_unset=True`, everything else with orjson."""
    dump_json = getattr(obj, "model_dump_json", None)
    if dump_json is not None and not isinstance(obj, type):
        return dump_json(exclude_unset=True).encode()
    return orjson.dumps(obj, default=_orjson_default, option=_ORJSON_OPTS)


CookiesLike = Union[Mapping[str, Any], httpx.Cookies, SimpleCookie, None]


def encode_cookie_header(cookies: CookiesLike) -> Optional[str]:
    """One `Cookie` header value from a dict, `httpx.Cookies` or `SimpleCookie` (domains ignored: the
    caller decided to send them)."""
    if not cookies:
        return None
    if isinstance(getattr(cookies, "jar", None), http.cookiejar.CookieJar):  # httpx.Cookies, httpx2.Cookies
        pairs = [f"{c.name}={c.value}" for c in cookies.jar]
    elif isinstance(cookies, SimpleCookie):
        pairs = [f"{name}={morsel.coded_value}" for name, morsel in cookies.items()]
    else:
        pairs = []
        for name, value in cookies.items():
            coded = getattr(value, "coded_value", None)  # a Morsel
            pairs.append(f"{name}={coded if coded is not None else value}")
    return "; ".join(pairs) if pairs else None


class _NullCookieJar(http.cookiejar.CookieJar):
    """A cookie jar that never stores anything (for the shared `httpx.AsyncClient`)."""

    def set_cookie(self, cookie):  # noqa: D401
        return None

    def extract_cookies(self, response, request):
        return None

    def add_cookie_header(self, request):
        return None


# --------------------------------------------------------------------------------------------------------
# The shared transport (one per event loop per process)


def _transport_name(cfg: Any) -> str:
    name = config_get(cfg, TRANSPORT_CONFIG_KEY) or os.environ.get(TRANSPORT_ENV_VAR) or DEFAULT_TRANSPORT
    name = str(name).strip().lower()
    if name not in TRANSPORTS:
        raise ValueError(
            f"Unknown {TRANSPORT_CONFIG_KEY} / {TRANSPORT_ENV_VAR} value {name!r}; expected one of {TRANSPORTS}."
        )
    return name


def _remap_aiohttp_error(exc: BaseException, request: Any) -> Optional[httpx.TransportError]:
    """The httpx exception type that says the same as an aiohttp error (its `__cause__`), so callers and
    messages see one family of transport errors whichever transport ran. None if `exc` is not aiohttp's."""
    cause = exc if isinstance(exc, aiohttp.ClientError) else exc.__cause__
    if not isinstance(cause, (aiohttp.ClientError, asyncio.TimeoutError)):
        return None
    text = str(cause) or type(cause).__name__
    if isinstance(cause, asyncio.TimeoutError):
        if isinstance(cause, aiohttp.ConnectionTimeoutError):
            new: httpx.TransportError = httpx.ConnectTimeout(text)
        else:
            new = httpx.ReadTimeout(text)
    elif isinstance(cause, aiohttp.ClientConnectorError):
        new = httpx.ConnectError(text)
    elif isinstance(cause, aiohttp.ServerDisconnectedError):
        new = httpx.RemoteProtocolError(text if "disconnect" in text.lower() else f"Server disconnected: {text}")
    elif isinstance(cause, (aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        new = httpx.ReadError(text)
    elif isinstance(cause, (aiohttp.ClientResponseError, aiohttp.ClientConnectionError)):
        new = httpx.RemoteProtocolError(text)
    else:
        return None
    if isinstance(request, httpx.Request):
        new.request = request
    new.__cause__ = cause
    return new


_client_timeouts: dict[tuple, aiohttp.ClientTimeout] = {}


def _client_timeout(timeout: Mapping[str, Any]) -> aiohttp.ClientTimeout:
    """aiohttp's timeout for an httpx-style timeout dict: pool -> `connect` (waiting for a pooled connection
    included), connect -> `sock_connect`, read -> `sock_read`; no total."""
    key = (timeout.get("connect"), timeout.get("read"), timeout.get("pool"))
    value = _client_timeouts.get(key)
    if value is None:
        value = aiohttp.ClientTimeout(total=None, connect=key[2], sock_connect=key[0], sock_read=key[1])
        if len(_client_timeouts) < 256:
            _client_timeouts[key] = value
    return value


def _new_session(limit: int, limit_per_host: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, limit_per_host=limit_per_host),
        cookie_jar=aiohttp.DummyCookieJar(),  # cookies are explicit per call, never stored
        timeout=aiohttp.ClientTimeout(total=None),
        # Local traffic: no compression negotiation, no User-Agent.
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
    )


async def aiohttp_exchange(
    session: aiohttp.ClientSession, method: str, url: Any, *, request: Any = None, **kwargs: Any
) -> tuple[aiohttp.ClientResponse, bytes]:
    """One request through `session` (no redirects), read whole; an aiohttp error is raised as the httpx error
    that says the same (`request`, an `httpx.Request`, is attached to it when given)."""
    try:
        resp = await session.request(method, url, allow_redirects=False, **kwargs)
        try:
            body = await resp.read()
        finally:
            resp.release()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        new = _remap_aiohttp_error(exc, request)
        if new is None:
            raise
        raise new from exc
    return resp, body


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends with one `aiohttp.ClientSession` (aiohttp's public API only), so httpx
    clients (`NeMoGymAsyncOpenAI`, the vLLM model server) share the process's connector. Bodies are read whole;
    aiohttp errors are raised as the httpx exception saying the same thing (the aiohttp error as `__cause__`)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            body = request.content
        except httpx.RequestNotRead:
            body = await request.aread()
        resp, content = await aiohttp_exchange(
            self.session,
            request.method,
            str(request.url),
            request=request,
            headers=request.headers.multi_items(),
            data=body or None,
            auto_decompress=False,  # httpx decodes Content-Encoding itself
            compress=False,
            timeout=_client_timeout(request.extensions.get("timeout") or {}),
        )
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if resp.reason:
            extensions["reason_phrase"] = resp.reason.encode()
        return httpx.Response(
            resp.status, headers=resp.raw_headers, stream=httpx.ByteStream(content), request=request,
            extensions=extensions,
        )

    async def aclose(self) -> None:
        await self.session.close()


def _make_httpx_transport(limit: int, limit_per_host: int) -> httpx.AsyncBaseTransport:
    # httpcore has one pool for all hosts: size it so requests never wait in its (quadratic) queue.
    return httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit_per_host),
        trust_env=False,
    )


def build_transport(
    name: str = DEFAULT_TRANSPORT,
    limit: int = DEFAULT_CONNECTOR_LIMIT,
    limit_per_host: int = DEFAULT_CONNECTOR_LIMIT_PER_HOST,
) -> httpx.AsyncBaseTransport:
    """A new httpx transport of the kind the shared client uses (`aiohttp`: an `AiohttpTransport` over a new
    session; `httpx`: an httpcore pool). Call inside a running loop."""
    if name in ("aiohttp", "lean"):
        return AiohttpTransport(_new_session(limit, limit_per_host))
    if name == "httpx":
        return _make_httpx_transport(limit, limit_per_host)
    raise ValueError(f"Unknown transport {name!r}; expected one of {TRANSPORTS}.")


@dataclass(eq=False)
class _LoopState:
    loop: asyncio.AbstractEventLoop
    transport: httpx.AsyncBaseTransport
    transport_name: str
    # The aiohttp session ServerClient sends with directly; None with the `httpx` transport.
    session: Optional[aiohttp.ClientSession] = None
    # ServerClient's plain-http calls with the `lean` transport (the default).
    lean: Optional[LeanClient] = None
    debug: bool = False
    client: Optional[httpx.AsyncClient] = None
    closer: Any = None
    closed: bool = False

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.lean is not None:
                await self.lean.aclose()
            if self.client is not None:
                await self.client.aclose()  # closes the transport too
            else:
                await self.transport.aclose()
        except Exception:  # pragma: no cover - best effort at shutdown
            logger.debug("closing the shared HTTP transport failed", exc_info=True)


_states: dict[int, _LoopState] = {}
_states_lock = threading.Lock()
_last_state: Optional[_LoopState] = None


async def _closer_gen(state: _LoopState) -> AsyncIterator[None]:
    # Registered with the loop's async-generator hooks; `loop.shutdown_asyncgens()` (asyncio.run, uvicorn,
    # pytest-asyncio runners) closes it, which closes the transport while the loop can still run I/O.
    try:
        yield
    finally:
        await state.aclose()
        with _states_lock:
            if _states.get(id(state.loop)) is state:
                del _states[id(state.loop)]


def _get_state(cfg: Any = None) -> _LoopState:
    global _last_state
    loop = asyncio.get_running_loop()
    state = _last_state
    if state is not None and state.loop is loop and not state.closed:
        return state
    with _states_lock:
        state = _states.get(id(loop))
        if state is not None and (state.loop is not loop or state.closed):
            state = None
        if state is None:
            for key, other in list(_states.items()):  # forget loops that are gone
                if other.loop.is_closed() or other.closed:
                    del _states[key]
            name = _transport_name(cfg)
            limit = int(config_get(cfg, "global_aiohttp_connector_limit", DEFAULT_CONNECTOR_LIMIT))
            per_host = int(
                config_get(cfg, "global_aiohttp_connector_limit_per_host", DEFAULT_CONNECTOR_LIMIT_PER_HOST)
            )
            transport = build_transport(name, limit, per_host)
            state = _LoopState(
                loop=loop,
                transport=transport,
                transport_name=name,
                session=transport.session if isinstance(transport, AiohttpTransport) else None,
                lean=LeanClient(per_host) if name == "lean" else None,
                debug=bool(config_get(cfg, "global_aiohttp_client_request_debug", False)),
            )
            # Start the closer generator synchronously up to its `yield` (it awaits nothing before it);
            # `__anext__()` registers it with the running loop's firstiter hook.
            closer = _closer_gen(state)
            step = closer.__anext__()
            try:
                step.send(None)
            except StopIteration:
                pass
            state.closer = closer
            _states[id(loop)] = state
        _last_state = state
    return state


async def get_global_transport(global_config_dict: Any = None) -> httpx.AsyncBaseTransport:
    """The shared transport of the running event loop (created on first use)."""
    return _get_state(global_config_dict).transport


async def get_global_client(global_config_dict: Any = None) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` over the shared transport (never stores cookies, no client timeout beyond
    connect 10 s). For ad-hoc calls to URLs that are not servers of the config."""
    state = _get_state(global_config_dict)
    if state.client is None:
        state.client = httpx.AsyncClient(
            transport=state.transport,
            cookies=_NullCookieJar(),  # kept as the jar itself (a Cookies would be copied into a real jar)
            timeout=DEFAULT_TIMEOUT,
            follow_redirects=False,
            trust_env=False,
        )
    return state.client


async def close_global_client() -> None:
    """Close the running loop's shared transport/client (a later request creates a fresh one)."""
    global _last_state
    loop = asyncio.get_running_loop()
    with _states_lock:
        state = _states.pop(id(loop), None)
        if _last_state is state:
            _last_state = None
    if state is None or state.loop is not loop:
        return
    closer = state.closer
    state.closer = None
    if closer is not None:
        await closer.aclose()  # runs the generator's finally -> state.aclose()
    await state.aclose()


def _close_all_at_exit() -> None:
    with _states_lock:
        states = list(_states.values())
        _states.clear()
    for state in states:
        loop = state.loop
        if state.closed or loop.is_closed() or loop.is_running():
            continue
        try:
            loop.run_until_complete(state.aclose())
        except Exception:  # pragma: no cover
            pass


atexit.register(_close_all_at_exit)


# --------------------------------------------------------------------------------------------------------
# ServerClient


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


# A replica that refused or dropped a connection is not chosen for this long (unless all are out).
REPLICA_DOWN_S = 2.0
# Ray actor replicas: re-read their addresses from the head server at most this often while one is out.
REPLICA_REFRESH_S = 0.5
# Errors after which a replica counts as gone (its process died or is restarting).
_REPLICA_GONE_ERRORS: tuple[type[BaseException], ...] = (
    httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError,
    aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
)


class Replicas:
    """The replicas of one server (a block with several `replica_ports`, or Ray actors) as one `ServerClient`
    sees them: their base URLs (None: a Ray actor replica with no address now), this client's requests in flight
    to each, which are out for a moment, and how a call picks one (`choose`)."""

    __slots__ = ("bases", "in_flight", "suffix", "_next", "_urls", "_sticky", "down_until", "dynamic", "refreshed_at")

    def __init__(self, server_name: str, bases: list[Optional[str]], *, dynamic: bool = False) -> None:
        self.bases = bases
        self.in_flight = [0] * len(bases)
        self.suffix = "___" + str(server_name)  # the end of this server's session cookie name
        self._next = 0
        self._urls: list[dict[str, URL]] = [{} for _ in bases]
        self._sticky: dict[Any, Optional[int]] = {}  # cookie value -> replica in its payload (bounded)
        self.down_until = [0.0] * len(bases)
        self.dynamic = dynamic  # addresses come from the head server (Ray actors)
        self.refreshed_at = 0.0

    def __len__(self) -> int:
        return len(self.bases)

    def _out(self, i: int, now: float) -> bool:
        return self.bases[i] is None or self.down_until[i] > now

    def least_loaded(self) -> int:
        """The replica with the fewest requests in flight from this client; among equals, the first after the
        one chosen last, so ties go round-robin. Replicas that are out (no address, or failed a moment ago) are
        skipped while another is in."""
        in_flight = self.in_flight
        n = len(in_flight)
        best = start = self._next
        if self.dynamic or any(self.down_until):  # the slower path: some replica may be out
            now = _monotonic()
            best_key = (self._out(start, now), in_flight[start])
            for k in range(1, n):
                i = start + k if start + k < n else start + k - n
                key = (self._out(i, now), in_flight[i])
                if key < best_key:
                    best, best_key = i, key
            if self.bases[best] is None:  # no replica has an address: any with one, else this one
                best = next((i for i in range(n) if self.bases[i] is not None), best)
        else:
            best_load = in_flight[start]
            for k in range(1, n):
                i = start + k
                if i >= n:
                    i -= n
                if in_flight[i] < best_load:
                    best, best_load = i, in_flight[i]
        self._next = best + 1 if best + 1 < n else 0
        return best

    def mark_down(self, replica: int) -> None:
        self.down_until[replica] = _monotonic() + REPLICA_DOWN_S

    def stale(self) -> bool:
        """A Ray actor replica is out and its address was not re-read for a moment."""
        if not self.dynamic:
            return False
        now = _monotonic()
        return now - self.refreshed_at > REPLICA_REFRESH_S and any(self._out(i, now) for i in range(len(self.bases)))

    def update(self, bases: list[Optional[str]]) -> None:
        """New addresses (from the head server): a replica at a new address is in again."""
        self.refreshed_at = _monotonic()
        for i, base in enumerate(bases[: len(self.bases)]):
            if base != self.bases[i]:
                self.bases[i] = base
                self._urls[i] = {}
                self.down_until[i] = 0.0

    def pinned(self, cookies: CookiesLike) -> Optional[int]:
        """The replica named by this server's session cookie among `cookies`, or None (no such cookie, or one
        without a usable `_replica`)."""
        suffix = self.suffix
        if isinstance(cookies, httpx.Cookies):
            pairs: Any = ((c.name, c.value) for c in cookies.jar)
        elif hasattr(cookies, "items"):
            pairs = cookies.items()
        else:
            return None
        for name, value in pairs:
            if not isinstance(name, str) or not name.endswith(suffix):
                continue
            key = value if isinstance(value, (str, bytes)) else getattr(value, "value", None)
            replica = self._sticky.get(key, -1) if key is not None else -1
            if replica == -1:
                replica = replica_of_cookie(value)
                if key is not None:
                    if len(self._sticky) >= 4096:
                        self._sticky.clear()
                    self._sticky[key] = replica
            if replica is not None and replica < len(self.bases):
                return replica
        return None

    def choose(self, cookies: CookiesLike) -> int:
        """The replica a call goes to: the one its session cookie pins, else the least loaded."""
        if cookies:
            replica = self.pinned(cookies)
            if replica is not None:
                return replica
        return self.least_loaded()

    def url(self, replica: int, url_path: str) -> URL:
        urls = self._urls[replica]
        url = urls.get(url_path)
        if url is None:
            path = url_path if not url_path or url_path.startswith("/") else "/" + url_path
            base = self.bases[replica]
            if base is None:  # a Ray actor replica without an address (restarting): a refused connection
                base = "http://127.0.0.1:1"
            url = URL(base + path)
            if len(urls) >= 4096:
                urls.clear()
            urls[url_path] = url
        return url


def _head_base_url(head: Any) -> str:
    """`http://host:port` of the head server described by `head` (`host`/`port` as attributes or keys; default
    127.0.0.1:11000). A wildcard bind address is reached on loopback."""
    host = _get_field(head, "host") or "127.0.0.1"
    port = _get_field(head, "port") or 11000
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    host = f"[{host}]" if ":" in str(host) and not str(host).startswith("[") else host
    return f"http://{host}:{int(port)}"


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
        self._timeout_dict = _coerce_timeout(timeout)
        self.timeout = httpx.Timeout(**self._timeout_dict)
        self._base_urls: dict[str, str] = {}
        self._urls: dict[tuple[str, str], URL] = {}  # parsed URLs per (server, path): parsing is costly
        # Servers with several replicas only (empty for most stacks, so the check per request is one test).
        self._replicas: dict[str, Replicas] = {}
        self._client_timeout = _client_timeout(self._timeout_dict)
        # A transport of your own (tests: httpx.MockTransport; benchmarks); None = the shared one per loop.
        self._transport = transport
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
        self._base_urls.clear()
        self._urls.clear()
        self._replicas.clear()
        self._server_types.clear()
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
        try:
            response = httpx.get(
                self._head_url() + "/server_instances", timeout=httpx.Timeout(5.0, connect=2.0), trust_env=False
            )
            instances = response.json() if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError):
            return bases
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
            url = self._build_url(server_name, url_path)
        replicas = self._replicas.get(server_name) if self._replicas else None
        replica = -1
        if replicas is not None:  # several processes serve it: the session's one, else the least loaded
            if replicas.dynamic and replicas.stale():
                await self._refresh_actor_replicas(server_name, replicas)
            replica = replicas.choose(cookies)
            url = replicas.url(replica, url_path)

        header_map: dict[str, str] = {}
        body: Optional[bytes] = None
        if json is not None:
            body = encode_json_body(json)
            header_map.update(_JSON_HEADERS)
        elif content is not None or data is not None:
            raw = content if content is not None else data
            body = raw.encode() if isinstance(raw, str) else raw
        if headers:
            header_map.update(headers)
        if cookies:
            cookie_header = encode_cookie_header(cookies)
            if cookie_header:
                header_map["Cookie"] = cookie_header

        timeout_override = None if timeout is _NO_TIMEOUT_OVERRIDE else _coerce_timeout(timeout)
        session: Optional[aiohttp.ClientSession] = None
        lean: Optional[LeanClient] = None
        if self._transport is not None:
            transport, debug = self._transport, False
        else:
            state = _get_state(self._global_config_dict)
            transport, session, lean, debug = state.transport, state.session, state.lean, state.debug
        if idempotent is None:
            idempotent = is_idempotent_method(method)

        if lean is not None and params is None and url.scheme == "http" and method != "HEAD":  # the default
            lean_timeout = self._timeout_dict if timeout_override is None else timeout_override
            host, port, target = url.host, url.port, url.raw_path_qs

            async def send() -> ServerResponse:
                answer = await lean.request(method, host, port, target, header_map, body, lean_timeout)
                return ServerResponse(answer.status, answer.reason, answer.headers, answer.body, url, method, server_name)

        elif session is not None:  # aiohttp directly
            client_timeout = self._client_timeout if timeout_override is None else _client_timeout(timeout_override)

            async def send() -> ServerResponse:
                resp = await session.request(
                    method, url, data=body, headers=header_map, params=params, timeout=client_timeout,
                    allow_redirects=False,
                )
                try:
                    content = await resp.read()
                finally:
                    resp.release()
                return ServerResponse(resp.status, resp.reason, resp.headers, content, resp.url, method, server_name)

        else:  # an httpx transport (`http_client_transport: httpx`, or one passed in)

            async def send() -> ServerResponse:
                request = httpx.Request(
                    method, str(url), params=params, headers=header_map, content=body,
                    extensions={"timeout": timeout_override or self._timeout_dict},
                )
                response = await transport.handle_async_request(request)
                try:
                    await response.aread()
                finally:
                    await response.aclose()
                wrapped = ServerResponse.from_httpx(response, URL(str(request.url)), method)
                wrapped.server_name = server_name
                return wrapped

        if replica >= 0:
            replicas.in_flight[replica] += 1
            send_once = send

            async def send() -> ServerResponse:  # noqa: F811 - failover around the chosen transport's send
                """A replica that refused or dropped the connection is out for a moment, and a retry goes to the
                replica chosen again (the same one when the session cookie pins it, at its new address)."""
                nonlocal replica, url, host, port, target
                try:
                    return await send_once()
                except _REPLICA_GONE_ERRORS:
                    replicas.mark_down(replica)
                    if replicas.dynamic:
                        await self._refresh_actor_replicas(server_name, replicas)
                    replicas.in_flight[replica] -= 1
                    replica = replicas.choose(cookies)
                    replicas.in_flight[replica] += 1
                    url = replicas.url(replica, url_path)
                    host, port, target = url.host, url.port, url.raw_path_qs
                    raise

        try:
            outcome = await self.retry_policy.run(
                send,
                idempotent=idempotent,
                label=lambda: f"{method} {url} (server `{server_name}`"
                + (f", replica {replica})" if replica >= 0 else ")"),
                max_attempts=max_attempts,
            )
        finally:
            if replica >= 0:
                replicas.in_flight[replica] -= 1
        attempt = outcome.attempts
        if outcome.error is not None:
            error = outcome.error
            if not isinstance(error, httpx.TransportError):
                error = _remap_aiohttp_error(error, None) or error
            if isinstance(error, httpx.TransportError):
                raise self._final_error(error, server_name, method, url, attempt, debug) from outcome.error
            raise error
        response = outcome.result
        response.attempts = attempt
        if debug and response.status >= 400:
            logger.warning(
                "%s %s (server `%s`) -> HTTP %s after %d attempt(s); request body: %r; response body: %r",
                method, url, server_name, response.status, attempt, body, response.content,
            )
        return response

    @staticmethod
    def _final_error(
        exc: httpx.TransportError, server_name: str, method: str, url: Any, attempts: int, debug: bool
    ) -> httpx.TransportError:
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


# --------------------------------------------------------------------------------------------------------
# Process-level helpers (NeMo Gym v0.5 `server_utils`; `nemo_gym.http.external` builds on the first two)


def get_global_aiohttp_session(global_config_dict: Any = None) -> Optional[aiohttp.ClientSession]:
    """The running event loop's shared aiohttp session (created on first use, sized from `global_config_dict`),
    or None under the `httpx` transport, which has none. Call from async code."""
    return _get_state(global_config_dict).session


def close_idle_global_clients() -> None:
    """Close the shared transports of event loops that are not running now (those of running loops are left to
    `close_global_client()` on their loop)."""
    with _states_lock:
        idle = [s for s in _states.values() if not s.loop.is_running()]
        for state in idle:
            _states.pop(id(state.loop), None)
    for state in idle:
        if state.closed or state.loop.is_closed():
            continue
        try:
            state.loop.run_until_complete(state.aclose())
        except Exception:  # pragma: no cover - best effort
            logger.debug("closing an idle shared transport failed", exc_info=True)


def get_server_url(server_name: str) -> str:
    """`http://host:port` of server id `server_name` in this process's global config (an unknown id is a
    `ValueError` listing the known ones)."""
    return ServerClient(head_server_config=None, global_config_dict=None).base_url(server_name)
