"""`"stream": true` on a model server's `/v1/responses`, `/v1/chat/completions` and `/v1/messages`, for every
model server.

The routes a model server implements take non-streaming requests (`stream` may only be false, as in v0.2). This
pure-ASGI middleware, which every model server gets from the base, takes a streaming request, sends it on without
`stream` (and `stream_options`), and turns the whole answer into the API's server-sent events
(`nemo_gym/api/streaming.py`). An error answer goes back as JSON with its status, in the API's error shape
(OpenAI's `{"error": {"message", "type", "param", "code"}}`; `/v1/messages` answers in Anthropic's already), so
SDKs raise their typed exceptions. A client that hangs up
before the answer is ready cancels the call to the backend. Non-streaming requests pass through untouched.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from nemo_gym.api.streaming import (
    chat_completion_chunks,
    encode_sse,
    messages_events,
    responses_events,
)
from nemo_gym.servers.asgi_body import read_body, replay_body

__all__ = ["StreamAdapter", "openai_error_body", "error_message", "json_or_text"]

_STREAMED = {
    "/v1/responses": lambda answer, options: responses_events(answer),
    "/v1/chat/completions": lambda answer, options: chat_completion_chunks(
        answer, include_usage=bool((options or {}).get("include_usage"))
    ),
    "/v1/messages": lambda answer, options: messages_events(answer),
}
_ANTHROPIC_PATHS = {"/v1/messages"}


def error_message(data: Any) -> str:
    """The message of an error body (parsed JSON, or its text) in OpenAI's shape (`{"error": {"message"}}`),
    FastAPI's (`detail`) or any other (the whole body as JSON, at most 2000 characters)."""
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message") is not None:
            return str(error["message"])
        detail = data.get("detail")
        if detail is not None:
            return detail if isinstance(detail, str) else orjson.dumps(detail).decode()
        if isinstance(error, dict):
            return orjson.dumps(error).decode()
    text = data if isinstance(data, str) else orjson.dumps(data).decode()
    return text[:2000]


def json_or_text(raw: bytes) -> Any:
    """A body parsed as JSON, or its text when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", errors="replace")


def openai_error_body(status: int, body: bytes) -> bytes:
    """`body` in OpenAI's error shape (kept as it is when it already is)."""
    data = json_or_text(body)
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and "message" in data["error"]:
        return body
    kind = "invalid_request_error" if status < 500 else "server_error"
    return orjson.dumps({"error": {"message": error_message(data), "type": kind, "param": None, "code": None}})


class StreamAdapter:
    """See the module docstring. Safe on the hot path: `HotRoutes` re-creates it around hot calls."""

    hot_routes_compatible = True

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in _STREAMED:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        request = None
        if b'"stream"' in body:
            try:
                request = orjson.loads(body)
            except orjson.JSONDecodeError:
                request = None
        if not (isinstance(request, dict) and request.get("stream") is True):
            await self.app(scope, replay_body(body, receive), send)
            return
        del request["stream"]
        options = request.pop("stream_options", None)
        inner_body = orjson.dumps(request)
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(inner_body)).encode()))
        answer: dict = {"status": 500, "headers": [], "body": []}

        async def capture(message: dict) -> None:
            if message["type"] == "http.response.start":
                answer["status"] = message["status"]
                answer["headers"] = list(message.get("headers", ()))
            elif message["type"] == "http.response.body":
                answer["body"].append(message.get("body", b""))

        inner = asyncio.ensure_future(self.app({**scope, "headers": headers}, replay_body(inner_body, _never), capture))
        hangup = asyncio.ensure_future(_wait_for_disconnect(receive))
        try:
            await asyncio.wait({inner, hangup}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not inner.done():  # the client hung up first: stop the backend call
                inner.cancel()
            hangup.cancel()
        if inner.cancelled():
            return
        inner.result()
        status, content = answer["status"], b"".join(answer["body"])
        cookies = [(k, v) for k, v in answer["headers"] if k.lower() == b"set-cookie"]
        if status != 200:
            error = content if scope["path"] in _ANTHROPIC_PATHS else openai_error_body(status, content)
            await send({"type": "http.response.start", "status": status, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(error)).encode()), *cookies]})
            await send({"type": "http.response.body", "body": error})
            return
        events = _STREAMED[scope["path"]](orjson.loads(content), options)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"), *cookies]})
        for name, payload in events:
            await send({"type": "http.response.body", "body": encode_sse(name, payload), "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _never() -> dict:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}  # pragma: no cover


async def _wait_for_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
