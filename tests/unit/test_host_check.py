"""The Host / Origin rule (`serving/host_check.py`): which names pass, what a refusal says, the `allowed_hosts` key,
and the rule applied on both serving paths (HotRoutes' direct path for a hot POST, FastAPI's for the rest) of a
server served in this process over real HTTP."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, ValidationError

from nemo_gym.config.known_keys import GlobalKeys
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.http.client import ServerClient
from nemo_gym.servers.base import SimpleServer, serving_app
from nemo_gym.serving.host_check import ENV_VAR_NAME, HostCheck, HostPolicy, host_policy, parse_allowed_hosts
from nemo_gym.serving.hot_routes import HotRoutes
from nemo_gym.serving.private_api import NeMoGymHttpProtocol
from nemo_gym.testing.live_server import live_server
from tests.unit.test_server_utils import make_config

STACK = {
    "default_host": "127.0.0.1",
    "head_server": {"host": "head.cluster", "port": 11000},
    "ray_bind_host": "node_ip",
    "policy_model": {"responses_api_models": {"openai_model": {"host": "10.0.0.7", "port": 1}}},
    "my_agent": {"responses_api_agents": {"simple_agent": {"host": "agent-node", "port": 2}}},
    "not_a_block": [1, 2],
}


def verdict(policy: HostPolicy, host: bytes = b"127.0.0.1:8000", origin: bytes = b"") -> int:
    """200 when `policy` lets a request with these headers through, else the refusal's status."""
    headers = [(b"host", host), (b"content-type", b"application/json")]
    if origin:
        headers.append((b"origin", origin))
    refused = policy.refusal(headers)
    return 200 if refused is None else refused[0]


@pytest.mark.parametrize("host", [
    b"127.0.0.1", b"127.0.0.1:8000", b"localhost:1", b"LOCALHOST.", b"[::1]:80", b"127.0.0.53:9",  # loopback
    b"head.cluster:11000", b"10.0.0.7:1", b"agent-node", b"node_ip",  # the config's hosts
])
def test_loopback_and_the_config_hosts_pass(host):
    assert verdict(host_policy(STACK, "127.0.0.1"), host) == 200


@pytest.mark.parametrize("host", [
    b"evil.example", b"evil.example:8000", b"localhost.evil.example", b"127.0.0.1.evil.example", b"10.0.0.8",
    b"", b"[::1", b"x:y", b"::1", b"user@localhost",
])
def test_other_names_get_421(host):
    assert verdict(host_policy(STACK, "127.0.0.1"), host) == 421


@pytest.mark.parametrize("origin, status", [
    (b"http://localhost:3000", 200), (b"https://[::1]:5", 200), (b"http://head.cluster", 200),
    (b"http://evil.example", 403), (b"http://evil.example:8000", 403), (b"null", 403),
    (b"chrome-extension://abcdef", 403), (b"http://localhost@evil.example", 403), (b"http://10.0.0.8", 403),
])
def test_an_origin_must_be_one_of_the_names_when_present(origin, status):
    assert verdict(host_policy(STACK, "127.0.0.1"), b"localhost:8000", origin) == status


def test_a_refusal_is_one_line_naming_the_value_and_the_key():
    status, headers, body = HostPolicy().refusal([(b"host", b"evil.example:1"), (b"origin", b"http://evil.example")])
    assert status == 421 and dict(headers)[b"content-type"] == b"application/json"
    detail = httpx.Response(status, content=body).json()["detail"]
    assert "\n" not in detail and '"evil.example:1"' in detail and "allowed_hosts" in detail
    status, _, body = HostPolicy().refusal([(b"host", b"localhost"), (b"origin", b"http://evil.example")])
    assert status == 403 and '"http://evil.example"' in httpx.Response(status, content=body).json()["detail"]
    long = HostPolicy().refusal([(b"host", b"a" * 100_000)])[2]
    assert len(long) < 1000  # the value is cut to an excerpt


def test_a_request_without_host_or_origin_passes():
    assert HostPolicy().refusal([(b"content-type", b"application/json")]) is None


def test_the_verdicts_remembered_are_bounded():
    policy = HostPolicy()
    for i in range(5000):
        assert verdict(policy, b"name%d.example" % i) == 421
    assert len(policy._hosts) <= 1024


def test_allowed_hosts_adds_names_and_a_star_allows_any():
    policy = host_policy({**STACK, "allowed_hosts": ["Node1.Example.com", "*.corp.example", "192.168.1.9"]}, "127.0.0.1")
    assert verdict(policy, b"node1.example.com:80") == 200
    assert verdict(policy, b"a.b.corp.example") == 200 and verdict(policy, b"corp.example") == 421
    assert verdict(policy, b"192.168.1.9:1", b"http://192.168.1.9:3") == 200
    anything = host_policy({"allowed_hosts": "*"}, "127.0.0.1")
    assert verdict(anything, b"evil.example", b"http://evil.example") == 200


@pytest.mark.parametrize("entry", ["http://node1", "node1:8000", "node1/path", "*", "*.x.org", "::1", "[::1]"])
def test_allowed_hosts_entries(entry):
    if entry in ("*", "*.x.org", "::1", "[::1]"):
        assert parse_allowed_hosts([entry]) == [{"[::1]": "::1"}.get(entry, entry)]
    else:
        with pytest.raises(ValueError, match="is not a host name or address"):
            parse_allowed_hosts([entry])
        with pytest.raises(NeMoGymConfigError, match="^allowed_hosts: .* is not a host name or address"):
            host_policy({"allowed_hosts": [entry]}, "127.0.0.1")


def test_allowed_hosts_is_a_known_global_key_validated_on_the_command_line():
    assert "allowed_hosts" in GlobalKeys.parameter_keys()
    assert GlobalKeys(allowed_hosts="*").allowed_hosts == ["*"]
    with pytest.raises(ValidationError, match="without scheme, port or path"):
        GlobalKeys(allowed_hosts=["http://node1:8000"])


def test_listening_on_every_interface_adds_this_machines_names():
    import socket

    loopback_only = host_policy({}, "127.0.0.1")
    everywhere = host_policy({}, "0.0.0.0")
    name = socket.gethostname().encode()
    assert verdict(loopback_only, name) == 421 and verdict(everywhere, name) == 200
    assert verdict(everywhere, b"0.0.0.0:9000") == 200  # what a local client of a 0.0.0.0 server sends
    assert verdict(everywhere, b"evil.example") == 421
    assert verdict(host_policy({}, "10.1.2.3"), b"10.1.2.3:80") == 200  # its own address


def test_the_policy_reaches_uvicorn_workers_through_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_VAR_NAME, "")  # recorded, so the export below is undone after the test
    monkeypatch.delenv(ENV_VAR_NAME)
    assert HostPolicy.from_env() is None
    host_policy({"allowed_hosts": ["node1", "*.corp.example"]}, "127.0.0.1").export_to_env()
    back = HostPolicy.from_env()
    assert verdict(back, b"node1") == 200 and verdict(back, b"x.corp.example") == 200
    assert verdict(back, b"evil.example") == 421


# -------------------------------------------------------------------------------------------------------------
# Both serving paths, over real HTTP


class Note(BaseModel):
    text: str


class NoteServer(SimpleServer):
    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)

        @app.post("/note")
        async def note(body: Note) -> dict:
            return {"text": body.text}

        return app


@pytest.mark.parametrize("direct", [True, False], ids=["hot_routes_direct_path", "plain_fastapi"])
def test_both_paths_refuse_another_host_and_origin_and_serve_the_rest(direct, monkeypatch):
    if not direct:
        monkeypatch.setenv("NEMO_GYM_HOT_ROUTES", "0")
        from nemo_gym.serving import runner

        runner._private_api_works.cache_clear()
    server = NoteServer(config=make_config("notes"), server_client=ServerClient(head_server_config=None, global_config_dict={}))
    app = serving_app(server.build_app(), hosts=host_policy({}, "127.0.0.1"))
    assert isinstance(app, HotRoutes if direct else HostCheck)
    options = {"http": NeMoGymHttpProtocol} if direct else {"http": "httptools"}
    with live_server(app, proxy_headers=False, **options) as url, httpx.Client(base_url=url) as client:
        assert client.post("/note", json={"text": "hi"}).json() == {"text": "hi"}
        assert client.get("/health").status_code == 200
        for path in ("/note", "/health"):
            method = client.post if path == "/note" else client.get
            kwargs = {"json": {"text": "hi"}} if path == "/note" else {}
            rebound = method(path, headers={"Host": "evil.example", "Origin": "http://evil.example"}, **kwargs)
            assert rebound.status_code == 421 and "evil.example" in rebound.json()["detail"], rebound.text
            other_site = method(path, headers={"Origin": "http://evil.example"}, **kwargs)
            assert other_site.status_code == 403, other_site.text
            same_machine = method(path, headers={"Origin": "http://localhost:3000"}, **kwargs)
            assert same_machine.status_code == 200, same_machine.text
        # The connection still serves after a refusal (keep-alive).
        assert client.post("/note", json={"text": "again"}).json() == {"text": "again"}


def test_the_viewer_holds_its_requests_to_the_same_rule(tmp_path):
    from fastapi.testclient import TestClient

    from nemo_gym.workbench.view.app import create_app
    from nemo_gym.workbench.view.index import RolloutIndex
    from nemo_gym.workbench.view.query import RolloutQuery

    path = tmp_path / "rollouts.jsonl"
    path.write_text("")
    index = RolloutIndex(path, tmp_path / "cache")
    index.update()
    query = RolloutQuery([index])
    try:
        with TestClient(create_app(query), base_url="http://127.0.0.1:8080") as client:
            assert client.get("/api/status").status_code == 200
            assert client.get("/api/status", headers={"Host": "attacker.example"}).status_code == 421
            assert client.get("/api/status", headers={"Origin": "http://attacker.example"}).status_code == 403
        with TestClient(create_app(query, allowed_hosts=("*",)), base_url="http://attacker.example") as client:
            assert client.get("/api/status").status_code == 200
    finally:
        query.close()
        index.close()
