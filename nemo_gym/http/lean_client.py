"""A lean HTTP/1.1 client for the calls between a stack's own servers.

Why: a rollout is a handful of small JSON POSTs from the agent to the other servers, and aiohttp's general
client spends about three times the CPU of a bare asyncio exchange on each (request and response objects, header
multidicts, URL handling, timers, tracing hooks; measured about 165 us against 50 us per call on the project
machine). `ServerClient` sends plain `http://` calls through `LeanClient` by default (`http_client_transport:
lean`); `aiohttp` and `httpx` remain selectable and serve everything else (query parameters, `https`, `HEAD`).

What it does: keep-alive connections per `host:port` (the most recently used idle one first; one that has sat idle
longer than `max_idle_s`, or that the peer closed, is dropped), at most `limit_per_host` open per peer (callers
wait for a free one), one `write` per request (head and body together), responses parsed by httptools (the parser
uvicorn uses; chunked bodies included), a connect timeout and an optional read timeout. Failures raise httpx's
transport errors, the family `ServerClient` and the retry policy already speak: `ConnectError` /
`ConnectTimeout` (nothing was sent), `RemoteProtocolError` (the peer closed or sent garbage), `ReadError`,
`ReadTimeout`. A request whose caller is cancelled closes its connection (its answer would otherwise arrive on
the next request).

A response body is read no further than `max_body` bytes (`http_client_max_response_body_bytes`, default 256 MiB):
a `Content-Length` over it fails as soon as the header arrives, any other body as its bytes arrive; the
connection is closed and `ResponseTooLargeError` raised (not retried).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Mapping, Optional

import httptools
import httpx
from multidict import CIMultiDict, CIMultiDictProxy

from nemo_gym.http.response import DEFAULT_MAX_RESPONSE_BODY_BYTES, ResponseTooLargeError

__all__ = ["LeanClient", "LeanResponse"]

DEFAULT_MAX_IDLE_S = 4.0  # under uvicorn's default keep-alive (5 s), so a reused connection is still open


class LeanResponse:
    """A fully read answer: status, reason, headers (case-insensitive multidict), body."""

    __slots__ = ("status", "reason", "headers", "body")

    def __init__(self, status: int, reason: str, headers: CIMultiDictProxy, body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body


class _Connection(asyncio.Protocol):
    """One keep-alive connection: sends one request at a time, parses the answer with httptools."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_body: int = DEFAULT_MAX_RESPONSE_BODY_BYTES) -> None:
        self.loop = loop
        self.max_body = max_body
        self.transport: Optional[asyncio.Transport] = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: Optional[asyncio.Future] = None
        self.closed = False
        self.idle_since = 0.0
        self._reason = b""
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self._size = 0  # body bytes of this answer so far
        self._got_bytes = False

    # -- asyncio.Protocol ----------------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if exc is not None:
                error: Exception = httpx.ReadError(f"connection lost: {exc}")
            elif self._got_bytes:
                error = httpx.RemoteProtocolError("Server disconnected in the middle of the response.")
            else:
                error = httpx.RemoteProtocolError("Server disconnected without sending a response.")
            self.waiter.set_exception(error)

    # -- httptools callbacks -------------------------------------------------------------------------------

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        # A declared body over the cap fails before any of it is read (len first: most names are not 14 long).
        if len(name) == 14 and name.lower() == b"content-length" and value.isdigit() and int(value) > self.max_body:
            self._too_large(int(value), True)
        self._headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        size = self._size = self._size + len(body)
        if size > self.max_body:
            self._too_large(size, False)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        response = LeanResponse(
            self.parser.get_status_code(),
            self._reason.decode("latin-1"),
            CIMultiDictProxy(CIMultiDict(self._headers)),
            body,
        )
        # An idle connection keeps nothing of the answer it carried (its pieces, its future's result): kept, every
        # pooled connection held its last answer, 20 MB each for a model server relaying large answers (issue 37).
        self._body, self._headers, self.waiter = [], [], None
        if not self.parser.should_keep_alive():
            self.close()
        waiter.set_result(response)

    # -- use ----------------------------------------------------------------------------------------------

    def _fail(self, error: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    def _too_large(self, size: int, declared: bool) -> None:
        """The answer's body is over the cap: fail the exchange and close the connection (nothing more is read;
        the rest of the answer must not reach the next request)."""
        if self.closed:
            return
        self._body = []
        self._fail(ResponseTooLargeError(size=size, limit=self.max_body, declared=declared))
        self.close()

    async def exchange(self, data: bytes, read_timeout: Optional[float]) -> LeanResponse:
        self._reason, self._headers, self._body, self._size, self._got_bytes = b"", [], [], 0, False
        waiter = self.waiter = self.loop.create_future()
        self.transport.write(data)  # type: ignore[union-attr]
        if read_timeout is None:
            return await waiter
        timer = self.loop.call_later(
            read_timeout, self._fail, httpx.ReadTimeout(f"no complete answer within {read_timeout} s")
        )
        try:
            return await waiter
        finally:
            timer.cancel()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Peer:
    """The connections to one `host:port`."""

    __slots__ = ("host", "port", "idle", "slots")

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host = host
        self.port = port
        self.idle: collections.deque[_Connection] = collections.deque()
        self.slots = asyncio.Semaphore(limit) if limit > 0 else None


class LeanClient:
    """Keep-alive HTTP/1.1 over asyncio for plain-`http` calls between our servers (see the module docstring).
    Bound to the event loop that created it."""

    def __init__(
        self,
        limit_per_host: int = 1024,
        max_idle_s: float = DEFAULT_MAX_IDLE_S,
        max_body: int = DEFAULT_MAX_RESPONSE_BODY_BYTES,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.limit_per_host = limit_per_host
        self.max_idle_s = max_idle_s
        self.max_body = max_body  # the cap on one response body (`ResponseTooLargeError` past it)
        self._peers: dict[tuple[str, int], _Peer] = {}
        self._open: set[_Connection] = set()
        self.closed = False

    async def request(
        self,
        method: str,
        host: str,
        port: int,
        target: str,
        headers: Mapping[str, str],
        body: Optional[bytes],
        timeout: Mapping[str, Any],
    ) -> LeanResponse:
        """Send one request (`target`: path and query) and return the whole answer."""
        if self.closed:
            raise RuntimeError("LeanClient is closed")
        peer = self._peers.get((host, port))
        if peer is None:
            peer = self._peers[(host, port)] = _Peer(host, port, self.limit_per_host)
        head = [f"{method} {target} HTTP/1.1\r\nHost: {host}:{port}\r\n"]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(body) if body else 0}\r\n")
        head.append("\r\n")
        data = "".join(head).encode("latin-1")
        if body:
            data += body

        slots = peer.slots
        if slots is not None:
            if slots.locked() and timeout.get("pool") is not None:
                try:
                    await asyncio.wait_for(slots.acquire(), timeout["pool"])
                except asyncio.TimeoutError:
                    raise httpx.PoolTimeout(f"no free connection to {host}:{port} within {timeout['pool']} s") from None
            else:
                await slots.acquire()
        try:
            connection = self._idle_connection(peer) or await self._connect(peer, timeout.get("connect"))
            try:
                response = await connection.exchange(data, timeout.get("read"))
            except BaseException as exc:
                connection.close()  # an unfinished exchange: its answer must not reach the next request
                self._open.discard(connection)
                if isinstance(exc, ResponseTooLargeError) and exc.url is None:  # name the request
                    raise exc.named(method=method, url=f"http://{host}:{port}{target}", server_name=None, attempts=1)
                raise
            if connection.closed:
                self._open.discard(connection)
            else:
                connection.idle_since = self.loop.time()
                peer.idle.append(connection)
            return response
        finally:
            if slots is not None:
                slots.release()

    def _idle_connection(self, peer: _Peer) -> Optional[_Connection]:
        idle = peer.idle
        oldest_ok = self.loop.time() - self.max_idle_s
        while idle:
            connection = idle.pop()  # the most recently used
            if not connection.closed and connection.idle_since >= oldest_ok and not connection.transport.is_closing():
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    async def _connect(self, peer: _Peer, connect_timeout: Optional[float]) -> _Connection:
        loop = self.loop
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop, self.max_body), peer.host, peer.port), connect_timeout
            )
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {peer.host}:{peer.port} took over {connect_timeout} s") from None
        except OSError as exc:
            raise httpx.ConnectError(f"Cannot connect to host {peer.host}:{peer.port} [{exc.strerror or exc}]") from exc
        self._open.add(connection)
        return connection

    async def aclose(self) -> None:
        self.closed = True
        for connection in list(self._open):
            connection.close()
        self._open.clear()
        self._peers.clear()
