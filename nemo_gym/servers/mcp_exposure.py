"""A resources server's tool routes served over MCP at `/mcp` (NeMo Gym v0.5 `nemo_gym.mcp_auto_exposure`).

Why: agents that speak MCP (Claude Code, Codex, ...) call tools over MCP, not by POSTing to `/<tool>`. A server
that sets `expose_tools_over_mcp: true` keeps its handlers as they are; `install_auto_exposure` turns its routes
into MCP tools once, at start-up:

* Tools are the `POST` routes with a fixed path, minus `/verify`, `/seed_session`, `/aggregate_metrics` and
  `/mcp`. The name is the path without its `/`, the input schema the body model's JSON schema (a permissive
  object schema without one), the description the route's. One catch-all route (`POST /{name}`) backs tools only
  when the server's `mcp_tools(harvested, catchall)` hook asks for them with `catchall.tool(...)`.
* `/seed_session` answers gain `mcp` (`MCPServerMetadata`): where the endpoint is and a signed session token
  (`X-NeMo-Gym-Session-Token`). The token carries the rollout's session id and its allowed tools
  (`mcp_allowed_tools_for_session(seed_body)`), signed with this launch's session secret (`serving/sessions.py`).
* A `tools/call` needs a valid token. The route's handler is called once, directly, with a `Request` whose
  session is `{"session_id": <the token's id>}`: the same per-rollout state the HTTP tool calls of that rollout
  see. Because the call skips the middleware, a server with middleware other than ours is refused at start-up
  (as are handler shapes a direct call cannot reproduce: dependency injection, query parameters, several or
  optional bodies); a wrong dispatch would corrupt rollouts quietly, a start-up error is a small fix.
* Failures come back as MCP tool errors `HTTP <status> from POST /<name>: <detail>`, the status and detail the
  HTTP route would have answered; dict results as JSON text plus `structuredContent`.
* `/verify` sees MCP-namespaced call names (`mcp__<server>__<tool>`) as bare tool names (`normalize_tool_name`);
  the names are put back, by `call_id`, in its answer.

The MCP side is the official SDK's low-level `Server` and `StreamableHTTPSessionManager` (stateless, JSON
responses), run in the app's lifespan. mcp 1.x and 2.x register handlers differently; `_mcp_server` is the only
place that knows. The SDK is imported only here and only when a server opts in.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Optional

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from nemo_gym.serving.hot_routes import exception_handler_for
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from nemo_gym.serving.private_api import route_shape, typed_signature
from nemo_gym.serving.sessions import SESSION_ID_KEY, decode_session_cookie, encode_session_cookie

__all__ = [
    "MCPServerMetadata",
    "NEMO_GYM_MCP_METADATA_KEY",
    "NEMO_GYM_MCP_SESSION_TOKEN_HEADER",
    "TOKEN_HEADER",
    "TOKEN_SALT",
    "MCP_URL_PATH",
    "RESERVED_TOOL_NAMES",
    "PERMISSIVE_SCHEMA",
    "MCPTool",
    "CatchAllRoute",
    "MCPToolHooks",
    "harvest_tools",
    "install_auto_exposure",
    "maybe_auto_expose",
    "mint_session_token",
    "read_session_token",
    "default_normalize_tool_name",
]

NEMO_GYM_MCP_METADATA_KEY = "mcp"
NEMO_GYM_MCP_SESSION_TOKEN_HEADER = "X-NeMo-Gym-Session-Token"
TOKEN_HEADER = NEMO_GYM_MCP_SESSION_TOKEN_HEADER
TOKEN_SALT = "nemo-gym-mcp-session-token"
MCP_URL_PATH = "/mcp"
RESERVED_TOOL_NAMES = frozenset({"verify", "seed_session", "aggregate_metrics", "mcp"})
PERMISSIVE_SCHEMA: dict = {"type": "object", "additionalProperties": True}

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]+")
_CATCH_ALL_PATH = re.compile(r"/\{[^/{}]+\}")
# What JSONResponse writes, so a tool's text is the same bytes over MCP as over HTTP.
_JSON_SEPARATORS = (",", ":")


class MCPServerMetadata(BaseModel):
    """The `mcp` entry of a `/seed_session` answer: how this rollout reaches the server's tools over MCP
    (`url_path` is relative to the server's base URL; send `headers` with every MCP request)."""

    server_name: str
    url_path: str = MCP_URL_PATH
    transport: str = "http"
    headers: dict[str, str] = {}


# -------------------------------------------------------------------------------------------------------------
# The server's hooks (defaults)


def default_normalize_tool_name(name: str, server_name: Optional[str] = None) -> str:
    """`mcp__<server>__<tool>` -> `<tool>` (the name an MCP client gives a tool of server `<server>`); other names
    unchanged. When `server_name` is known its exact prefix is tried first, so a server name with `__` works."""
    if server_name:
        prefix = f"mcp__{server_name}__"
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix) :]
    if name.startswith("mcp__"):
        _, sep, tool = name[len("mcp__") :].partition("__")
        if sep and tool:
            return tool
    return name


class MCPToolHooks:
    """The defaults of the hooks a resources server may override to shape what it serves over MCP (a mixin for
    `SimpleResourcesServer`; `install_auto_exposure` also works with servers that lack it)."""

    def mcp_tools(self, harvested: list["MCPTool"], catchall: Optional["CatchAllRoute"]) -> Optional[list["MCPTool"]]:
        """The tools to serve: by default every harvested route. Return a filtered list, append tools backed by the
        catch-all route (`catchall.tool(name, input_schema, description)`; `catchall` is None without one), or
        return None / `[]` to serve none."""
        return harvested

    def mcp_allowed_tools_for_session(self, seed_body: dict) -> Optional[list[str]]:
        """The tools one rollout may list and call, from its `/seed_session` JSON body; None: all of them."""
        return None

    def normalize_tool_name(self, name: str) -> str:
        """The tool name `/verify` should see for a function call named `name` (`mcp__<server>__<tool>` -> tool)."""
        config = getattr(self, "config", None)
        return default_normalize_tool_name(name, getattr(config, "name", None))


# -------------------------------------------------------------------------------------------------------------
# Tools and how each is called


@dataclass
class _DirectCall:
    """How to call one route handler without HTTP: which parameter takes the body (a model, a dict or none), which
    the Request, which the catch-all's path value, and how FastAPI would serialise the result."""

    endpoint: Callable[..., Any]
    body_name: Optional[str] = None
    body_type: Any = None  # a pydantic model class, or dict
    request_name: Optional[str] = None
    path_param_name: Optional[str] = None
    response_model: Any = None
    is_async: bool = True


@dataclass
class MCPTool:
    """One tool served at `/mcp`. `route_path` is the route that answers it; `problems` say why its handler cannot
    be called directly (the tool is then refused at start-up if it is served)."""

    name: str
    input_schema: dict
    description: str
    route_path: str
    call: Optional[_DirectCall] = field(default=None, repr=False)
    problems: list[str] = field(default_factory=list)
    path_value: Optional[str] = None  # the catch-all's path parameter for this tool


class CatchAllRoute:
    """The server's one parameterised POST route (e.g. `POST /{tool_name}`), handed to `mcp_tools` so a server
    whose tools live in data can serve them: `catchall.tool(name, input_schema, description)`."""

    def __init__(self, route: APIRoute, call: Optional[_DirectCall], problems: list[str]) -> None:
        self.route = route
        self.path = route.path
        self._call = call
        self._problems = problems

    def tool(self, name: str, input_schema: Optional[Mapping[str, Any]] = None, description: str = "") -> MCPTool:
        """A tool answered by this route with its path parameter set to `name`."""
        return MCPTool(
            name=name,
            input_schema=dict(input_schema) if input_schema else dict(PERMISSIVE_SCHEMA),
            description=description or f"POST /{name}",
            route_path=self.path,
            call=self._call,
            problems=list(self._problems),
            path_value=name,
        )


def _direct_call(route: APIRoute, *, catch_all: bool = False) -> tuple[Optional[_DirectCall], list[str]]:
    """How to call `route`'s handler directly, from FastAPI's own reading of its signature; or None and the
    reasons it cannot be (what a direct call would skip or could not fill in)."""
    shape = route_shape(route)
    problems: list[str] = []
    injected = [
        *(f"dependency {name!r}" for name in shape.dependencies),
        *(f"header parameter {p.name!r}" for p in shape.header_params),
        *(f"cookie parameter {p.name!r}" for p in shape.cookie_params),
        *(f"{kind} parameter {name!r}" for kind, name in shape.injected.items() if kind != "Request"),
    ]
    if injected:
        problems.append("it uses FastAPI dependency injection (" + ", ".join(injected) + ")")
    for param in shape.query_params:
        kind = "defaulted query parameter" if not param.required else "query parameter"
        problems.append(f"it takes the {kind} {param.name!r}, which an MCP call has no way to set")

    path_param_name = None
    if catch_all:
        for param in shape.path_params:
            if param.annotation is not str:
                problems.append(f"its path parameter {param.name!r} is not a `str` (the tool name is a string)")
            path_param_name = param.name
    elif shape.path_params:
        problems.append("its path has parameters")

    body_name = body_type = None
    if len(shape.body_params) > 1:
        names = ", ".join(repr(p.name) for p in shape.body_params)
        problems.append(f"it takes several body parameters ({names}); take one pydantic model")
    elif shape.body_params:
        param = shape.body_params[0]
        annotation = param.annotation
        if param.embed:
            problems.append(f"its body parameter {param.name!r} is embedded (Body(embed=True))")
        elif not param.required or _allows_none(annotation):
            problems.append(f"its body parameter {param.name!r} is optional; make it a required model")
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            body_name, body_type = param.name, annotation
        elif annotation is dict or typing.get_origin(annotation) is dict:
            body_name, body_type = param.name, dict
        else:
            problems.append(f"its body parameter {param.name!r} is a {annotation!r}, not a pydantic model or dict")
    if problems:
        return None, problems
    endpoint = shape.endpoint
    return (
        _DirectCall(
            endpoint=endpoint,
            body_name=body_name,
            body_type=body_type,
            request_name=shape.request_param_name,
            path_param_name=path_param_name,
            response_model=route.response_model,
            is_async=_is_async(endpoint),
        ),
        [],
    )


def _allows_none(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def _is_async(endpoint: Any) -> bool:
    """Whether calling `endpoint` gives a coroutine (an `async def`, or an object with an `async def __call__`)."""
    return inspect.iscoroutinefunction(endpoint) or inspect.iscoroutinefunction(getattr(endpoint, "__call__", None))


def _describe(route: APIRoute) -> str:
    return (route.description or route.summary or "").strip() or f"POST {route.path}"


def _schema(body_type: Any) -> dict:
    if isinstance(body_type, type) and issubclass(body_type, BaseModel):
        return body_type.model_json_schema()
    return dict(PERMISSIVE_SCHEMA)


def _post_routes(app: FastAPI) -> Iterable[APIRoute]:
    return (route for route in app.router.routes if isinstance(route, APIRoute) and "POST" in (route.methods or ()))


def harvest_tools(app: FastAPI, server: Any = None) -> tuple[list[MCPTool], Optional[CatchAllRoute]]:
    """The tools the app's fixed-path POST routes make (reserved routes left out) and its catch-all route, if it
    has exactly one. Handlers that cannot be called directly are kept, with their `problems`; they are refused
    only if served. ValueError for a second catch-all route."""
    tools: list[MCPTool] = []
    catch_alls: list[APIRoute] = []
    for route in _post_routes(app):
        if "{" in route.path_format:
            if _CATCH_ALL_PATH.fullmatch(route.path_format):
                catch_alls.append(route)
            continue  # other parameterised routes are not tools
        name = route.path_format[1:] if route.path_format.startswith("/") else route.path_format
        if name in RESERVED_TOOL_NAMES:
            continue
        call, problems = _direct_call(route)
        body_type = call.body_type if call is not None else _declared_body_type(route)
        tools.append(MCPTool(name, _schema(body_type), _describe(route), route.path, call, problems))
    if len(catch_alls) > 1:
        paths = ", ".join(f"POST {route.path}" for route in catch_alls)
        raise ValueError(
            f"{_server_label(server)} has {len(catch_alls)} catch-all routes ({paths}); MCP exposure can back tools "
            f"with one at most. Merge them into one route, or set expose_tools_over_mcp: false."
        )
    catchall = None
    if catch_alls:
        call, problems = _direct_call(catch_alls[0], catch_all=True)
        catchall = CatchAllRoute(catch_alls[0], call, problems)
    return tools, catchall


def _declared_body_type(route: APIRoute) -> Any:
    params = route_shape(route).body_params
    return params[0].annotation if len(params) == 1 else None


# -------------------------------------------------------------------------------------------------------------
# Start-up checks


def _server_label(server: Any) -> str:
    config = getattr(server, "config", None)
    name = getattr(config, "name", None)
    return f"{type(server).__name__} ({name!r})" if name else type(server).__name__


def _gym_middleware() -> tuple[type, ...]:
    from nemo_gym.serving.sessions import SessionCookieMiddleware
    from nemo_gym.serving.errors import NeMoGymExceptionMiddleware
    from nemo_gym.servers.rollout_context import RolloutContextMiddleware
    from nemo_gym.serving.stream_adapter import StreamAdapter

    return (SessionCookieMiddleware, RolloutContextMiddleware, NeMoGymExceptionMiddleware, StreamAdapter)


def _check_app(server: Any, app: FastAPI) -> None:
    """ValueError for an app whose tools cannot be served over MCP as they are over HTTP."""
    label = _server_label(server)
    ours = _gym_middleware()
    foreign = [m.cls for m in app.user_middleware if m.cls not in ours]
    if foreign:
        names = ", ".join(f"{getattr(c, '__module__', '?')}.{getattr(c, '__qualname__', c)}" for c in foreign)
        raise ValueError(
            f"{label} adds middleware of its own ({names}). MCP tool calls go straight to the route handler and "
            f"would skip it, so they could behave differently from HTTP calls. Do that work in the handlers (or a "
            f"helper they call) instead, or set expose_tools_over_mcp: false."
        )
    taken = [
        route
        for route in app.router.routes
        if _route_path(route) == MCP_URL_PATH or _route_path(route).startswith(MCP_URL_PATH + "/")
    ]
    if taken:
        raise ValueError(
            f"{label} already serves {_route_path(taken[0])} ({type(taken[0]).__name__}); MCP exposure serves its "
            f"tools there. Remove or move that route, or set expose_tools_over_mcp: false."
        )


def _route_path(route: BaseRoute) -> str:
    return getattr(route, "path", "") or ""


def _check_tools(server: Any, tools: list[MCPTool]) -> None:
    """ValueError naming the route and the fix for a served tool with a bad, reserved or duplicate name, or a
    handler that cannot be called directly."""
    label = _server_label(server)
    seen: dict[str, MCPTool] = {}
    for tool in tools:
        if not isinstance(tool, MCPTool):
            raise ValueError(
                f"{label}.mcp_tools() returned {tool!r}; return MCPTool items (the harvested ones, or "
                f"catchall.tool(name, input_schema, description))."
            )
        where = f"POST {tool.route_path}" + (f" (catch-all, as tool {tool.name!r})" if tool.path_value else "")
        if not _TOOL_NAME.fullmatch(tool.name or ""):
            raise ValueError(
                f"{label}: {where} would be the MCP tool {tool.name!r}, but tool names may only use letters, digits, "
                f"'_' and '-'. Rename the route (e.g. /{re.sub(r'[^A-Za-z0-9_-]+', '_', tool.name).strip('_')}) or "
                f"leave it out in mcp_tools()."
            )
        if tool.name in RESERVED_TOOL_NAMES:
            raise ValueError(
                f"{label}: {where} would be the MCP tool {tool.name!r}, a reserved name "
                f"({', '.join(sorted(RESERVED_TOOL_NAMES))}). Pick another name in mcp_tools()."
            )
        if tool.name in seen:
            raise ValueError(
                f"{label}: two MCP tools are named {tool.name!r} ({where} and POST {seen[tool.name].route_path}). "
                f"Tool names must be unique: rename one, or leave one out in mcp_tools()."
            )
        seen[tool.name] = tool
        if tool.call is None or tool.problems:
            raise ValueError(
                f"{label}: the handler of {where} cannot be called directly over MCP: "
                + "; ".join(tool.problems or ["it was not harvested from a route"])
                + ". Give it the shape `async def tool(self, body: Model)` (optionally with `request: Request`), "
                "leave it out in mcp_tools(), or set expose_tools_over_mcp: false."
            )


# -------------------------------------------------------------------------------------------------------------
# Session tokens


def _token_name(server_key: str) -> str:
    # Bound into the signature (like a cookie name): a token is valid for this server only, never as a cookie.
    return f"{TOKEN_SALT}|{server_key}"


def mint_session_token(server_key: str, session_id: str, tools: Optional[list[str]]) -> str:
    """A token for rollout `session_id` of the server whose session key is `server_key`, allowed `tools` (None:
    all), signed with this launch's session secret."""
    return encode_session_cookie({"sid": session_id, "tools": tools}, _token_name(server_key))


def read_session_token(server_key: str, token: Optional[str]) -> Optional[tuple[str, Optional[list[str]]]]:
    """(session id, allowed tools or None) of a valid token of this server; None for anything else."""
    if not token:
        return None
    claims = decode_session_cookie(token, _token_name(server_key))
    if not claims:
        return None
    session_id, tools = claims.get("sid"), claims.get("tools")
    if not isinstance(session_id, str) or not (
        tools is None or (isinstance(tools, list) and all(isinstance(t, str) for t in tools))
    ):
        return None
    return session_id, tools


def _narrow(allowed: Optional[Iterable[str]], install_allowed: Optional[Iterable[str]]) -> Optional[list[str]]:
    """The tools a session token allows: the server's answer for the rollout within the install-time allow-list
    (None on both sides: every tool)."""
    if allowed is None and install_allowed is None:
        return None
    if allowed is None:
        return list(install_allowed)  # type: ignore[arg-type]
    keep = None if install_allowed is None else set(install_allowed)
    return [name for name in dict.fromkeys(allowed) if keep is None or name in keep]


# -------------------------------------------------------------------------------------------------------------
# Calling a handler and reading what it answered


class _ToolFailure(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass
class _Outcome:
    """A tool call's result in SDK-neutral terms (the SDK adapter turns it into a `CallToolResult`)."""

    text: str
    structured: Optional[dict] = None
    is_error: bool = False


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=_JSON_SEPARATORS)


def _payload(result: Any, response_model: Any) -> Any:
    """The JSON value FastAPI would send for an endpoint's return value (validated against the response model and
    dumped by alias when the route has one)."""
    if response_model is not None:
        adapter = _adapter(response_model)
        return adapter.dump_python(adapter.validate_python(result, from_attributes=True), mode="json", by_alias=True)
    return jsonable_encoder(result)


_adapters: dict[Any, TypeAdapter] = {}


def _adapter(model: Any) -> TypeAdapter:
    """One TypeAdapter per response model (building one costs far more than using it)."""
    adapter = _adapters.get(model)
    if adapter is None:
        adapter = _adapters[model] = TypeAdapter(model)
    return adapter


def _detail(body: bytes) -> str:
    """The readable part of an error response body: FastAPI's `detail`, our exception middleware's string, or the
    body itself."""
    text = body.decode("utf-8", errors="replace")
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict) and "detail" in value:
        value = value["detail"]
    return value if isinstance(value, str) else _json_text(value)


def _response_outcome(response: Response, name: str) -> _Outcome:
    body = bytes(response.body) if getattr(response, "body", None) is not None else b""
    if response.status_code >= 400:
        return _Outcome(f"HTTP {response.status_code} from POST /{name}: {_detail(body)}", is_error=True)
    text = body.decode("utf-8", errors="replace")
    try:
        value = json.loads(text)
    except ValueError:
        return _Outcome(text)
    return _Outcome(text, value if isinstance(value, dict) else None)


class _Dispatcher:
    """Calls tools: checks the token, builds the Request, calls the handler once, maps the outcome."""

    def __init__(self, server: Any, app: FastAPI, tools: dict[str, MCPTool], allowed: Optional[list[str]]) -> None:
        from nemo_gym.serving.errors import NeMoGymExceptionMiddleware

        self.app = app
        self.tools = tools
        self.install_allowed = None if allowed is None else set(allowed)
        self.server_key = _session_key(server)
        self.errors = NeMoGymExceptionMiddleware(None, server_key=self.server_key)

    def visible(self, token: Optional[str]) -> list[MCPTool]:
        """The tools `tools/list` shows: all, narrowed by a valid token's allow-list (a missing or bad token is
        not an error here; calling needs a good one)."""
        claims = read_session_token(self.server_key, token)
        allowed = claims[1] if claims else None
        return [
            tool
            for tool in self.tools.values()
            if (allowed is None or tool.name in allowed)
            and (self.install_allowed is None or tool.name in self.install_allowed)
        ]

    async def call(self, name: str, arguments: Optional[Mapping[str, Any]], token: Optional[str]) -> _Outcome:
        if not token:
            return _Outcome(
                f"Calling {name!r} needs this rollout's session token in the {TOKEN_HEADER} header: POST "
                f"/seed_session answers it under `{NEMO_GYM_MCP_METADATA_KEY}.headers`.",
                is_error=True,
            )
        claims = read_session_token(self.server_key, token)
        if claims is None:
            return _Outcome(
                f"The {TOKEN_HEADER} header does not hold a session token of this server (it is damaged, or from "
                f"another server or an earlier launch); seed the rollout again with POST /seed_session.",
                is_error=True,
            )
        session_id, allowed = claims
        tool = self.tools.get(name)
        if (
            tool is None
            or (allowed is not None and name not in allowed)
            or (self.install_allowed is not None and name not in self.install_allowed)
        ):
            known = sorted(t.name for t in self.visible(token))
            return _Outcome(
                f"Unknown tool {name!r} for this session; the tools are: {', '.join(known) or '(none)'}.",
                is_error=True,
            )
        try:
            result = await self._run(tool, dict(arguments or {}), session_id)
        except _ToolFailure as failure:
            return _Outcome(f"HTTP {failure.status} from POST /{name}: {failure.detail}", is_error=True)
        if isinstance(result, Response):
            return _response_outcome(result, name)
        if isinstance(result, str):
            return _Outcome(result)
        return _Outcome(_json_text(result), result if isinstance(result, dict) else None)

    async def _run(self, tool: MCPTool, arguments: dict, session_id: str) -> Any:
        """The handler's answer as FastAPI would send it (its JSON value, or the `Response` it returned); a
        `_ToolFailure` with the status and detail of the error answer HTTP would have given."""
        call: _DirectCall = tool.call  # type: ignore[assignment]
        raw = _json_text(arguments).encode("utf-8")
        request = self._request(tool, raw, session_id)
        kwargs: dict[str, Any] = {}
        try:
            if call.body_name is not None:
                if call.body_type is dict:
                    kwargs[call.body_name] = arguments
                else:
                    kwargs[call.body_name] = _validate_body(call.body_type, raw, arguments)
            if call.request_name is not None:
                kwargs[call.request_name] = request
            if call.path_param_name is not None:
                kwargs[call.path_param_name] = tool.path_value
            if call.is_async:
                result = await call.endpoint(**kwargs)
            else:
                result = await run_in_threadpool(call.endpoint, **kwargs)
            return result if isinstance(result, Response) else _payload(result, call.response_model)
        except Exception as exc:
            status, detail = await self._error_answer(exc, request)
            raise _ToolFailure(status, detail) from exc

    def _request(self, tool: MCPTool, raw: bytes, session_id: str) -> Request:
        """The Request the handler gets: a POST to its route with the arguments as JSON body and this rollout's
        session, as the session middleware would have decoded it."""
        call: _DirectCall = tool.call  # type: ignore[assignment]
        path = "/" + tool.path_value if tool.path_value is not None else tool.route_path
        path_params = {call.path_param_name: tool.path_value} if call.path_param_name is not None else {}
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode("utf-8"),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
            "app": self.app,
            "path_params": path_params,
            "session": {SESSION_ID_KEY: session_id},
            "state": {},
        }
        sent = False

        async def receive() -> dict:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        return Request(scope, receive)

    async def _error_answer(self, exc: Exception, request: Request) -> tuple[int, str]:
        """(status, detail) of what the HTTP route would have answered for `exc`: the app's exception handler for
        it (FastAPI's for HTTPException and validation errors), else our exception middleware's 500."""
        handler = exception_handler_for(self.app, exc)
        if handler is not None:
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
            return response.status_code, _detail(bytes(getattr(response, "body", b"") or b""))
        return 500, self.errors.describe(exc, request.scope)



def _validate_body(model: type[BaseModel], raw: bytes, arguments: dict) -> BaseModel:
    """The body model from the arguments, or the RequestValidationError FastAPI raises (its 422 follows)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=arguments) from None


def _session_key(server: Any) -> str:
    key = getattr(server, "get_session_middleware_key", None)
    return key() if callable(key) else type(server).__name__


# -------------------------------------------------------------------------------------------------------------
# Wrapping /seed_session and /verify


def _find_route(app: FastAPI, path: str) -> Optional[tuple[int, APIRoute]]:
    for index, route in enumerate(app.router.routes):
        if isinstance(route, APIRoute) and route.path == path and "POST" in (route.methods or ()):
            return index, route
    return None


def _rewrap(app: FastAPI, index: int, route: APIRoute, make: Callable, response_model: Any) -> None:
    """Replace `route` (at `index`) by one whose endpoint is `make(call_original, request_name)`, taking the same
    parameters as the original (plus a Request when it has none), so FastAPI validates and injects exactly as
    before."""
    original = route_shape(route).endpoint
    signature = typed_signature(original)
    params = list(signature.parameters.values())
    request_name = next((p.name for p in params if p.annotation is Request), None)
    added = request_name is None
    if added:
        request_name = "nemo_gym_mcp_request"
        extra = inspect.Parameter(request_name, inspect.Parameter.KEYWORD_ONLY, annotation=Request)
        cut = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
        params.insert(cut, extra)
    is_async = _is_async(original)

    async def call_original(kwargs: dict) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if not (added and k == request_name)}
        if is_async:
            return await original(**kwargs)
        return await run_in_threadpool(original, **kwargs)

    endpoint = make(call_original, request_name)
    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = getattr(original, "__name__", route.name)
    endpoint.__doc__ = getattr(original, "__doc__", None)
    app.router.routes[index] = APIRoute(
        route.path,
        endpoint,
        response_model=response_model,
        status_code=route.status_code,
        tags=route.tags,
        dependencies=route.dependencies,
        summary=route.summary,
        description=route.description,
        response_description=route.response_description,
        responses=route.responses,
        deprecated=route.deprecated,
        name=route.name,
        methods=route.methods,
        operation_id=route.operation_id,
        include_in_schema=route.include_in_schema,
        response_class=route.response_class,
    )


def _wrap_seed_session(server: Any, app: FastAPI, install_allowed: Optional[list[str]]) -> None:
    found = _find_route(app, "/seed_session")
    if found is None:
        return
    index, route = found
    server_key = _session_key(server)
    server_name = getattr(getattr(server, "config", None), "name", None) or type(server).__name__
    hook = getattr(server, "mcp_allowed_tools_for_session", None)
    response_model = route.response_model

    def make(call_original: Callable, request_name: str) -> Callable:
        async def seed_session(**kwargs: Any) -> Any:
            result = await call_original(kwargs)
            if isinstance(result, Response):
                return result
            payload = _payload(result, response_model)
            if not isinstance(payload, dict) or NEMO_GYM_MCP_METADATA_KEY in payload:
                return payload
            request: Request = kwargs[request_name]
            allowed = None
            if callable(hook):
                allowed = hook(await _json_body(request))
                if inspect.isawaitable(allowed):
                    allowed = await allowed
            token = mint_session_token(server_key, request.session[SESSION_ID_KEY], _narrow(allowed, install_allowed))
            metadata = MCPServerMetadata(server_name=server_name, headers={TOKEN_HEADER: token})
            return {**payload, NEMO_GYM_MCP_METADATA_KEY: metadata.model_dump()}

        return seed_session

    _rewrap(app, index, route, make, response_model=None)


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _output_items(value: Any) -> list:
    """`response.output` of a verify request or answer (model or dict); [] when it has none."""
    response = value.get("response") if isinstance(value, dict) else getattr(value, "response", None)
    output = response.get("output") if isinstance(response, dict) else getattr(response, "output", None)
    return output if isinstance(output, list) else []


def _item_get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def _item_set(item: Any, key: str, value: Any) -> None:
    if isinstance(item, dict):
        item[key] = value
    else:
        setattr(item, key, value)


def _rename_calls(value: Any, rename: Callable[[str], str]) -> dict[Any, str]:
    """Rename the function calls of `value`'s `response.output` in place; {call_id: the name before} of those
    renamed."""
    renamed: dict[Any, str] = {}
    for item in _output_items(value):
        if _item_get(item, "type") != "function_call":
            continue
        name = _item_get(item, "name")
        if not isinstance(name, str):
            continue
        bare = rename(name)
        if bare != name:
            _item_set(item, "name", bare)
            renamed[_item_get(item, "call_id")] = name
    return renamed


def _restore_calls(value: Any, renamed: dict[Any, str]) -> None:
    for item in _output_items(value):
        if _item_get(item, "type") == "function_call" and _item_get(item, "call_id") in renamed:
            _item_set(item, "name", renamed[_item_get(item, "call_id")])


def _wrap_verify(server: Any, app: FastAPI) -> None:
    found = _find_route(app, "/verify")
    if found is None:
        return
    index, route = found
    body_params = route_shape(route).body_params
    body_name = body_params[0].name if len(body_params) == 1 else None
    hook = getattr(server, "normalize_tool_name", None)
    server_name = getattr(getattr(server, "config", None), "name", None)
    normalize = hook if callable(hook) else (lambda name: default_normalize_tool_name(name, server_name))

    def make(call_original: Callable, request_name: str) -> Callable:
        async def verify(**kwargs: Any) -> Any:
            renamed = _rename_calls(kwargs.get(body_name), normalize) if body_name else {}
            result = await call_original(kwargs)
            if not renamed:
                return result
            if isinstance(result, JSONResponse):
                data = json.loads(bytes(result.body))
                _restore_calls(data, renamed)
                return JSONResponse(data, status_code=result.status_code)
            _restore_calls(result, renamed)
            return result

        return verify

    _rewrap(app, index, route, make, response_model=route.response_model)


# -------------------------------------------------------------------------------------------------------------
# The MCP endpoint


def _headers_of(request: Any) -> Mapping[str, str]:
    headers = getattr(request, "headers", None)
    return headers if headers is not None else {}


def _mcp_server(
    name: str,
    list_tools: Callable[[Optional[str]], list[MCPTool]],
    call_tool: Callable[[str, Optional[Mapping[str, Any]], Optional[str]], Awaitable[_Outcome]],
) -> Any:
    """The SDK's low-level `Server` answering `tools/list` and `tools/call` with our two functions (each given the
    session token header of the HTTP request, or None).

    The one place mcp 1.x and 2.x differ: 2.x takes the handlers as `on_list_tools` / `on_call_tool` constructor
    arguments, each called with (context, params), the HTTP request at `context.request`, and expects a
    `CallToolResult`. 1.x registers them with the `list_tools()` / `call_tool()` decorators, finds the HTTP
    request at `server.request_context.request`, and (from 1.10 on) builds the result itself from a
    `(content, structured)` pair; an exception becomes an error result whose text is the exception's message
    (the only error form every 1.x release takes)."""
    from mcp import types
    from mcp.server.lowlevel import Server

    def as_tools(tools: list[MCPTool]) -> list:
        return [types.Tool(name=t.name, description=t.description, inputSchema=t.input_schema) for t in tools]

    def content(outcome: _Outcome) -> list:
        return [types.TextContent(type="text", text=outcome.text)]

    if "on_call_tool" in inspect.signature(Server.__init__).parameters:  # mcp 2.x

        async def on_list_tools(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult(tools=as_tools(list_tools(_token(ctx.request))))

        async def on_call_tool(ctx: Any, params: Any) -> Any:
            outcome = await call_tool(params.name, params.arguments, _token(ctx.request))
            return types.CallToolResult(
                content=content(outcome), structuredContent=outcome.structured, isError=outcome.is_error
            )

        return Server(name, on_list_tools=on_list_tools, on_call_tool=on_call_tool)

    server = Server(name)  # mcp 1.x

    @server.list_tools()
    async def handle_list_tools() -> list:
        return as_tools(list_tools(_token(server.request_context.request)))

    @server.call_tool(validate_input=False)  # the handler's own validation answers (422), as over HTTP
    async def handle_call_tool(tool_name: str, arguments: Optional[dict]) -> Any:
        outcome = await call_tool(tool_name, arguments, _token(server.request_context.request))
        if outcome.is_error:
            raise _MCPToolError(outcome.text)
        return (content(outcome), outcome.structured) if outcome.structured is not None else content(outcome)

    return server


class _MCPToolError(Exception):
    """Raised in the mcp 1.x handler so the SDK answers an error result with exactly this text."""


def _token(request: Any) -> Optional[str]:
    return _headers_of(request).get(TOKEN_HEADER)


class _MCPEndpoint:
    """The ASGI app at `/mcp`: the SDK's session manager while the app's lifespan runs (a new manager per
    lifespan, since one can run only once), else a 503 that says why."""

    def __init__(self, mcp_server: Any) -> None:
        self.mcp_server = mcp_server
        self.manager: Any = None

    def new_manager(self) -> Any:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings

        return StreamableHTTPSessionManager(
            app=self.mcp_server,
            json_response=True,
            stateless=True,
            # Host and Origin are checked for every request of the server, /mcp included, before it gets here
            # (serving/host_check.py: the config's hosts and allowed_hosts, which the SDK's list cannot follow).
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.manager is None:
            response = JSONResponse(
                {"detail": "the MCP endpoint runs inside the app's lifespan, which has not started (serve the app "
                           "with lifespan events on, e.g. uvicorn's default lifespan='auto')"},
                status_code=503,
            )
            await response(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)


def _mount(app: FastAPI, endpoint: _MCPEndpoint) -> None:
    """`/mcp` (and anything under it) at the front of the routes, and the session manager in the app's lifespan."""
    app.router.routes[0:0] = [Route(MCP_URL_PATH, endpoint), Mount(MCP_URL_PATH, app=endpoint)]
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(lifespan_app: Any):
        manager = endpoint.new_manager()
        async with manager.run():
            endpoint.manager = manager
            try:
                async with inner(lifespan_app) as state:
                    yield state
            finally:
                endpoint.manager = None

    app.router.lifespan_context = lifespan


# -------------------------------------------------------------------------------------------------------------
# Entry points


def install_auto_exposure(server: Any, app: FastAPI, allowed_tools: Optional[list[str]] = None) -> dict[str, MCPTool]:
    """Serve `server`'s tool routes over MCP at `/mcp` of `app` (the app `setup_webserver()` built): harvest the
    tools, ask the server's `mcp_tools` hook, check them, wrap `/seed_session` and `/verify`, mount `/mcp`.
    `allowed_tools` narrows every session to those tools. Returns {tool name: MCPTool}. ValueError (naming the
    route and the fix) for an app that cannot be served as it is."""
    _check_app(server, app)
    harvested, catchall = harvest_tools(app, server)
    hook = getattr(server, "mcp_tools", None)
    chosen = hook(harvested, catchall) if callable(hook) else harvested
    tools = list(chosen or [])
    _check_tools(server, tools)
    tool_map = {tool.name: tool for tool in tools}

    _wrap_seed_session(server, app, allowed_tools)
    _wrap_verify(server, app)

    dispatcher = _Dispatcher(server, app, tool_map, allowed_tools)
    name = getattr(getattr(server, "config", None), "name", None) or type(server).__name__
    _mount(app, _MCPEndpoint(_mcp_server(name, dispatcher.visible, dispatcher.call)))
    return tool_map


def maybe_auto_expose(server: Any, app: FastAPI) -> Optional[dict[str, MCPTool]]:
    """`install_auto_exposure(server, app)` when the server's config says `expose_tools_over_mcp: true`, else None."""
    if not getattr(getattr(server, "config", None), "expose_tools_over_mcp", False):
        return None
    return install_auto_exposure(server, app)
