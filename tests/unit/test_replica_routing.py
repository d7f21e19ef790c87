"""Replicas (docs/design.md, decision 22): how `ServerClient` picks a replica (least in flight, ties round-robin;
the replica a session cookie names), how the cookie is read without its secret, the `_replica` stamp of the
session middleware, and the launcher's ports and processes per replica. The end-to-end run with `ng_run` is
tests/integration/test_replicas.py; here servers are real apps on real ports (uvicorn in a thread)."""

from __future__ import annotations

import asyncio
import contextlib
import io
from http.cookies import SimpleCookie

import httpx
import pytest
from omegaconf import OmegaConf
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nemo_gym.config import ports
from nemo_gym.config.global_config import parse_global_config
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.http.client import Replicas, ServerClient
from nemo_gym.serving.sessions import (
    REPLICA_KEY,
    SESSION_ID_KEY,
    SessionCookieMiddleware,
    decode_session_cookie,
    encode_session_cookie,
    replica_of_cookie,
)
from nemo_gym.runtime.launcher import RunHelper
from nemo_gym.runtime.status import print_status
from nemo_gym.testing.live_server import live_server
from tests.conftest import FIXTURE_STACK

COOKIE = "CounterServer___counter"
SECRET = b"s" * 32


def block(port: int, replica_ports=None, host: str = "127.0.0.1") -> dict:
    impl = {"entrypoint": "app.py", "domain": "agent", "host": host, "port": port}
    if replica_ports is not None:
        impl["replica_ports"] = replica_ports
    return {"resources_servers": {"counter": impl}}


# ------------------------------------------------------------------------------------------ cookie decoding


def test_the_replica_is_read_from_a_cookie_without_its_secret():
    value = encode_session_cookie({SESSION_ID_KEY: "abc", REPLICA_KEY: 3}, COOKIE, SECRET)
    assert replica_of_cookie(value) == 3
    assert replica_of_cookie(value.encode()) == 3
    assert replica_of_cookie(f'"{value}"') == 3  # a quoted cookie value
    morsel = SimpleCookie()
    morsel[COOKIE] = value
    assert replica_of_cookie(morsel[COOKIE]) == 3


@pytest.mark.parametrize(
    "value",
    [
        encode_session_cookie({SESSION_ID_KEY: "abc"}, COOKIE, SECRET),  # a single-replica server's cookie
        encode_session_cookie({SESSION_ID_KEY: "abc", REPLICA_KEY: -1}, COOKIE, SECRET),
        encode_session_cookie({SESSION_ID_KEY: "abc", REPLICA_KEY: "1"}, COOKIE, SECRET),
        encode_session_cookie({SESSION_ID_KEY: "abc", REPLICA_KEY: True}, COOKIE, SECRET),
        "",
        "null",
        "no-dot-here",
        "!!!.sig",
        "bm90IGpzb24.sig",  # "not json"
        "WzFd.sig",  # [1]: not an object
        "é.sig",
        None,
        42,
    ],
)
def test_a_cookie_without_a_usable_replica_names_none(value):
    assert replica_of_cookie(value) is None


# --------------------------------------------------------------------------------------------- the choice


def test_least_in_flight_wins_and_ties_go_round_robin():
    replicas = Replicas("counter", ["http://h:1", "http://h:2", "http://h:3"])
    assert [replicas.least_loaded() for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    replicas.in_flight[:] = [2, 0, 1]
    assert [replicas.least_loaded() for _ in range(3)] == [1, 1, 1]
    replicas.in_flight[:] = [1, 0, 0]
    assert [replicas.least_loaded() for _ in range(4)] == [2, 1, 2, 1]  # the tied ones in turn


def test_this_servers_session_cookie_pins_the_replica_in_every_cookie_form():
    replicas = Replicas("counter", ["http://h:1", "http://h:2"])
    value = encode_session_cookie({SESSION_ID_KEY: "abc", REPLICA_KEY: 1}, COOKIE, SECRET)
    other = encode_session_cookie({SESSION_ID_KEY: "x", REPLICA_KEY: 0}, "Model___policy_model", SECRET)
    simple = SimpleCookie()
    simple[COOKIE] = value
    jar = httpx.Cookies()
    jar.set(COOKIE, value)
    for cookies in ({"Model___policy_model": other, COOKIE: value}, simple, jar):
        assert [replicas.choose(cookies) for _ in range(4)] == [1, 1, 1, 1]
    # Another server's cookie, a cookie whose name only contains ours, no cookie: by load.
    for cookies in ({"Model___policy_model": other}, {COOKIE + "_x": value}, {}, None):
        assert {replicas.choose(cookies) for _ in range(4)} == {0, 1}
    # An index this client does not know (a config with fewer replicas): by load, not an error.
    far = encode_session_cookie({SESSION_ID_KEY: "abc", REPLICA_KEY: 7}, COOKIE, SECRET)
    assert {replicas.choose({COOKIE: far}) for _ in range(4)} == {0, 1}


def test_server_client_learns_replicas_from_the_config_and_single_servers_take_no_replica_path():
    client = ServerClient(global_config_dict={
        "counter": block(1000, [1000, 1001, 1002]),
        "single": block(2000),
        "one_listed": block(3000, [3000]),
    })
    assert client.base_url("counter") == "http://127.0.0.1:1000"  # replica 0: the block's own host/port
    assert client.replicas("counter").bases == ["http://127.0.0.1:1000", "http://127.0.0.1:1001", "http://127.0.0.1:1002"]
    assert client.replicas("single") is None and client.replicas("one_listed") is None
    assert set(client._replicas) == {"counter"}
    client.global_config_dict = {"counter": block(1000)}
    assert client.replicas("counter") is None and not client._replicas


# ------------------------------------------------------------------------------ the middleware's stamp


def counter_app(replica, secret: bytes) -> SessionCookieMiddleware:
    """A stateful server as a resources server is one: per-session counter, 409 for cookies it did not mint."""
    counters: dict[str, int] = {}
    served: list[int] = []

    async def seed(request: Request) -> JSONResponse:
        counters[request.session[SESSION_ID_KEY]] = (await request.json())["initial"]
        served.append(replica)
        return JSONResponse({"replica": replica})

    async def increment(request: Request) -> JSONResponse:
        sid = request.session[SESSION_ID_KEY]
        counters[sid] += 1
        await asyncio.sleep(0.001)
        return JSONResponse({"count": counters[sid], "replica": replica})

    app = Starlette(routes=[Route("/seed_session", seed, methods=["POST"]),
                            Route("/increment", increment, methods=["POST"])])
    middleware = SessionCookieMiddleware(app, COOKIE, secret, refuse_unknown_cookies=True, replica=replica)
    middleware.served = served  # type: ignore[attr-defined]
    return middleware


def test_a_replica_stamps_its_index_into_the_sessions_it_sends_and_a_single_server_does_not():
    for replica, expected in ((1, {REPLICA_KEY: 1}), (None, {})):
        with live_server(counter_app(replica, SECRET)) as url:
            seeded = httpx.post(url + "/seed_session", json={"initial": 1})
            value = seeded.cookies[COOKIE]
            session = decode_session_cookie(value, COOKIE, SECRET)
            assert {k: v for k, v in session.items() if k != SESSION_ID_KEY} == expected
            again = httpx.post(url + "/increment", cookies={COOKIE: value})
            assert again.json()["count"] == 2 and again.cookies[COOKIE] == value  # unchanged: re-sent as is


# -------------------------------------------------------------------- routing through real servers


def test_rollouts_stick_to_the_replica_that_seeded_them_and_spread_over_replicas():
    """Two replicas with different secrets (a mis-routed call is a 409); 40 concurrent rollouts of v0.2 style
    (the caller threads `cookies=` itself) through one `ServerClient`."""
    apps = [counter_app(0, b"a" * 32), counter_app(1, b"b" * 32)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(live_server(app)) for app in apps]
        ports_ = [int(u.rsplit(":", 1)[1]) for u in urls]
        client = ServerClient(global_config_dict={"counter": block(ports_[0], ports_)})

        async def rollout(i: int) -> tuple[int, list[int]]:
            cookies: dict = {}
            seeded = await client.post("counter", "/seed_session", json={"initial": i}, cookies=cookies)
            assert seeded.status == 200
            cookies.update({k: m.value for k, m in seeded.cookies.items()})
            seen = []
            for step in range(3):
                reply = await client.post("counter", "/increment", cookies=cookies)
                assert reply.status == 200, reply.content
                body = await reply.json()
                assert body["count"] == i + step + 1
                seen.append(body["replica"])
            return (await seeded.json())["replica"], seen

        async def main():
            return await asyncio.gather(*(rollout(i) for i in range(40)))

        results = asyncio.run(main())
    assert all(seen == [first] * 3 for first, seen in results)
    assert len(apps[0].served) + len(apps[1].served) == 40
    assert len(apps[0].served) >= 10 and len(apps[1].served) >= 10  # spread by load


# --------------------------------------------------------------------------------------------- launcher


def stack_config(*overrides: str):
    return parse_global_config(
        ["+config_paths=[configs/replicas.yaml]", "+policy_base_url=http://127.0.0.1:1/v1", "+policy_api_key=x",
         "+policy_model_name=m", *overrides],
        cwd=FIXTURE_STACK, load_env_yaml=False,
    )


def test_ng_run_prepares_one_process_per_replica_on_its_own_reserved_port():
    try:
        cfg = stack_config("+replica_counter_resources_server.resources_servers.replica_counter.num_replicas=3")
        helper = RunHelper(cfg, cwd=FIXTURE_STACK, out=io.StringIO())
        helper.prepare()
        by_id: dict[str, list] = {}
        for server in helper.servers:
            by_id.setdefault(server.spec.server_id, []).append(server)
        resources = by_id["replica_counter_resources_server"]
        assert [(s.replica, s.num_replicas) for s in resources] == [(0, 3), (1, 3), (2, 3)]
        assert [s.label for s in resources] == [f"replica_counter_resources_server[{i}]" for i in range(3)]
        block_cfg = cfg.replica_counter_resources_server.resources_servers.replica_counter
        assert list(block_cfg.replica_ports) == [s.port for s in resources] and resources[0].port == block_cfg.port
        assert len({s.port for s in helper.servers}) == len(helper.servers) == 6
        assert all(ports.is_reserved(s.host, s.port) for s in helper.servers)
        model = by_id["policy_model"][0]
        assert (model.label, model.num_replicas) == ("policy_model", 1)
        assert "replica_ports" not in cfg.policy_model.responses_api_models.openai_model  # one replica: untouched
        config_yaml = OmegaConf.to_yaml(cfg)
        env = helper._child_env(resources[2], config_yaml, None)
        assert env["NEMO_GYM_REPLICA"] == "2"
        assert "NEMO_GYM_REPLICA" not in helper._child_env(model, config_yaml, None)
        assert [i["replica"] for i in (s.display() for s in resources)] == [0, 1, 2]
        # What the children and the head server get names every replica.
        client = ServerClient(global_config_dict=OmegaConf.create(config_yaml))
        assert client.replicas("replica_counter_resources_server").bases == [s.url for s in resources]
    finally:
        ports.release_all()


@pytest.mark.parametrize(
    "override, message",
    [
        ("+replica_counter_resources_server.resources_servers.replica_counter.replica_ports=[1,2,3]",
         "list of 2 port numbers"),
    ],
)
def test_unsupported_or_inconsistent_replica_settings_are_config_errors(override, message):
    try:
        helper = RunHelper(stack_config(override), cwd=FIXTURE_STACK, out=io.StringIO())
        with pytest.raises(NeMoGymConfigError, match=message):
            helper.prepare()
    finally:
        ports.release_all()


def test_num_replicas_below_one_is_refused_when_the_config_is_read():
    try:
        with pytest.raises(NeMoGymConfigError, match="num_replicas"):
            stack_config("+replica_counter_resources_server.resources_servers.replica_counter.num_replicas=0")
    finally:
        ports.release_all()


def test_status_names_each_replica():
    out = io.StringIO()
    base = {"server_type": "resources_servers", "name": "impl", "healthy": True, "state": "ready", "uptime": "1s"}
    print_status(
        [
            {**base, "process_name": "srv", "url": "http://h:1", "pid": 7, "replica": 0, "num_replicas": 2},
            {**base, "process_name": "srv", "url": "http://h:2", "pid": 8, "replica": 1, "num_replicas": 2},
            {**base, "process_name": "solo", "url": "http://h:3", "pid": 9},
        ],
        out,
    )
    text = out.getvalue()
    assert "srv[0]" in text and "srv[1]" in text and "http://h:2" in text and "solo[" not in text
    assert "3 servers found (3 healthy, 0 unhealthy)" in text
