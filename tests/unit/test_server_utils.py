"""SimpleServer: health, exception middleware, validation logging, process helpers, in this process. run_webserver
in a real child process is tests/integration/test_serving_runner.py."""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading
from typing import ContextManager

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from nemo_gym.config.types import BaseRunServerInstanceConfig
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.servers.base import (
    IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME,
    IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME,
    SESSION_ID_KEY,
    HideOkAccessLogFilter,
    LinePrefixingWriter,
    NeMoGymExceptionMiddleware,
    ServerClient,
    SimpleServer,
    get_response_json,
    install_access_log_filter,
    is_nemo_gym_fastapi_entrypoint,
    raise_for_status,
    raise_open_files_limit,
)
from nemo_gym.testing.live_server import live_server as shared_live_server


# ------------------------------------------------------------------------------------------------------------
# Shared helpers (also used by test_sessions.py and test_base_servers.py)


def live_server(app) -> ContextManager[str]:
    """The shared live_server on uvicorn's httptools parser, as run_webserver serves apps; yields the base URL."""
    return shared_live_server(app, http="httptools", start_timeout=10)


def make_config(name: str = "test_server", port: int = 0, **extra) -> BaseRunServerInstanceConfig:
    return BaseRunServerInstanceConfig(host="127.0.0.1", port=port, entrypoint="app.py", name=name, **extra)


class Payload(BaseModel):
    count: int


class DemoServer(SimpleServer):
    """Routes that exercise the error paths; calls `inner_server` (another DemoServer) by server id."""

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        app.post("/echo")(self.echo)
        app.post("/boom")(self.boom)
        app.post("/boom_empty")(self.boom_empty)
        app.post("/http_exception")(self.http_exception)
        app.post("/call_inner")(self.call_inner)
        return app

    async def echo(self, request: Request, body: Payload) -> dict:
        return {"count": body.count, "session_id": request.session[SESSION_ID_KEY]}

    async def boom(self) -> dict:
        raise ValueError("boom: the tool exploded")

    async def boom_empty(self) -> dict:
        raise RuntimeError()

    async def http_exception(self) -> dict:
        raise HTTPException(status_code=418, detail="teapot")

    async def call_inner(self, request: Request) -> dict:
        response = await self.server_client.post("inner_server", "/boom", json={})
        await raise_for_status(response)
        return await get_response_json(response)


def demo_server(name: str = "test_server", global_config: dict | None = None) -> DemoServer:
    client = ServerClient(head_server_config={"host": "127.0.0.1", "port": 11000}, global_config_dict=global_config or {})
    return DemoServer(config=make_config(name), server_client=client)


# ------------------------------------------------------------------------------------------------------------
# The app as run_webserver serves it


def test_health_route_names_the_server_and_its_client_limit():
    from nemo_gym.http.transports import DEFAULT_CONNECTOR_LIMIT_PER_HOST

    app = demo_server("my_server").build_app()
    with live_server(app) as url:
        response = httpx.get(f"{url}/health")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok", "name": "my_server", "client_limit_per_host": DEFAULT_CONNECTOR_LIMIT_PER_HOST,
    }


def test_prepare_app_is_idempotent_and_keeps_existing_health_route():
    server = demo_server()
    app = server.setup_webserver()

    @app.get("/health")
    async def custom_health():
        return {"custom": True}

    server.prepare_app(app)
    server.prepare_app(app)
    assert sum(1 for r in app.router.routes if getattr(r, "path", None) == "/health") == 1
    classes = [m.cls for m in app.user_middleware]
    assert classes.count(NeMoGymExceptionMiddleware) == 1
    assert classes[0] is NeMoGymExceptionMiddleware  # outermost of ours
    with live_server(app) as url:
        assert httpx.get(f"{url}/health").json() == {"custom": True}


def test_exception_becomes_500_with_type_and_message(capsys):
    app = demo_server("svc").build_app()
    with live_server(app) as url:
        response = httpx.post(f"{url}/boom", json={})
        empty = httpx.post(f"{url}/boom_empty", json={})
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert response.json() == "ValueError: boom: the tool exploded"
    assert empty.status_code == 500 and empty.json() == "RuntimeError"
    err = capsys.readouterr().err
    # The traceback is logged once, naming the server.
    assert err.count("Traceback (most recent call last)") == 2
    assert "Unhandled exception in DemoServer___svc while serving POST /boom" in err
    assert 'raise ValueError("boom: the tool exploded")' in err


def test_http_exception_keeps_its_status():
    app = demo_server().build_app()
    with live_server(app) as url:
        response = httpx.post(f"{url}/http_exception", json={})
    assert response.status_code == 418
    assert response.json() == {"detail": "teapot"}


def test_inner_server_error_is_relayed_with_its_body(capsys):
    inner_app = demo_server("inner_server").build_app()
    with live_server(inner_app) as inner_url:
        port = int(inner_url.rsplit(":", 1)[1])
        global_config = {"inner_server": {"resources_servers": {"demo": {"host": "127.0.0.1", "port": port}}}}
        outer_app = demo_server("outer_server", global_config).build_app()
        with live_server(outer_app) as outer_url:
            response = httpx.post(f"{outer_url}/call_inner", json={})
    assert response.status_code == 500
    assert response.json() == (
        'Hit an exception in DemoServer___outer_server calling an inner server: "ValueError: boom: the tool exploded"'
    )
    err = capsys.readouterr().err
    assert "DemoServer___outer_server POST /call_inner: an inner server call failed with HTTP 500" in err


def test_request_validation_error_is_logged_then_422(capsys):
    app = demo_server("svc").build_app()
    with live_server(app) as url:
        bad = httpx.post(f"{url}/echo", json={"count": "not a number", "x": "y" * 5000})
        not_json = httpx.post(f"{url}/echo", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "count"]
    assert not_json.status_code == 422
    err = capsys.readouterr().err
    assert "DemoServer___svc POST /echo: request validation failed (HTTP 422)" in err
    assert "int_parsing" in err and '"count": "not a number"' in err
    assert "more chars]" in err  # the long body is truncated
    assert len(err) < 10000


async def test_exception_after_response_started_is_logged_not_resent(capsys):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise KeyError("late")

    sent = []

    async def send(message):
        sent.append(message)

    middleware = NeMoGymExceptionMiddleware(app, server_key="X___y")
    await middleware({"type": "http", "method": "GET", "path": "/late", "headers": []}, None, send)
    assert [m["type"] for m in sent] == ["http.response.start"]
    assert "response had already started" in capsys.readouterr().err


async def test_cancellation_is_not_swallowed():
    async def app(scope, receive, send):
        raise asyncio.CancelledError()

    middleware = NeMoGymExceptionMiddleware(app, server_key="X___y")
    with pytest.raises(asyncio.CancelledError):
        await middleware({"type": "http", "method": "GET", "path": "/", "headers": []}, None, None)


async def test_non_http_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    await NeMoGymExceptionMiddleware(app, server_key="X___y")({"type": "lifespan"}, None, None)
    assert seen == ["lifespan"]


def test_session_key_and_cookie_name():
    server = demo_server("weather")
    assert server.get_session_middleware_key() == "DemoServer___weather"
    assert server.get_session_cookie_name() == "DemoServer___weather"


def test_simple_server_is_abstract():
    with pytest.raises(TypeError):
        SimpleServer(config=make_config(), server_client=ServerClient(global_config_dict={}))


# ------------------------------------------------------------------------------------------------------------
# Config loading


class WeatherConfig(BaseRunServerInstanceConfig):
    city: str
    units: str = "metric"


class WeatherServer(SimpleServer):
    config: WeatherConfig

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        return app


@pytest.fixture
def global_config(monkeypatch):
    from nemo_gym.config import global_config as gc

    def install(cfg: dict, server_id: str):
        gc.set_global_config_dict(cfg)
        monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", server_id)

    yield install
    gc.reset_global_config_dict_cache()


def test_load_config_from_global_config_validates_into_the_declared_config(global_config):
    global_config(
        {
            "default_city": "Paris",
            "weather": {
                "resources_servers": {
                    "weather_impl": {
                        "entrypoint": "app.py",
                        "host": "127.0.0.1",
                        "port": 12345,
                        "city": "${default_city}",
                        "extra_thing": 1,
                    }
                }
            },
        },
        "weather",
    )
    config = WeatherServer.load_config_from_global_config()
    assert isinstance(config, WeatherConfig)
    assert config.name == "weather"
    assert config.city == "Paris"  # interpolation resolved
    assert config.port == 12345 and config.units == "metric"


def test_load_config_missing_field_is_a_config_error(global_config):
    global_config(
        {"weather": {"resources_servers": {"w": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 1}}}}, "weather"
    )
    with pytest.raises(NeMoGymConfigError, match="city"):
        WeatherServer.load_config_from_global_config()


def test_run_webserver_dry_run_returns_without_serving(global_config):
    global_config(
        {
            "dry_run": True,
            "weather": {"resources_servers": {"w": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 1, "city": "x"}}},
        },
        "weather",
    )
    stdout_before = sys.stdout
    assert WeatherServer.run_webserver() is None
    assert sys.stdout is stdout_before  # nothing was wrapped or started


# ------------------------------------------------------------------------------------------------------------
# Process helpers


def _record(status: int) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', ("1.2.3.4:5", "GET", "/x", "1.1", status), None
    )


def test_access_log_filter_hides_only_200():
    f = HideOkAccessLogFilter()
    assert f.filter(_record(200)) is False
    assert f.filter(_record(404)) is True
    assert f.filter(_record(500)) is True
    other = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, "plain message", None, None)
    assert f.filter(other) is True


def test_install_access_log_filter_is_idempotent_and_switchable():
    access = logging.getLogger("uvicorn.access")
    try:
        install_access_log_filter(False)
        install_access_log_filter(False)
        assert sum(isinstance(f, HideOkAccessLogFilter) for f in access.filters) == 1
        install_access_log_filter(True)  # uvicorn_logging_show_200_ok: true
        assert not any(isinstance(f, HideOkAccessLogFilter) for f in access.filters)
    finally:
        install_access_log_filter(True)


def test_line_prefixing_writer_whole_lines_and_partial_flush():
    out = io.StringIO()
    w = LinePrefixingWriter(out, "(srv) ")
    print("hello", file=w)
    w.write("a\nb\nc")
    assert out.getvalue() == "(srv) hello\n(srv) a\n(srv) b\n"
    w.write("d")
    w.flush()  # a partial line is written on flush, once
    assert out.getvalue().endswith("(srv) cd")
    w.write(" more\n")  # continues the same line without a second prefix
    assert out.getvalue().endswith("(srv) cd more\n")
    w.write("tail")
    w.flush_all()
    assert out.getvalue().endswith("(srv) tail\n")
    assert w.write("") == 0
    with pytest.raises(TypeError):
        w.write(b"bytes")  # type: ignore[arg-type]


def test_line_prefixing_writer_threads_never_interleave_within_a_line():
    out = io.StringIO()
    w = LinePrefixingWriter(out, "(p) ")

    def worker(tag: str) -> None:
        for i in range(300):
            print(f"{tag}-{i}-" + tag * 20, file=w)

    threads = [threading.Thread(target=worker, args=(t,)) for t in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1200
    for line in lines:
        assert line.startswith("(p) ")
        tag = line[4]
        assert line.endswith(tag * 20) and line.count("(p)") == 1


def test_line_prefixing_writer_delegates_stream_attributes():
    out = io.StringIO()
    w = LinePrefixingWriter(out, "> ")
    assert w.isatty() is False
    assert w.getvalue() == ""  # any other attribute comes from the wrapped stream
    assert w.wrapped is out and w.prefix == "> "


def test_raise_open_files_limit():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    result = raise_open_files_limit()
    new_soft, new_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert new_hard == hard
    want = 65535 if hard == resource.RLIM_INFINITY else min(hard, 65535)
    assert new_soft == result and (new_soft >= want or new_soft == resource.RLIM_INFINITY)


def test_is_nemo_gym_fastapi_entrypoint(monkeypatch, tmp_path):
    entry = tmp_path / "app.py"
    entry.write_text("")
    monkeypatch.delenv(IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME, raising=False)
    monkeypatch.setenv(IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME, str(entry))
    assert not is_nemo_gym_fastapi_entrypoint(str(entry))  # not a worker
    monkeypatch.setenv(IS_NEMO_GYM_FASTAPI_WORKER_KEY_NAME, "1")
    assert is_nemo_gym_fastapi_entrypoint(str(entry))
    assert not is_nemo_gym_fastapi_entrypoint(str(tmp_path / "other.py"))
    monkeypatch.setenv(IS_NEMO_GYM_FASTAPI_ENTRYPOINT_KEY_NAME, "servers/impl/app.py")  # relative (reference style)
    assert is_nemo_gym_fastapi_entrypoint("/somewhere/servers/impl/app.py")

