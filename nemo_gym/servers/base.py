"""Server base classes: `BaseServer` / `SimpleServer` (FastAPI app, sessions, errors, health, running).

Environment code imports these names from the NeMo Gym v0.2 path `nemo_gym.server_utils`, which re-exports
this module: `SESSION_ID_KEY`, `BaseServer`, `SimpleServer`, and the client helpers `ServerClient`, `raise_for_status`, `get_response_json`
(plus `NeMoGymHTTPError`, `BaseServerConfig`, `BaseRunServerInstanceConfig`).

How a server subclass is written (unchanged from the reference)::

    class MyServer(SimpleResourcesServer):
        config: MyConfig

        def setup_webserver(self) -> FastAPI:
            app = super().setup_webserver()          # FastAPI() + session middleware + base routes
            app.post("/get_weather")(self.get_weather)
            return app

    if __name__ == "__main__":
        MyServer.run_webserver()

`run_webserver()` then adds everything else through `prepare_app(app)`: `GET /health`, request-validation
logging, and the outermost exception middleware. Per request the stack is exactly two pure-ASGI layers of
ours (errors outside, sessions inside) around FastAPI's router, because stacked `BaseHTTPMiddleware` layers
and cookie handling were where the reference spent its CPU per request.

Errors (outermost middleware):

* An exception carrying `response_content` (a `NeMoGymHTTPError` from `raise_for_status` on an inner server
  call) -> HTTP 500, JSON string body `"Hit an exception in <ClassName>___<server_id> calling an inner
  server: <inner body>"` (the reference's text).
* Any other `Exception` -> HTTP 500, JSON string body `"<ExceptionType>: <message>"`. This is richer than
  the reference's `repr(exc)`: the type name always leads, then `str(exc)`. The traceback is printed once,
  with the server named. An agent that calls a tool which raises feeds this string back to the model as the
  tool output, so catch expected errors in the handler and return a normal response instead.
* Request validation errors are printed (errors and body, truncated) and answered with FastAPI's normal 422.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import signal
import socket
import sys
import threading
import traceback
from abc import abstractmethod
from contextlib import contextmanager
from typing import Any, Callable, ClassVar, Iterator, Optional

import orjson
from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict

from nemo_gym.config.types import BaseRunServerInstanceConfig, BaseServerConfig
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.http.client import NeMoGymHTTPError, ServerClient, get_response_json, raise_for_status
from nemo_gym.http.sessions import (
    REPLICA_ENV_VAR_NAME,
    SESSION_ID_KEY,
    SessionCookieMiddleware,
    export_session_secret_to_env,
)
from nemo_gym.servers.hot_routes import HotRoutes
from nemo_gym.config.values import truthy

__all__ = [
    "SESSION_ID_KEY",
    "BaseServer",
    "SimpleServer",
    "ServerClient",
    "NeMoGymHTTPError",
    "raise_for_status",
    "get_response_json",
    "BaseServerConfig",
    "BaseRunServerInstanceConfig",
    "NeMoGymExceptionMiddleware",
    "LinePrefixingWriter",
    "HideOkAccessLogFilter",
    "install_access_log_filter",
    "serving_app",
    "prefix_process_output",
    "raise_open_files_limit",
    "is_nemo_gym_fastapi_worker",
    "is_nemo_gym_fastapi_entrypoint",
    "get_nemo_gym_fastapi_num_workers",
    "IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME",
    "IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME",
    "NEMO_GYM_FASTAPI_NUM_WORKERS",
]

# --------------------------------------------------------------------------------------------------------
# Multi-worker plumbing (env vars that pass information from a server's main process to its uvicorn workers)

IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME = "IS_NEMO_GYM_FASTAPI_WORKER"
IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME = "IS_NEMO_GYM_FASTAPI_ENTRYPOINT"
NEMO_GYM_FASTAPI_NUM_WORKERS = "NEMO_GYM_FASTAPI_NUM_WORKERS"
# Ours: `<module>:<qualname>` of the server class, so a worker can build the app when the entrypoint has no
# module-level `app`.
NEMO_GYM_FASTAPI_SERVER_CLASS = "NEMO_GYM_FASTAPI_SERVER_CLASS"

UVICORN_LOGGING_SHOW_200_OK_KEY_NAME = "uvicorn_logging_show_200_ok"
UVICORN_TIMEOUT_WORKER_HEALTHCHECK_KEY_NAME = "uvicorn_timeout_worker_healthcheck"
DEFAULT_OPEN_FILES_SOFT_LIMIT = 65535
_LOG_BODY_CHARS = 2000

HOT_ROUTES_ENV_VAR_NAME = "NEMO_GYM_HOT_ROUTES"
_WORKER_APP: Optional[FastAPI] = None  # the app built in this worker process (multi-worker mode)


def is_nemo_gym_fastapi_worker() -> bool:
    """True inside a uvicorn worker of a `num_workers > 1` server (and in its supervisor once it started them)."""
    return os.environ.get(IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME) == "1"


def is_nemo_gym_fastapi_entrypoint(file: str) -> bool:
    """For the module-level `app` pattern of multi-worker servers::

        if __name__ == "__main__":
            MyModel.run_webserver()
        elif is_nemo_gym_fastapi_entrypoint(__file__):
            app = MyModel.run_webserver()

    True when this process is a worker and `file` is the server's entrypoint. (The pattern is optional here:
    workers also find the server class by name.)"""
    if not is_nemo_gym_fastapi_worker():
        return False
    entry = os.environ.get(IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME)
    if not entry or not file:
        return False
    return _same_file(file, entry) or os.path.normpath(file).endswith(os.path.normpath(entry))


def get_nemo_gym_fastapi_num_workers() -> int:
    try:
        return max(1, int(os.environ.get(NEMO_GYM_FASTAPI_NUM_WORKERS, "1")))
    except ValueError:
        return 1


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False



def _truncate(text: str, limit: int = _LOG_BODY_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def _eprint(text: str) -> None:
    stream = sys.stderr
    try:
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()
    except Exception:  # pragma: no cover - a closed stream must not turn into a second error
        pass


# --------------------------------------------------------------------------------------------------------
# Exception middleware


class NeMoGymExceptionMiddleware:
    """Outermost pure-ASGI middleware: turn an escaped exception into HTTP 500 with a JSON string body.

    See the module docstring for the bodies. `asyncio.CancelledError` (shutdown, a cancelled task) and other
    `BaseException`s that are not `Exception` propagate untouched, so cancellation keeps its meaning.
    """

    # Set by `serve` when only non-200 access lines are shown: they are then written here (uvicorn's handlers and
    # format, see `_access_log_by_middleware`), and the 200s cost no log record at all.
    log_non_200: ClassVar[bool] = False
    direct_role: ClassVar[str] = "errors"  # HotRoutes.answer does this layer's work itself (servers/hot_routes.py)

    def __init__(self, app: Any, server_key: str) -> None:
        self.app = app
        self.server_key = server_key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.guard(self.app, scope, receive, send)

    async def guard(self, app: Any, scope: dict, receive: Any, send: Any) -> None:
        """Run the ASGI `app` for an HTTP request as this layer does: non-200 access lines, and an exception
        turned into the 500 (or, once the response has started, only logged)."""
        started = False

        async def send_tracking(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.log_status(scope, message["status"])
            await send(message)

        try:
            await app(scope, receive, send_tracking)
        except Exception as exc:
            answer = self.error_answer(exc, scope, response_started=started)
            if answer is None:
                return  # nothing we can send any more; the error is logged
            status, headers, content = answer
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": content})

    def log_status(self, scope: dict, status: int) -> None:
        """The access line of a response that is not a 200, when those are shown (see `log_non_200`)."""
        if self.log_non_200 and status != 200:
            _log_access(scope, status)

    def error_answer(self, exc: Exception, scope: dict, *, response_started: bool) -> Optional[tuple[int, list, bytes]]:
        """(status, headers, body) of the 500 for `exc`, its access line written; None once the response has
        started (then only the log tells)."""
        body = self.describe(exc, scope, response_started=response_started)
        if response_started:
            return None
        content = orjson.dumps(body)
        if self.log_non_200:
            _log_access(scope, 500)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode("latin-1"))]
        return 500, headers, content

    def describe(self, exc: Exception, scope: dict, *, response_started: bool = False) -> str:
        """The 500 body for `exc`; logs the error once."""
        where = f"{scope.get('method', '')} {scope.get('path', '')}".strip()
        inner = getattr(exc, "response_content", None)
        if inner is not None:
            if isinstance(inner, (bytes, bytearray)):
                inner = bytes(inner).decode("utf-8", errors="replace")
            body = f"Hit an exception in {self.server_key} calling an inner server: {inner}"
            status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
            _eprint(
                f"{self.server_key} {where}: an inner server call failed"
                + (f" with HTTP {status}" if status else "")
                + f"; answering HTTP 500. {_truncate(str(exc))}"
            )
            return body
        message = str(exc)
        body = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        note = (
            "the response had already started, so the client gets a broken response"
            if response_started
            else f"answering HTTP 500 with {_truncate(body, 500)!r}"
        )
        _eprint(
            f"Unhandled exception in {self.server_key} while serving {where}; {note}. "
            f"If the caller should get something else (e.g. a tool error the model can read), catch it in the "
            f"handler and return a normal response.\n{tb.rstrip()}"
        )
        return body


# --------------------------------------------------------------------------------------------------------
# Process-level helpers: access log filter, line-prefixed output, open-files limit


ACCESS_LOGGER_NAME = "nemo_gym.access"


def _access_log_by_middleware() -> None:
    """Only non-200 access lines are wanted: move uvicorn's access-log handlers to our logger, which the exception
    middleware writes those lines to. uvicorn's protocol logs only while its logger has handlers, so the 200s then
    cost no log record at all."""
    uvicorn_access = logging.getLogger("uvicorn.access")
    ours = logging.getLogger(ACCESS_LOGGER_NAME)
    ours.handlers = list(uvicorn_access.handlers)
    ours.setLevel(uvicorn_access.level)
    ours.propagate = False
    uvicorn_access.handlers = []
    uvicorn_access.propagate = False
    NeMoGymExceptionMiddleware.log_non_200 = True


def _log_access(scope: dict, status: int) -> None:
    """One access line, as uvicorn writes it (`client - "METHOD /path HTTP/1.1" status`)."""
    client = scope.get("client")
    client_addr = f"{client[0]}:{client[1]}" if client else ""
    path = scope.get("root_path", "") + scope.get("path", "")
    if scope.get("query_string"):
        path += "?" + scope["query_string"].decode("ascii", errors="replace")
    logging.getLogger(ACCESS_LOGGER_NAME).info(
        '%s - "%s %s HTTP/%s" %d', client_addr, scope.get("method", ""), path, scope.get("http_version", "1.1"), status
    )


class HideOkAccessLogFilter(logging.Filter):
    """Drops uvicorn access-log records whose status is 200 (errors and other statuses stay visible)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and len(args) >= 5 and args[4] == 200)


def install_access_log_filter(show_200_ok: bool = False) -> None:
    """Hide `200 OK` access lines unless `show_200_ok` (config `uvicorn_logging_show_200_ok: true`)."""
    access = logging.getLogger("uvicorn.access")
    for existing in [f for f in access.filters if isinstance(f, HideOkAccessLogFilter)]:
        access.removeFilter(existing)
    if not show_200_ok:
        access.addFilter(HideOkAccessLogFilter())


class LinePrefixingWriter:
    """A text stream wrapper that writes `prefix` at the start of every output line.

    Whole lines: text is buffered per thread until a newline, so lines written by different threads never
    interleave mid-line (`print` writes the text and the newline in two calls). A partial line is written
    out on `flush()` (e.g. `print(..., end="", flush=True)`). Every write that completes lines flushes the
    underlying stream. Other attributes (`fileno`, `isatty`, `encoding`, `buffer`, ...) are the wrapped
    stream's.
    """

    def __init__(self, stream: Any, prefix: str) -> None:
        self._stream = stream
        self._prefix = prefix
        self._lock = threading.RLock()
        self._pending: dict[int, str] = {}
        self._mid_line_owner: Optional[int] = None  # thread whose partial line is on screen

    @property
    def wrapped(self) -> Any:
        return self._stream

    @property
    def prefix(self) -> str:
        return self._prefix

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        if not s:
            return 0
        tid = threading.get_ident()
        with self._lock:
            pending = self._pending.pop(tid, None)
            text = pending + s if pending else s
            cut = text.rfind("\n") + 1
            if cut == 0:
                self._pending[tid] = text
                return len(s)
            if cut < len(text):
                self._pending[tid] = text[cut:]
            self._emit_lines(text[:cut], tid)
            self._stream.flush()
        return len(s)

    def _emit_lines(self, complete: str, tid: int) -> None:
        prefix = self._prefix
        lines = complete.split("\n")
        lines.pop()  # `complete` ends with "\n"
        head = ""
        owner = self._mid_line_owner
        if owner is not None:
            self._mid_line_owner = None
            if owner == tid:  # this thread continues its partial line: no prefix on the first line
                head = lines.pop(0) + "\n"
            else:  # another thread's partial line is open: end it first
                head = "\n"
        self._stream.write(head + "".join(prefix + line + "\n" for line in lines))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        tid = threading.get_ident()
        with self._lock:
            pending = self._pending.pop(tid, None)
            if pending:
                owner = self._mid_line_owner
                if owner is None:
                    out = self._prefix + pending
                elif owner == tid:
                    out = pending
                else:
                    out = "\n" + self._prefix + pending
                self._mid_line_owner = tid
                self._stream.write(out)
            self._stream.flush()

    def flush_all(self) -> None:
        """Write out the partial lines of every thread (at exit)."""
        with self._lock:
            try:
                for tid, pending in list(self._pending.items()):
                    del self._pending[tid]
                    if not pending:
                        continue
                    owner = self._mid_line_owner
                    if owner == tid:
                        out = pending + "\n"
                    elif owner is None:
                        out = self._prefix + pending + "\n"
                    else:
                        out = "\n" + self._prefix + pending + "\n"
                    self._mid_line_owner = None
                    self._stream.write(out)
                if self._mid_line_owner is not None:
                    self._mid_line_owner = None
                    self._stream.write("\n")
                self._stream.flush()
            except Exception:  # pragma: no cover - the stream may be closed at exit
                pass

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not set up (e.g. during copy/unpickling): no recursion through _stream
            raise AttributeError(name)
        return getattr(self._stream, name)


def prefix_process_output(prefix: str) -> None:
    """Wrap `sys.stdout`/`sys.stderr` in `LinePrefixingWriter`s (idempotent) and re-point logging stream
    handlers that already write to the raw streams (uvicorn's, when logging was configured first)."""
    import atexit

    replaced: dict[int, LinePrefixingWriter] = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, LinePrefixingWriter):
            continue
        writer = LinePrefixingWriter(stream, prefix)
        setattr(sys, name, writer)
        replaced[id(stream)] = writer
        atexit.register(writer.flush_all)
    if not replaced:
        return
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for lg in loggers:
        for handler in lg.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in replaced:
                handler.setStream(replaced[id(stream)])


def raise_open_files_limit(target: int = DEFAULT_OPEN_FILES_SOFT_LIMIT) -> Optional[int]:
    """Raise the RLIMIT_NOFILE soft limit to min(hard limit, target); returns the soft limit in effect
    (None where the platform has no such limit). Thousands of in-flight rollouts need thousands of sockets."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return want
    except (ValueError, OSError) as err:
        _eprint(
            f"Could not raise the open-files limit from {soft} to {want} ({err}); many concurrent requests may "
            f"fail with `OSError: [Errno 24] Too many open files`. Raise it with `ulimit -n`."
        )
        return soft


# --------------------------------------------------------------------------------------------------------
# Servers


# The uvicorn server of this process (single-worker serving), for `/health`'s `in_flight`.
_SERVING: Optional[Any] = None

class BaseServer(BaseModel):
    """A server is a pydantic model: its validated `config` (with `name` = server id) and a `ServerClient`
    for calling the other servers of the stack by server id."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    config: BaseRunServerInstanceConfig
    server_client: Optional[ServerClient] = None

    @classmethod
    def config_class(cls) -> type[BaseModel]:
        """The config model this server validates its block into (the annotation of its `config` field)."""
        return cls.model_fields["config"].annotation  # type: ignore[return-value]

    @classmethod
    def load_config_from_global_config(cls) -> BaseRunServerInstanceConfig:
        """Resolve the block named by `NEMO_GYM_CONFIG_PATH` in this process's global config and validate it
        into `config_class()`. Mistakes raise `NeMoGymConfigError` naming the field and the fix."""
        from nemo_gym.config.global_config import load_server_config

        return load_server_config(cls.config_class())  # type: ignore[return-value]

    def setup_liveness(self, app: FastAPI) -> None:
        """`GET /` -> `{"status": "ok"}` (NeMo Gym v0.5's liveness route), unless the app serves `/` itself."""
        routes = app.router.routes
        if any(getattr(r, "path", None) == "/" and "GET" in (getattr(r, "methods", None) or ()) for r in routes):
            return

        async def liveness() -> dict:
            return {"status": "ok"}

        app.add_api_route("/", liveness, methods=["GET"], include_in_schema=False)


class SimpleServer(BaseServer):
    """A FastAPI server with signed-cookie sessions, `/health`, the exception middleware and `run_webserver`."""

    server_client: ServerClient

    # Flags on `app.state` that make the setup steps idempotent.
    _SESSION_FLAG: ClassVar[str] = "nemo_gym_session_middleware_installed"
    _PREPARED_FLAG: ClassVar[str] = "nemo_gym_app_prepared"
    # Stateful servers answer 409 to a session cookie this process did not issue (see `http/sessions.py`).
    refuse_unknown_session_cookies: ClassVar[bool] = False

    @abstractmethod
    def setup_webserver(self) -> FastAPI:
        """Build the app: `FastAPI()`, `self.setup_session_middleware(app)`, then the routes."""

    def _app_with_post_routes(self, routes: dict[str, Callable[..., Any]]) -> FastAPI:
        """`FastAPI()` with the session middleware and `POST` routes (path -> handler): the base routes of the
        resources, model and agent servers, built the same way."""
        app = FastAPI()
        self.setup_session_middleware(app)
        for path, handler in routes.items():
            app.post(path)(handler)
        return app

    # -- sessions ------------------------------------------------------------------------------------------

    def get_session_middleware_key(self) -> str:
        """`<ClassName>___<server_id>`: the session cookie name (and the server's name in error messages)."""
        return f"{type(self).__name__}___{self.config.name}"

    def get_session_cookie_name(self) -> str:
        return self.get_session_middleware_key()

    def setup_session_middleware(self, app: FastAPI) -> None:
        """Give every request `request.session` (with `session_id`) from this server's signed cookie."""
        if getattr(app.state, self._SESSION_FLAG, False):
            return
        setattr(app.state, self._SESSION_FLAG, True)
        # A replica of a server with `num_replicas` > 1 (ng_run sets the env var) stamps its index into the
        # sessions it sends, so clients route the rest of a rollout to it (docs/design.md, decision 22).
        replica = os.environ.get(REPLICA_ENV_VAR_NAME)
        app.add_middleware(
            SessionCookieMiddleware,
            cookie_name=self.get_session_cookie_name(),
            refuse_unknown_cookies=self.refuse_unknown_session_cookies,
            replica=int(replica) if replica and replica.isdigit() else None,
        )

    # -- the rest of the app -------------------------------------------------------------------------------

    def setup_health_route(self, app: FastAPI) -> None:
        """`GET /health` -> 200 `{"status": "ok", "name": <server id>, "in_flight": N}` (ng_run's readiness check;
        `in_flight`, the requests this process is answering besides this one, is what ng_status shows per
        replica; it is left out where uvicorn's state is not reachable, e.g. with several workers)."""
        if any(getattr(route, "path", None) == "/health" for route in app.router.routes):
            return
        payload = {"status": "ok", "name": self.config.name}

        async def health() -> dict:
            if _SERVING is None:
                return payload
            return {**payload, "in_flight": max(0, len(_SERVING.server_state.tasks) - 1)}

        app.add_api_route("/health", health, methods=["GET"], include_in_schema=False)

    def setup_request_validation_logging(self, app: FastAPI) -> None:
        """Print request validation errors (errors and body, truncated), then answer FastAPI's usual 422."""
        key = self.get_session_middleware_key()

        async def on_validation_error(request: Request, exc: RequestValidationError):
            try:
                errors = json.dumps(exc.errors(), default=repr)
            except Exception:  # pragma: no cover
                errors = repr(exc.errors())
            body = exc.body
            if isinstance(body, (bytes, bytearray)):
                body_text = bytes(body).decode("utf-8", errors="replace")
            else:
                try:
                    body_text = json.dumps(body, default=repr)
                except Exception:  # pragma: no cover
                    body_text = repr(body)
            _eprint(
                f"{key} {request.method} {request.url.path}: request validation failed (HTTP 422).\n"
                f"Errors: {_truncate(errors)}\nBody: {_truncate(body_text)}"
            )
            return await request_validation_exception_handler(request, exc)

        app.add_exception_handler(RequestValidationError, on_validation_error)

    def setup_exception_middleware(self, app: FastAPI) -> None:
        """Install the outermost exception middleware (call after every other `add_middleware`)."""
        app.add_middleware(NeMoGymExceptionMiddleware, server_key=self.get_session_middleware_key())

    def prepare_app(self, app: FastAPI) -> FastAPI:
        """The final step before serving (idempotent): sessions if `setup_webserver` did not add them,
        `GET /health`, request-validation logging, and the exception middleware as the outermost layer."""
        if getattr(app.state, self._PREPARED_FLAG, False):
            return app
        setattr(app.state, self._PREPARED_FLAG, True)
        self.setup_session_middleware(app)
        self.setup_health_route(app)
        self.setup_liveness(app)
        self.setup_request_validation_logging(app)
        self.setup_exception_middleware(app)
        return app

    def build_app(self) -> FastAPI:
        """`setup_webserver()` (+ the tools over MCP when the config says `expose_tools_over_mcp: true`) +
        `prepare_app()`: the app exactly as `run_webserver` serves it (for tests)."""
        app = self.setup_webserver()
        if getattr(self.config, "expose_tools_over_mcp", False):
            from nemo_gym.mcp_auto_exposure import maybe_auto_expose

            maybe_auto_expose(self, app)
        return self.prepare_app(app)

    # -- process setup -------------------------------------------------------------------------------------

    def set_ulimit(self, target_soft_limit: int = DEFAULT_OPEN_FILES_SOFT_LIMIT) -> Optional[int]:
        return raise_open_files_limit(target_soft_limit)

    def prefix_server_logs(self) -> None:
        """Prefix every stdout/stderr line of this process with `(<server_id>) `."""
        prefix_process_output(f"({self.config.name}) ")

    # -- running -------------------------------------------------------------------------------------------

    @classmethod
    def run_webserver(cls) -> Optional[FastAPI]:
        """Load this server's config, build the app and serve it until SIGINT/SIGTERM (then exit code 0).

        Serves on the listening socket passed in `NEMO_GYM_LISTEN_FD` (by `ng_run`) or binds the configured
        host/port. Returns None on `dry_run`; inside a multi-worker uvicorn worker it returns the app instead of
        serving."""
        from nemo_gym.config.global_config import (
            DRY_RUN_KEY_NAME,
            NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME,
            get_global_config_dict,
            get_head_server_config,
        )

        global _WORKER_APP
        worker = is_nemo_gym_fastapi_worker()
        server_id = os.environ.get(NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME, "")
        try:
            global_config_dict = get_global_config_dict()
            server_config = cls.load_config_from_global_config()
            head_server_config = get_head_server_config(global_config_dict)
        except NeMoGymConfigError as err:
            prefix = f"({server_id}) " if server_id else ""
            _eprint("\n".join(prefix + line for line in str(err).splitlines()))
            raise SystemExit(2) from None

        _maybe_initialize_ray(global_config_dict)
        server_client = ServerClient(head_server_config=head_server_config, global_config_dict=global_config_dict)
        server = cls(config=server_config, server_client=server_client)

        if truthy(global_config_dict.get(DRY_RUN_KEY_NAME, False)):
            return None

        server.prefix_server_logs()
        server.set_ulimit()
        app = server.build_app()
        show_200_ok = truthy(global_config_dict.get(UVICORN_LOGGING_SHOW_200_OK_KEY_NAME, False))

        if worker:
            # uvicorn configured logging in this worker before importing us: filter its access logger now.
            install_access_log_filter(show_200_ok)
            _WORKER_APP = app
            return app

        server.serve(app, global_config_dict=global_config_dict, show_200_ok=show_200_ok)
        return app

    def serve(self, app: FastAPI, *, global_config_dict: Any = None, show_200_ok: bool = False) -> None:
        """Run uvicorn (uvloop + httptools) until SIGINT/SIGTERM; returns normally after a graceful stop."""
        import uvicorn

        from nemo_gym.config.global_config import NEMO_GYM_LISTEN_FD_ENV_VAR_NAME

        sock = _socket_from_env(NEMO_GYM_LISTEN_FD_ENV_VAR_NAME)
        num_workers = int(self.config.num_workers or 1)
        healthcheck_timeout = 30
        if global_config_dict is not None:
            try:
                healthcheck_timeout = int(global_config_dict.get(UVICORN_TIMEOUT_WORKER_HEALTHCHECK_KEY_NAME, 30))
            except (TypeError, ValueError):
                healthcheck_timeout = 30
        common: dict[str, Any] = dict(
            host=self.config.host,
            port=int(self.config.port),
            loop=_loop_choice(),
            http=_http_choice(),
            # Cancel in-flight requests quickly on shutdown instead of waiting for long rollouts.
            timeout_graceful_shutdown=0.5,
            # Longer than the client's idle keep-alive, so the server never closes a connection the client is
            # about to reuse.
            timeout_keep_alive=30,
            # Servers call each other directly: no X-Forwarded-* rewriting (and one ASGI layer less).
            proxy_headers=False,
            server_header=False,
            access_log=True,
            log_level="info",
        )

        if num_workers <= 1:
            config = uvicorn.Config(serving_app(app), **common)  # configures logging
            install_access_log_filter(show_200_ok)
            if not show_200_ok:
                _access_log_by_middleware()
            tune_gc_for_serving()
            server = uvicorn.Server(config)
            global _SERVING
            _SERVING = server
            with _exit_quietly_on_signals():
                server.run(sockets=[sock] if sock is not None else None)
            return

        from uvicorn.config import STARTUP_FAILURE
        from uvicorn.supervisors import Multiprocess

        os.environ[IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME] = "1"
        os.environ[NEMO_GYM_FASTAPI_NUM_WORKERS] = str(num_workers)
        os.environ[NEMO_GYM_FASTAPI_SERVER_CLASS] = f"{type(self).__module__}:{type(self).__qualname__}"
        entry = _entrypoint_file(type(self))
        if entry:
            os.environ[IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME] = entry
        export_session_secret_to_env()  # every worker must accept its siblings' cookies
        config = uvicorn.Config(
            f"{__name__}:_nemo_gym_worker_app",
            factory=True,
            workers=num_workers,
            timeout_worker_healthcheck=healthcheck_timeout,
            **common,
        )
        if sock is None:
            sock = config.bind_socket()
        install_access_log_filter(show_200_ok)
        with _exit_quietly_on_signals():
            supervisor = Multiprocess(config, sockets=[sock])
            supervisor.run()
        if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
            raise SystemExit(STARTUP_FAILURE)


def _fast_serving() -> bool:
    return os.environ.get(HOT_ROUTES_ENV_VAR_NAME, "1").strip().lower() not in ("0", "false", "no", "off")


def serving_app(app: FastAPI) -> Any:
    """The ASGI app uvicorn runs for `app`: its plain POST routes answered by `HotRoutes` (set
    `NEMO_GYM_HOT_ROUTES=0` to serve everything through FastAPI and uvicorn's own protocol, e.g. to compare)."""
    if not _fast_serving():
        return app
    return HotRoutes(app, own_middleware=(SessionCookieMiddleware, NeMoGymExceptionMiddleware))


def tune_gc_for_serving(gen0_threshold: int = 100_000) -> None:
    """Move everything allocated at start-up (modules, models, the app) out of the collector's sight and make
    young-generation collections rarer.

    Why: the collector runs when the number of live container objects has grown by `gen0_threshold`, and then
    walks every young object, most of which belong to requests still in flight. With thousands in flight,
    CPython's default (700) made it rescan the same objects over and over (moving to 20,000 cut CPU per request
    on the client benchmark by about half). The rollout path itself leaves no cyclic garbage (none found after
    1,000 rollouts through a stack), so every collection there is pure overhead: at 1,024 in flight, 100,000
    instead of 20,000 halved the time the three servers spent collecting (0.77 s to 0.43 s per 4,000
    rollouts). Cycles an environment creates are still collected, after at most that many new objects."""
    import gc

    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


# --------------------------------------------------------------------------------------------------------
# run_webserver internals


def _maybe_initialize_ray(global_config_dict: Any) -> None:
    """Join/start Ray when the config asks for it (`nemo_gym.runtime.ray.initialize_ray` decides; it does not
    import ray otherwise). Missing ray_utils or ray is not an error for servers that do not use it."""
    try:
        from nemo_gym.runtime.ray import initialize_ray
    except ImportError:  # pragma: no cover
        return
    initialize_ray(global_config_dict)


def _loop_choice() -> str:
    try:
        import uvloop  # noqa: F401

        return "uvloop"
    except ImportError:  # pragma: no cover
        return "asyncio"


def _http_choice() -> Any:
    """uvicorn's httptools protocol with one write per response and a direct path for hot routes
    (`servers/http_protocol.py`); plain httptools with
    `NEMO_GYM_HOT_ROUTES=0`; h11 without httptools."""
    try:
        import httptools  # noqa: F401
    except ImportError:  # pragma: no cover
        return "h11"
    if not _fast_serving():
        return "httptools"
    from nemo_gym.servers.http_protocol import NeMoGymHttpProtocol

    return NeMoGymHttpProtocol


def _socket_from_env(env_name: str) -> Optional[socket.socket]:
    """The already-listening socket handed down by ng_run (the env var is removed so that processes this
    server starts do not see it; the fd is made non-inheritable for the same reason)."""
    text = os.environ.pop(env_name, None)
    if not text:
        return None
    try:
        fd = int(text)
    except ValueError:
        raise NeMoGymConfigError(f"{env_name}={text!r} is not a file descriptor number.") from None
    sock = socket.socket(fileno=fd)
    sock.set_inheritable(False)
    return sock


def _entrypoint_file(cls: type) -> Optional[str]:
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path else None


def _ignore_signal(signum: int, frame: Any) -> None:
    return None


@contextmanager
def _exit_quietly_on_signals() -> Iterator[None]:
    """uvicorn re-raises the SIGINT/SIGTERM that stopped it once it has shut down (to run the previous handler).
    With the default handlers that means a KeyboardInterrupt traceback or death by SIGTERM; with these no-op
    handlers in place the server returns normally and the process exits 0. Defaults are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _ignore_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _nemo_gym_worker_app() -> Any:
    """uvicorn app factory run in each worker of a `num_workers > 1` server: the worker's app, as served."""
    return serving_app(_find_worker_app())


def _find_worker_app() -> FastAPI:
    """The app of this worker.

    The worker process re-imported the entrypoint as `__mp_main__` (multiprocessing spawn). If that import
    already built the app (module-level `app = X.run_webserver()` pattern) it is reused; else a module-level
    `app` is used; else the server class named by the supervisor builds it."""
    if _WORKER_APP is not None:
        return _WORKER_APP
    entry = os.environ.get(IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME, "")
    module_name, _, qualname = os.environ.get(NEMO_GYM_FASTAPI_SERVER_CLASS, "").partition(":")

    namespace: Optional[dict] = None
    if module_name and module_name != "__main__":
        import importlib

        namespace = vars(importlib.import_module(module_name))
    else:
        for name in ("__mp_main__", "__main__"):
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None)
            if path and entry and _same_file(path, entry):
                namespace = vars(module)
                break
        if namespace is None and entry:
            namespace = runpy.run_path(entry, run_name="__nemo_gym_worker__")
    if _WORKER_APP is not None:
        return _WORKER_APP
    if namespace is None:
        raise RuntimeError(
            f"nemo_gym worker: cannot find the server entrypoint ({IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME}={entry!r})."
        )
    app = namespace.get("app")
    if isinstance(app, FastAPI):
        return app
    target: Any = namespace
    for part in qualname.split(".") if qualname else []:
        target = target.get(part) if isinstance(target, dict) else getattr(target, part, None)
    if not (isinstance(target, type) and issubclass(target, SimpleServer)):
        raise RuntimeError(
            f"nemo_gym worker: server class {qualname!r} not found in {entry or module_name!r}; define a "
            f"module-level `app` with `is_nemo_gym_fastapi_entrypoint(__file__)` instead."
        )
    built = target.run_webserver()
    if built is None:  # pragma: no cover - dry run inside a worker
        raise RuntimeError("nemo_gym worker: run_webserver returned no app")
    return built
