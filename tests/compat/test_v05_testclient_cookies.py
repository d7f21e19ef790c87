"""FastAPI's TestClient takes cookies from every place v0.2/v0.5 test code gets them, whichever HTTP library
starlette builds it on.

With `httpx2` installed (newer openai, anthropic and mcp bring it), starlette's TestClient is an `httpx2.Client`,
whose `Cookies` used to take an `httpx.Cookies` for a cookie jar and break (AttributeError) on the constructor's
`cookies=`, `client.cookies = ...`, `client.cookies.update(...)` and per-request `cookies=`; `SimpleCookie`
(aiohttp-style responses, our `ServerClient` responses) never worked. `nemo_gym.http.cookie_interop` fixes both;
these tests hold with and without `httpx2`. Real servers and real session cookies throughout."""

import asyncio
import warnings
from http.cookies import SimpleCookie

import httpx
import pytest
import starlette.testclient
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient
from nemo_gym.testing.live_server import live_servers

COOKIE = "TallyEnv___tally_env"


class TallyEnvConfig(BaseResourcesServerConfig):
    pass


class TallyEnv(SimpleResourcesServer):
    config: TallyEnvConfig
    counts: dict = {}

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment")(self.increment)
        app.post("/echo_cookies")(self.echo_cookies)
        return app

    async def increment(self, request: Request) -> dict:
        session_id = request.session[SESSION_ID_KEY]
        self.counts[session_id] = self.counts.get(session_id, 0) + 1
        return {"session_id": session_id, "count": self.counts[session_id]}

    async def echo_cookies(self, request: Request) -> dict:
        return {name: value for name, value in request.cookies.items() if name != COOKIE}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


@pytest.fixture
def server() -> TallyEnv:
    config = TallyEnvConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="tally_env", domain="other")
    return TallyEnv(config=config, server_client=ServerClient(head_server_config=None, global_config_dict={}))


def httpx_jar(**values: str) -> httpx.Cookies:
    jar = httpx.Cookies()
    for name, value in values.items():
        jar.set(name, value)
    return jar


def simple_cookie(**values: str) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for name, value in values.items():
        jar[name] = value
    return jar


CONTAINERS = {"httpx.Cookies": httpx_jar, "SimpleCookie": simple_cookie, "dict": dict}


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_cookies_given_to_the_constructor(server, kind):
    client = TestClient(server.setup_webserver(), cookies=CONTAINERS[kind](tenant="acme", region="eu"))
    assert client.post("/echo_cookies").json() == {"tenant": "acme", "region": "eu"}


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_cookies_assigned_and_merged_into_the_client(server, kind):
    client = TestClient(server.setup_webserver())
    client.cookies = CONTAINERS[kind](tenant="acme")
    assert client.post("/echo_cookies").json() == {"tenant": "acme"}
    client.cookies.update(CONTAINERS[kind](region="eu"))
    assert client.post("/echo_cookies").json() == {"tenant": "acme", "region": "eu"}


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_cookies_given_per_request(server, kind):
    client = TestClient(server.setup_webserver())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # httpx's notice about per-request cookies
        assert client.post("/echo_cookies", cookies=CONTAINERS[kind](tenant="acme")).json() == {"tenant": "acme"}


def test_a_session_cookie_from_seed_session_is_fed_back_in_every_way(server):
    app = server.setup_webserver()
    seeded = TestClient(app).post("/seed_session", json={})
    assert seeded.status_code == 200 and COOKIE in seeded.cookies
    session_id = TestClient(app, cookies=seeded.cookies).post("/increment").json()["session_id"]

    as_httpx = httpx.Cookies()
    as_httpx.set(COOKIE, seeded.cookies[COOKIE])
    assigned = TestClient(app)
    assigned.cookies = as_httpx
    assert assigned.post("/increment").json()["session_id"] == session_id
    assert TestClient(app, cookies=as_httpx).post("/increment").json()["session_id"] == session_id
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        again = TestClient(app).post("/increment", cookies=seeded.cookies).json()
    assert again == {"session_id": session_id, "count": 4}
    # The test client's cookies go into an httpx jar as well (the other direction).
    assert httpx.Cookies(seeded.cookies)[COOKIE] == seeded.cookies[COOKIE]


def test_cookies_of_a_live_server_response_reach_the_test_client_and_back(server):
    """A session started over real HTTP with `ServerClient` (its `.cookies` is a `SimpleCookie`, as aiohttp's) goes
    on under the TestClient, and the TestClient's cookies go back through `ServerClient`."""
    global_config: dict = {}
    client = ServerClient(head_server_config=None, global_config_dict=global_config)
    with live_servers({"tally_env": server}, global_config):

        async def over_http(cookies=None):
            response = await client.post("tally_env", "/increment", cookies=cookies)
            return await response.json(), response.cookies

        first, live_cookies = asyncio.run(over_http())
        assert isinstance(live_cookies, SimpleCookie) and COOKIE in live_cookies
        under_test = TestClient(server.setup_webserver(), cookies=live_cookies)
        second = under_test.post("/increment")
        assert second.json() == {"session_id": first["session_id"], "count": 2}
        third, _ = asyncio.run(over_http(cookies=second.cookies))
        assert third == {"session_id": first["session_id"], "count": 3}


def test_response_helpers_take_test_client_responses(server):
    from nemo_gym.server_utils import NeMoGymHTTPError, get_response_json, raise_for_status

    client = TestClient(server.setup_webserver())
    assert asyncio.run(get_response_json(client.post("/increment")))["count"] == 1
    with pytest.raises(NeMoGymHTTPError) as info:
        asyncio.run(raise_for_status(client.post("/no_such_route")))
    assert "Not Found" in info.value.response_content
