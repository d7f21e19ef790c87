"""Ray actor replicas (docs/design.md, decision 24) without a Ray cluster: bad actor settings are clear config
errors, and `ServerClient` finds actor replicas through a real head server, spreads calls over them and fails over
when one goes away (real HTTP servers in this process throughout). The single-machine path never importing ray and
one actor replica on a real local Ray are tests/integration/test_ray_actors_processes.py; the cluster itself is
tested in tests/integration/test_ray_cluster.py."""

from __future__ import annotations

import asyncio
import contextlib
import io

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nemo_gym.config import ports
from nemo_gym.config.global_config import parse_global_config
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.http.client import Replicas, ServerClient
from nemo_gym.runtime.head_server import HeadServer
from nemo_gym.runtime.launcher import RunHelper
from nemo_gym.runtime.ray_actors import NODE_IP, actor_options, bind_host_for
from nemo_gym.testing.live_server import live_server
from tests.conftest import FIXTURE_STACK, free_port

BLOCK = "+replica_counter_resources_server.resources_servers.replica_counter"


def stack_config(*overrides: str):
    return parse_global_config(
        ["+config_paths=[configs/replicas.yaml]", "+policy_base_url=http://127.0.0.1:1/v1", "+policy_api_key=x",
         "+policy_model_name=m", *overrides],
        cwd=FIXTURE_STACK, load_env_yaml=False,
    )


def test_a_ray_block_is_prepared_as_actor_replicas_and_its_port_given_back():
    try:
        cfg = stack_config(f"{BLOCK}.ray_actor_options={{num_cpus:1,resources:{{verifier_node:1}}}}",
                           f"{BLOCK}.scheduling_strategy=SPREAD", f"{BLOCK}.max_restarts=7")
        helper = RunHelper(cfg, cwd=FIXTURE_STACK, out=io.StringIO())
        helper.prepare()
        assert [r.label for r in helper.ray_replicas] == [
            "replica_counter_resources_server[0]", "replica_counter_resources_server[1]"
        ]
        assert all(r.max_restarts == 7 for r in helper.ray_replicas)
        assert "replica_counter_resources_server" not in {s.spec.server_id for s in helper.servers}
        port = cfg.replica_counter_resources_server.resources_servers.replica_counter.port
        assert not ports.is_reserved("127.0.0.1", port)  # the actors bind their own ports
        records = helper.instances()
        assert [r["state"] for r in records if r.get("ray_actor")] == ["starting", "starting"]
        assert all(r["url"] is None for r in records if r.get("ray_actor"))
    finally:
        ports.release_all()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ([f"{BLOCK}.ray_actor_options={{num_cpus:1}}", f"{BLOCK}.scheduling_strategy=PACK"],
         "scheduling_strategy.*SPREAD"),
        ([f"{BLOCK}.ray_actor_options={{num_cpus:1}}", f"{BLOCK}.replica_ports=[1,2]"],
         "replica_ports` cannot be used with `ray_actor_options"),
        ([f"{BLOCK}.ray_actor_options=[1]"], "ray_actor_options"),
    ],
)
def test_bad_actor_settings_are_config_errors_naming_the_key(overrides, message):
    try:
        with pytest.raises(Exception, match=message) as info:
            helper = RunHelper(stack_config(*overrides), cwd=FIXTURE_STACK, out=io.StringIO())
            helper.prepare()
        assert isinstance(info.value, (NeMoGymConfigError, ValueError)), info.value
        assert "replica_counter_resources_server" in str(info.value)
    finally:
        ports.release_all()


def test_actor_options_and_bind_host():
    block = {"ray_actor_options": {"num_cpus": 2, "resources": {"verifier_node": 1}}, "scheduling_strategy": "SPREAD"}
    options = actor_options(block, max_restarts=3)
    assert options["num_cpus"] == 2 and options["resources"] == {"verifier_node": 1}
    assert options["scheduling_strategy"] == "SPREAD" and options["max_restarts"] == 3
    assert actor_options({"ray_actor_options": {}}, max_restarts=0)["num_cpus"] == 0
    # Nothing listens beyond loopback unless the stack joined a cluster, or the config says where.
    assert bind_host_for({}, joined_cluster=False) == "127.0.0.1"
    assert bind_host_for({}, joined_cluster=True) == NODE_IP
    assert bind_host_for({"ray_bind_host": "10.0.0.5"}, joined_cluster=False) == "10.0.0.5"


def test_replicas_skip_one_that_is_out_and_take_it_back_at_a_new_address():
    replicas = Replicas("s", ["http://a:1", None, "http://c:3"], dynamic=True)
    assert {replicas.least_loaded() for _ in range(6)} == {0, 2}  # no address: not chosen
    replicas.mark_down(0)
    assert {replicas.least_loaded() for _ in range(4)} == {2}
    replicas.update(["http://a:9", "http://b:2", "http://c:3"])  # 0 restarted elsewhere, 1 has come up
    assert replicas.down_until == [0.0, 0.0, 0.0]
    assert {replicas.least_loaded() for _ in range(6)} == {0, 1, 2}
    assert str(replicas.url(0, "/x")) == "http://a:9/x"
    nobody = Replicas("s", [None, None], dynamic=True)
    assert nobody.least_loaded() in (0, 1) and str(nobody.url(0, "/x")).startswith("http://127.0.0.1:1/")


def whoami_app(name: str) -> Starlette:
    async def whoami(request: Request) -> JSONResponse:
        return JSONResponse({"name": name})

    return Starlette(routes=[Route("/whoami", whoami, methods=["POST", "GET"])])


def test_client_finds_actor_replicas_at_the_head_server_and_fails_over():
    """Two live replicas listed by a real head server: calls spread over both. Replica 1's server then stops
    (connections refused; the head lists it restarting): every call lands on replica 0, none fails. It comes
    back at a new address (as a restarted actor does): the client reads it from the head server and uses it."""
    import socket

    records = {}

    def instances():
        return [{"process_name": "svc", "replica": i, "num_replicas": 2, "ray_actor": True, **records[i]}
                for i in sorted(records)]

    with contextlib.ExitStack() as stack:
        r0 = stack.enter_context(live_server(whoami_app("r0")))
        replica1 = contextlib.ExitStack()
        r1 = replica1.enter_context(live_server(whoami_app("r1")))
        records[0] = {"url": r0, "state": "ready"}
        records[1] = {"url": r1, "state": "ready"}
        head_port = free_port()
        head = HeadServer("{}", instances)
        head.start(socket.create_server(("127.0.0.1", head_port)))
        stack.callback(head.stop)
        cfg = {
            "head_server": {"host": "127.0.0.1", "port": head_port},
            "svc": {"resources_servers": {"x": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 1,
                                                 "num_replicas": 2, "ray_actor_options": {"num_cpus": 1}}}},
        }
        client = ServerClient(global_config_dict=cfg, backoff_base=0.01, backoff_max=0.05)

        async def names(n: int) -> list[str]:
            answers = await asyncio.gather(*(client.post("svc", "/whoami") for _ in range(n)))
            assert all(a.status == 200 for a in answers)
            return [(await a.json())["name"] for a in answers]

        async def spread() -> None:
            assert set(await names(8)) == {"r0", "r1"}

        asyncio.run(spread())
        replica1.close()  # replica 1's server is gone
        records[1] = {"url": None, "state": "restarting"}

        async def failover() -> None:
            for _ in range(3):
                assert set(await names(8)) == {"r0"}

        asyncio.run(failover())
        with live_server(whoami_app("r1-restarted")) as r1_new:
            records[1] = {"url": r1_new, "state": "ready"}

            async def back() -> None:
                seen: set[str] = set()
                for _ in range(40):  # the client re-reads the head server while a replica is out
                    seen.update(await names(4))
                    if "r1-restarted" in seen:
                        break
                    await asyncio.sleep(0.1)
                assert seen == {"r0", "r1-restarted"}, seen

            asyncio.run(back())

