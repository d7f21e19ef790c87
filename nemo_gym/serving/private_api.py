"""The one module that uses names uvicorn, FastAPI and starlette do not promise to keep.

Everything else in nemo_gym uses those libraries' public API only. What is here, and why:

- **uvicorn's httptools protocol, made cheaper** (`CoalescingHttpToolsProtocol`, `NeMoGymHttpProtocol`): a
  subclass of `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol` that overrides its callbacks and reads
  its attributes (`cycle`, `parser`, `scope`, `headers`, `flow`, `pipeline`, `tasks`, `server_state`, ...), and
  builds uvicorn's `RequestResponseCycle` for requests it hands back. It also holds every request to the server's
  limits (`serving/limits.py`): a body over its size is refused before it is buffered (413), a head over its size
  (431) or not complete in time (408) too. See "The protocol" below.
- **uvicorn's multi-process supervisor** (`Multiprocess`, `STARTUP_FAILURE`) and the count of requests in flight
  (`Server.server_state.tasks`).
- **FastAPI's reading of a route** (`APIRoute.dependant`, `DefaultPlaceholder`,
  `fastapi.dependencies.utils.get_typed_signature`): `route_shape` turns it into a plain `RouteShape`, which is all
  hot routes and the MCP exposure read.
- **starlette's cached request body** (`Request._body`): `request_with_body` builds a `Request` whose `body()` is
  given bytes, so a handler can be called with a body we already read or rewrote.

`check_compatibility()` says which of these the installed versions lack; `tests/unit/test_private_api.py` runs it
(and exercises each piece), so an incompatible uvicorn, FastAPI or starlette release fails the tests loudly. At
run time a server whose libraries fail the check serves through plain uvicorn and FastAPI (slower, same answers)
and says so once.

The protocol
------------
uvicorn's httptools protocol, made cheaper for the many small JSON requests between a stack's servers.

Three things, each measured on the rollout hot path (`perf/floor_vs_stack.py`):

- **One write per response.** uvicorn writes a response's status line and headers as soon as the app sends
  `http.response.start`, and the body in a second `write`. With `TCP_NODELAY` each write is its own send syscall
  and its own wake-up of the peer. Here the connection's transport gathers the writes made in one turn of the
  event loop and sends them together at the end of that turn (or at once past 64 KiB, so a large streamed body does
  not pile up); `close`, `write_eof` and `abort` send (or drop) what is pending first.
- **A direct path for hot routes** (`NeMoGymHttpProtocol`). A `POST` to one of `HotRoutes`' routes is not turned
  into an ASGI cycle (scope events, `receive`/`send` messages, three middleware layers, uvicorn's response state
  machine): its body is collected as it arrives and `HotRoutes.answer` writes the whole response at once. It gives
  the same answers, cookies, access lines and error bodies (`tests/unit/test_hot_routes.py` compares them with
  plain FastAPI); anything unusual is served by uvicorn's own cycle.
- **One keep-alive timer per idle period.** uvicorn arms a timer after every response and cancels it when the
  next request arrives; here the timer stays armed and re-arms itself until the connection has really been idle
  for `timeout_keep_alive`. The same timer is armed when a connection opens (uvicorn arms none until a first
  answer, so a connection that never sends a whole request stayed open for ever) and ends a request whose head
  is not complete within the head timeout, or whose body stopped arriving for the body timeout.

uvicorn's parsing, flow control, pipelining and shutdown stay its own.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.utils import get_typed_signature
from fastapi.routing import APIRoute
from starlette.requests import Request
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.supervisors import Multiprocess

try:
    from uvicorn.config import STARTUP_FAILURE
except ImportError:  # uvicorn < 0.32 keeps it in uvicorn.main
    from uvicorn.main import STARTUP_FAILURE

from nemo_gym.serving.limits import (
    RESPONSE_SEND_TIMEOUT_KEY_NAME,
    RequestLimits,
    body_too_slow_body,
    head_too_large_body,
    head_too_slow_body,
    too_large_body,
)
from nemo_gym.serving.memory import LARGE_BYTES, large_traffic

__all__ = [
    "CoalescingHttpToolsProtocol",
    "NeMoGymHttpProtocol",
    "protocol_with_limits",
    "Multiprocess",
    "STARTUP_FAILURE",
    "requests_in_flight",
    "Param",
    "RouteShape",
    "route_shape",
    "typed_signature",
    "request_with_body",
    "check_compatibility",
]

FLUSH_AT_BYTES = 64 * 1024
# The limits of this process (`protocol_with_limits`), or of the parent that started it as a uvicorn worker.
_LIMITS = RequestLimits.from_env()


class _CoalescingTransport:
    """Wraps a transport: `write`s of one loop turn leave as one; everything else is the wrapped transport's."""

    __slots__ = ("_transport", "_loop", "_tasks", "_pending", "_size", "_scheduled")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, tasks: Any = ()) -> None:
        self._transport = transport
        self._loop = loop
        self._tasks = tasks  # the server's requests in flight (`serving/memory.py`)
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: Any) -> None:
        if not data:
            return
        self._pending.append(data)
        self._size += len(data)
        if self._size >= FLUSH_AT_BYTES:
            self._flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def write_now(self, data: bytes) -> None:
        """Send what is pending and `data` at once (a whole response: nothing to wait for)."""
        self._pending.append(data)
        self._flush()

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        self._pending = []
        self._size = 0
        if len(data) >= LARGE_BYTES:  # a large answer: its memory goes back once the server is idle
            large_traffic(self._loop, self._tasks)
        if not self._transport.is_closing():
            self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._size

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = []
        self._size = 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` over a `_CoalescingTransport` (pass the class as uvicorn's `http`)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop, self.tasks))  # type: ignore[arg-type]


class NeMoGymHttpProtocol(CoalescingHttpToolsProtocol):
    """uvicorn's httptools protocol, plus a direct path for hot routes (see `HotRoutes.answer`).

    A `POST` to a hot route (exact path, no query, no `Expect: 100-continue`, not pipelined behind an unfinished
    request) is not turned into an ASGI cycle: its body is collected as it arrives, then one task calls
    `HotRoutes.answer`, which writes the whole response at once (and the access line uvicorn would write, when its
    access logger has handlers). Everything else is uvicorn's, untouched. The direct path is off when uvicorn limits
    concurrency or serves under a root path.

    Every request, direct or not, is held to the server's limits (`protocol_with_limits`):
    - a `Content-Length` over `max_body` is answered 413 once the body has gone by, none of it kept (so a client
      still sending reads the answer, not a reset connection); a chunked body that grows past it is answered 413 and
      the connection closed;
    - a head (request line and headers) over `max_head` bytes is answered 431 and the connection closed: a whole
      head at once, one still arriving as soon as the reads after the one it began in pass the limit (so at most
      one socket read more is looked at, and httptools' joining of a header's pieces stays bounded);
    - a head not complete `head_timeout` seconds after it began is answered 408 and the connection closed;
    - a body from which nothing more arrived for `body_timeout` seconds (counted from its last bytes) is answered
      408 and the connection closed, unless we paused reading it (flow control: the app is slow, not the client);
    - more than `max_pipelined` requests waiting behind one not yet answered, or more than `max_body` bytes of their
      bodies together, close the connection;
    - a client that reads nothing of an answer for `send_timeout` seconds once the socket is full (writing paused)
      has its connection dropped, and the app sees a disconnect (a stream stops; its upstream call is closed).

    A client that goes away before its answer is complete (it timed out, was cancelled, crashed) cancels the task
    answering it (`_abandon`), quietly: the handler's own calls to other servers are cancelled with it and close
    their connections, so an abandoned rollout ends on every hop instead of running on unseen (issue 37)."""

    max_body: ClassVar[Optional[int]] = _LIMITS.max_body
    max_head: ClassVar[Optional[int]] = _LIMITS.max_head
    head_timeout: ClassVar[Optional[float]] = _LIMITS.head_timeout_s
    body_timeout: ClassVar[Optional[float]] = _LIMITS.body_timeout_s
    send_timeout: ClassVar[Optional[float]] = _LIMITS.send_timeout_s
    # At most this many requests, with at most `max_body` bytes of bodies together, wait on one connection behind
    # the one being answered (HTTP/1.1 pipelining). uvicorn queues every pipelined request it parses and reads on after
    # each answer (and whenever an app reads its body), so a client that sent requests without reading the answers
    # grew a server by about 145 MB per connection (8 connections: 1.2 GB, kept after they closed). Past either
    # limit the connection is closed (they cannot be answered out of order); the few clients that pipeline at all
    # keep a handful of small requests in flight.
    max_pipelined: ClassVar[int] = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from nemo_gym.serving.hot_routes import HotRoutes

        app = self.app
        direct = (
            isinstance(app, HotRoutes)
            and app.direct is not None
            and self.limit_concurrency is None
            and not self.root_path
        )
        self.hot_routes: Optional[HotRoutes] = app if direct else None
        self.idle_since: Optional[float] = None  # when the last response finished; None while a request is open
        self.keep_alive_timer: Optional[asyncio.TimerHandle] = None
        # The head being read: whether one is, since when, and the bytes of the reads after the one it began in
        # (`head_first`: that read's size, an upper bound of the head's part in it).
        self.head_open = False
        self.head_started = 0.0
        self.head_size = 0
        self.head_first = 0
        self._read_size = 0
        # When the last bytes arrived (the loop's clock): a body has stopped arriving `body_timeout` after that.
        self.read_at = 0.0
        periods = [t for t in (self.timeout_keep_alive, self.head_timeout, self.body_timeout) if t is not None]
        self._timer_period = min(periods)
        self.dropping = False  # closed for too many pipelined requests: the rest of the read is not looked at
        self.send_timer: Optional[asyncio.TimerHandle] = None  # armed while writing is paused (the client not reading)
        self.work: Optional[_AbandonableApp] = None  # the request uvicorn's cycle answers (`_abandon`)

    # -- keep-alive: one timer per idle period (the module docstring) -------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.idle_since = self.loop.time()  # a connection that never sends a request is closed like an idle one
        self.keep_alive_timer = self.loop.call_later(self._timer_period, self._keep_alive_due)

    def _unset_keepalive_if_required(self) -> None:
        self.idle_since = None

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._release()
        self.idle_since = self.loop.time()
        if self.keep_alive_timer is None:
            self.keep_alive_timer = self.loop.call_later(self._timer_period, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self.keep_alive_timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self.idle_since is None:  # busy: reading a head or a body (their deadlines), or answering (it re-arms)
            if self.head_open:
                if self.head_timeout is not None:
                    left = self.head_started + self.head_timeout - now
                    if left > 0:  # (looks again within a period: the body that follows may have a shorter limit)
                        self.keep_alive_timer = self.loop.call_later(min(left, self._timer_period), self._keep_alive_due)
                    else:
                        self._refuse_early(408, head_too_slow_body(self.head_timeout))
            elif self.body_timeout is not None and self._body_arriving():
                left = self.read_at + self.body_timeout - now
                if left > 0:
                    self.keep_alive_timer = self.loop.call_later(min(left, self._timer_period), self._keep_alive_due)
                elif type(self.cycle) is _RefusedCycle:  # refused for its size, the rest of it never came
                    self.cycle.answer()
                else:
                    self._refuse_early(408, body_too_slow_body(self.body_timeout))
            return
        left = self.idle_since + self.timeout_keep_alive - now
        if left > 0:
            self.keep_alive_timer = self.loop.call_later(min(left, self._timer_period), self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.keep_alive_timer is not None:
            self.keep_alive_timer.cancel()
            self.keep_alive_timer = None
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None
        super().connection_lost(exc)
        self._abandon()
        self.cycle = self.scope = self.work = None  # type: ignore[assignment]  # (`_release`)
        self.pipeline.clear()

    def _release(self) -> None:
        """Let go of the request just answered (its scope, body, and what the app put in the scope) once the
        connection is idle; `connection_lost` lets go of everything. Kept, a request lived as long as its idle
        keep-alive connection; and a closed connection is a reference cycle (protocol, parser, transport, cycle)
        that only the cyclic collector frees, which with `tune_gc_for_serving`'s threshold can take thousands of
        requests: 30 bodies of 30 MB on separate connections held 2.7 GB (issue 37). The task still answering a
        request keeps what it needs itself."""
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:
            self.cycle = self.work = None  # type: ignore[assignment]
            if self.scope is cycle.scope:  # (not the next request's head, already being read)
                self.scope = None  # type: ignore[assignment]

    # -- a client gone before its answer: the work for it ends too (the class docstring) ------------------------

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        work = self.work = _AbandonableApp(app, cycle)
        start = getattr(super(), "_start_asgi_task", None)
        if start is not None:
            start(cycle, work)
        else:  # older uvicorn (0.31) starts a first request's task inline, without this method: only pipelined
            # requests come through here, and their abandonment is all that is cancelled there
            task = self.loop.create_task(cycle.run_asgi(work))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

    def _abandon(self) -> None:
        """Cancel the request being answered on this lost connection, if its answer is not complete."""
        cycle = self.cycle
        if type(cycle) is _DirectCycle and not cycle.delegated:
            task = cycle.task
            if task is not None and not cycle.response_complete and not task.done():
                cycle.abandoned = True
                task.cancel()
            return
        if self.work is not None:
            self.work.abandon()

    # -- an answer the client stopped reading (the class docstring) ---------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timeout is not None and self.send_timer is None:
            self.send_timer = self.loop.call_later(self.send_timeout, self._send_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _send_stalled(self) -> None:
        """Writing has been paused for `send_timeout`: the client reads nothing. Drop the connection (closing would
        wait for the unread answer to drain first)."""
        self.send_timer = None
        scope = getattr(self, "scope", None) or {}
        self.logger.warning(
            'Dropped a connection from %s: it read nothing of the answer to "%s %s" for %g s (%s).',
            get_client_addr(scope) if "client" in scope else "?", scope.get("method", "-"), scope.get("path", "-"),
            self.send_timeout, RESPONSE_SEND_TIMEOUT_KEY_NAME,
        )
        self.transport.abort()

    # -- the head: its size and its time (the class docstring) --------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.read_at = self.loop.time()
        size = self._read_size = len(data)
        if self.head_open:  # this read continues a head
            self.head_size += size
        super().data_received(data)
        if self.head_open and self.max_head is not None and self.head_size > self.max_head:
            self._refuse_early(431, head_too_large_body(self.max_head))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.head_open = True
        self.head_started = self.loop.time()
        self.head_size = 0
        self.head_first = self._read_size

    def _head_size_over(self, limit: int) -> bool:
        """Whether the head just read, added up exactly, is over `limit` (asked only when the reads it came in could
        hold that much)."""
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > limit

    def _body_arriving(self) -> bool:
        """Whether the current request's body is still coming in, and we are reading it (not paused because the
        app has not taken what came)."""
        cycle = self.cycle
        return cycle is not None and cycle.more_body and not cycle.response_started and not self.flow.read_paused

    def _refuse_early(self, status: int, body: bytes) -> None:
        """Refuse the request being read (its head or its body): answer `status` with `body` and close (just close
        when a response of this connection has started or an earlier request is still being answered: answering
        now would answer out of order)."""
        head_open, self.head_open = self.head_open, False
        cycle = self.cycle
        if self.pipeline or (cycle is not None and not cycle.response_complete and (head_open or cycle.response_started)):
            self.transport.close()
            return
        if cycle is not None and not cycle.response_complete:  # a body that stopped arriving: the app must not wait
            cycle.disconnected = True
            cycle.message_event.set()
        refused = _RefusedCycle(self, self.scope, status, body)
        self.cycle = refused  # type: ignore[assignment]
        refused.answer()

    def on_headers_complete(self) -> None:
        if self.dropping:
            return
        self.head_open = False
        head_limit = self.max_head
        if head_limit is not None and self.head_first + self.head_size > head_limit and self._head_size_over(head_limit):
            self._refuse_early(431, head_too_large_body(head_limit))
            return
        limit = self.max_body
        cycle = self.cycle
        if limit is not None:
            for name, value in self.headers:
                if name == b"content-length":
                    if value.isdigit() and int(value) > limit:
                        if cycle is not None and not cycle.response_complete:  # pipelined behind an open answer
                            self.transport.close()  # answering now would answer out of order
                            return
                        refused = _RefusedCycle(self, self.scope, 413, too_large_body(f"{int(value)} bytes", limit),
                                                limit)
                        self.cycle = refused  # type: ignore[assignment]
                        return
                    break
        hot_routes = self.hot_routes
        parser = self.parser
        if (
            hot_routes is not None
            and (cycle is None or cycle.response_complete)
            and not self.expect_100_continue
            and parser.get_method() == b"POST"
            and not parser.should_upgrade()
        ):
            route = hot_routes.route_for(self.url)
            if route is not None:
                scope = self.scope
                scope["method"] = "POST"
                version = parser.get_http_version()
                if version != "1.1":
                    scope["http_version"] = version
                scope["path"] = route.route.path_format
                scope["raw_path"] = self.url
                scope["query_string"] = b""
                self.cycle = _DirectCycle(self, scope, route, version != "1.0" and parser.should_keep_alive())
                return
        if cycle is not None and not cycle.response_complete and self.pipeline and self._pipeline_full():
            return
        super().on_headers_complete()

    def _pipeline_full(self) -> bool:
        """Whether the requests waiting behind an unanswered one are already `max_pipelined`, or hold more than
        `max_body` bytes of bodies together; if so, drop them and close the connection (what was already written
        still goes out; the answer in progress does not)."""
        pipeline = self.pipeline
        if len(pipeline) >= self.max_pipelined:
            what = f"more than {self.max_pipelined} requests"
        elif self.max_body is not None and sum(len(waiting.body) for waiting, _ in pipeline) > self.max_body:
            what = f"requests with more than {self.max_body} bytes of bodies"
        else:
            return False
        self.dropping = True
        pipeline.clear()
        self.logger.warning(
            "Closed a connection from %s: %s were sent behind one not yet answered (HTTP pipelining) without "
            "reading the answers.", get_client_addr(self.scope), what
        )
        self.transport.close()
        return True

    def on_body(self, body: bytes) -> None:
        if self.dropping:
            return
        cycle = self.cycle
        kind = type(cycle)
        if kind is _DirectCycle:
            cycle.chunks.append(body)
            cycle.size += len(body)
            if self.max_body is not None and cycle.size > self.max_body:
                cycle.chunks.clear()
                self._refuse_now(cycle.size)
            return
        if kind is _RefusedCycle:
            cycle.discard(len(body))
            return
        super().on_body(body)
        if cycle is None:
            return
        size = len(cycle.body)
        if size >= LARGE_BYTES:  # (uvicorn's cycle: what its app has not read yet)
            large_traffic(self.loop, self.tasks)
        if self.max_body is not None and size > self.max_body:
            cycle.body = b""
            cycle.disconnected = True  # the app's receive() answers http.disconnect
            cycle.message_event.set()
            self._refuse_now(None)

    def _refuse_now(self, size: Optional[int]) -> None:
        """A body without `Content-Length` grew past `max_body`: answer 413 and close, in the middle of it (just
        close when earlier requests of this connection are still waiting for their answers)."""
        if self.pipeline:
            self.transport.close()
            return
        limit = self.max_body or 0
        size_text = f"{size} bytes" if size is not None else f"more than {limit} bytes"
        refused = _RefusedCycle(self, self.scope, 413, too_large_body(size_text, limit), limit)
        self.cycle = refused  # type: ignore[assignment]
        refused.answer()

    def on_message_complete(self) -> None:
        if self.dropping:
            return
        cycle = self.cycle
        if type(cycle) is _RefusedCycle:
            if not cycle.response_started:
                cycle.answer()
            return
        if type(cycle) is _DirectCycle:
            cycle.more_body = False
            if cycle.size >= LARGE_BYTES:  # a large body: its memory goes back once the server is idle
                large_traffic(self.loop, self.tasks)
            task = cycle.task = self.loop.create_task(cycle.run())
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
            return
        super().on_message_complete()


class _AbandonableApp:
    """The ASGI app of one request served by uvicorn's cycle (`cycle`), cancelled by `abandon` when the client
    went away before the answer was complete; that cancellation ends the request quietly (uvicorn would log it as
    an exception)."""

    __slots__ = ("app", "cycle", "task", "abandoned")

    def __init__(self, app: Any, cycle: Any) -> None:
        self.app = app
        self.cycle = cycle
        self.task: Optional[asyncio.Task] = None
        self.abandoned = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        task = self.task = asyncio.current_task()
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not self.abandoned:
                raise
            task.uncancel()  # type: ignore[union-attr]

    def abandon(self) -> None:
        task = self.task
        if task is not None and not task.done() and not self.cycle.response_complete:
            self.abandoned = True
            task.cancel()


class _Signal:
    """What uvicorn's protocol calls `message_event` on a cycle: set on disconnect; `wait` for that."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: Optional[asyncio.Future] = None

    def set(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.future is None:
            self.future = loop.create_future()
        await self.future


class _DirectCycle:
    """One request on the direct path: what uvicorn's protocol reads of its current cycle (`response_complete`,
    `disconnected`, `keep_alive`, `message_event`), the body as it arrives, and the responder `HotRoutes.answer`
    writes to."""

    __slots__ = (
        "protocol", "scope", "route", "chunks", "more_body", "keep_alive", "response_started", "response_complete",
        "disconnected", "delegated", "message_event", "body_sent", "size", "task", "abandoned",
    )

    def __init__(self, protocol: NeMoGymHttpProtocol, scope: dict, route: Any, keep_alive: bool) -> None:
        self.protocol = protocol
        self.scope = scope
        self.route = route
        self.chunks: list[bytes] = []
        self.more_body = True
        self.keep_alive = keep_alive
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.delegated = False
        self.body_sent = False
        self.size = 0
        self.message_event = _Signal()
        self.task: Optional[asyncio.Task] = None  # the task answering it (`NeMoGymHttpProtocol._abandon`)
        self.abandoned = False

    def body(self) -> bytes:
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def run(self) -> None:
        """Answer the request; what escapes is handled as uvicorn handles what escapes an ASGI app."""
        protocol = self.protocol
        try:
            await protocol.hot_routes.answer(self.route, self.scope, self.body(), self)  # type: ignore[union-attr]
        except BaseException as exc:
            if self.delegated or (self.abandoned and isinstance(exc, asyncio.CancelledError)):
                return  # (abandoned: its client went away, nothing to answer)
            protocol.logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                self._internal_error()
            else:
                protocol.transport.close()
        else:
            if not self.delegated and not self.response_started and not self.disconnected:
                protocol.logger.error("ASGI callable returned without starting response.")
                self._internal_error()

    def _internal_error(self) -> None:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        self.respond(500, headers, b"Internal Server Error")

    async def receive(self) -> dict:
        """The ASGI `receive` of this request: its body once, then `http.disconnect` when the client goes."""
        if not self.body_sent and not self.disconnected:
            self.body_sent = True
            return {"type": "http.request", "body": self.body(), "more_body": False}
        if not self.disconnected and not self.response_complete:
            await self.message_event.wait(self.protocol.loop)
        return {"type": "http.disconnect"}

    def respond(self, status: int, headers: list, body: bytes) -> None:
        """Write the whole response in one piece, then hand the connection back as uvicorn's cycle does."""
        if self.response_started:
            raise RuntimeError("the response was already sent")
        if self.disconnected:
            self.response_started = True
            return
        protocol = self.protocol
        out = [STATUS_LINE[status]]
        close_sent = False
        length: Optional[int] = None
        for name, value in (*protocol.server_state.default_headers, *headers):
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and length is None:
                length = int(value)
            elif name == b"connection" and b"close" in [token.strip().lower() for token in value.split(b",")]:
                self.keep_alive = False
                close_sent = True
            out += (name, b": ", value, b"\r\n")
        if length is None and status not in (204, 304):
            length = len(body)
            out += (b"content-length: ", str(length).encode(), b"\r\n")
        if length is not None and length != len(body):
            raise RuntimeError("Response content longer than Content-Length" if len(body) > length
                               else "Response content shorter than Content-Length")
        if not self.keep_alive and not close_sent:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", body)
        self.response_started = True
        if protocol.access_log:  # the line uvicorn's cycle writes when the response starts
            scope = self.scope
            protocol.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                                        get_path_with_query_string(scope), scope["http_version"], status)
        protocol.transport.write_now(b"".join(out))  # type: ignore[attr-defined]
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            protocol.transport.close()
        protocol.on_response_complete()

    async def asgi(self, app: Any) -> None:
        """Serve this request through uvicorn's own cycle with `app` (the body is in hand already)."""
        protocol = self.protocol
        self.delegated = True
        body_ready = asyncio.Event()
        body_ready.set()  # uvicorn's receive waits for it before handing out the body, which is all here
        cycle = RequestResponseCycle(
            scope=self.scope,  # type: ignore[arg-type]
            transport=protocol.transport,
            flow=protocol.flow,
            logger=protocol.logger,
            access_logger=protocol.access_logger,
            access_log=protocol.access_log,
            default_headers=protocol.server_state.default_headers,
            message_event=body_ready,
            expect_100_continue=False,
            keep_alive=self.keep_alive,
            on_response=protocol.on_response_complete,
        )
        cycle.body = self.body()  # type: ignore[assignment]
        cycle.more_body = False
        cycle.disconnected = self.disconnected
        work = _AbandonableApp(app, cycle)
        if protocol.cycle is self:
            protocol.cycle = cycle
            protocol.work = work
        await cycle.run_asgi(work)


# The access line of a refused request shows at most this much of its path (a refused head can be a 64 KiB URL).
_LOGGED_PATH_BYTES = 1024


class _RefusedCycle(_DirectCycle):
    """A request refused for a limit (`status`, a JSON `answer_body`); the connection closes after the answer. A
    body over its limit is first counted and dropped as it arrives (`discard`), so the client reads the 413."""

    __slots__ = ("status", "answer_body", "limit", "discarded")

    # A client that keeps sending long after its refusal is cut off here (multiples of the limit).
    DISCARD_FACTOR = 4

    def __init__(self, protocol: NeMoGymHttpProtocol, scope: dict, status: int, answer_body: bytes,
                 limit: int = 0) -> None:
        super().__init__(protocol, scope, None, keep_alive=False)
        if "method" not in scope:  # refused before uvicorn read the request line into the scope
            try:
                scope["method"] = protocol.parser.get_method().decode("ascii")
            except Exception:  # noqa: BLE001 - the request line is not read yet (a head timed out early)
                scope["method"] = "-"
            path, _, query = protocol.url[:_LOGGED_PATH_BYTES].decode("latin-1").partition("?")
            scope["path"], scope["raw_path"], scope["query_string"] = path, path.encode("latin-1"), query.encode("latin-1")
        self.status = status
        self.answer_body = answer_body
        self.limit = limit
        self.discarded = 0

    def discard(self, size: int) -> None:
        self.discarded += size
        if self.discarded > self.DISCARD_FACTOR * self.limit and not self.response_started:
            self.answer()

    def answer(self) -> None:
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        self.respond(self.status, headers, self.answer_body)


def protocol_with_limits(limits: RequestLimits) -> type[NeMoGymHttpProtocol]:
    """`NeMoGymHttpProtocol`, holding every request to `limits` in this process and in the uvicorn workers it
    starts (they import this module afresh and read the limits from the environment)."""
    NeMoGymHttpProtocol.max_body = limits.max_body
    NeMoGymHttpProtocol.max_head = limits.max_head
    NeMoGymHttpProtocol.head_timeout = limits.head_timeout_s
    NeMoGymHttpProtocol.body_timeout = limits.body_timeout_s
    NeMoGymHttpProtocol.send_timeout = limits.send_timeout_s
    limits.export_to_env()
    return NeMoGymHttpProtocol


# -------------------------------------------------------------------------------------------------------------
# uvicorn: requests in flight


def requests_in_flight(server: Any) -> int:
    """How many requests a running `uvicorn.Server` is answering (its tasks)."""
    return len(server.server_state.tasks)


# -------------------------------------------------------------------------------------------------------------
# FastAPI: what a route takes, read once


@dataclass(frozen=True)
class Param:
    """One parameter of a route's endpoint, as FastAPI reads it."""

    name: str
    annotation: Any
    required: bool
    embed: bool = False
    media_type: str = "application/json"


@dataclass(frozen=True)
class RouteShape:
    """What a route's endpoint takes and how FastAPI would call it: plain values, no FastAPI objects."""

    endpoint: Callable[..., Any]
    path_params: tuple[Param, ...]
    query_params: tuple[Param, ...]
    header_params: tuple[Param, ...]
    cookie_params: tuple[Param, ...]
    body_params: tuple[Param, ...]
    dependencies: tuple[str, ...]  # the names of the dependency callables
    # Parameters FastAPI injects, by kind ("Request", "WebSocket", "Response", ...) -> parameter name.
    injected: dict[str, str]
    default_response_class: bool

    @property
    def request_param_name(self) -> Optional[str]:
        return self.injected.get("Request")


_INJECTED = (
    ("request_param_name", "Request"),
    ("http_connection_param_name", "HTTPConnection"),
    ("websocket_param_name", "WebSocket"),
    ("response_param_name", "Response"),
    ("background_tasks_param_name", "BackgroundTasks"),
    ("security_scopes_param_name", "SecurityScopes"),
)


def _params(fields: Any) -> tuple[Param, ...]:
    out = []
    for field in fields or ():
        info = field.field_info
        out.append(
            Param(
                name=field.name,
                annotation=info.annotation,
                required=info.is_required(),
                embed=bool(getattr(info, "embed", False)),
                media_type=getattr(info, "media_type", "application/json"),
            )
        )
    return tuple(out)


def route_shape(route: APIRoute) -> RouteShape:
    """FastAPI's own reading of `route`'s endpoint (its `dependant`), as a `RouteShape`."""
    dependant = route.dependant
    return RouteShape(
        endpoint=dependant.call,
        path_params=_params(dependant.path_params),
        query_params=_params(dependant.query_params),
        header_params=_params(dependant.header_params),
        cookie_params=_params(dependant.cookie_params),
        body_params=_params(dependant.body_params),
        dependencies=tuple(str(getattr(d.call, "__name__", d.call)) for d in dependant.dependencies),
        injected={kind: getattr(dependant, attr) for attr, kind in _INJECTED if getattr(dependant, attr, None)},
        default_response_class=isinstance(route.response_class, DefaultPlaceholder),
    )


def typed_signature(endpoint: Callable[..., Any]) -> inspect.Signature:
    """The signature FastAPI reads of `endpoint` (string annotations resolved as FastAPI resolves them)."""
    return get_typed_signature(endpoint)


# -------------------------------------------------------------------------------------------------------------
# starlette: a request whose body is already read


def request_with_body(scope: dict, receive: Any, body: bytes) -> Request:
    """A `Request` over `scope` whose `body()` (and so `json()`) returns `body` without reading the stream."""
    request = Request(scope, receive)
    request._body = body  # what Request.body() caches
    return request


# -------------------------------------------------------------------------------------------------------------
# The check


def check_compatibility() -> list[str]:
    """What the installed uvicorn / FastAPI / starlette lack of what this module uses (empty: all there)."""
    problems: list[str] = []
    for name in (
        "on_message_begin", "on_headers_complete", "on_body", "on_message_complete", "on_response_complete",
        "data_received", "connection_made", "connection_lost", "timeout_keep_alive_handler",
        "_unset_keepalive_if_required", "pause_writing", "resume_writing",
    ):
        if not callable(getattr(HttpToolsProtocol, name, None)):
            problems.append(f"uvicorn: HttpToolsProtocol.{name} is gone")
    cycle_params = inspect.signature(RequestResponseCycle.__init__).parameters
    for name in (
        "scope", "transport", "flow", "logger", "access_logger", "access_log", "default_headers", "message_event",
        "expect_100_continue", "keep_alive", "on_response",
    ):
        if name not in cycle_params:
            problems.append(f"uvicorn: RequestResponseCycle() no longer takes {name}=")
    if not callable(getattr(RequestResponseCycle, "run_asgi", None)):
        problems.append("uvicorn: RequestResponseCycle.run_asgi is gone")
    try:
        from uvicorn.protocols.http.flow_control import FlowControl

        if not isinstance(getattr(FlowControl(None), "read_paused", None), bool):  # type: ignore[arg-type]
            problems.append("uvicorn: FlowControl.read_paused is gone")
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        problems.append(f"uvicorn: FlowControl failed ({type(exc).__name__}: {exc})")
    if any(status not in STATUS_LINE for status in (408, 413, 431, 500)):
        problems.append("uvicorn: STATUS_LINE no longer maps status codes to status lines")

    async def probe(request: Request) -> None:
        return None

    try:
        shape = route_shape(APIRoute("/probe", probe, methods=["POST"]))
        if shape.request_param_name != "request" or shape.endpoint is not probe:
            problems.append("FastAPI: APIRoute.dependant no longer describes the endpoint's parameters")
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        problems.append(f"FastAPI: reading a route failed ({type(exc).__name__}: {exc})")
    request = request_with_body({"type": "http", "method": "POST", "path": "/", "headers": []}, None, b"{}")
    try:
        if _run_without_loop(request.body()) != b"{}":
            problems.append("starlette: Request.body() no longer returns the cached `_body`")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"starlette: Request.body() with a cached body failed ({type(exc).__name__}: {exc})")
    return problems


def _run_without_loop(coro: Any) -> Any:
    """The result of a coroutine that never suspends (no event loop needed, none disturbed)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the coroutine suspended")
