"""Running a server's app under uvicorn: the event loop and protocol chosen, the listening socket handed down by
`ng_run`, the open-files limit, the garbage collector tuned for serving, and signals that end the process quietly.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from fastapi import FastAPI

from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.serving.errors import NeMoGymExceptionMiddleware, eprint
from nemo_gym.serving.body import BodyLimit
from nemo_gym.serving.host_check import HostCheck, HostPolicy, host_policy
from nemo_gym.serving.limits import RequestLimits, request_limits
from nemo_gym.serving.logs import ACCESS_LOGGER_NAME, install_access_log_filter
from nemo_gym.serving.sessions import SessionCookieMiddleware, export_session_secret_to_env
from nemo_gym.serving.workers import WORKER_APP_FACTORY, export_worker_env

__all__ = [
    "serve",
    "serving_app",
    "in_flight",
    "raise_open_files_limit",
    "tune_gc_for_serving",
    "DEFAULT_OPEN_FILES_SOFT_LIMIT",
    "HOT_ROUTES_ENV_VAR_NAME",
    "UVICORN_TIMEOUT_WORKER_HEALTHCHECK_KEY_NAME",
]

UVICORN_TIMEOUT_WORKER_HEALTHCHECK_KEY_NAME = "uvicorn_timeout_worker_healthcheck"
DEFAULT_OPEN_FILES_SOFT_LIMIT = 65535
HOT_ROUTES_ENV_VAR_NAME = "NEMO_GYM_HOT_ROUTES"

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
        eprint(
            f"Could not raise the open-files limit from {soft} to {want} ({err}); many concurrent requests may "
            f"fail with `OSError: [Errno 24] Too many open files`. Raise it with `ulimit -n`."
        )
        return soft




# The uvicorn server of this process (single-worker serving), for `/health`'s `in_flight`.
_serving: list = []


def serve(
    app: FastAPI,
    *,
    host: str,
    port: int,
    num_workers: int = 1,
    server_cls: Optional[type] = None,
    global_config_dict: Any = None,
    show_200_ok: bool = False,
    limits: Optional[RequestLimits] = None,
) -> None:
    """Run uvicorn (uvloop + httptools) on `app` until SIGINT/SIGTERM; returns normally after a graceful stop.
    With `num_workers > 1` uvicorn's supervisor runs that many worker processes, each building the app from
    `server_cls`. Every request is held to `limits` (default: the global config's, `serving/limits.py`): a body
    or a head over its size is refused before it is read into memory, a head that does not arrive in time too; and
    one that names a host that is not one of this server's, or comes from another site's page, is refused
    (`serving/host_check.py`)."""
    import uvicorn

    from nemo_gym.config.global_config import NEMO_GYM_LISTEN_FD_ENV_VAR_NAME

    sock = _socket_from_env(NEMO_GYM_LISTEN_FD_ENV_VAR_NAME)
    if limits is None:
        limits = request_limits(global_config_dict)
    hosts = host_policy(global_config_dict, sock.getsockname()[0] if sock is not None else host)
    healthcheck_timeout = 30
    if global_config_dict is not None:
        try:
            healthcheck_timeout = int(global_config_dict.get(UVICORN_TIMEOUT_WORKER_HEALTHCHECK_KEY_NAME, 30))
        except (TypeError, ValueError):
            healthcheck_timeout = 30
    common: dict[str, Any] = dict(
        host=host,
        port=int(port),
        loop=_loop_choice(),
        http=_http_choice(limits),
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
        config = uvicorn.Config(serving_app(app, limits.max_body, hosts), **common)  # configures logging
        install_access_log_filter(show_200_ok)
        if not show_200_ok:
            _access_log_by_middleware()
        tune_gc_for_serving()
        server = uvicorn.Server(config)
        _serving.append(server)
        with _exit_quietly_on_signals():
            server.run(sockets=[sock] if sock is not None else None)
        return

    from nemo_gym.serving.private_api import STARTUP_FAILURE, Multiprocess

    if server_cls is None:
        raise ValueError("serve(num_workers > 1) needs server_cls: the workers build the app from it")
    export_worker_env(num_workers, server_cls)
    hosts.export_to_env()  # read back by `serving_app` in each worker
    export_session_secret_to_env()  # every worker must accept its siblings' cookies
    config = uvicorn.Config(
        WORKER_APP_FACTORY,
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


def in_flight() -> Optional[int]:
    """Requests this process is answering besides the caller's own (None when not serving single-worker uvicorn)."""
    if not _serving:
        return None
    from nemo_gym.serving.private_api import requests_in_flight

    return max(0, requests_in_flight(_serving[-1]) - 1)


def _fast_serving() -> bool:
    if os.environ.get(HOT_ROUTES_ENV_VAR_NAME, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return _private_api_works()


@functools.lru_cache(maxsize=1)
def _private_api_works() -> bool:
    """Whether the installed uvicorn / FastAPI / starlette still have what the fast path uses; if not, serving goes
    through their public API (slower, same answers) and the reason is printed once."""
    try:
        from nemo_gym.serving.private_api import check_compatibility

        problems = check_compatibility()
    except ImportError as exc:
        problems = [str(exc)]
    if problems:
        eprint(
            "nemo_gym: serving through plain uvicorn and FastAPI (slower, same answers): the installed versions lack "
            "what the fast path uses (nemo_gym/serving/private_api.py): " + "; ".join(problems)
        )
    return not problems


def serving_app(app: FastAPI, max_body: Optional[int] = None, hosts: Optional[HostPolicy] = None) -> Any:
    """The ASGI app uvicorn runs for `app`: its plain POST routes answered by `HotRoutes` (set
    `NEMO_GYM_HOT_ROUTES=0` to serve everything through FastAPI and uvicorn's own protocol, e.g. to compare).
    Without our protocol, which holds bodies to `max_body` itself, `BodyLimit` does. Requests are held to `hosts`
    (default: what the server process exported to its uvicorn workers; none: every Host passes)."""
    if hosts is None:
        hosts = HostPolicy.from_env()
    if not _fast_serving():
        served = app if max_body is None else BodyLimit(app, max_body)
        return served if hosts is None else HostCheck(served, hosts)
    from nemo_gym.serving.hot_routes import HotRoutes

    return HotRoutes(app, own_middleware=(SessionCookieMiddleware, NeMoGymExceptionMiddleware), hosts=hosts)


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


def _loop_choice() -> str:
    try:
        import uvloop  # noqa: F401

        return "uvloop"
    except ImportError:  # pragma: no cover
        return "asyncio"


def _http_choice(limits: RequestLimits) -> Any:
    """uvicorn's httptools protocol with one write per response and a direct path for hot routes
    (`serving/private_api.py`); plain httptools with
    `NEMO_GYM_HOT_ROUTES=0`; h11 without httptools."""
    try:
        import httptools  # noqa: F401
    except ImportError:  # pragma: no cover
        return "h11"
    if not _fast_serving():
        return "httptools"
    from nemo_gym.serving.private_api import protocol_with_limits

    return protocol_with_limits(limits)


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


