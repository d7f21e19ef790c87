"""ServerClient against a real HTTP server on 127.0.0.1 (uvicorn in a background thread)."""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import socket
import threading
import time
from http.cookies import SimpleCookie
from typing import Optional

import aiohttp
import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from omegaconf import OmegaConf
from pydantic import BaseModel

from nemo_gym.http import client as sc
from nemo_gym.http import retry
from nemo_gym.http.client import (
    NeMoGymHTTPError,
    ServerClient,
    close_global_client,
    get_global_client,
    get_global_transport,
    get_response_json,
    raise_for_status,
)
from tests.unit.test_retry import slept  # noqa: F401  (fixture)

# ------------------------------------------------------------------------------------------ test server


def _build_app(state: dict) -> FastAPI:
    app = FastAPI()
    calls: collections.Counter = state["calls"]

    @app.post("/echo")
    @app.get("/echo")
    async def echo(request: Request):
        raw = await request.body()
        return {
            "method": request.method,
            "body": orjson.loads(raw) if raw else None,
            "content_type": request.headers.get("content-type"),
            "cookie": request.headers.get("cookie"),
            "x_test": request.headers.get("x-test"),
            "query": dict(request.query_params),
        }

    @app.get("/set_cookie")
    async def set_cookie():
        response = Response(content=b'{"ok": true}', media_type="application/json")
        response.set_cookie("SimpleAgent___agent", "signed.value-1")
        response.set_cookie("other", "two")
        return response

    @app.api_route("/flaky/{key}/{failures}/{status}", methods=["GET", "POST"])
    async def flaky(key: str, failures: int, status: int, retry_after: Optional[str] = None):
        calls[key] += 1
        if calls[key] <= failures:
            headers = {"Retry-After": retry_after} if retry_after else None
            return Response(content=f"try again ({calls[key]})", status_code=status, headers=headers)
        return {"ok": True, "calls": calls[key]}

    @app.post("/status/{key}/{status}")
    async def always(key: str, status: int):
        calls[key] += 1
        return Response(content=f"status {status} body for {key}", status_code=status)

    @app.get("/bytes/{key}/{n}")
    async def n_bytes(key: str, n: int, chunked: bool = False):
        calls[key] += 1
        if not chunked:
            return Response(content=b"b" * n, media_type="application/octet-stream")

        async def parts():
            for start in range(0, n, 16384):
                yield b"c" * min(16384, n - start)

        return StreamingResponse(parts(), media_type="application/octet-stream")

    @app.api_route("/slow/{key}", methods=["GET", "POST"])
    async def slow(key: str):
        calls[key] += 1
        await asyncio.sleep(3)
        return {"ok": True}

    @app.get("/global_config_dict_yaml")
    async def global_config_dict_yaml():
        if state.get("raw_yaml"):
            return Response(content=state["yaml"], media_type="text/plain")
        return state["yaml"]  # FastAPI JSON-encodes the str: a JSON string literal holding YAML

    return app


class _ThreadedServer:
    def __init__(self) -> None:
        self.state: dict = {"calls": collections.Counter(), "yaml": ""}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(2048)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(
            _build_app(self.state), log_level="warning", lifespan="off", access_log=False, backlog=2048
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> "_ThreadedServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def server():
    srv = _ThreadedServer().start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
async def _fresh_shared_client():
    yield
    await close_global_client()


def _config(port: int, host: str = "127.0.0.1") -> dict:
    return {
        "head_server": {"host": "127.0.0.1", "port": 11000},
        "test_agent": {"responses_api_agents": {"simple_agent": {"host": host, "port": port}}},
        "test_resources": {"resources_servers": {"example": {"host": host, "port": port, "domain": "other"}}},
        "policy_model_name": "x",
    }


def _client(port: int, **kwargs) -> ServerClient:
    kwargs.setdefault("backoff_base", 0.01)
    kwargs.setdefault("backoff_max", 0.05)
    return ServerClient(global_config_dict=_config(port), **kwargs)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ------------------------------------------------------------------------------------------ addressing


def test_url_building_from_dict_and_dictconfig():
    client = ServerClient(global_config_dict=_config(12345))
    assert client.base_url("test_agent") == "http://127.0.0.1:12345"
    cfg = OmegaConf.create(
        {
            "default_host": "127.0.0.1",
            "my_model": {"responses_api_models": {"openai_model": {"host": "${default_host}", "port": "23456"}}},
        }
    )
    client = ServerClient(global_config_dict=cfg)
    assert client.base_url("my_model") == "http://127.0.0.1:23456"
    assert client.base_url("my_model") is client.base_url("my_model")  # cached


async def test_request_goes_to_the_configured_host_and_path(server):
    client = _client(server.port)
    response = await client.get("test_resources", "/echo", params={"q": "1"})
    assert response.status_code == 200
    assert str(response.url) == f"http://127.0.0.1:{server.port}/echo?q=1"
    assert (await get_response_json(response))["query"] == {"q": "1"}
    # A path without its leading slash still works.
    response = await client.post("test_agent", "echo", json={"a": 1})
    assert (await response.json())["body"] == {"a": 1}


def test_unknown_server_lists_known_ids():
    client = ServerClient(global_config_dict=_config(1))
    with pytest.raises(ValueError) as info:
        client.base_url("test_agnet")
    message = str(info.value)
    assert "test_agnet" in message
    assert "test_agent" in message and "test_resources" in message
    assert "head_server" not in message.split("Known server ids:")[1]
    assert "Did you mean `test_agent`" in message


def test_server_without_port_is_a_clear_error():
    cfg = {"srv": {"resources_servers": {"impl": {"host": "127.0.0.1"}}}}
    with pytest.raises(ValueError, match="no host/port"):
        ServerClient(global_config_dict=cfg).base_url("srv")


# ------------------------------------------------------------------------------------------ bodies


class _Inner(BaseModel):
    x: int = 1
    y: Optional[str] = None


class _Body(BaseModel):
    model: str = "default-model"
    temperature: Optional[float] = None
    inner: Optional[_Inner] = None


async def test_pydantic_body_is_dumped_with_exclude_unset(server):
    client = _client(server.port)
    body = _Body(temperature=0.5, inner=_Inner(y="z"))
    response = await client.post("test_agent", "/echo", json=body)
    seen = (await response.json())
    assert seen["body"] == {"temperature": 0.5, "inner": {"y": "z"}}
    assert seen["content_type"] == "application/json"


async def test_plain_json_with_nested_models_and_headers(server):
    client = _client(server.port)
    response = await client.post(
        "test_agent", "/echo", json={"items": [_Inner(x=5)], "n": 1}, headers={"X-Test": "yes"}
    )
    seen = (await response.json())
    assert seen["body"] == {"items": [{"x": 5}], "n": 1}
    assert seen["content_type"] == "application/json"
    assert seen["x_test"] == "yes"


# ------------------------------------------------------------------------------------------ cookies


async def test_cookies_are_sent_explicitly_and_never_stored(server):
    client = _client(server.port)
    response = await client.post("test_agent", "/echo", json={}, cookies={"a": "1", "b": "2"})
    assert (await response.json())["cookie"] == "a=1; b=2"
    # The next call without cookies carries none: nothing was stored.
    response = await client.post("test_agent", "/echo", json={})
    assert (await response.json())["cookie"] is None
    # httpx.Cookies and SimpleCookie are accepted too.
    jar = httpx.Cookies()
    jar.set("c", "3", domain="127.0.0.1")
    assert (await (await client.post("test_agent", "/echo", json={}, cookies=jar)).json())["cookie"] == "c=3"
    simple = SimpleCookie()
    simple["d"] = "4"
    assert (await (await client.post("test_agent", "/echo", json={}, cookies=simple)).json())["cookie"] == "d=4"
    # A second client on the same loop shares the transport but not cookies.
    other = _client(server.port)
    assert (await (await other.get("test_agent", "/echo")).json())["cookie"] is None


async def test_set_cookie_is_read_from_the_response_and_can_be_passed_on(server):
    client = _client(server.port)
    response = await client.get("test_agent", "/set_cookie")
    assert response.cookies["SimpleAgent___agent"].value == "signed.value-1"
    assert response.cookies["other"].value == "two"
    response2 = await client.post("test_resources", "/echo", json={}, cookies=response.cookies)
    sent = (await response2.json())["cookie"]
    assert "SimpleAgent___agent=signed.value-1" in sent and "other=two" in sent
    # Not stored by the client, nor by the shared AsyncClient.
    assert (await (await client.get("test_agent", "/echo")).json())["cookie"] is None
    shared = await get_global_client()
    await shared.get(f"http://127.0.0.1:{server.port}/set_cookie")
    assert len(shared.cookies.jar) == 0
    assert (await shared.get(f"http://127.0.0.1:{server.port}/echo")).json()["cookie"] is None


# ------------------------------------------------------------------------------------------ retries


# A POST (a tool call, a /verify) is retried only on statuses that mean it never ran; a GET, or a call that says
# `idempotent=True`, also on those that mean it may have run (500, 502, 504).
@pytest.mark.parametrize(
    "method, idempotent, status",
    [
        ("POST", None, 429), ("POST", None, 503), ("POST", None, 408),
        ("GET", None, 502), ("GET", None, 504), ("POST", True, 500), ("POST", True, 502),
    ],
)
async def test_retry_on_retryable_status_then_success(server, method, idempotent, status):
    key = f"retry-{method}-{idempotent}-{status}"
    client = _client(server.port)
    response = await client.request("test_agent", f"/flaky/{key}/2/{status}", method, idempotent=idempotent)
    assert response.status_code == 200
    assert (await response.json()) == {"ok": True, "calls": 3}
    assert server.state["calls"][key] == 3
    assert response.attempts == 3


async def test_503_with_retry_after_is_retried_after_the_time_asked_for(server, slept):
    client = _client(server.port, max_retry_after=30.0)
    response = await client.post("test_agent", "/flaky/ra/2/503?retry_after=2", json={})
    assert response.status_code == 200 and server.state["calls"]["ra"] == 3
    assert slept == [2.0, 2.0]  # the backoff (at most 0.05 s here) is raised to what the server asked
    response = await client.post("test_agent", "/flaky/ra-cap/1/429?retry_after=3600", json={})
    assert response.status_code == 200 and slept[-1] == 30.0  # capped at max_retry_after
    # Retry-After on a status that is not retried for this request changes nothing.
    response = await client.post("test_agent", "/flaky/ra-500/1/500?retry_after=1", json={})
    assert response.status_code == 500 and server.state["calls"]["ra-500"] == 1 and len(slept) == 3


async def test_give_up_after_max_attempts_on_503(server):
    client = _client(server.port, max_attempts=3)
    response = await client.post("test_agent", "/status/giveup/503", json={})
    assert response.status_code == 503
    assert server.state["calls"]["giveup"] == 3
    with pytest.raises(NeMoGymHTTPError) as info:
        await raise_for_status(response)
    assert info.value.status == 503 and info.value.response.status_code == 503
    assert "after 3 attempts" in str(info.value)
    assert "test_agent" in str(info.value)
    # Per-call override of the bound.
    response = await client.post("test_agent", "/status/giveup-once/503", json={}, max_attempts=1)
    assert response.status_code == 503 and server.state["calls"]["giveup-once"] == 1


# A tool that raised (500), or a gateway that lost the answer (502, 504), may have done its work: a POST is
# not sent again (before the shared retry policy, 502 and 504 were retried for every request).
@pytest.mark.parametrize("status", [400, 404, 422, 500, 501, 502, 504])
async def test_no_retry_on_other_error_statuses(server, status):
    key = f"noretry-{status}"
    client = _client(server.port)
    response = await client.post("test_agent", f"/status/{key}/{status}", json={})
    assert response.status_code == status
    assert server.state["calls"][key] == 1


async def test_connection_refused_is_retried_then_raised_clearly():
    port = _free_port()
    client = _client(port, max_attempts=3)
    with pytest.raises(httpx.ConnectError) as info:
        await client.post("test_agent", "/run", json={"x": 1})
    err = info.value
    assert err.attempts == 3
    assert err.server_name == "test_agent"
    message = str(err)
    assert f"127.0.0.1:{port}/run" in message
    assert "test_agent" in message and "after 3 attempts" in message
    assert "running" in message


# A disconnect after the request was sent may come after the handler ran: retried for idempotent calls only
# (before the shared retry policy, every POST was retried on it).
async def test_remote_disconnect_is_retried_for_idempotent_calls_only():
    accepted = 0

    async def handle(reader, writer):
        nonlocal accepted
        accepted += 1
        await reader.read(100)  # start of the request, then hang up without answering
        writer.close()

    tcp = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    try:
        client = _client(port, max_attempts=3)
        with pytest.raises(httpx.TransportError) as info:
            await client.post("test_agent", "/run", json={"x": 1}, idempotent=True)
        assert isinstance(info.value, sc.RETRY_EXCEPTIONS)
        assert info.value.attempts == 3
        assert accepted == 3
        with pytest.raises(httpx.TransportError) as info:
            await client.post("test_agent", "/verify", json={"x": 1})
        assert info.value.attempts == 1 and accepted == 4
    finally:
        tcp.close()
        await tcp.wait_closed()


async def test_read_timeout_is_retried_for_idempotent_calls_only(server):
    client = _client(server.port)
    with pytest.raises(httpx.ReadTimeout) as info:
        await client.post("test_agent", "/slow/t1", json={}, timeout=httpx.Timeout(5.0, read=0.2))
    assert info.value.attempts == 1  # the server may still be working on it
    assert server.state["calls"]["t1"] == 1
    with pytest.raises(httpx.ReadTimeout) as info:
        await client.get("test_agent", "/slow/t2", timeout=httpx.Timeout(5.0, read=0.2), max_attempts=2)
    assert info.value.attempts == 2 and server.state["calls"]["t2"] == 2


def test_retry_settings_are_the_policy_s():
    client = ServerClient(global_config_dict={}, max_attempts=5, backoff_base=0.1, backoff_max=2.0, max_retry_after=9)
    assert client.retry_policy == sc.RetryPolicy(5, 0.1, 2.0, 9.0)
    assert (client.max_attempts, client.backoff_base, client.backoff_max, client.max_retry_after) == (5, 0.1, 2.0, 9.0)
    assert sc.RETRY_STATUSES is retry.RETRY_STATUSES and sc.RETRY_EXCEPTIONS is retry.RETRY_EXCEPTIONS  # one set
    with pytest.raises(ValueError):
        ServerClient(global_config_dict={}, max_attempts=0)


# ------------------------------------------------------------------------------------------ helpers


async def test_raise_for_status_attaches_body_text(server):
    client = _client(server.port)
    response = await client.post("test_resources", "/status/boom/500", json={})
    with pytest.raises(NeMoGymHTTPError) as info:
        await raise_for_status(response)
    err = info.value
    assert err.response_content == "status 500 body for boom"
    assert err.status == err.status_code == 500
    assert isinstance(err, httpx.HTTPStatusError)
    assert isinstance(err, aiohttp.ClientResponseError)  # code written against the reference still catches it
    message = str(err)
    assert "500" in message and "test_resources" in message and "/status/boom/500" in message
    assert "status 500 body for boom" in message
    ok = await client.get("test_resources", "/echo")
    assert await raise_for_status(ok) is None


async def test_get_response_json(server):
    client = _client(server.port)
    response = await client.post("test_agent", "/echo", json={"nested": {"list": [1, 2.5, None, "s"]}})
    data = await get_response_json(response)
    assert data["body"] == {"nested": {"list": [1, 2.5, None, "s"]}}
    assert data["method"] == "POST"


# ------------------------------------------------------------------------------------------ head server


@pytest.mark.parametrize("raw_yaml", [False, True])
async def test_load_from_global_config(server, raw_yaml):
    cfg = _config(server.port)
    cfg["default_host"] = "127.0.0.1"
    cfg["test_agent"]["responses_api_agents"]["simple_agent"]["host"] = "${default_host}"
    server.state["yaml"] = OmegaConf.to_yaml(OmegaConf.create(cfg))
    server.state["raw_yaml"] = raw_yaml
    try:
        client = ServerClient.load_from_global_config({"host": "127.0.0.1", "port": server.port})
    finally:
        server.state["raw_yaml"] = False
    assert client.global_config_dict["test_agent"]["responses_api_agents"]["simple_agent"]["port"] == server.port
    assert client.base_url("test_agent") == f"http://127.0.0.1:{server.port}"
    response = await client.post("test_agent", "/echo", json={"hello": "world"})
    assert (await response.json())["body"] == {"hello": "world"}


def test_load_from_global_config_unreachable_head_server():
    port = _free_port()

    class HeadCfg:  # a BaseServerConfig-like object
        host = "127.0.0.1"

    HeadCfg.port = port
    with pytest.raises(ValueError) as info:
        ServerClient.load_from_global_config(HeadCfg())
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "ng_run" in message and "+head_server.host" in message


# ------------------------------------------------------------------------------------------ transport


async def test_one_thousand_concurrent_requests_complete(server):
    client = _client(server.port)
    results = await asyncio.gather(*(client.post("test_agent", "/echo", json={"i": i}) for i in range(1000)))
    assert [(await r.json())["body"]["i"] for r in results] == list(range(1000))
    assert all(r.status_code == 200 for r in results)


async def test_shared_transport_defaults_and_limits_from_config(server):
    cfg = _config(server.port)
    cfg["global_aiohttp_connector_limit"] = 321
    cfg["global_aiohttp_connector_limit_per_host"] = 12
    client = ServerClient(global_config_dict=cfg)
    assert (await client.get("test_agent", "/echo")).status_code == 200
    transport = await get_global_transport()
    assert transport is await get_global_transport()  # one per loop
    assert isinstance(transport.session, aiohttp.ClientSession)
    assert transport.session.connector.limit == 321
    assert transport.session.connector.limit_per_host == 12
    await close_global_client()
    assert transport.session.closed
    # A new one is created on demand after closing.
    assert (await client.get("test_agent", "/echo")).status_code == 200
    assert await get_global_transport() is not transport


@pytest.mark.parametrize("via", ["config", "env"])
async def test_httpx_transport_switch(server, monkeypatch, via):
    cfg = _config(server.port)
    if via == "config":
        cfg["http_client_transport"] = "httpx"
    else:
        monkeypatch.setenv("NEMO_GYM_HTTP_CLIENT_TRANSPORT", "httpx")
    client = ServerClient(global_config_dict=cfg, backoff_base=0.01)
    response = await client.post("test_agent", "/echo", json={"via": via}, cookies={"k": "v"})
    assert (await response.json())["body"] == {"via": via}
    assert (await response.json())["cookie"] == "k=v"
    assert isinstance(await get_global_transport(), httpx.AsyncHTTPTransport)
    assert (await client.post("test_agent", "/flaky/httpx-" + via + "/1/503", json={})).status_code == 200


def test_unknown_transport_name_is_rejected():
    with pytest.raises(ValueError, match="http_client_transport"):
        sc._transport_name({"http_client_transport": "curl"})


def test_shared_transport_is_closed_when_asyncio_run_ends(server):
    client = _client(server.port)
    seen = {}

    async def main():
        await client.get("test_agent", "/echo")
        seen["transport"] = await get_global_transport()

    asyncio.run(main())
    assert seen["transport"].session.closed  # closed by loop.shutdown_asyncgens()


@pytest.mark.parametrize("transport", ["lean", "httpx"])
def test_a_loop_closed_without_shutting_down_is_let_go_of_quietly(server, monkeypatch, caplog, transport):
    """pytest-asyncio 0.24 and hand-made loops close without `shutdown_asyncgens()`: the next loop forgets the old
    loop's shared state, and aiohttp does not log "Unclosed client session" or "Unclosed connector" when it is
    collected (CI saw those lines land in another test's caplog). The global aiohttp client of v0.2/v0.5 code is let
    go of the same way."""
    from nemo_gym.server_utils import get_global_aiohttp_client

    monkeypatch.setenv("NEMO_GYM_HTTP_CLIENT_TRANSPORT", transport)
    client = _client(server.port)
    sessions = []  # each loop's aiohttp sessions: the shared one (none under httpx) and the global client

    async def use() -> None:
        assert (await client.get("test_agent", "/echo")).status_code == 200
        async with get_global_aiohttp_client().get(f"http://127.0.0.1:{server.port}/echo") as response:
            assert response.status == 200
        sessions.append({s for s in (sc.get_global_aiohttp_session(), get_global_aiohttp_client()) if s is not None})

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        for _ in range(3):
            loop = asyncio.new_event_loop()
            loop.run_until_complete(use())
            loop.close()  # no shutdown_asyncgens(): the shared state cannot be closed on its loop any more
        gc.collect()
        # The next loop let go of each loop's sessions; the last loop's go with the next loop made, or at exit.
        assert all(s.closed for loop_sessions in sessions[:-1] for s in loop_sessions)
        assert not any(s.closed for s in sessions[-1])
        sessions.clear()
        gc.collect()
    assert [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()] == []


# ------------------------------------------------------------------------------------------ ServerResponse


def _server_response(body: bytes, headers=(), status: int = 200) -> sc.ServerResponse:
    return sc.ServerResponse.from_httpx(httpx.Response(status, headers=list(headers), content=body), "http://h/p", "POST")


async def test_server_response_reads_like_aiohttp():
    resp = _server_response(
        "héllo".encode("latin-1"),
        [("content-type", "text/plain; charset=latin-1"), ("set-cookie", "A___a=1.2; Path=/; HttpOnly"),
         ("set-cookie", "b=two")],
    )
    assert (resp.status, resp.status_code, resp.ok, resp.reason) == (200, 200, True, "OK")
    assert resp.content_type == "text/plain" and resp.charset == "latin-1"
    assert await resp.text() == "héllo" and await resp.read() == resp.content == resp.body
    assert {name: morsel.value for name, morsel in resp.cookies.items()} == {"A___a": "1.2", "b": "two"}
    assert sc.encode_cookie_header(resp.cookies) == "A___a=1.2; b=two"
    assert await _server_response(b"").json() is None
    assert await _server_response(b' {"a": 1}').json(loads=lambda text: {"loaded": text.strip()}) == {"loaded": '{"a": 1}'}
    failed = _server_response(b"nope", status=503)
    assert not failed.ok
    with pytest.raises(sc.NeMoGymHTTPError) as caught:
        failed.raise_for_status()
    assert caught.value.status == 503 and caught.value.response_content == "nope"
    assert str(caught.value.request_info.url) == "http://h/p"


def test_aiohttp_errors_map_to_the_httpx_type_that_says_the_same():
    import aiohttp

    assert isinstance(sc._remap_aiohttp_error(aiohttp.ServerDisconnectedError(), None), httpx.RemoteProtocolError)
    assert isinstance(sc._remap_aiohttp_error(aiohttp.ConnectionTimeoutError(), None), httpx.ConnectTimeout)
    assert isinstance(sc._remap_aiohttp_error(aiohttp.SocketTimeoutError(), None), httpx.ReadTimeout)
    assert isinstance(sc._remap_aiohttp_error(aiohttp.ClientPayloadError("cut"), None), httpx.ReadError)
    assert sc._remap_aiohttp_error(ValueError("not aiohttp"), None) is None


# ------------------------------------------------------------------------------------------ response size cap


@pytest.mark.parametrize("transport", ["lean", "aiohttp", "httpx"])
@pytest.mark.parametrize("chunked", [False, True])
async def test_a_response_over_the_cap_is_a_clear_error_not_retried(server, transport, chunked):
    cfg = _config(server.port)
    cfg["http_client_transport"] = transport
    cfg["http_client_max_response_body_bytes"] = 100_000
    client = ServerClient(global_config_dict=cfg, backoff_base=0.01)
    key = f"cap-{transport}-{chunked}"
    query = "?chunked=true" if chunked else ""
    # At the cap: read whole.
    ok = await client.get("test_agent", f"/bytes/{key}-ok/100000{query}")
    assert ok.status == 200 and len(ok.content) == 100_000
    with pytest.raises(sc.ResponseTooLargeError) as info:
        await client.get("test_agent", f"/bytes/{key}/1000000{query}")  # GET: idempotent, still not retried
    error = info.value
    assert server.state["calls"][key] == 1 and error.attempts == 1
    assert isinstance(error, httpx.TransportError) and not isinstance(error, retry.RETRY_EXCEPTIONS)
    assert error.server_name == "test_agent" and error.limit == 100_000
    assert (error.size, error.declared) == ((1_000_000, True) if not chunked else (error.size, False))
    assert 100_000 < error.size <= 1_000_000
    message = str(error)
    assert f"GET http://127.0.0.1:{server.port}/bytes/{key}/1000000" in message
    assert "server `test_agent`" in message and "http_client_max_response_body_bytes" in message
    assert ("Content-Length 1000000" in message) if not chunked else ("at least" in message)
    # The client still works afterwards (the aborted connection is not reused).
    assert (await client.get("test_agent", "/echo")).status_code == 200


async def test_the_cap_applies_to_a_transport_passed_in_and_to_httpx_clients_of_the_shared_transport(server):
    big = httpx.MockTransport(lambda request: httpx.Response(200, content=b"m" * 5000))
    cfg = {**_config(server.port), "http_client_max_response_body_bytes": 4096}
    client = ServerClient(global_config_dict=cfg, transport=big)
    with pytest.raises(sc.ResponseTooLargeError, match="server `test_agent`"):
        await client.get("test_agent", "/anything")
    # httpx clients over the shared transport (the OpenAI client, get_global_client) read under the same cap.
    await _client(server.port).get("test_agent", "/echo")  # creates this loop's shared state, default cap
    await close_global_client()
    await ServerClient(global_config_dict=cfg).get("test_agent", "/echo")  # recreated with the 4096 cap
    shared = await get_global_client()
    with pytest.raises(sc.ResponseTooLargeError, match="http_client_max_response_body_bytes"):
        await shared.get(f"http://127.0.0.1:{server.port}/bytes/shared/5000")
    assert len((await shared.get(f"http://127.0.0.1:{server.port}/bytes/shared-ok/4096")).content) == 4096


@pytest.mark.parametrize("value", [0, -5, "lots", True])
def test_a_bad_cap_is_refused_naming_the_key(value):
    with pytest.raises(ValueError, match="http_client_max_response_body_bytes"):
        sc.max_response_body_bytes({"http_client_max_response_body_bytes": value})
    assert sc.max_response_body_bytes({}) == sc.DEFAULT_MAX_RESPONSE_BODY_BYTES == 256 * 1024 * 1024
    assert sc.max_response_body_bytes({"http_client_max_response_body_bytes": "1024"}) == 1024


async def test_a_content_length_with_no_body_to_follow_is_not_refused():
    # HEAD answers, 204 and 304 declare a length without a body: nothing is over the cap.
    for method, status in (("HEAD", 200), ("GET", 204), ("GET", 304)):
        response = httpx.Response(status, headers={"content-length": str(10**9)}, stream=httpx.ByteStream(b""))
        assert await sc.read_httpx_body(response, 1000, "http://h/p", method) == b""
    response = httpx.Response(200, headers={"content-length": str(10**9)}, stream=httpx.ByteStream(b""))
    with pytest.raises(sc.ResponseTooLargeError, match="Content-Length 1000000000 bytes"):
        await sc.read_httpx_body(response, 1000, "http://h/p", "GET")
