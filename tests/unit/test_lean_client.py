"""LeanClient against real servers: uvicorn for the usual answers, a raw asyncio server for misbehaving peers."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from nemo_gym.http.lean_client import LeanClient
from nemo_gym.testing.live_server import live_server

TIMEOUT = {"connect": 5.0, "read": None, "pool": None}


def app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        body = await request.body()
        return Response(body, headers={"x-client-port": str(request.client.port), "x-length": str(len(body))})

    @app.get("/chunked")
    async def chunked():
        async def parts():
            for i in range(5):
                yield f"part{i};".encode()

        return StreamingResponse(parts(), media_type="text/plain")

    @app.get("/close")
    async def close(request: Request):
        return PlainTextResponse(str(request.client.port), headers={"connection": "close"})

    @app.get("/slow/{seconds}/{tag}")
    async def slow(seconds: float, tag: str, request: Request):
        await asyncio.sleep(seconds)
        return PlainTextResponse(f"{tag}@{request.client.port}")

    @app.get("/cookies")
    async def cookies():
        response = PlainTextResponse("ok")
        response.set_cookie("a", "1")
        response.set_cookie("b", "2")
        return response

    return app


@pytest.fixture(scope="module")
def server():
    with live_server(app(), timeout_keep_alive=1) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def run(coro_fn):
    async def main():
        client = LeanClient(limit_per_host=4)
        try:
            return await coro_fn(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_keep_alive_reuses_one_connection_for_sequential_calls(server):
    host, port = server

    async def go(client):
        ports = set()
        for i in range(30):
            r = await client.request("POST", host, port, "/echo", {"Content-Type": "text/plain"}, f"n{i}".encode(), TIMEOUT)
            assert r.status == 200 and r.body == f"n{i}".encode() and r.reason == "OK"
            ports.add(r.headers["x-client-port"])
        return ports

    assert len(run(go)) == 1


def test_large_bodies_and_chunked_answers_and_repeated_headers(server):
    host, port = server

    async def go(client):
        big = b"x" * (3 * 1024 * 1024)
        r = await client.request("POST", host, port, "/echo", {}, big, TIMEOUT)
        assert r.headers["x-length"] == str(len(big)) and r.body == big
        r = await client.request("GET", host, port, "/chunked", {}, None, TIMEOUT)
        assert r.body == b"part0;part1;part2;part3;part4;" and r.headers["transfer-encoding"] == "chunked"
        r = await client.request("GET", host, port, "/cookies", {}, None, TIMEOUT)
        assert len(r.headers.getall("set-cookie")) == 2

    run(go)


def test_connection_close_answers_and_idle_connections_closed_by_the_server(server):
    host, port = server

    async def go(client):
        first = (await client.request("GET", host, port, "/close", {}, None, TIMEOUT)).body
        second = (await client.request("GET", host, port, "/close", {}, None, TIMEOUT)).body
        assert first != second  # the closed connection was not reused
        await client.request("POST", host, port, "/echo", {}, b"a", TIMEOUT)
        await asyncio.sleep(1.5)  # past the server's keep-alive: it closes the idle connection
        r = await client.request("POST", host, port, "/echo", {}, b"b", TIMEOUT)
        assert r.body == b"b"

    run(go)


def test_a_read_timeout_or_a_cancelled_call_never_leaks_its_answer_into_the_next_call(server):
    host, port = server

    async def go(client):
        with pytest.raises(httpx.ReadTimeout):
            await client.request("GET", host, port, "/slow/0.5/late", {}, None, {**TIMEOUT, "read": 0.1})
        task = asyncio.ensure_future(client.request("GET", host, port, "/slow/0.3/cancelled", {}, None, TIMEOUT))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.6)
        r = await client.request("GET", host, port, "/slow/0/fresh", {}, None, TIMEOUT)
        assert r.body.startswith(b"fresh@")

    run(go)


def test_limit_per_host_bounds_open_connections(server):
    host, port = server

    async def go(client):
        answers = await asyncio.gather(
            *(client.request("GET", host, port, f"/slow/0.1/t{i}", {}, None, TIMEOUT) for i in range(12))
        )
        return {a.body.split(b"@")[1] for a in answers}

    assert len(run(go)) <= 4


def test_refused_connection_is_a_connect_error():
    from nemo_gym.testing.stack import free_port

    async def go(client):
        with pytest.raises(httpx.ConnectError, match="Cannot connect"):
            await client.request("GET", "127.0.0.1", free_port(), "/", {}, None, TIMEOUT)

    run(go)


@pytest.mark.parametrize(
    "reply, error",
    [
        (b"", "without sending a response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "in the middle of the response"),
        (b"NOT HTTP AT ALL\r\n\r\n", "invalid HTTP response"),
    ],
)
def test_a_peer_that_hangs_up_or_talks_garbage_is_a_remote_protocol_error(reply, error):
    async def go(client):
        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(httpx.RemoteProtocolError, match=error):
                await client.request("GET", "127.0.0.1", port, "/", {}, None, TIMEOUT)
        finally:
            server.close()

    run(go)


# ------------------------------------------------------------------------- the cap on response bodies


async def _raw_peer(reply: bytes, *, body_chunks: int = 0, chunk: bytes = b""):
    """A peer that answers every request with `reply` then `body_chunks` x `chunk` (and keeps the connection open);
    returns (server, port, sent) where `sent[0]` counts body bytes written."""
    sent = [0]

    async def handle(reader, writer):
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            for _ in range(body_chunks):
                writer.write(chunk)
                sent[0] += len(chunk)
                await writer.drain()
            await asyncio.sleep(30)  # never finishes on its own: the client must stop reading
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], sent


def test_a_declared_body_over_the_cap_fails_before_any_of_it_is_read():
    from nemo_gym.http.response import ResponseTooLargeError

    async def main():
        client = LeanClient(max_body=1000)
        # Only the head is sent: were the client waiting for the body, this would hang (bounded by wait_for).
        server, port, _ = await _raw_peer(b"HTTP/1.1 200 OK\r\nContent-Length: 5000000\r\n\r\n")
        try:
            with pytest.raises(ResponseTooLargeError) as info:
                await asyncio.wait_for(client.request("GET", "127.0.0.1", port, "/big", {}, None, TIMEOUT), 20)
            error = info.value
            assert (error.size, error.limit, error.declared) == (5000000, 1000, True)
            assert f"http://127.0.0.1:{port}/big" in str(error) and "http_client_max_response_body_bytes" in str(error)
            assert not client._open  # its connection was closed
        finally:
            server.close()
            await client.aclose()

    asyncio.run(main())


def test_a_chunked_body_over_the_cap_stops_being_read_there(server):
    from nemo_gym.http.response import ResponseTooLargeError

    async def main():
        client = LeanClient(max_body=256 * 1024)
        chunk = b"5000\r\n" + b"y" * 0x5000 + b"\r\n"  # 20 KiB chunks, forever (until the client hangs up)
        peer, port, sent = await _raw_peer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", body_chunks=2000, chunk=chunk
        )
        try:
            with pytest.raises(ResponseTooLargeError) as info:
                await asyncio.wait_for(client.request("GET", "127.0.0.1", port, "/stream", {}, None, TIMEOUT), 20)
            error = info.value
            assert error.declared is False and error.limit == 256 * 1024
            assert 256 * 1024 < error.size <= 256 * 1024 + 256 * 1024  # stopped within one read of the cap
            assert "at least" in str(error)
            assert sent[0] < 2000 * len(chunk)  # the peer could not send it all: the client hung up
            # The client is still usable, on a fresh connection (the aborted one is gone).
            host, port2 = server
            answer = await client.request("POST", host, port2, "/echo", {}, b"after", TIMEOUT)
            assert answer.body == b"after"
            # A body exactly at the cap is fine.
            exact = b"z" * (256 * 1024)
            assert (await client.request("POST", host, port2, "/echo", {}, exact, TIMEOUT)).body == exact
        finally:
            peer.close()
            await client.aclose()

    asyncio.run(main())
