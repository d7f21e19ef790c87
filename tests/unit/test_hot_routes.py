"""HotRoutes answers exactly as FastAPI does: the same server served three ways over real HTTP (plain FastAPI,
HotRoutes on uvicorn's protocol, HotRoutes' direct path on NeMoGymHttpProtocol), compared."""

from __future__ import annotations

import logging
import time

import httpx
import pytest
from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask
from pydantic import BaseModel, ConfigDict

from nemo_gym.http.client import ServerClient
from nemo_gym.servers.base import SimpleServer, serving_app
from nemo_gym.serving.hot_routes import HotRoutes
from nemo_gym.serving.private_api import NeMoGymHttpProtocol
from nemo_gym.testing.live_server import live_server as shared_live_server
from tests.unit.test_server_utils import live_server, make_config


class Question(BaseModel):
    text: str
    n: int = 1


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")
    reward: float


class DetailedAnswer(Answer):
    detail: str = "only in the subclass"


class Strict(BaseModel):
    value: int


def needs_header(request: Request) -> str:
    return request.headers.get("x-extra", "")


BACKGROUND_RUNS: list[str] = []


class RouteZoo(SimpleServer):
    """One route per case the fast path must either serve like FastAPI or leave to FastAPI."""

    refuse_unknown_session_cookies = True

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        app.post("/model")(self.model)
        app.post("/subclass")(self.subclass)
        app.post("/with_request")(self.with_request)
        app.post("/plain_dict")(self.plain_dict)
        app.post("/no_body")(self.no_body)
        app.post("/raw_response")(self.raw_response)
        app.post("/http_error")(self.http_error)
        app.post("/crash")(self.crash)
        app.post("/session")(self.session)
        app.post("/bad_answer")(self.bad_answer)
        app.post("/with_dependency")(self.with_dependency)
        app.post("/sync")(self.sync)
        app.post("/status", status_code=201)(self.created)
        app.post("/streamed")(self.streamed)
        app.post("/background")(self.background)
        app.post("/forget")(self.forget)
        return app

    async def model(self, body: Question) -> Answer:
        return Answer(reward=len(body.text) * body.n, extra_field="kept")

    async def subclass(self, body: Question) -> Answer:
        return DetailedAnswer(reward=1.0)  # FastAPI sends the declared model's fields (plus extras)

    async def with_request(self, request: Request, body: Question = Body()) -> dict:
        raw = await request.json()
        return {"raw": raw, "validated": body.model_dump(), "path": request.url.path}

    async def plain_dict(self, body: dict) -> dict:
        return {"keys": sorted(body)}

    async def no_body(self) -> Answer:
        return Answer(reward=0.5)

    async def raw_response(self, body: Question) -> Response:
        return Response(b'{"raw": true}', media_type="application/json", headers={"x-mine": "1"})

    async def http_error(self, body: Question) -> Answer:
        raise HTTPException(status_code=418, detail={"why": body.text})

    async def crash(self, body: Question) -> Answer:
        raise ValueError(f"broken on {body.text}")

    async def session(self, request: Request, body: Question) -> dict:
        request.session["seen"] = request.session.get("seen", 0) + 1
        return dict(request.session)

    async def bad_answer(self, body: Question) -> Strict:
        return {"value": "not a number"}  # type: ignore[return-value]

    async def with_dependency(self, body: Question, extra: str = Depends(needs_header)) -> dict:
        return {"extra": extra}

    def sync(self, body: Question) -> dict:
        return {"sync": body.text}

    async def created(self, body: Question) -> Answer:
        return Answer(reward=2.0)

    async def streamed(self, body: Question) -> StreamingResponse:
        async def parts():
            for i in range(body.n):
                yield f"{body.text}{i};".encode()

        return StreamingResponse(parts(), media_type="text/plain")

    async def background(self, body: Question) -> Response:
        return Response(b"later", background=BackgroundTask(BACKGROUND_RUNS.append, body.text))

    async def forget(self, request: Request) -> dict:
        request.session.clear()
        return {"forgotten": True}


def make_server() -> RouteZoo:
    config = make_config("zoo")
    return RouteZoo(config=config, server_client=ServerClient(head_server_config=None, global_config_dict={}))


def test_only_plain_async_post_routes_are_hot():
    hot = HotRoutes(make_server().build_app(), own_middleware=_own_middleware())
    assert {"/model", "/subclass", "/with_request", "/plain_dict", "/no_body", "/status", "/crash"} <= set(hot.routes)
    assert "/with_dependency" not in hot.routes and "/sync" not in hot.routes and "/health" not in hot.routes


def test_foreign_middleware_or_handlers_turn_the_fast_path_off():
    app = make_server().build_app()

    @app.middleware("http")
    async def stamp(request, call_next):  # pragma: no cover - never called here
        return await call_next(request)

    hot = HotRoutes(app, own_middleware=_own_middleware())
    assert hot.routes == {} and hot.route_for(b"/model") is None
    assert HotRoutes(make_server().build_app(), own_middleware=_own_middleware()).route_for(b"/model") is not None
    app = make_server().build_app()
    app.add_exception_handler(ValueError, lambda request, exc: Response(status_code=400))
    assert HotRoutes(app, own_middleware=_own_middleware()).routes == {}


def _own_middleware():
    from nemo_gym.serving.sessions import SessionCookieMiddleware
    from nemo_gym.serving.errors import NeMoGymExceptionMiddleware

    return (SessionCookieMiddleware, NeMoGymExceptionMiddleware)


CASES = [
    ("/model", {"json": {"text": "abc", "n": 2}}),
    ("/model", {"json": {"text": "abc", "n": "two"}}),  # 422 from FastAPI, through the fallback
    ("/model", {"json": {"n": 2}}),
    ("/model", {"content": b"not json", "headers": {"content-type": "application/json"}}),
    ("/model", {"content": b'{"text": "x"}', "headers": {"content-type": "text/plain"}}),
    ("/model", {"content": b'{"text": "no content type"}'}),
    ("/model", {}),
    ("/subclass", {"json": {"text": "a"}}),
    ("/with_request", {"json": {"text": "a", "unknown": [1, 2]}}),
    ("/plain_dict", {"json": {"b": 1, "a": 2}}),
    ("/plain_dict", {"json": [1, 2]}),
    ("/no_body", {}),
    ("/raw_response", {"json": {"text": "a"}}),
    ("/http_error", {"json": {"text": "teapot"}}),
    ("/crash", {"json": {"text": "purpose"}}),
    ("/bad_answer", {"json": {"text": "a"}}),
    ("/with_dependency", {"json": {"text": "a"}, "headers": {"x-extra": "yes"}}),
    ("/sync", {"json": {"text": "a"}}),
    ("/status", {"json": {"text": "a"}}),
    ("/seed_session", {"json": {}}),
    ("/missing", {"json": {}}),
    ("/streamed", {"json": {"text": "s", "n": 3}}),
    ("/background", {"json": {"text": "b"}}),
    ("/forget", {}),
    ("/model", {"json": {"text": "abc"}, "cookies": {"RouteZoo___zoo": "e30.bm90IHNpZ25lZA"}}),  # 409: not ours
    ("/seed_session", {"json": {}, "cookies": {"RouteZoo___zoo": "e30.bm90IHNpZ25lZA"}}),  # seeding is let through
    ("/model?x=1", {"json": {"text": "query"}}),
    ("/model", {"json": {"text": "closing"}, "headers": {"connection": "close"}}),
]


@pytest.fixture(scope="module")
def urls():
    server = make_server()
    direct = serving_app(server.build_app())
    answer = direct.answer

    def counted_answer(*args):
        DIRECT_ANSWERS.append(args[1]["path"])
        return answer(*args)

    direct.answer = counted_answer
    with (
        live_server(server.build_app()) as fastapi_url,
        live_server(serving_app(server.build_app())) as hot_url,
        shared_live_server(direct, http=NeMoGymHttpProtocol, proxy_headers=False) as direct_url,
    ):
        yield fastapi_url, hot_url, direct_url


DIRECT_ANSWERS: list[str] = []


def test_the_third_server_takes_the_direct_path_and_writes_uvicorns_access_lines(urls):
    """Whatever the process's logging set-up (a handler on uvicorn's access logger, or one it propagates to)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    access = logging.getLogger("uvicorn.access")
    handler = Keep()
    DIRECT_ANSWERS.clear()
    assert httpx.post(urls[2] + "/model", json={"text": "d"}).status_code == 200  # a new connection per call
    assert httpx.post(urls[2] + "/model?x=1", json={"text": "d"}).status_code == 200  # a query: not direct
    access.addHandler(handler)
    level = access.level
    access.setLevel(logging.INFO)  # the live server logs at warning
    try:
        assert httpx.post(urls[2] + "/model", json={"n": 1}).status_code == 422  # through uvicorn's cycle
        assert httpx.post(urls[2] + "/model", json={"text": "logged"}).status_code == 200
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert DIRECT_ANSWERS == ["/model", "/model", "/model"]  # the 422 is handed on by the direct path
    assert [line.split(" - ", 1)[1] for line in lines] == ['"POST /model HTTP/1.1" 422', '"POST /model HTTP/1.1" 200']


def _answer(url: str, path: str, kwargs: dict) -> tuple:
    kwargs = dict(kwargs)
    with httpx.Client(cookies=kwargs.pop("cookies", None)) as client:
        response = client.post(url + path, **kwargs)
    try:
        body = response.json()
    except ValueError:
        body = response.text
    headers = {k: v for k, v in response.headers.items() if k in ("content-type", "x-mine", "connection")}
    cookie = response.headers.get("set-cookie")
    cookie_shape = None if cookie is None else (cookie.split("=", 1)[0], cookie.split(";", 1)[1], "null;" in cookie)
    return response.status_code, body, headers, cookie_shape


@pytest.mark.parametrize("path, kwargs", CASES, ids=[f"{p} {i}" for i, (p, _) in enumerate(CASES)])
def test_hot_and_fastapi_answers_are_the_same(urls, path, kwargs):
    fastapi_url, hot_url, direct_url = urls
    fastapi = _answer(fastapi_url, path, kwargs)
    for answer in (_answer(hot_url, path, kwargs), _answer(direct_url, path, kwargs)):
        if path == "/bad_answer":  # FastAPI's message adds where the endpoint is defined; the error is the same
            assert answer[0] == fastapi[0] == 500
            assert answer[1].splitlines()[:2] == fastapi[1].splitlines()[:2]
            assert answer[1].startswith("ResponseValidationError: 1 validation error")
        else:
            assert answer == fastapi


def test_background_tasks_run_on_the_direct_path(urls):
    _, _, direct_url = urls
    assert httpx.post(direct_url + "/background", json={"text": "direct"}).text == "later"
    deadline = time.monotonic() + 5  # the task runs after the response has gone out
    while "direct" not in BACKGROUND_RUNS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert BACKGROUND_RUNS.count("direct") == 1


@pytest.mark.parametrize("which", [1, 2])
def test_sessions_work_the_same_on_the_fast_path(urls, which):
    with httpx.Client(base_url=urls[which]) as client:
        first = client.post("/session", json={"text": "a"}).json()
        second = client.post("/session", json={"text": "a"}).json()
        assert client.post("/forget").json() == {"forgotten": True}
        third = client.post("/session", json={"text": "a"}).json()
    assert second["session_id"] == first["session_id"] and second["seen"] == 2
    assert third["session_id"] != first["session_id"] and third["seen"] == 1


def test_serving_app_can_be_turned_off(monkeypatch):
    app = make_server().build_app()
    monkeypatch.setenv("NEMO_GYM_HOT_ROUTES", "0")
    assert serving_app(app) is app
    monkeypatch.delenv("NEMO_GYM_HOT_ROUTES")
    assert isinstance(serving_app(app), HotRoutes)
