"""uvicorn's httptools protocol, writing each response to the socket once instead of twice.

Why: uvicorn writes a response's status line and headers as soon as the app sends `http.response.start`, and the
body in a second `write`. With `TCP_NODELAY` each write is its own send syscall and its own wake-up of the peer, so
every small JSON answer between our servers cost two of each. Here the connection's transport gathers the writes
made in one turn of the event loop and sends them together at the end of that turn (or at once past 64 KiB, so a
large streamed body does not pile up). Nothing else changes: uvicorn's parsing, flow control, keep-alive and
shutdown are its own; `close`, `write_eof` and `abort` send (or drop) what is pending first.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingHttpToolsProtocol"]

FLUSH_AT_BYTES = 64 * 1024


class _CoalescingTransport:
    """Wraps a transport: `write`s of one loop turn leave as one; everything else is the wrapped transport's."""

    __slots__ = ("_transport", "_loop", "_pending", "_size", "_scheduled")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
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
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
