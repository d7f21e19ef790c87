"""Serve an ASGI app for real (uvicorn on 127.0.0.1, in a thread) for the length of a `with` block; `live_servers`
does so for several servers that call one another by name."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator, Mapping

import uvicorn


@contextlib.contextmanager
def live_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    backlog: int = 128,
    start_timeout: float = 30.0,
    stop_timeout: float = 10.0,
    **uvicorn_options: Any,
) -> Iterator[str]:
    """Yields the base URL (`http://127.0.0.1:<port>`); the port is bound before the thread starts, so the URL is
    valid as soon as it is yielded.

    `backlog` is the listening socket's; `uvicorn_options` go to `uvicorn.Config` on top of the defaults here
    (`log_level="warning"`, `access_log=False`, `lifespan="off"`), e.g. `http="httptools"` or
    `timeout_graceful_shutdown=1`. On exit the server is asked to stop and its thread joined for `stop_timeout` s."""
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(backlog)
    port = sock.getsockname()[1]
    options = {"log_level": "warning", "access_log": False, "lifespan": "off", **uvicorn_options}
    server = uvicorn.Server(uvicorn.Config(app, **options))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=stop_timeout)
        sock.close()


SERVER_TYPES = ("resources_servers", "responses_api_models", "responses_api_agents")


def server_type_of(server: Any) -> str:
    """`resources_servers`, `responses_api_models` or `responses_api_agents`: the kind of a server object."""
    from nemo_gym.base_resources_server import SimpleResourcesServer
    from nemo_gym.base_responses_api_agent import SimpleResponsesAPIAgent
    from nemo_gym.base_responses_api_model import SimpleResponsesAPIModel

    bases = (SimpleResourcesServer, SimpleResponsesAPIModel, SimpleResponsesAPIAgent)
    for server_type, base in zip(SERVER_TYPES, bases):
        if isinstance(server, base):
            return server_type
    raise TypeError(f"{type(server).__name__} is not a resources server, model server or agent")


def server_block(server_type: str, url: str) -> dict:
    """The global-config block of a server of `server_type` listening at `url` (`http://<host>:<port>`)."""
    host, port = url.split("://", 1)[-1].rsplit(":", 1)
    return {server_type: {"impl": {"host": host, "port": int(port), "entrypoint": "app.py"}}}


@contextlib.contextmanager
def live_servers(servers: Mapping[str, Any], global_config: dict, **live_server_options: Any) -> Iterator[dict]:
    """Serve several server objects at once (each with `live_server(server.build_app(), **live_server_options)`)
    and add each one's block to `global_config` under its name (the dict their `ServerClient` reads), so they
    call one another by name as under `ng_run`. Yields {name: base URL}."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for name, server in servers.items():
            urls[name] = stack.enter_context(live_server(server.build_app(), **live_server_options))
            global_config[name] = server_block(server_type_of(server), urls[name])
        yield urls
