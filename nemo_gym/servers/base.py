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

The engine that serves the app (protocol, hot routes, sessions, the errors layer, logs, uvicorn) is
`nemo_gym.serving`; the names it used to export from here still are.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from typing import Any, Callable, ClassVar, Optional

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict

from nemo_gym.config.types import BaseRunServerInstanceConfig, BaseServerConfig
from nemo_gym.config.values import config_get, truthy
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.http.client import NeMoGymHTTPError, ServerClient, get_response_json, raise_for_status
from nemo_gym.serving.errors import NeMoGymExceptionMiddleware, eprint, validation_error_handler
from nemo_gym.serving.limits import request_limits
from nemo_gym.serving.logs import (
    HideOkAccessLogFilter,
    LinePrefixingWriter,
    install_access_log_filter,
    prefix_process_output,
)
from nemo_gym.serving.runner import (
    DEFAULT_OPEN_FILES_SOFT_LIMIT,
    in_flight,
    raise_open_files_limit,
    serve,
    serving_app,
    tune_gc_for_serving,
)
from nemo_gym.serving.sessions import REPLICA_ENV_VAR_NAME, SESSION_ID_KEY, SessionCookieMiddleware
from nemo_gym.serving.workers import (
    IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME,
    IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME,
    NEMO_GYM_FASTAPI_NUM_WORKERS,
    get_nemo_gym_fastapi_num_workers,
    is_nemo_gym_fastapi_entrypoint,
    is_nemo_gym_fastapi_worker,
    set_worker_app,
)

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
    "tune_gc_for_serving",
]

UVICORN_LOGGING_SHOW_200_OK_KEY_NAME = "uvicorn_logging_show_200_ok"

# --------------------------------------------------------------------------------------------------------
# Servers

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
    # Stateful servers answer 409 to a session cookie this process did not issue (see `serving/sessions.py`).
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
        """`GET /health` -> 200 `{"status": "ok", "name": <server id>, "in_flight": N, "client_limit_per_host": M}` (ng_run's readiness check;
        `in_flight`, the requests this process is answering besides this one, is what ng_status shows per
        replica; it is left out where uvicorn's state is not reachable, e.g. with several workers)."""
        if any(getattr(route, "path", None) == "/health" for route in app.router.routes):
            return
        payload: dict = {"status": "ok", "name": self.config.name}
        limit = self.client_limit_per_host()
        if limit is not None:
            payload["client_limit_per_host"] = limit

        async def health() -> dict:
            count = in_flight()
            return payload if count is None else {**payload, "in_flight": count}

        app.add_api_route("/health", health, methods=["GET"], include_in_schema=False)

    def client_limit_per_host(self) -> Optional[int]:
        """How many requests this server's client has open to one peer at most (`/health` shows it, ng_status too)."""
        from nemo_gym.http.transports import DEFAULT_CONNECTOR_LIMIT_PER_HOST

        config = getattr(self.server_client, "global_config_dict", None)
        try:
            return int(config_get(config, "global_aiohttp_connector_limit_per_host", DEFAULT_CONNECTOR_LIMIT_PER_HOST))
        except (TypeError, ValueError):
            return None

    def setup_request_validation_logging(self, app: FastAPI) -> None:
        """Print request validation errors (errors and body, truncated), then answer FastAPI's 422 with every
        offending input cut to an excerpt (`serving/errors.py`)."""
        handler = validation_error_handler(self.get_session_middleware_key())
        app.add_exception_handler(RequestValidationError, handler)

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
        from nemo_gym.runtime.supervisor_watch import watch_supervisor  # dies with its ng_run (design.md, 15)
        watch_supervisor()
        from nemo_gym.config.global_config import (
            DRY_RUN_KEY_NAME,
            NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME,
            get_global_config_dict,
            get_head_server_config,
        )

        worker = is_nemo_gym_fastapi_worker()
        server_id = os.environ.get(NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME, "")
        try:
            global_config_dict = get_global_config_dict()
            server_config = cls.load_config_from_global_config()
            head_server_config = get_head_server_config(global_config_dict)
        except NeMoGymConfigError as err:
            prefix = f"({server_id}) " if server_id else ""
            eprint("\n".join(prefix + line for line in str(err).splitlines()))
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
            set_worker_app(app)
            return app

        server.serve(app, global_config_dict=global_config_dict, show_200_ok=show_200_ok)
        return app

    def serve(self, app: FastAPI, *, global_config_dict: Any = None, show_200_ok: bool = False) -> None:
        """Serve `app` on this server's host and port (`nemo_gym.serving.runner.serve`) until SIGINT/SIGTERM."""
        serve(
            app,
            host=self.config.host,
            port=int(self.config.port),
            num_workers=int(self.config.num_workers or 1),
            server_cls=type(self),
            global_config_dict=global_config_dict,
            show_200_ok=show_200_ok,
            limits=request_limits(global_config_dict, self.config),
        )


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


