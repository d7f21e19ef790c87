"""The shared HTTP transport: one per event loop per process, chosen by `http_client_transport` (`lean`, the
default: plain-http calls of `ServerClient` through `LeanClient`, the rest through aiohttp; `aiohttp`; `httpx`)
and sized by `global_aiohttp_connector_limit` / `global_aiohttp_connector_limit_per_host`. Every transport reads
a response body only up to `http_client_max_response_body_bytes` (`nemo_gym.http.response`).

`get_global_transport` / `get_global_client` / `close_global_client` and the per-loop state live here;
see `nemo_gym.http.client`'s module docstring for why aiohttp and how the state is closed.
"""

from __future__ import annotations

import asyncio
import atexit
import http.cookiejar
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Optional

import aiohttp
import httpx

from nemo_gym.config.values import config_get
from nemo_gym.http.lean_client import LeanClient
from nemo_gym.http.response import (
    DEFAULT_MAX_RESPONSE_BODY_BYTES,
    ResponseTooLargeError,
    _declared_length,
    max_response_body_bytes,
    read_aiohttp_body,
)

logger = logging.getLogger(__name__)

__all__ = [
    "AiohttpTransport",
    "DEFAULT_TIMEOUT",
    "DEFAULT_CONNECTOR_LIMIT",
    "DEFAULT_CONNECTOR_LIMIT_PER_HOST",
    "DEFAULT_TRANSPORT",
    "TRANSPORTS",
    "aiohttp_exchange",
    "build_transport",
    "get_global_transport",
    "get_global_client",
    "close_global_client",
    "get_global_aiohttp_session",
    "existing_global_aiohttp_session",
    "close_idle_global_clients",
]

DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=None, pool=None)

DEFAULT_CONNECTOR_LIMIT = 102400
DEFAULT_CONNECTOR_LIMIT_PER_HOST = 1024
TRANSPORT_ENV_VAR = "NEMO_GYM_HTTP_CLIENT_TRANSPORT"
TRANSPORT_CONFIG_KEY = "http_client_transport"
TRANSPORTS = ("lean", "aiohttp", "httpx")
# `lean`: ServerClient's plain-http calls go through `LeanClient`; the rest, and httpx users, through aiohttp.
DEFAULT_TRANSPORT = "lean"


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
    session: aiohttp.ClientSession,
    method: str,
    url: Any,
    *,
    request: Any = None,
    max_body: Optional[int] = None,
    **kwargs: Any,
) -> tuple[aiohttp.ClientResponse, bytes]:
    """One request through `session` (no redirects), read whole but no further than `max_body` bytes
    (`ResponseTooLargeError`; None: the cap of the shared state whose session this is, else the default); an
    aiohttp error is raised as the httpx error that says the same (`request`, an `httpx.Request`, is attached to it
    when given)."""
    if max_body is None:
        state = _last_state
        max_body = state.max_body if state is not None and state.session is session else DEFAULT_MAX_RESPONSE_BODY_BYTES
    try:
        resp = await session.request(method, url, allow_redirects=False, **kwargs)
        try:
            body = await read_aiohttp_body(resp, max_body, method)
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
    clients (`NeMoGymAsyncOpenAI`, the vLLM model server) share the process's connector. Bodies are read whole, up
    to `max_body` bytes; aiohttp errors are raised as the httpx exception saying the same thing (the aiohttp error
    as `__cause__`)."""

    def __init__(self, session: aiohttp.ClientSession, max_body: int = DEFAULT_MAX_RESPONSE_BODY_BYTES) -> None:
        self.session = session
        self.max_body = max_body

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
            max_body=self.max_body,
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


class _CappedStream(httpx.AsyncByteStream):
    """A response stream of the `httpx` transport that stops past `limit` bytes (`ResponseTooLargeError`)."""

    def __init__(self, stream: Any, limit: int, url: Any, method: str) -> None:
        self._stream, self._limit, self._url, self._method = stream, limit, url, method

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._limit:
                raise ResponseTooLargeError(size=size, limit=self._limit, url=self._url, method=self._method)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class CappedHTTPTransport(httpx.AsyncHTTPTransport):
    """httpx's (httpcore's) transport whose responses are read no further than `max_body` bytes: a declared
    `Content-Length` over it fails at once, any other body as its bytes arrive (streamed or read whole)."""

    def __init__(self, *args: Any, max_body: int = DEFAULT_MAX_RESPONSE_BODY_BYTES, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_body = max_body

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        limit = self.max_body
        length = _declared_length(response.headers.get("content-length"), request.method, response.status_code)
        if length is not None and length > limit:
            await response.aclose()
            raise ResponseTooLargeError(size=length, limit=limit, declared=True, url=request.url, method=request.method)
        return httpx.Response(
            response.status_code, headers=response.headers, extensions=response.extensions,
            stream=_CappedStream(response.stream, limit, request.url, request.method),
        )


def _make_httpx_transport(
    limit: int, limit_per_host: int, max_body: int = DEFAULT_MAX_RESPONSE_BODY_BYTES
) -> httpx.AsyncBaseTransport:
    # httpcore has one pool for all hosts: size it so requests never wait in its (quadratic) queue.
    return CappedHTTPTransport(
        limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit_per_host),
        trust_env=False,
        max_body=max_body,
    )


def build_transport(
    name: str = DEFAULT_TRANSPORT,
    limit: int = DEFAULT_CONNECTOR_LIMIT,
    limit_per_host: int = DEFAULT_CONNECTOR_LIMIT_PER_HOST,
    max_body: int = DEFAULT_MAX_RESPONSE_BODY_BYTES,
) -> httpx.AsyncBaseTransport:
    """A new httpx transport of the kind the shared client uses (`aiohttp`: an `AiohttpTransport` over a new
    session; `httpx`: an httpcore pool), reading response bodies up to `max_body` bytes. Call inside a running
    loop."""
    if name in ("aiohttp", "lean"):
        return AiohttpTransport(_new_session(limit, limit_per_host), max_body)
    if name == "httpx":
        return _make_httpx_transport(limit, limit_per_host, max_body)
    raise ValueError(f"Unknown transport {name!r}; expected one of {TRANSPORTS}.")


def close_session_of_closed_loop(session: aiohttp.ClientSession) -> None:
    """Close an aiohttp session whose event loop is already closed. Its `close()` does no I/O then (a connector
    whose loop is closed only marks itself closed), so the coroutine runs to its end here without a loop; should a
    later aiohttp wait in it after all, it is dropped and the session detached (marked closed) instead. The
    sockets of a closed loop are closed when they are collected."""
    closing = session.close()
    try:
        closing.send(None)
    except StopIteration:
        return
    except Exception:  # pragma: no cover - best effort for a loop that is gone
        logger.debug("closing the aiohttp session of a closed loop failed", exc_info=True)
    closing.close()
    session.detach()


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
    # The cap on a response body (`http_client_max_response_body_bytes`).
    max_body: int = DEFAULT_MAX_RESPONSE_BODY_BYTES
    client: Optional[httpx.AsyncClient] = None
    closer: Any = None
    closed: bool = False

    def forget(self) -> None:
        """Let go of the state of a loop that was closed without shutting down its async generators
        (pytest-asyncio 0.24, a hand-made loop), so that aiohttp does not log "Unclosed client session" or
        "Unclosed connector" when it is collected."""
        self.closed = True
        if self.session is not None:
            close_session_of_closed_loop(self.session)

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


def _forget_gone_loops() -> None:
    """Drop the states of closed loops (let go of quietly, `_LoopState.forget`) and closed states. Call with
    `_states_lock` held."""
    for key, other in list(_states.items()):
        if other.loop.is_closed():
            del _states[key]
            other.forget()
        elif other.closed:
            del _states[key]


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
            if cfg is None:  # a caller without the config (the model client): this process's, if it has one
                from nemo_gym.config.global_config import loaded_global_config_dict

                cfg = loaded_global_config_dict()
            _forget_gone_loops()
            name = _transport_name(cfg)
            limit = int(config_get(cfg, "global_aiohttp_connector_limit", DEFAULT_CONNECTOR_LIMIT))
            per_host = int(
                config_get(cfg, "global_aiohttp_connector_limit_per_host", DEFAULT_CONNECTOR_LIMIT_PER_HOST)
            )
            max_body = max_response_body_bytes(cfg)
            transport = build_transport(name, limit, per_host, max_body)
            state = _LoopState(
                loop=loop,
                transport=transport,
                transport_name=name,
                session=transport.session if isinstance(transport, AiohttpTransport) else None,
                lean=LeanClient(per_host, max_body=max_body) if name == "lean" else None,
                debug=bool(config_get(cfg, "global_aiohttp_client_request_debug", False)),
                max_body=max_body,
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
        _forget_gone_loops()
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


def get_global_aiohttp_session(global_config_dict: Any = None) -> Optional[aiohttp.ClientSession]:
    """The running event loop's shared aiohttp session (created on first use, sized from `global_config_dict`),
    or None under the `httpx` transport, which has none. Call from async code."""
    return _get_state(global_config_dict).session


def existing_global_aiohttp_session() -> Optional[aiohttp.ClientSession]:
    """The running event loop's shared aiohttp session if one was made already, else None; never makes one (so
    code can ask whether the global client is set up without setting it up)."""
    loop = asyncio.get_running_loop()
    with _states_lock:
        state = _states.get(id(loop))
    if state is None or state.loop is not loop or state.closed:
        return None
    return state.session


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
