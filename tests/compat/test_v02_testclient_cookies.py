"""v0.2-style server tests: FastAPI's TestClient on `setup_webserver()`, cookies customised on the client, and the
session cookie `<ClassName>___<server_id>` carried from one request to the next."""

from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient

COOKIE = "CounterEnv___counter_env"


class CounterEnvConfig(BaseResourcesServerConfig):
    pass


class CounterEnv(SimpleResourcesServer):
    config: CounterEnvConfig
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


def new_server() -> CounterEnv:
    config = CounterEnvConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="counter_env", domain="other")
    return CounterEnv(config=config, server_client=ServerClient(head_server_config=None, global_config_dict={}))


def test_session_cookie_round_trip_keeps_the_session():
    client = TestClient(new_server().setup_webserver())
    first = client.post("/increment")
    assert first.status_code == 200
    assert COOKIE in first.cookies
    second = client.post("/increment")  # the client's jar sends the cookie back
    assert second.json()["session_id"] == first.json()["session_id"]
    assert second.json()["count"] == 2


def test_cookies_assigned_to_the_client():
    server = new_server()
    client = TestClient(server.setup_webserver())
    first = client.post("/increment")
    cookie_value = first.cookies[COOKIE]

    other = TestClient(server.setup_webserver())
    other.cookies = {COOKIE: cookie_value, "tenant": "acme"}
    again = other.post("/increment")
    assert again.json()["session_id"] == first.json()["session_id"]
    assert other.post("/echo_cookies").json() == {"tenant": "acme"}

    fresh = TestClient(server.setup_webserver())
    assert fresh.post("/increment").json()["session_id"] != first.json()["session_id"]


def test_cookies_set_on_the_client():
    client = TestClient(new_server().setup_webserver())
    client.cookies.set("tenant", "globex")
    client.cookies.set("region", "eu")
    assert client.post("/echo_cookies").json() == {"tenant": "globex", "region": "eu"}
    client.cookies.clear()
    assert client.post("/echo_cookies").json() == {}


def test_seed_session_and_verify_routes_under_testclient():
    client = TestClient(new_server().setup_webserver())
    seeded = client.post("/seed_session", json={})
    assert seeded.status_code == 200 and COOKIE in seeded.cookies
    body = {
        "responses_create_params": {"input": "hi"},
        "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [],
                     "parallel_tool_calls": True, "tool_choice": "auto", "tools": []},
    }
    verified = client.post("/verify", json=body)
    assert verified.status_code == 200 and verified.json()["reward"] == 1.0
