"""Serve an ASGI app for real (uvicorn on 127.0.0.1, in a thread) for the length of a `with` block."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator

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
