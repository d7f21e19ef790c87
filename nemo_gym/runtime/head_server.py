"""The head server: a small discovery service that lives in the `ng_run` process.

Clients such as `ng_collect_rollouts` and `ng_status` only know the head server's address; they ask it for the
global config (to find every server by name) and for the list of running server processes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, Optional

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from nemo_gym import __version__
from nemo_gym.serving.host_check import HostCheck, HostPolicy, host_policy


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


class HeadServer:
    """Serves `/global_config_dict_yaml`, `/server_instances` and `/health` from a daemon thread.

    `config_yaml` is the masked global config. The YAML endpoint answers with a JSON string literal holding
    the YAML text, as NeMo Gym v0.2 does, so clients written for it keep working;
    `?raw=true` returns the YAML itself. Requests are held to `hosts` (default: loopback and the address it
    listens on), as every server's are (`serving/host_check.py`): another site's page must not read the config.
    """

    def __init__(
        self, config_yaml: str, instances: Callable[[], list[dict[str, Any]]], hosts: Optional[HostPolicy] = None
    ):
        self.config_yaml = config_yaml
        self._instances = instances
        self.hosts = hosts
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.started_at = time.time()
        self.app = self._build_app()

    def _build_app(self) -> Any:
        # Plain Starlette: the head server has four tiny routes, and FastAPI's import would cost `ng_run` ~0.4 s.
        async def global_config_dict_yaml(request: Request) -> Response:
            if request.query_params.get("raw", "").lower() in ("1", "true", "yes"):
                return PlainTextResponse(self.config_yaml, media_type="application/yaml")
            return _json(self.config_yaml)

        async def server_instances(request: Request) -> Response:
            return _json(self._instances())

        async def health(request: Request) -> Response:
            # `pid` is the ng_run process (the head server lives in it): a new ng_run that finds this port taken
            # names the stack's owner (runtime/stale_stack.py).
            return _json(
                {"status": "ok", "name": "head_server", "version": __version__, "pid": os.getpid(),
                 "started_at": self.started_at}
            )

        async def liveness(request: Request) -> Response:  # NeMo Gym v0.5's `GET /` on every server
            return _json({"status": "ok"})

        app = Starlette(
            routes=[
                Route("/global_config_dict_yaml", global_config_dict_yaml, methods=["GET"]),
                Route("/server_instances", server_instances, methods=["GET"]),
                Route("/health", health, methods=["GET"]),
                Route("/", liveness, methods=["GET"]),
            ]
        )
        return HostCheck(app, self.hosts if self.hosts is not None else HostPolicy())

    def start(self, sock: socket.socket) -> None:
        """Serve on an already-bound listening socket and return once the server accepts requests."""
        if self.hosts is None:
            self.app.policy = host_policy(None, sock.getsockname()[0])
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, loop="asyncio", http="h11", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        # A thread cannot take signal handlers; the launcher owns SIGINT/SIGTERM.
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="nemo_gym-head-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("the head server did not start within 10 s")

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
