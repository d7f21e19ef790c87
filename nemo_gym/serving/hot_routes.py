"""Hot routes: answer a FastAPI app's plain `POST` routes without FastAPI's per-request machinery.

Why: a rollout is a handful of small JSON POSTs between our own servers, and on those FastAPI's generic path
(its middleware stack, routing, dependency solving, stdlib JSON parsing, then validating the parsed dict) cost
more CPU than the work itself. `HotRoutes` wraps the app that uvicorn serves. For a route that qualifies it reads
the body, validates it with pydantic straight from the JSON bytes, calls the endpoint, and serialises the answer
the way FastAPI would; the session and exception middlewares the app was given still wrap every call. The app
itself is unchanged (tests that use `TestClient(app)` see plain FastAPI), and so are the routes' names, schemas
and answers.

A route qualifies when it is an `async def` `APIRoute` for `POST` whose parameters are at most one JSON body (not
embedded) and the `Request`, with no dependencies, no `Response`/`BackgroundTasks` parameters and the default
response class; and only while the app has no middleware and no exception handlers beyond ours and FastAPI's
defaults, and no dependency overrides. Anything else, and any request the fast path cannot answer exactly as
FastAPI would (a body that is empty, not JSON, or fails validation: FastAPI then answers its usual 422 and our log
line names the errors), goes to the FastAPI app untouched.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import (
    RequestValidationError,
    ResponseValidationError,
    WebSocketRequestValidationError,
)
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nemo_gym.serving.body import read_body, replay_body
from nemo_gym.serving.host_check import HostPolicy, send_refusal
from nemo_gym.serving.private_api import request_with_body, route_shape

__all__ = ["HotRoutes", "exception_handler_for"]

_ROUTE_KEY = "nemo_gym.hot_route"
_VALUE_KEY = "nemo_gym.hot_body"
_BODY_KEY = "nemo_gym.hot_raw_body"
_DEFAULT_HANDLERS = {HTTPException, RequestValidationError, WebSocketRequestValidationError}


class _HotRoute:
    """What the fast path needs of one route, worked out once."""

    __slots__ = ("route", "endpoint", "body_name", "validate", "request_name", "status", "serialize")

    def __init__(
        self, route: APIRoute, endpoint: Any, body_name: Optional[str], body_type: Any, request_name: Optional[str]
    ):
        self.route = route
        self.endpoint = endpoint
        self.body_name = body_name
        self.validate: Optional[Callable[[bytes], Any]] = None
        if body_name is not None:
            if isinstance(body_type, type) and issubclass(body_type, BaseModel):
                self.validate = body_type.model_validate_json
            else:
                self.validate = TypeAdapter(body_type).validate_json
        self.request_name = request_name
        self.status = route.status_code or 200
        self.serialize = _serializer(route.response_model)


def _serializer(response_model: Any) -> Callable[[Any], bytes]:
    """The JSON body FastAPI would send for an endpoint's return value (not a `Response`): validated against the
    declared response model (so it decides which fields go out) and dumped by alias; without one, FastAPI's
    `jsonable_encoder`."""
    if response_model is None:
        encoder = JSONResponse(None)

        def serialize_plain(result: Any) -> bytes:
            return encoder.render(jsonable_encoder(result))

        return serialize_plain
    adapter = TypeAdapter(response_model)

    def serialize(result: Any) -> bytes:
        try:
            value = adapter.validate_python(result, from_attributes=True)
        except ValidationError as exc:
            errors = [{**error, "loc": ("response", *error["loc"])} for error in exc.errors(include_url=False)]
            raise ResponseValidationError(errors, body=result) from None
        return adapter.dump_json(value, by_alias=True)

    return serialize


def _hot_route(route: Any) -> Optional[_HotRoute]:
    """The fast-path description of `route`, or None when FastAPI must serve it."""
    if not isinstance(route, APIRoute) or set(route.methods or ()) != {"POST"}:
        return None
    if "{" in route.path_format:
        return None
    shape = route_shape(route)
    if not shape.default_response_class:
        return None
    endpoint = shape.endpoint
    if not inspect.iscoroutinefunction(endpoint) or inspect.isasyncgenfunction(endpoint):
        return None
    if (
        shape.path_params or shape.query_params or shape.header_params or shape.cookie_params or shape.dependencies
        or set(shape.injected) - {"Request"}
    ):
        return None
    body_params = shape.body_params
    if len(body_params) > 1:
        return None
    body_name = body_type = None
    if body_params:
        param = body_params[0]
        if param.embed or param.media_type != "application/json":
            return None
        body_name, body_type = param.name, param.annotation
    return _HotRoute(route, endpoint, body_name, body_type, shape.request_param_name)


def _app_is_plain(app: FastAPI, own_middleware: tuple[type, ...]) -> bool:
    """No middleware, exception handler or dependency override the fast path would skip."""
    if app.dependency_overrides or app.router.dependencies:
        return False
    if any(
        middleware.cls not in own_middleware and not getattr(middleware.cls, "hot_routes_compatible", False)
        for middleware in _middleware_to_recreate(app)
    ):
        return False
    return all(key in _DEFAULT_HANDLERS for key in app.exception_handlers)


def exception_handler_for(app: FastAPI, exc: Exception) -> Any:
    """The app's handler for `exc` (FastAPI's defaults unless the app replaced them), as FastAPI picks it; None
    when the exception is not handled (our exception middleware answers 500)."""
    handlers = app.exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    if isinstance(exc, HTTPException):
        return http_exception_handler
    if isinstance(exc, RequestValidationError):
        return request_validation_exception_handler
    return None


def _middleware_to_recreate(app: FastAPI) -> list:
    """The app's middleware minus what only acts on paths that are never hot (`hot_routes_transparent`, e.g. the
    rollout-prefix middleware: a prefixed path is not an exact hot path, so FastAPI's whole stack answers it)."""
    return [m for m in app.user_middleware if not getattr(m.cls, "hot_routes_transparent", False)]


class HotRoutes:
    """The ASGI app uvicorn serves: hot routes answered directly, everything else by `app`.

    `own_middleware` are the middleware classes the fast path re-creates (with the app's own arguments) around
    every hot call, as are classes that say `hot_routes_compatible = True` (pure ASGI, no per-app state); an app
    with any other middleware gets no hot routes at all. `hosts`, when given, refuses requests that name another
    host or come from another site's page (`serving/host_check.py`), on both paths."""

    def __init__(self, app: FastAPI, own_middleware: tuple[type, ...], hosts: Optional[HostPolicy] = None) -> None:
        self.app = app
        self.hosts = hosts
        self.routes: dict[str, _HotRoute] = {}
        self.pipeline: Any = None
        self.direct: Optional[_DirectLayers] = None  # our own middleware, when the direct path may do their work
        self.raw_paths: dict[bytes, _HotRoute] = {}
        if not _app_is_plain(app, own_middleware):
            return
        for route in app.router.routes:
            hot = _hot_route(route)
            if hot is not None and route.path_format not in self.routes:
                self.routes[route.path_format] = hot
        pipeline: Any = self._endpoint
        layers = []
        for middleware in reversed(_middleware_to_recreate(app)):  # user_middleware[0] is the outermost
            cls, args, kwargs = middleware
            pipeline = cls(pipeline, *args, **kwargs)
            layers.append(pipeline)
        self.pipeline = pipeline
        self.direct = _DirectLayers.of(layers[::-1])
        self.raw_paths = {path.encode("ascii"): hot for path, hot in self.routes.items() if path.isascii()}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        hosts = self.hosts
        if hosts is not None and scope["type"] != "lifespan":
            refused = hosts.refusal(scope["headers"])
            if refused is not None:
                if self.direct is not None:
                    self.direct.errors.log_status(scope, refused[0])
                await send_refusal(scope, send, refused)
                return
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        hot = self.routes.get(scope["path"])
        if hot is None:
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        replay = replay_body(body, receive)
        if not self._enter(scope, hot, body):
            await self.app(scope, replay, send)  # FastAPI answers (a 422 is logged by our handler)
            return
        await self.pipeline(scope, replay, send)

    def _enter(self, scope: dict, hot: _HotRoute, body: bytes) -> bool:
        """Validate the body for `hot` and put into the scope what FastAPI's routing would, and what we keep there;
        False (nothing put) when FastAPI must answer instead: no body, not JSON, or invalid."""
        if hot.validate is not None:
            if not body or not _is_json(scope["headers"]):
                return False
            try:
                scope[_VALUE_KEY] = hot.validate(body)
            except ValidationError:
                return False
        scope["app"] = self.app
        scope["path_params"] = {}
        scope["route"] = hot.route
        scope["endpoint"] = hot.endpoint
        scope[_ROUTE_KEY] = hot
        scope[_BODY_KEY] = body
        return True

    async def _endpoint(self, scope: dict, receive: Any, send: Any) -> None:
        result = await self._run_endpoint(scope[_ROUTE_KEY], scope, receive)
        if isinstance(result, Response):
            await result(scope, receive, send)
            return
        content = scope[_ROUTE_KEY].serialize(result)
        await send({"type": "http.response.start", "status": scope[_ROUTE_KEY].status, "headers": _json_headers(content)})
        await send({"type": "http.response.body", "body": content})

    async def _run_endpoint(self, hot: _HotRoute, scope: dict, receive: Any) -> Any:
        """The endpoint's return value, or the `Response` of the app's handler for what it raised (as FastAPI
        picks it); an exception without a handler propagates."""
        kwargs: dict = {}
        request: Optional[Request] = None
        if hot.body_name is not None:
            kwargs[hot.body_name] = scope[_VALUE_KEY]
        if hot.request_name is not None:
            request = request_with_body(scope, receive, scope[_BODY_KEY])  # no second read of the stream
            kwargs[hot.request_name] = request
        try:
            return await hot.endpoint(**kwargs)
        except Exception as exc:
            handler = exception_handler_for(self.app, exc)
            if handler is None:
                raise  # to the exception middleware, as on FastAPI's path
            if request is None:
                request = Request(scope, receive)
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
            return response

    # -- the direct path: a whole request in hand, answered in one call (serving/private_api.py) -----------

    def route_for(self, raw_path: bytes) -> Optional[_HotRoute]:
        """The hot route a request target names exactly (no query, no escapes), when the direct path may serve it."""
        return self.raw_paths.get(raw_path) if self.direct is not None else None

    async def answer(self, hot: _HotRoute, scope: dict, body: bytes, responder: Any) -> None:
        """Answer a hot request whose whole body is in hand: what the ASGI path (middleware chain, `__call__`,
        `_endpoint`) does, in one call, with the same answers, cookies, logs and error bodies. `responder` writes
        a whole response (`respond(status, headers, body)`) or serves the request through uvicorn's own cycle
        (`await asgi(app)`), which is where everything unusual goes: a body that is not valid JSON for the route
        (FastAPI answers), a streamed request, an endpoint's streaming or background `Response`."""
        direct: _DirectLayers = self.direct
        hosts = self.hosts
        if hosts is not None:
            refused = hosts.refusal(scope["headers"])
            if refused is not None:
                direct.errors.log_status(scope, refused[0])
                responder.respond(*refused)
                return
        if direct.stream is not None and direct.stream.streams(scope["path"], body):
            await responder.asgi(self)
            return
        if not self._enter(scope, hot, body):
            await responder.asgi(self.app)  # FastAPI answers, as `__call__` would after the same check fails
            return
        errors, sessions = direct.errors, direct.sessions
        try:
            opened = None
            if sessions is not None:
                opened = sessions.open(scope)
                if opened is None:
                    status, headers, content = sessions.refusal()
                    errors.log_status(scope, status)
                    responder.respond(status, headers, content)
                    return
            result = await self._run_endpoint(hot, scope, responder.receive)
            if isinstance(result, Response):
                if type(result).__call__ is not Response.__call__ or result.background is not None:
                    await responder.asgi(_SendResponse(result, errors, sessions, opened))
                    return
                status, headers, content = result.status_code, list(result.raw_headers), result.body
            else:
                status, content = hot.status, hot.serialize(result)
                headers = _json_headers(content)
            if sessions is not None:
                headers.append((b"set-cookie", sessions.cookie(scope["session"], opened)))
        except Exception as exc:
            status, headers, content = errors.error_answer(exc, scope, response_started=False)
            responder.respond(status, headers, content)
            return
        errors.log_status(scope, status)
        responder.respond(status, headers, content)


def _is_json(headers: Any) -> bool:
    """A JSON content type (without one, FastAPI versions differ: they decide)."""
    for key, value in headers:
        if key == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return False


def _json_headers(content: bytes) -> list:
    return [(b"content-length", str(len(content)).encode()), (b"content-type", b"application/json")]


class _DirectLayers:
    """Our own middleware, in the order `HotRoutes.answer` does their work: errors outermost, then sessions, then
    the streaming adapter (each optional but the first)."""

    __slots__ = ("errors", "sessions", "stream")

    def __init__(self, errors: Any, sessions: Any, stream: Any) -> None:
        self.errors = errors
        self.sessions = sessions
        self.stream = stream

    @classmethod
    def of(cls, layers: list) -> Optional["_DirectLayers"]:
        """The layers (outermost first) when they are exactly ours in that order, else None (no direct path)."""
        order = ("errors", "session", "stream")
        roles = [getattr(type(layer), "direct_role", None) for layer in layers]
        if not roles or roles[0] != "errors" or not set(roles) <= set(order) or roles != sorted(set(roles), key=order.index):
            return None
        by_role = dict(zip(roles, layers))
        return cls(by_role["errors"], by_role.get("session"), by_role.get("stream"))


class _SendResponse:
    """The ASGI app that sends an endpoint's `Response` the direct path could not write in one piece (streaming,
    background tasks) through uvicorn's cycle, with the session cookie, access line and error handling the
    middleware would have given it."""

    def __init__(self, response: Response, errors: Any, sessions: Any, opened: Any) -> None:
        self.response = response
        self.errors = errors
        self.sessions = sessions
        self.opened = opened

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        async def send_response(scope: dict, receive: Any, send: Any) -> None:
            if self.sessions is not None:
                send = self.sessions.cookie_sender(scope, self.opened, send)
            await self.response(scope, receive, send)

        await self.errors.guard(send_response, scope, receive, send)
