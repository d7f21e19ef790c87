"""Reading a request body in pure ASGI and handing it on again: what a layer that looks at the body before the
app does (`HotRoutes`, `StreamAdapter`) needs."""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["read_body", "replay_body"]


async def read_body(receive: Any) -> bytes:
    """The whole body of the request (empty when the client hung up first)."""
    message = await receive()
    if message["type"] != "http.request":
        return b""
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    chunks = [body]
    while message.get("more_body", False):
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


def replay_body(body: bytes, receive: Any) -> Callable[[], Any]:
    """A `receive` that hands the already-read body out once, then passes on the connection's own messages
    (a disconnect)."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
