"""One write per response: the coalescing transport's rules, and uvicorn serving real requests through it."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from nemo_gym.servers.http_protocol import FLUSH_AT_BYTES, CoalescingHttpToolsProtocol, _CoalescingTransport
from nemo_gym.testing.live_server import live_server


class RecordingTransport:
    """Stands in for the socket transport: records what would go to the socket."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.events.append("close")
        self.closing = True

    def write_eof(self) -> None:
        self.events.append("eof")

    def abort(self) -> None:
        self.events.append("abort")
        self.closing = True

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default


def test_writes_of_one_loop_turn_leave_together_in_order():
    async def go():
        inner = RecordingTransport()
        transport = _CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"")
        transport.writelines([b"body-", b"part"])
        assert inner.writes == [] and transport.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody-part")
        await asyncio.sleep(0)
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody-part"]
        transport.write(b"next")
        await asyncio.sleep(0)
        assert inner.writes[-1] == b"next" and len(inner.writes) == 2
        assert transport.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else is the transport's

    asyncio.run(go())


def test_big_bodies_close_eof_and_abort():
    async def go():
        inner = RecordingTransport()
        transport = _CoalescingTransport(inner, asyncio.get_running_loop())
        transport.write(b"h")
        transport.write(b"x" * FLUSH_AT_BYTES)  # past the threshold: sent at once
        assert inner.writes == [b"h" + b"x" * FLUSH_AT_BYTES]
        transport.write(b"last words")
        transport.write_eof()
        assert inner.writes[-1] == b"last words" and inner.events == ["eof"]
        transport.write(b"then close")
        transport.close()
        assert inner.writes[-1] == b"then close" and inner.events == ["eof", "close"]
        transport.write(b"dropped")  # the socket is closing: nothing more goes out
        await asyncio.sleep(0)
        assert inner.writes[-1] == b"then close"

        inner2 = RecordingTransport()
        transport2 = _CoalescingTransport(inner2, asyncio.get_running_loop())
        transport2.write(b"pending")
        transport2.abort()
        await asyncio.sleep(0)
        assert inner2.writes == [] and inner2.events == ["abort"]

    asyncio.run(go())


def app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        return PlainTextResponse((await request.body()).decode())

    @app.get("/stream")
    async def stream():
        async def parts():
            for i in range(200):
                yield (f"{i:04d}" * 2048).encode()  # 8 KiB each, 1.6 MB in all

        return StreamingResponse(parts())

    @app.get("/bye")
    async def bye():
        return PlainTextResponse("bye", headers={"connection": "close"})

    return app


@pytest.fixture(scope="module")
def url():
    with live_server(app(), http=CoalescingHttpToolsProtocol) as base_url:
        yield base_url


def test_uvicorn_serves_through_it(url):
    with httpx.Client(base_url=url) as client:
        for i in range(20):  # keep-alive: several answers on one connection
            assert client.post("/echo", content=f"hello {i}").text == f"hello {i}"
        streamed = client.get("/stream").content
        assert streamed == b"".join((f"{i:04d}" * 2048).encode() for i in range(200))
        assert client.get("/bye").text == "bye"
        assert client.post("/echo", content="after close").text == "after close"  # a new connection
