"""v0.5 `nemo_gym.server_utils`: `request()` over the global aiohttp client (bodies, retries), the client's
functions, `get_server_url`, `setup_server_client` against a real head server, and `raise_for_status` reading
`.ok`. Real sockets throughout: uvicorn for well-behaved servers, raw asyncio servers for the failures."""

from __future__ import annotations

import asyncio
import socket
from unittest.mock import AsyncMock, MagicMock, PropertyMock

import aiohttp
import pytest
import yaml
from omegaconf import OmegaConf
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from nemo_gym.config import global_config as global_config_module
from nemo_gym.http import external
from nemo_gym.runtime.head_server import HeadServer
from nemo_gym.server_utils import (
    GlobalAIOHTTPAsyncClientConfig,
    NeMoGymHTTPError,
    apply_rollout_prefix,
    get_global_aiohttp_client,
    get_response_json,
    get_server_url,
    global_aiohttp_client_exit,
    is_global_aiohttp_client_request_debug_enabled,
    is_global_aiohttp_client_setup,
    raise_for_status,
    request,
    rollout_path_prefix,
    set_global_aiohttp_client,
    setup_server_client,
)
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.stack import free_port


@pytest.fixture(autouse=True)
def isolated_process_config(monkeypatch):
    """Each test starts without a loaded global config and without `setup_server_client`'s config."""
    monkeypatch.setattr(external, "_configured", None)
    monkeypatch.setattr(global_config_module, "_GLOBAL_CONFIG_DICT", None)
    monkeypatch.delenv(global_config_module.NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME, raising=False)


# ----------------------------------------------------------------------------------------------- servers


def echo_app(hits: dict) -> Starlette:
    async def echo(request: Request):
        hits["echo"] = hits.get("echo", 0) + 1
        return JSONResponse({
            "method": request.method,
            "content_type": request.headers.get("content-type"),
            "user_agent": request.headers.get("user-agent"),
            "query": dict(request.query_params),
            "body": (await request.body()).decode(),
        })

    async def unavailable(request: Request):
        hits["unavailable"] = hits.get("unavailable", 0) + 1
        return PlainTextResponse("try later", status_code=503)

    async def broken(request: Request):
        return PlainTextResponse("upstream exploded", status_code=500)

    return Starlette(routes=[
        Route("/echo", echo, methods=["GET", "POST"]),
        Route("/unavailable", unavailable, methods=["POST"]),
        Route("/broken", broken, methods=["GET"]),
    ])


async def raw_server(misbehave_first: int, how: str):
    """A TCP server whose first `misbehave_first` requests are answered badly (`drop`: the connection is closed
    without an answer; `garbage`: bytes that are not HTTP), the rest with a 200 JSON body. Returns (server, url,
    counter)."""
    seen = {"requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        seen["requests"] += 1
        if seen["requests"] <= misbehave_first:
            if how == "garbage":
                writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                await writer.drain()
        else:
            body = b'{"ok": true}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/x", seen


@pytest.fixture(scope="module")
def echo_server():
    hits: dict = {}
    with live_server(echo_app(hits)) as url:
        yield url, hits


# ----------------------------------------------------------------------------------------------- request()


class Question(BaseModel):
    text: str
    hint: str = "none"


async def test_request_sends_json_with_orjson_and_returns_an_aiohttp_response(echo_server):
    url, _ = echo_server
    resp = await request("POST", f"{url}/echo", json={"q": "hi", "n": [1, 2]}, params={"k": "v"})
    assert isinstance(resp, aiohttp.ClientResponse)
    assert resp.status == 200
    data = await get_response_json(resp)
    assert data["content_type"] == "application/json"
    assert data["body"] == '{"q":"hi","n":[1,2]}'  # orjson's compact form
    assert data["query"] == {"k": "v"}
    assert data["user_agent"].startswith("nemo-gym/")

    resp = await request("POST", f"{url}/echo", json=Question(text="t"), headers={"User-Agent": "mine/1"})
    data = await resp.json()
    assert data["body"] == '{"text":"t"}'  # pydantic models: unset fields left out
    assert data["user_agent"] == "mine/1"


async def test_http_statuses_are_never_retried(echo_server):
    url, hits = echo_server
    before = hits.get("unavailable", 0)
    resp = await request("POST", f"{url}/unavailable", json={})
    assert resp.status == 503 and await resp.text() == "try later"
    assert hits["unavailable"] == before + 1


async def test_a_dropped_connection_is_retried_until_it_succeeds():
    server, url, seen = await raw_server(misbehave_first=4, how="drop")
    async with server:
        resp = await request("GET", url)  # external, yet retried past MAX_NUM_TRIES
        assert resp.status == 200 and await resp.json() == {"ok": True}
    assert seen["requests"] == 5


async def test_other_errors_give_up_after_three_tries_for_external_calls():
    server, url, seen = await raw_server(misbehave_first=10, how="garbage")
    async with server:
        with pytest.raises(aiohttp.ClientResponseError):
            await request("GET", url)
    assert seen["requests"] == external.MAX_NUM_TRIES == 3


async def test_other_errors_are_retried_until_success_for_internal_calls():
    server, url, seen = await raw_server(misbehave_first=4, how="garbage")
    async with server:
        resp = await request("GET", url, _internal=True)
        assert resp.status == 200
    assert seen["requests"] == 5


# ----------------------------------------------------------------------------------------------- the global client


async def test_the_global_client_is_one_session_per_loop_and_can_be_closed(echo_server):
    url, _ = echo_server
    session = get_global_aiohttp_client()
    assert isinstance(session, aiohttp.ClientSession) and not session.closed
    assert get_global_aiohttp_client() is session
    task = global_aiohttp_client_exit()
    assert task is not None
    await task
    assert session.closed
    fresh = get_global_aiohttp_client()
    assert fresh is not session and not fresh.closed
    resp = await request("GET", f"{url}/echo")
    assert resp.status == 200 and (await resp.json())["method"] == "GET"


def test_the_global_client_needs_a_running_loop():
    with pytest.raises(RuntimeError, match="running event loop"):
        get_global_aiohttp_client()


async def test_set_global_aiohttp_client_sizes_the_connector_from_a_global_config(echo_server):
    """As trainers call it: `if not is_global_aiohttp_client_setup(): set_global_aiohttp_client(
    GlobalAIOHTTPAsyncClientConfig.model_validate(global_config_dict))`, the config a DictConfig with other keys."""
    url, _ = echo_server
    global_config_dict = OmegaConf.create({
        "global_aiohttp_connector_limit": 65_536,
        "global_aiohttp_connector_limit_per_host": "16384",
        "global_aiohttp_client_request_debug": True,
        "policy_api_key": "${oc.env:NEMO_GYM_TEST_UNSET_VARIABLE}",  # other keys are never read
    })
    assert not is_global_aiohttp_client_setup()
    session = set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig.model_validate(global_config_dict))
    assert is_global_aiohttp_client_setup() and get_global_aiohttp_client() is session
    assert (session.connector.limit, session.connector.limit_per_host) == (65_536, 16_384)
    assert is_global_aiohttp_client_request_debug_enabled()
    resp = await request("GET", f"{url}/echo")
    assert resp.status == 200
    with pytest.raises(RuntimeError, match="already.*global_aiohttp_client_exit"):
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    await global_aiohttp_client_exit()
    assert not is_global_aiohttp_client_setup()


async def test_the_global_client_counts_as_set_up_once_anything_made_it_on_this_loop(echo_server):
    url, _ = echo_server
    assert not is_global_aiohttp_client_setup()
    await request("GET", f"{url}/echo")
    assert is_global_aiohttp_client_setup()


def test_no_global_client_is_set_up_outside_an_event_loop():
    assert not is_global_aiohttp_client_setup()
    with pytest.raises(RuntimeError, match="running event loop"):
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())


def test_the_client_config_defaults_are_v05s():
    cfg = GlobalAIOHTTPAsyncClientConfig.model_validate({})
    assert (cfg.global_aiohttp_connector_limit, cfg.global_aiohttp_connector_limit_per_host) == (102_400, 1024)
    assert not cfg.global_aiohttp_client_request_debug


def test_setup_server_client_reads_the_head_servers_config(monkeypatch):
    port = free_port()
    config = {
        "head_server": {"host": "127.0.0.1", "port": port},
        "global_aiohttp_client_request_debug": True,
        "lookup": {"resources_servers": {"lookup": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 23456}}},
    }
    head = HeadServer(yaml.safe_dump(config), lambda: [])
    head.start(socket.create_server(("127.0.0.1", port)))
    try:
        assert not is_global_aiohttp_client_request_debug_enabled()
        client = setup_server_client({"host": "127.0.0.1", "port": port})
        assert client.base_url("lookup") == "http://127.0.0.1:23456"
        assert is_global_aiohttp_client_request_debug_enabled()
    finally:
        head.stop()


def test_get_server_url_reads_this_processs_config(monkeypatch):
    monkeypatch.setattr(global_config_module, "_GLOBAL_CONFIG_DICT", global_config_module.OmegaConf.create({
        "judge": {"responses_api_models": {"openai_model": {"entrypoint": "app.py", "host": "0.0.0.0", "port": 9100}}},
    }))
    assert get_server_url("judge") == "http://127.0.0.1:9100"
    with pytest.raises(ValueError, match="judg"):
        get_server_url("judg")


def test_rollout_prefix_helpers_are_reexported():
    assert rollout_path_prefix(None) == ""
    assert rollout_path_prefix("3-1") == "/ng-rollout/3-1"
    assert apply_rollout_prefix("http://h:1", "3-1").startswith("http://h:1/ng-rollout/3-1")


# ----------------------------------------------------------------------------------------------- raise_for_status


class StubResponse:
    """A response object as a test hand-builds one: `ok`, `status` and an awaitable `read()`; it counts how often
    `.ok` is read."""

    def __init__(self, ok: bool, status: int, body: bytes) -> None:
        self._ok, self.status, self._body = ok, status, body
        self.ok_reads = 0
        self.body_reads = 0

    @property
    def ok(self) -> bool:
        self.ok_reads += 1
        return self._ok

    async def read(self) -> bytes:
        self.body_reads += 1
        return self._body


async def test_raise_for_status_reads_ok_and_attaches_the_body():
    # The status alone would pass: only `.ok` says this response failed.
    response = StubResponse(ok=False, status=200, body=b'{"detail": "judge unavailable"}')
    with pytest.raises(NeMoGymHTTPError) as info:
        await raise_for_status(response)
    assert response.ok_reads >= 1 and response.body_reads == 1
    assert info.value.response_content == '{"detail": "judge unavailable"}'
    assert isinstance(info.value, aiohttp.ClientResponseError)


async def test_raise_for_status_lets_an_ok_response_through_whatever_its_status():
    response = StubResponse(ok=True, status=500, body=b"not read")
    await raise_for_status(response)
    assert response.ok_reads >= 1 and response.body_reads == 0


async def test_raise_for_status_on_a_magicmock_response_as_v05_tests_build_it():
    response = MagicMock()
    ok = PropertyMock(return_value=False)
    type(response).ok = ok
    response.read = AsyncMock(return_value=b'{"detail": "judge unavailable"}')
    with pytest.raises(NeMoGymHTTPError) as info:
        await raise_for_status(response)
    assert ok.called
    response.read.assert_awaited_once()
    assert info.value.response_content == '{"detail": "judge unavailable"}'


async def test_raise_for_status_on_a_real_response_of_request(echo_server):
    url, _ = echo_server
    resp = await request("GET", f"{url}/broken")
    with pytest.raises(NeMoGymHTTPError) as info:
        await raise_for_status(resp)
    assert info.value.response_content == "upstream exploded"
    assert info.value.status == 500


def test_liveness_answers_get_slash_on_the_head_server_and_every_server_base():
    """`GET /` -> `{"status": "ok"}` (v0.5): the head server, and `setup_liveness` (on `BaseServer`) as `prepare_app` uses
    it; an app that serves `/` itself keeps its own route."""
    import httpx as httpx_client
    from fastapi import FastAPI

    from nemo_gym.server_utils import BaseServer, SimpleServer

    port = free_port()
    head = HeadServer("{}", lambda: [])
    head.start(socket.create_server(("127.0.0.1", port)))
    try:
        assert httpx_client.get(f"http://127.0.0.1:{port}/").json() == {"status": "ok"}
    finally:
        head.stop()

    assert SimpleServer.setup_liveness is BaseServer.setup_liveness
    own = FastAPI()

    @own.get("/")
    async def mine() -> dict:
        return {"mine": True}

    BaseServer.setup_liveness(None, own)  # the method reads nothing of the server
    plain = FastAPI()
    BaseServer.setup_liveness(None, plain)

    for app, expected in ((own, {"mine": True}), (plain, {"status": "ok"})):
        with live_server(app) as base:
            assert httpx_client.get(base + "/").json() == expected


def test_async_openai_create_completion_posts_to_completions_with_the_default_headers():
    from nemo_gym.openai_utils import NeMoGymAsyncOpenAI

    seen: list = []

    async def completions(request: Request):
        seen.append((request.url.path, request.headers.get("x-team"), await request.json()))
        return JSONResponse({"object": "text_completion", "choices": [{"text": " 4", "index": 0}]})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])

    with live_server(app) as base:
        client = NeMoGymAsyncOpenAI(base + "/v1", api_key="k", default_headers={"X-Team": "gym"})
        assert client.default_headers == {"X-Team": "gym"}
        answer = asyncio.run(client.create_completion(model="m", prompt="2 + 2 =", max_tokens=2))
    assert answer["choices"][0]["text"] == " 4"
    assert seen == [("/v1/completions", "gym", {"model": "m", "prompt": "2 + 2 =", "max_tokens": 2})]
