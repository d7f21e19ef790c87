"""Several uvicorn workers for one server (`num_workers > 1`): the env vars a server's main process hands its
workers, and how a worker finds the app it serves.

uvicorn's multi-process supervisor starts each worker with the multiprocessing spawn method, so a worker knows
nothing but its environment: it re-imports the entrypoint and builds (or finds) the same app.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any, Optional

from fastapi import FastAPI

__all__ = [
    "IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME",
    "IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME",
    "NEMO_GYM_FASTAPI_NUM_WORKERS",
    "NEMO_GYM_FASTAPI_SERVER_CLASS",
    "is_nemo_gym_fastapi_worker",
    "is_nemo_gym_fastapi_entrypoint",
    "get_nemo_gym_fastapi_num_workers",
    "set_worker_app",
    "export_worker_env",
    "WORKER_APP_FACTORY",
]

IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME = "IS_NEMO_GYM_FASTAPI_WORKER"
IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME = "IS_NEMO_GYM_FASTAPI_ENTRYPOINT"
NEMO_GYM_FASTAPI_NUM_WORKERS = "NEMO_GYM_FASTAPI_NUM_WORKERS"
# Ours: `<module>:<qualname>` of the server class, so a worker can build the app when the entrypoint has no
# module-level `app`.
NEMO_GYM_FASTAPI_SERVER_CLASS = "NEMO_GYM_FASTAPI_SERVER_CLASS"


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


def _entrypoint_file(cls: type) -> Optional[str]:
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path else None


def _nemo_gym_worker_app() -> Any:
    """uvicorn app factory run in each worker of a `num_workers > 1` server: the worker's app, as served."""
    from nemo_gym.serving.runner import serving_app

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
    from nemo_gym.servers.base import SimpleServer

    if not (isinstance(target, type) and issubclass(target, SimpleServer)):
        raise RuntimeError(
            f"nemo_gym worker: server class {qualname!r} not found in {entry or module_name!r}; define a "
            f"module-level `app` with `is_nemo_gym_fastapi_entrypoint(__file__)` instead."
        )
    built = target.run_webserver()
    if built is None:  # pragma: no cover - dry run inside a worker
        raise RuntimeError("nemo_gym worker: run_webserver returned no app")
    return built


# uvicorn's app factory for the workers (`factory=True`).
WORKER_APP_FACTORY = f"{__name__}:_nemo_gym_worker_app"


def set_worker_app(app: FastAPI) -> None:
    """Record the app this worker built (`run_webserver` inside a worker returns it instead of serving)."""
    global _WORKER_APP
    _WORKER_APP = app


def export_worker_env(num_workers: int, server_cls: type) -> None:
    """What the workers need to find and build the app: set in this process's environment before uvicorn
    spawns them."""
    os.environ[IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME] = "1"
    os.environ[NEMO_GYM_FASTAPI_NUM_WORKERS] = str(num_workers)
    os.environ[NEMO_GYM_FASTAPI_SERVER_CLASS] = f"{server_cls.__module__}:{server_cls.__qualname__}"
    entry = _entrypoint_file(server_cls)
    if entry:
        os.environ[IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME] = entry
