"""`"stream": true` on a model server's `/v1/responses`, `/v1/chat/completions` and `/v1/messages`, for every
model server.

The routes a model server implements take non-streaming requests (`stream` may only be false, as in v0.2). This
pure-ASGI middleware, which every model server gets from the base, serves a streaming request one of two ways:

- **Passed through**: a server whose backend streams opts in by defining `stream_responses(body, request)` (an
  async iterator of Responses stream event payloads, ending with `response.completed` / `response.incomplete`)
  and/or `stream_chat_completions(body, request)` (an async iterator of `chat.completion.chunk` dicts); `body` is
  the validated request (`NeMoGymResponseCreateParamsNonStreaming` / `NeMoGymChatCompletionCreateParamsNonStreaming`,
  `stream_options` kept for chat). Each event goes to the client as it comes. `/v1/messages` is converted to a
  Responses request and served from `stream_responses`, its events turned into Messages events
  (`ResponsesToMessages`, `nemo_gym/api/streaming.py`). A hook that cannot start raises `StreamRefused` with the
  error response to send; an error after the first event ends the stream with the API's error event.
- **Buffered** (servers without the hook): the request goes on without `stream` (and `stream_options`) to the
  server's own route, and the whole answer is sent as the API's events (`nemo_gym/api/streaming.py`).
- **Fallback** (a hook whose backend answers whole): when the hook's backend answers a streamed request with
  JSON instead of server-sent events (the hook raises, before its first event, `BackendDoesNotStream` or the
  `RuntimeError` of `upstream_sse` saying "the backend does not stream"), nothing has been sent yet: the request
  is served buffered instead, and the hook is no longer tried while the server runs (one log line says so), so
  only that first request costs the backend two calls.

A streamed request whose body has `NaN` / `Infinity` / `-Infinity` literals (not JSON, but Python's `json` takes
them) is refused naming the fields (422; 400 on `/v1/messages`): re-encoding would turn them into `null`.

Errors before the stream starts go back as JSON with their status, in the API's error shape (OpenAI's
`{"error": {"message", "type", "param", "code"}}`, Anthropic's on `/v1/messages`), so SDKs raise their typed
exceptions. A client that hangs up cancels the call to the backend (a passed-through backend stream is closed).
Non-streaming requests pass through untouched, with no added work. The client side, a POST to a backend that
answers server-sent events, is `nemo_gym/http/sse_client.py`'s `upstream_sse` (importable from here too).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import traceback
from typing import Any, AsyncIterator, Callable, Optional

import orjson
from pydantic import ValidationError

from nemo_gym.api.anthropic_messages import MessagesConversionError, anthropic_error, messages_to_responses_params
from nemo_gym.api.schemas import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.api.streaming import (
    DONE,
    BackendDoesNotStream,
    does_not_stream,
    ResponsesToMessages,
    chat_completion_chunks,
    encode_sse,
    messages_events,
    responses_events,
)
from nemo_gym.http.sse_client import upstream_sse  # re-exported: model servers have imported it from here
from nemo_gym.serving.body import read_body, replay_body
from nemo_gym.serving.private_api import request_with_body

__all__ = [
    "StreamAdapter",
    "StreamRefused",
    "BackendDoesNotStream",
    "upstream_sse",
    "non_finite_fields",
    "non_finite_message",
    "lenient_json",
    "messages_to_responses_request",
    "report_dropped_fields",
    "openai_error_body",
    "error_message",
    "json_or_text",
    "DROPPED_FIELDS_HEADER",
]

DROPPED_FIELDS_HEADER = "x-nemo-gym-dropped-fields"

_STREAMED = {
    "/v1/responses": lambda answer, options: responses_events(answer),
    "/v1/chat/completions": lambda answer, options: chat_completion_chunks(
        answer, include_usage=bool((options or {}).get("include_usage"))
    ),
    "/v1/messages": lambda answer, options: messages_events(answer),
}
_ANTHROPIC_PATHS = {"/v1/messages"}
_HOOKS = {
    "/v1/responses": "stream_responses",
    "/v1/messages": "stream_responses",
    "/v1/chat/completions": "stream_chat_completions",
}
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class StreamRefused(Exception):
    """Raised by a streaming hook that cannot start the stream: `response` (its status and JSON body) is sent
    instead, in the route's error shape."""

    def __init__(self, response: Any) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


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


def messages_to_responses_request(body: Any) -> tuple[dict, NeMoGymResponseCreateParamsNonStreaming, list[str]]:
    """A Messages request as (Responses params, the same validated, names of the dropped fields); raises
    `MessagesConversionError` or pydantic's `ValidationError` (both answered as HTTP 400)."""
    params, dropped = messages_to_responses_params(body)
    return params, NeMoGymResponseCreateParamsNonStreaming.model_validate(params), dropped


def report_dropped_fields(server: Any, dropped: list[str]) -> None:
    """Log the Messages request fields that have no Responses equivalent (they are also named in the answer's
    `x-nemo-gym-dropped-fields` header)."""
    name = server.get_session_middleware_key() if server is not None else "model server"
    print(f"{name} POST /v1/messages: dropped request fields with no Responses equivalent: "
          f"{', '.join(sorted(dropped))}", file=sys.stderr, flush=True)


def lenient_json(raw: bytes) -> Any:
    """`raw` parsed the way Python's `json` does, which takes the `NaN` / `Infinity` / `-Infinity` literals that
    orjson (and JSON) refuse; None when it is not JSON even so. For error paths only (slow)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def non_finite_fields(value: Any, where: str = "") -> list[str]:
    """The paths (`temperature`, `messages[0].x`) of the non-finite numbers in parsed JSON `value`."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [where or "(the body)"]
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += non_finite_fields(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += non_finite_fields(item, f"{where}[{index}]")
    return found


def non_finite_message(fields: list[str]) -> str:
    return (f"{', '.join(fields)}: must be a finite number; NaN, Infinity and -Infinity are not JSON numbers and "
            f"are refused (send a finite value, or leave the field out for the default)")


def _error_body(path: str, status: int, body: bytes) -> bytes:
    """An error body in the error shape of the API at `path`."""
    if path not in _ANTHROPIC_PATHS:
        return openai_error_body(status, body)
    data = json_or_text(body)
    if isinstance(data, dict) and data.get("type") == "error" and isinstance(data.get("error"), dict):
        return body
    return orjson.dumps(anthropic_error(status, error_message(data)))


async def _send_json(send: Any, status: int, body: bytes, headers: tuple = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


class StreamAdapter:
    """See the module docstring. `server` is the model server whose streaming hooks are used (none: buffered).
    Safe on the hot path: `HotRoutes` re-creates it around hot calls."""

    hot_routes_compatible = True
    direct_role = "stream"  # HotRoutes.answer leaves to this layer only the requests `streams` picks

    @staticmethod
    def streams(path: str, body: bytes) -> bool:
        """Whether this layer may have to answer a request (a streamed one) rather than pass it on."""
        return path in _STREAMED and b'"stream"' in body

    def __init__(self, app: Any, server: Any = None, answers_whole: Optional[set] = None) -> None:
        self.app = app
        self.server = server
        # The hooks whose backend answered a streamed request whole; a set shared by the adapters of one app
        # (FastAPI's stack and the hot routes' each make one from the same arguments).
        self._answers_whole: set[str] = answers_whole if answers_whole is not None else set()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in _STREAMED:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        request = None
        path = scope["path"]
        if self.streams(path, body):
            try:
                request = orjson.loads(body)
            except orjson.JSONDecodeError:
                request = lenient_json(body)  # NaN / Infinity literals: refused below when streamed
                fields = non_finite_fields(request) if isinstance(request, dict) and request.get("stream") is True else []
                if fields:
                    await self._refuse_non_finite(path, fields, send)
                    return
        if not (isinstance(request, dict) and request.get("stream") is True):
            await self.app(scope, replay_body(body, receive), send)
            return
        del request["stream"]
        name = _HOOKS[path]
        hook = getattr(self.server, name, None) if self.server is not None else None
        if hook is not None and name not in self._answers_whole:
            whole = await self._pass_through(hook, dict(request), scope, receive, send)
            if whole is None:
                return
            self._answers_whole.add(name)
            server = self.server.get_session_middleware_key() if hasattr(self.server, "get_session_middleware_key") \
                else type(self.server).__name__
            print(f"{server} POST {path}: {whole}. Streamed requests that `{name}` serves are answered from the "
                  f"whole answer (sent as the API's events) from now on, until this server restarts; deltas as they "
                  f"come need a backend (and a mode of this server) that streams.", file=sys.stderr, flush=True)
        await self._buffered(request, scope, receive, send)

    async def _refuse_non_finite(self, path: str, fields: list[str], send: Any) -> None:
        message = non_finite_message(fields)
        if path in _ANTHROPIC_PATHS:
            await _send_json(send, 400, orjson.dumps(anthropic_error(400, message)))
            return
        await _send_json(send, 422, orjson.dumps({"error": {
            "message": message, "type": "invalid_request_error", "param": fields[0], "code": None}}))

    # -- a backend that streams --------------------------------------------------------------------------

    async def _pass_through(self, hook: Callable, request: dict, scope: dict, receive: Any,
                            send: Any) -> Optional[BaseException]:
        """Serve the request from `hook`; None when answered (or the client hung up), else the error saying the
        backend answered whole, before anything was sent (the caller then serves it buffered)."""
        path = scope["path"]
        headers: list = []
        try:
            if path == "/v1/messages":
                params, body, dropped = messages_to_responses_request(request)
                if dropped:
                    headers.append((DROPPED_FIELDS_HEADER.encode(), ",".join(sorted(dropped)).encode()))
                    report_dropped_fields(self.server, dropped)
            elif path == "/v1/responses":
                request.pop("stream_options", None)
                params, body = request, NeMoGymResponseCreateParamsNonStreaming.model_validate(request)
            else:
                params, body = request, NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(request)
        except MessagesConversionError as exc:
            await _send_json(send, 400, orjson.dumps(anthropic_error(400, str(exc))))
            return None
        except ValidationError as exc:
            status = 400 if path in _ANTHROPIC_PATHS else 422
            kind = "does not convert to a valid Responses request" if path in _ANTHROPIC_PATHS else "is not valid"
            message = f"the request {kind}: {exc}"
            await _send_json(send, status, _error_body(path, status, orjson.dumps({"error": {"message": message}})))
            return None
        handler_request = request_with_body(scope, receive, orjson.dumps(params))
        if path == "/v1/messages":
            events = _as_messages(hook(body, handler_request), ResponsesToMessages(request.get("model")))
        elif path == "/v1/responses":
            events = _named(hook(body, handler_request))
        else:
            events = _named(hook(body, handler_request), trailer=DONE)
        outcome = await _until_hangup(self._pump(events, path, headers, send), receive)
        return outcome if isinstance(outcome, BaseException) else None

    async def _pump(self, events: AsyncIterator, path: str, headers: list, send: Any) -> Optional[BaseException]:
        """Send the hook's events; the error when the backend answered whole (nothing sent then), else None."""
        try:
            try:
                first = await events.__anext__()
            except StopAsyncIteration:
                first = None
            except StreamRefused as refused:
                status = refused.response.status_code
                await _send_json(send, status, _error_body(path, status, bytes(refused.response.body)))
                return None
            except Exception as exc:  # the traceback goes to the log, the message to the client
                if does_not_stream(exc):
                    return exc
                traceback.print_exc()
                message = orjson.dumps({"error": {"message": f"{type(exc).__name__}: {exc}"}})
                await _send_json(send, 500, _error_body(path, 500, message))
                return None
            await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *headers]})
            try:
                if first is not None:
                    await send({"type": "http.response.body", "body": encode_sse(*first), "more_body": True})
                async for name, payload in events:
                    await send({"type": "http.response.body", "body": encode_sse(name, payload), "more_body": True})
            except Exception as exc:  # the stream has started: end it with the API's error event
                traceback.print_exc()
                message = f"{type(exc).__name__}: {exc}"
                await send({"type": "http.response.body", "body": encode_sse(*_error_event(path, message)),
                            "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return None
        finally:
            await events.aclose()

    # -- a backend that answers whole ----------------------------------------------------------------------

    async def _buffered(self, request: dict, scope: dict, receive: Any, send: Any) -> None:
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

        inner = self.app({**scope, "headers": headers}, replay_body(inner_body, _never), capture)
        if await _until_hangup(inner, receive) is _HUNG_UP:
            return
        status, content = answer["status"], b"".join(answer["body"])
        passed = [(k, v) for k, v in answer["headers"] if k.lower() in (b"set-cookie", DROPPED_FIELDS_HEADER.encode())]
        if status != 200:
            path = scope["path"]
            await _send_json(send, status, content if path in _ANTHROPIC_PATHS else openai_error_body(status, content),
                             tuple(k_v for k_v in passed if k_v[0].lower() == b"set-cookie"))
            return
        events = _STREAMED[scope["path"]](orjson.loads(content), options)
        await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *passed]})
        for name, payload in events:
            await send({"type": "http.response.body", "body": encode_sse(name, payload), "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _named(payloads: AsyncIterator, trailer: Any = None) -> AsyncIterator:
    """`(event name, payload)` for a hook's payloads (Responses events are named by their `type`; chat chunks have
    no name), then `trailer` (the chat stream's `[DONE]`)."""
    try:
        async for payload in payloads:
            yield (payload.get("type") if trailer is None else None), payload
        if trailer is not None:
            yield None, trailer
    finally:
        await payloads.aclose()


async def _as_messages(payloads: AsyncIterator, translator: ResponsesToMessages) -> AsyncIterator:
    try:
        async for payload in payloads:
            for event in translator.feed(payload):
                yield event
    finally:
        await payloads.aclose()


def _error_event(path: str, message: str) -> tuple:
    if path in _ANTHROPIC_PATHS:
        return "error", anthropic_error(500, message)
    error = {"message": message, "type": "server_error", "param": None, "code": "server_error"}
    if path == "/v1/responses":
        return "error", {"type": "error", "code": "server_error", "message": message, "param": None, "error": error}
    return None, {"error": error}


_HUNG_UP = object()


async def _until_hangup(work: Any, receive: Any) -> Any:
    """Run `work` (a coroutine) until it ends or the client hangs up, which cancels it (and so the backend call);
    its result when it ended, else `_HUNG_UP`."""
    task = asyncio.ensure_future(work)
    hangup = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, hangup}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
        if not task.done():  # the client hung up first (or we are cancelled): stop the backend call
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
    if task.cancelled():
        return _HUNG_UP
    return task.result()


async def _never() -> dict:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}  # pragma: no cover


async def _wait_for_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
