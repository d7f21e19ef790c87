"""The other dialects on top of a server's own Responses route: Anthropic Messages and streaming.

`DialectsMixin` gives a server (every model server, and every agent server, whose `/v1/responses` runs a whole
episode) `POST /v1/messages`: the Messages request is converted to Responses create params
(`nemo_gym/api/anthropic_messages.py`), the server's own `responses` runs, and its Response is converted back;
errors answer in Anthropic's shape. It also installs `StreamAdapter` (`serving/stream_adapter.py`), which serves
`"stream": true` on `/v1/responses`, `/v1/chat/completions` and `/v1/messages` as each API's events: passed through
from the backend when the server defines the streaming hooks (`stream_responses`, `stream_chat_completions`),
else buffered. So a harness written against either SDK can be pointed at a model server or at an agent alike.
"""

from __future__ import annotations

import inspect
import traceback
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.middleware import Middleware

from nemo_gym.api.anthropic_messages import (
    MessagesConversionError,
    anthropic_error,
    response_to_message,
)
from nemo_gym.serving.private_api import request_with_body
from nemo_gym.serving.stream_adapter import (
    DROPPED_FIELDS_HEADER,
    StreamAdapter,
    error_message,
    json_or_text,
    lenient_json,
    messages_to_responses_request,
    non_finite_fields,
    non_finite_message,
    report_dropped_fields,
)

__all__ = ["DialectsMixin", "MESSAGES_PATH", "DROPPED_FIELDS_HEADER"]

MESSAGES_PATH = "/v1/messages"


class DialectsMixin:
    """Mix in before the server base class (it extends `prepare_app`); the server must define `responses`."""

    def prepare_app(self, app: FastAPI) -> FastAPI:
        """Add `POST /v1/messages` (unless the server defines its own) and streaming on the three routes
        (`serving/stream_adapter.py`), then the usual final steps. The stream adapter is the innermost middleware:
        inside the session middleware, so a server's streaming hooks see the session (and its cookie is set on
        the stream)."""
        if not any(getattr(route, "path", None) == MESSAGES_PATH for route in app.router.routes):
            app.post(MESSAGES_PATH, include_in_schema=True)(self.messages)
        if not any(middleware.cls is StreamAdapter for middleware in app.user_middleware):
            # One set for every adapter made from these arguments: which hooks' backends answer streams whole.
            app.user_middleware.append(Middleware(StreamAdapter, server=self, answers_whole=set()))
        return super().prepare_app(app)

    async def messages(self, request: Request) -> Response:
        """One Anthropic Messages call: converted to a Responses call on this server and back; errors in
        Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`) with the status the SDKs expect."""
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            fields = non_finite_fields(lenient_json(await request.body()))  # NaN / Infinity literals
            if fields:
                return _anthropic_error_response(400, non_finite_message(fields))
            return _anthropic_error_response(400, f"the request body is not JSON: {exc}")
        try:
            params, validated, dropped = messages_to_responses_request(body)
        except MessagesConversionError as exc:
            return _anthropic_error_response(400, str(exc))
        except ValidationError as exc:
            return _anthropic_error_response(400, f"the request does not convert to a valid Responses request: {exc}")
        if dropped:
            report_dropped_fields(self, dropped)
        try:
            result = await self.responses(**self._responses_arguments(_request_with_body(request, params), validated))
        except Exception as exc:  # answered in Anthropic's shape; the traceback goes to the log
            traceback.print_exc()
            return _anthropic_error_response(500, f"{type(exc).__name__}: {exc}")
        if isinstance(result, Response):
            data = json_or_text(result.body)
            if result.status_code >= 400:
                return _anthropic_error_response(result.status_code, error_message(data))
        elif isinstance(result, BaseModel):
            data = result.model_dump(mode="json", exclude_none=True)
        else:
            data = result
        if not isinstance(data, dict):
            return _anthropic_error_response(500, f"the model server's Response is not an object: {str(data)[:500]}")
        headers = {DROPPED_FIELDS_HEADER: ",".join(sorted(dropped))} if dropped else None
        return Response(orjson.dumps(response_to_message(data, body.get("model"))), media_type="application/json", headers=headers)

    def _responses_arguments(self, request: Request, body: Any) -> dict:
        """Keyword arguments for this server's `responses`: the validated body, and the `Request` if it takes one."""
        arguments = {}
        for name, parameter in inspect.signature(self.responses).parameters.items():
            annotation = parameter.annotation
            if annotation is Request or annotation == "Request" or name == "request":
                arguments[name] = request
            else:
                arguments[name] = body
        return arguments


def _request_with_body(request: Request, params: dict) -> Request:
    """The request as the server's `responses` should see it: the same connection, with the converted Responses
    params as its body (handlers that read the raw body, like simple_agent's, get the Responses request)."""
    return request_with_body(request.scope, request.receive, orjson.dumps(params))


def _anthropic_error_response(status: int, message: str) -> Response:
    return Response(orjson.dumps(anthropic_error(status, message)), status_code=status, media_type="application/json")
