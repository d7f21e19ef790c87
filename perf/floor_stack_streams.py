"""The first floor of issue 11, on asyncio streams; kept for comparison with the lean floor (`perf/floor_stack.py`).

The real stack's architecture with nothing in the way, written on asyncio streams (StreamReader/StreamWriter,
readuntil/readexactly, a Semaphore per pool): it costs more CPU per exchange than `floor_stack.py`, which does the
same work on `asyncio.Protocol`. `perf/floor_vs_stack.py` measures both (this one as a second column).

Three server processes (agent, model proxy, resources), each a bare `asyncio.start_server` with a minimal
HTTP/1.1 keep-alive parser (request line, headers, Content-Length body; answers carry Content-Length), uvloop,
orjson, no validation. A rollout makes the same 8 HTTP exchanges as the real stack (example_single_tool_call +
openai_model + simple_agent): collector -> agent `/run`; agent -> resources `/seed_session`, model
`/v1/responses` x2 (each forwarded to the LLM), resources `/get_weather` with the call's arguments, resources
`/verify`. Between processes: a small pool of keep-alive connections per peer on asyncio streams.

Each server counts the requests it served per path, and the model proxy the calls it made to the LLM; `POST
/_floor/stats` answers them (not counted), so the harness can check that every rollout made its 8 exchanges.

Run one role (the harness, `floor_stack.start_floor(..., script=<this file>)`, starts all three;
`perf/floor_vs_stack.py` measures them):

    python perf/floor_stack_streams.py resources --port 9001
    python perf/floor_stack_streams.py model --port 9002 --upstream http://127.0.0.1:8000  # the fake LLM
    python perf/floor_stack_streams.py agent --port 9003 --model http://127.0.0.1:9002 --resources http://127.0.0.1:9001
"""

from __future__ import annotations

import argparse
import asyncio
import os
from urllib.parse import urlsplit

import orjson


class Pool:
    """Keep-alive HTTP/1.1 connections to one peer: at most `size` open, idle ones reused (LIFO); a request on a
    reused connection the peer has closed meanwhile (e.g. uvicorn's 5 s keep-alive timeout) goes again on another."""

    def __init__(self, url: str, size: int, extra_headers: bytes = b""):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.head = b"Host: %s:%d\r\nContent-Type: application/json\r\n%s" % (
            self.host.encode(), self.port, extra_headers)
        self.idle: list = []
        self.slots = asyncio.Semaphore(size)
        self.sent = 0  # requests answered by the peer

    async def post(self, path: bytes, body: bytes) -> bytes:
        async with self.slots:
            while True:
                reused = bool(self.idle)
                reader, writer = self.idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
                try:
                    writer.write(b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (path, self.head, len(body), body))
                    status, headers = _parse_head(await reader.readuntil(b"\r\n\r\n"))
                    data = await reader.readexactly(int(headers.get(b"content-length", 0)))
                    break
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    writer.close()  # an idle connection the peer closed meanwhile: retry on a new one
                    if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                        raise
                except BaseException:
                    writer.close()
                    raise
            self.sent += 1
            if headers.get(b"connection", b"").lower() == b"close":
                writer.close()
            else:
                self.idle.append((reader, writer))
        if not status.startswith(b"2"):
            raise RuntimeError(f"POST {path.decode()} -> {status.decode()}: {data[:300]!r}")
        return data


def _parse_head(head: bytes) -> tuple[bytes, dict]:
    """First line's second word (status code or path) and the lower-cased headers."""
    lines = head[:-4].split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return lines[0].split(b" ", 2)[1], headers


async def serve(port: int, routes: dict, upstream: Pool | None = None) -> None:
    """Serve `routes` (path -> async fn(body bytes) -> bytes) on 127.0.0.1:`port` until killed; `/_floor/stats`
    answers the requests served per path and those sent to `upstream` (the model proxy's LLM)."""
    served = dict.fromkeys(routes, 0)

    async def stats(body: bytes) -> bytes:
        return orjson.dumps({"served": {k.decode(): v for k, v in served.items()},
                             "upstream": upstream.sent if upstream else 0})

    routes = {**routes, b"/_floor/stats": stats}

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                path, headers = _parse_head(await reader.readuntil(b"\r\n\r\n"))
                length = int(headers.get(b"content-length", 0))
                body = await reader.readexactly(length) if length else b""
                handler = routes.get(path)
                if handler is None:
                    status, out = b"404 Not Found", b'{"detail":"Not Found"}'
                else:
                    if path in served:
                        served[path] += 1
                    try:
                        status, out = b"200 OK", await handler(body)
                    except Exception as exc:  # noqa: BLE001 - a benchmark server: report, keep serving
                        status, out = b"500 Internal Server Error", orjson.dumps({"error": repr(exc)})
                writer.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, len(out), out))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=4096)
    print(f"floor server ready on {port}", flush=True)
    async with server:
        await server.serve_forever()


def resources_routes() -> dict:
    async def seed_session(body: bytes) -> bytes:
        return b"{}"

    async def get_weather(body: bytes) -> bytes:
        city = orjson.loads(body)["city"]
        return orjson.dumps({"city": city, "weather_description": f"The weather in {city} is cold."})

    async def verify(body: bytes) -> bytes:
        rollout = orjson.loads(body)
        called = any(i.get("type") == "function_call" and i.get("name") == "get_weather"
                     for i in rollout["response"]["output"])
        return orjson.dumps({**rollout, "reward": 1.0, "called_get_weather": called})

    return {b"/seed_session": seed_session, b"/get_weather": get_weather, b"/verify": verify}


def model_routes(upstream: str, model_name: str, pool: int) -> dict:
    llm = Pool(upstream, pool, b"Authorization: Bearer dummy\r\n")

    async def responses(body: bytes) -> bytes:
        params = orjson.loads(body)
        params["model"] = model_name
        return await llm.post(b"/v1/responses", orjson.dumps(params))

    return {b"/v1/responses": responses}, llm


def agent_routes(model_url: str, resources_url: str, pool: int) -> dict:
    model, resources = Pool(model_url, pool), Pool(resources_url, pool)

    async def run(body: bytes) -> bytes:
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
                outputs.append({"type": "function_call_output", "call_id": call["call_id"], "output": out.decode()})
        verified = orjson.loads(await resources.post(b"/verify", orjson.dumps({**row, "response": {**last, "output": outputs}})))
        return orjson.dumps({**row, **verified})

    return {b"/run": run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["resources", "model", "agent"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", help="model: the LLM's base URL (without /v1)")
    parser.add_argument("--model-name", default="fake-model")
    parser.add_argument("--model", help="agent: the model proxy's URL")
    parser.add_argument("--resources", help="agent: the resources server's URL")
    parser.add_argument("--pool", type=int, default=64, help="keep-alive connections per peer, at most")
    args = parser.parse_args()

    import signal

    import uvloop

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # quiet, immediate

    async def amain() -> None:
        upstream = None
        if args.role == "resources":
            routes = resources_routes()
        elif args.role == "model":
            routes, upstream = model_routes(args.upstream, args.model_name, args.pool)
        else:
            routes = agent_routes(args.model, args.resources, args.pool)
        await serve(args.port, routes, upstream)

    uvloop.run(amain())


if __name__ == "__main__":
    main()
