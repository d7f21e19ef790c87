"""The "floor" of issue 11: the real stack's architecture with nothing in the way.

Three server processes (agent, model proxy, resources), each a bare `asyncio.Protocol` server on uvloop with
orjson and no validation. A rollout makes the same 8 HTTP exchanges as the real stack (example_single_tool_call +
openai_model + simple_agent): collector -> agent `/run`; agent -> resources `/seed_session`, model
`/v1/responses` x2 (each forwarded to the LLM), resources `/get_weather` with the call's arguments, resources
`/verify`.

Lean on purpose (issue 24), so the stack/floor ratio is honest:
- server side: `data_received` parses the request line, finds Content-Length and slices the body out of the
  chunk it came in (a memoryview, no copy; a bytearray only when a request spans reads), and each response is ONE
  `transport.write`. Handlers that never wait (the resources server's) answer inside `data_received`; the others
  run as one task per request;
- client side (agent -> model/resources, model -> LLM): keep-alive `asyncio.Protocol` connections, one future
  per in-flight request, one write per request, idle ones reused LIFO, at most `--pool` open per peer (callers
  beyond that get the next freed connection handed over directly); a request on a reused connection the peer
  closed meanwhile (uvicorn's 5 s keep-alive timeout) goes again on another;
- the garbage collector is tuned as the stack tunes it (`gc.freeze()`, generation 0 at 100,000).

Each server counts the requests it served per path, and the model proxy the calls it made to the LLM; `POST
/_floor/stats` answers them (not counted), so the harness can check that every rollout made its 8 exchanges.
`perf/floor_stack_streams.py` is the first floor (asyncio streams), kept for comparison.

Run one role (the harness, `start_floor`, starts all three; `perf/floor_vs_stack.py` measures them):

    python perf/floor_stack.py resources --port 9001
    python perf/floor_stack.py model --port 9002 --upstream http://127.0.0.1:8000  # the fake LLM
    python perf/floor_stack.py agent --port 9003 --model http://127.0.0.1:9002 --resources http://127.0.0.1:9001
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import inspect
import os
import sys
from urllib.parse import urlsplit

import orjson

_RESPONSE = b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
_OK = b"200 OK"


def _content_length(buf, end: int) -> int:
    """Content-Length of the head `buf[:end]` (end = index of the blank line); -1 for a chunked message."""
    i = buf.find(b"\r\ncontent-length:", 0, end)
    if i < 0:
        i = buf.find(b"\r\nContent-Length:", 0, end)
        if i < 0:
            head = bytes(buf[:end]).lower()
            i = head.find(b"\r\ncontent-length:")
            if i < 0:
                return -1 if b"\r\ntransfer-encoding:" in head else 0
    j = buf.find(b"\r", i + 17, end + 2)
    return int(buf[i + 17:j])


class _Conn(asyncio.Protocol):
    """One keep-alive client connection: at most one request in flight, answered through `fut`."""

    __slots__ = ("pool", "transport", "fut", "buf", "need", "start", "got", "keep", "closed")

    def __init__(self, pool: "Pool"):
        self.pool, self.transport, self.fut = pool, None, None
        self.buf, self.need, self.start, self.got, self.keep, self.closed = bytearray(), -1, 0, False, True, False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got = True
        buf = self.buf
        if buf:
            buf += data
            view = buf
        else:
            view = data
        need = self.need
        if need < 0:  # the head is not parsed yet
            end = view.find(b"\r\n\r\n")
            if end < 0:
                if view is data:
                    buf += data
                return
            length = _content_length(view, end)
            if length < 0:
                self._fail(RuntimeError(f"{self.pool.name}: a chunked answer; the floor client reads Content-Length only"))
                return
            self.start, need = end + 4, end + 4 + length
            self.keep = view.find(b"onnection: close", 0, end) < 0
            self.need = need
        if len(view) < need:
            if view is data:
                buf += data
            return
        fut, start = self.fut, self.start
        body = memoryview(data)[start:need] if view is data else bytes(buf[start:need])
        if len(view) > need:  # nothing should follow an answer: no request is pipelined
            self._fail(RuntimeError(f"{self.pool.name}: {len(view) - need} bytes after an answer"))
            return
        status = view[9:12]
        if buf:
            buf.clear()
        self.need, self.fut = -1, None
        if fut is not None and not fut.done():
            fut.set_result((status, body))

    def _fail(self, exc: BaseException) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionResetError(f"{self.pool.name}: the connection closed before the answer"))
        self.pool._lost(self)


class Pool:
    """Keep-alive HTTP/1.1 connections to one peer: at most `size` open, idle ones reused (LIFO); a request on a
    reused connection the peer has closed meanwhile goes again on another."""

    def __init__(self, url: str, size: int, extra_headers: bytes = b""):
        parts = urlsplit(url)
        self.host, self.port, self.size, self.name = parts.hostname, parts.port, size, url
        self.head = b"Host: %s:%d\r\nContent-Type: application/json\r\n%sContent-Length: " % (
            self.host.encode(), self.port, extra_headers)
        self.idle: list[_Conn] = []
        self.open = 0
        self.waiters: collections.deque = collections.deque()  # futures of callers waiting for a connection
        self.sent = 0  # requests answered by the peer
        self.loop = asyncio.get_running_loop()

    async def post(self, path: bytes, body) -> memoryview | bytes:
        request = b"POST %s HTTP/1.1\r\n%s%d\r\n\r\n%s" % (path, self.head, len(body), body)
        while True:
            if self.idle:
                conn, reused = self.idle.pop(), True
            elif self.open < self.size:
                conn, reused = await self._connect(), False
            else:
                waiter = self.loop.create_future()
                self.waiters.append(waiter)
                try:
                    conn = await waiter  # a freed connection, or None: one closed, open a new one in its place
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():  # handed over just before: pass it on
                        given = waiter.result()
                        if given is None:
                            self.open -= 1
                            self._wake(None)
                        else:
                            self._release(given)
                    raise
                reused = conn is not None
                if conn is None:
                    conn = await self._connect(counted=True)
                elif conn.closed:  # handed over, then closed by the peer before this caller ran: another
                    continue
            conn.fut = fut = self.loop.create_future()
            conn.transport.write(request)
            try:
                status, data = await fut
            except ConnectionResetError:
                if reused and not conn.got:  # an idle connection the peer closed meanwhile: again on another
                    continue
                raise
            except BaseException:
                conn.transport.close()
                raise
            break
        self.sent += 1
        if conn.keep:
            self._release(conn)
        else:
            conn.transport.close()
        if status[0] != 50:  # b"2"
            raise RuntimeError(f"POST {path.decode()} to {self.name} -> {bytes(status).decode()}: {bytes(data[:300])!r}")
        return data

    async def _connect(self, counted: bool = False) -> _Conn:
        if not counted:
            self.open += 1
        try:
            _, conn = await self.loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except BaseException:
            self.open -= 1
            self._wake(None)
            raise
        return conn

    def _release(self, conn: _Conn) -> None:
        conn.got = False
        if conn.closed:
            return
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self.idle.append(conn)

    def _lost(self, conn: _Conn) -> None:
        self.open -= 1
        try:
            self.idle.remove(conn)
        except ValueError:
            pass
        self._wake(None)

    def _wake(self, conn) -> None:
        """Tell the first waiting caller it may open a connection (one fewer is open now)."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                self.open += 1  # taken on the waiter's behalf
                waiter.set_result(conn)
                return


class _Server(asyncio.Protocol):
    """One server connection: parses requests from `data_received`, one write per response, in order."""

    __slots__ = ("routes", "transport", "buf", "busy", "loop")

    def __init__(self, routes: dict, loop):
        self.routes, self.loop, self.transport, self.buf, self.busy = routes, loop, None, bytearray(), False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        if self.busy or buf:
            buf += data
            if not self.busy:
                self._drain()
            return
        view = data
        pos = 0
        while True:  # usually one request, whole, in this chunk: sliced out of `data` without a copy
            end = view.find(b"\r\n\r\n", pos)
            if end < 0:
                break
            length = _content_length(view, end) if pos == 0 else _content_length(view[pos:], end - pos)
            if length < 0:
                self._refuse(b"411 Length Required", b'{"detail":"the floor reads Content-Length bodies only"}')
                return
            need = end + 4 + length
            if len(view) < need:
                break
            self._dispatch(view, pos, end, need, memoryview(view)[end + 4:need])
            pos = need
            if self.busy:
                break
        if pos < len(view):
            buf += memoryview(view)[pos:]
            if not self.busy:
                self._drain()

    def _drain(self) -> None:
        """Requests that came in pieces, or behind one still being answered (pipelined)."""
        buf = self.buf
        while buf and not self.busy:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            length = _content_length(buf, end)
            if length < 0:
                self._refuse(b"411 Length Required", b'{"detail":"the floor reads Content-Length bodies only"}')
                return
            need = end + 4 + length
            if len(buf) < need:
                return
            body = bytes(buf[end + 4:need])
            self._dispatch(buf, 0, end, need, body)
            del buf[:need]

    def _dispatch(self, view, pos: int, end: int, need: int, body) -> None:
        a = view.index(b" ", pos, end) + 1
        path = bytes(view[a:view.index(b" ", a, end)])
        route = self.routes.get(path)
        if route is None:
            self.transport.write(_RESPONSE % (b"404 Not Found", 22, b'{"detail":"Not Found"}'))
            return
        route[2] += 1
        handler = route[0]
        if route[1]:  # a coroutine function: one task, answered when it ends
            self.busy = True
            self.loop.create_task(self._answer(handler(body)))
            return
        try:
            out = handler(body)
        except Exception as exc:  # noqa: BLE001 - a benchmark server: report, keep serving
            self._error(exc)
            return
        self.transport.write(_RESPONSE % (_OK, len(out), out))

    async def _answer(self, coro) -> None:
        try:
            out = await coro
        except Exception as exc:  # noqa: BLE001
            self._error(exc)
        else:
            if not self.transport.is_closing():
                self.transport.write(_RESPONSE % (_OK, len(out), out))
        self.busy = False
        if self.buf:
            self._drain()

    def _error(self, exc: Exception) -> None:
        out = orjson.dumps({"error": repr(exc)})
        if not self.transport.is_closing():
            self.transport.write(_RESPONSE % (b"500 Internal Server Error", len(out), out))

    def _refuse(self, status: bytes, out: bytes) -> None:
        self.transport.write(_RESPONSE % (status, len(out), out))
        self.transport.close()


async def serve(port: int, routes: dict, upstream: Pool | None = None) -> None:
    """Serve `routes` (path -> fn(body) -> bytes, or a coroutine function) on 127.0.0.1:`port` until killed;
    `/_floor/stats` answers the requests served per path and those sent to `upstream` (the model proxy's LLM)."""
    table = {path: [fn, inspect.iscoroutinefunction(fn), 0] for path, fn in routes.items()}

    def stats(body) -> bytes:
        return orjson.dumps({"served": {k.decode(): v[2] for k, v in table.items() if k in routes},
                             "upstream": upstream.sent if upstream else 0})

    table[b"/_floor/stats"] = [stats, False, 0]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Server(table, loop), "127.0.0.1", port, backlog=4096)
    print(f"floor server ready on {port}", flush=True)
    async with server:
        await server.serve_forever()


def resources_routes() -> dict:
    def seed_session(body) -> bytes:
        return b"{}"

    def get_weather(body) -> bytes:
        city = orjson.loads(body)["city"]
        return orjson.dumps({"city": city, "weather_description": f"The weather in {city} is cold."})

    def verify(body) -> bytes:
        rollout = orjson.loads(body)
        called = any(i.get("type") == "function_call" and i.get("name") == "get_weather"
                     for i in rollout["response"]["output"])
        return orjson.dumps({**rollout, "reward": 1.0, "called_get_weather": called})

    return {b"/seed_session": seed_session, b"/get_weather": get_weather, b"/verify": verify}


def model_routes(upstream: str, model_name: str, pool: int) -> tuple[dict, Pool]:
    llm = Pool(upstream, pool, b"Authorization: Bearer dummy\r\n")

    async def responses(body) -> bytes:
        params = orjson.loads(body)
        params["model"] = model_name
        return await llm.post(b"/v1/responses", orjson.dumps(params))

    return {b"/v1/responses": responses}, llm


def agent_routes(model_url: str, resources_url: str, pool: int) -> dict:
    model, resources = Pool(model_url, pool), Pool(resources_url, pool)

    async def run(body) -> bytes:
        row = orjson.loads(body)
        await resources.post(b"/seed_session", body)
        params = row["responses_create_params"]
        original, outputs = params["input"], []
        while True:  # the simple_agent loop: model call, run its function calls, until it stops calling tools
            last = orjson.loads(await model.post(b"/v1/responses", orjson.dumps({**params, "input": original + outputs})))
            outputs.extend(last["output"])
            calls = [item for item in last["output"] if item.get("type") == "function_call"]
            if not calls:
                break
            for call in calls:
                out = await resources.post(b"/" + call["name"].encode(), call["arguments"].encode())
                outputs.append({"type": "function_call_output", "call_id": call["call_id"], "output": str(out, "utf-8")})
        verified = orjson.loads(await resources.post(b"/verify", orjson.dumps({**row, "response": {**last, "output": outputs}})))
        return orjson.dumps({**row, **verified})

    return {b"/run": run}


def start_floor(upstream: str, model_name: str = "fake-model", pool: int = 64, script: str = __file__,
                validate: bool = False, payload: bool = False) -> dict:
    """Start the three floor processes of `script` (this file, or `floor_stack_streams.py`) against the LLM at
    `upstream` (no `/v1`); `validate`: this file's servers with the contract's pydantic work
    (`perf/floor_validated.py`); `payload`: the training-mode weather task's routes (`perf/floor_payload.py`,
    the LLM's chat completions with token data). Returns {"resources"|"model"|"agent": ChildProcess} once all three are ready, the agent
    `/run` URL under "url" and each server's base URL under "urls"."""
    from nemo_gym.testing.stack import ChildProcess, free_port

    ports = {name: free_port() for name in ("resources", "model", "agent")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    cmd = [sys.executable, script, *(["--validate"] if validate else []), *(["--payload"] if payload else [])]
    roles = {
        "resources": [*cmd, "resources", "--port", str(ports["resources"])],
        "model": [*cmd, "model", "--port", str(ports["model"]), "--upstream", upstream, "--model-name", model_name,
                  "--pool", str(pool)],
        "agent": [*cmd, "agent", "--port", str(ports["agent"]), "--model", url["model"], "--resources",
                  url["resources"], "--pool", str(pool)],
    }
    procs = {}
    try:
        for name, args in roles.items():
            procs[name] = ChildProcess(args, name=f"floor {name}")
        for proc in procs.values():
            proc.wait_for("floor server ready", timeout=30)
    except BaseException:
        stop_floor(procs)
        raise
    return {**procs, "url": url["agent"] + "/run", "urls": url}


def floor_exchanges(floor: dict) -> int:
    """HTTP exchanges the floor has made so far: requests served by its 3 servers plus the model proxy's calls to
    the LLM (8 per rollout). Read from each server's `/_floor/stats`."""
    import httpx

    total = 0
    for base in floor["urls"].values():
        reply = httpx.post(base + "/_floor/stats", content=b"{}", timeout=10)
        reply.raise_for_status()
        stats = reply.json()
        total += sum(stats["served"].values()) + stats["upstream"]
    return total


def stop_floor(floor: dict) -> None:
    import signal

    for proc in floor.values():
        if hasattr(proc, "stop"):
            proc.stop(signal.SIGTERM, timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["resources", "model", "agent"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", help="model: the LLM's base URL (without /v1)")
    parser.add_argument("--model-name", default="fake-model")
    parser.add_argument("--model", help="agent: the model proxy's URL")
    parser.add_argument("--resources", help="agent: the resources server's URL")
    parser.add_argument("--pool", type=int, default=64, help="keep-alive connections per peer, at most")
    parser.add_argument("--validate", action="store_true",
                        help="the validated floor: the contract's pydantic work too (perf/floor_validated.py)")
    parser.add_argument("--payload", action="store_true",
                        help="the payload floor: the training-mode weather task's routes (perf/floor_payload.py)")
    args = parser.parse_args()

    import gc
    import signal

    import uvloop

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # quiet, immediate

    roles = sys.modules[__name__]
    if args.validate:
        import floor_validated as roles
    if args.payload:
        import floor_payload as roles

    async def amain() -> None:
        upstream = None
        if args.role == "resources":
            routes = roles.resources_routes()
        elif args.role == "model":
            routes, upstream = roles.model_routes(args.upstream, args.model_name, args.pool)
        else:
            routes = roles.agent_routes(args.model, args.resources, args.pool)
        gc.collect()  # as the stack's servers do (nemo_gym/serving/runner.py tune_gc_for_serving)
        gc.freeze()
        gc.set_threshold(100_000, *gc.get_threshold()[1:])
        await serve(args.port, routes, upstream)

    uvloop.run(amain())


if __name__ == "__main__":
    main()
