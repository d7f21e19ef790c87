"""Request bodies in pure ASGI: reading one and handing it on again (what a layer that looks at the body before
the app does, `HotRoutes` and `StreamAdapter`, needs), and holding every body to the server's size limit where our
protocol does not (`BodyLimit`: plain uvicorn, `NEMO_GYM_HOT_ROUTES=0`)."""

from __future__ import annotations

from typing import Any, Callable

from nemo_gym.serving.limits import too_large_body

__all__ = ["read_body", "replay_body", "BodyLimit"]


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


class BodyLimit:
    """Pure-ASGI layer: a request body over `limit` bytes is answered 413 and never handed to the app whole.

    A `Content-Length` over the limit is refused before a byte is read; a body without one is counted as it
    arrives and refused when it passes the limit (the app then sees the client disconnect)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > limit:
                    await self._refuse(send, f"{int(value)} bytes")
                    return
                break
        seen = 0
        refused = False
        started = False

        async def counting_receive() -> dict:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    refused = True
                    if not started:
                        await self._refuse(send, f"more than {limit} bytes")
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except Exception:
            if not refused:
                raise
            # The app met the disconnect we made up (starlette's ClientDisconnect); the 413 has gone out.

    async def _refuse(self, send: Any, size: str) -> None:
        body = too_large_body(size, self.limit)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
