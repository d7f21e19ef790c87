"""Serve an ASGI app for real (uvicorn on 127.0.0.1, in a thread) for the length of a `with` block."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator

import uvicorn


@contextlib.contextmanager
def live_server(app: Any, *, host: str = "127.0.0.1") -> Iterator[str]:
    """Yields the base URL (`http://127.0.0.1:<port>`); the port is bound before the thread starts, so the URL is
    valid as soon as it is yielded."""
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
