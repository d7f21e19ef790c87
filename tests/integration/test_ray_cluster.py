"""One stack across a real multi-node Ray cluster on this machine (issue 12; docs/design.md, decision 24).

`ray.cluster_utils.Cluster` starts a head and two worker nodes (all on loopback) with distinct custom resources:
{"verifier_node": 2} and {"agent_node": 2}. `ng_run` joins it (`+ray_head_node_address=...`) and starts the
example_session_state_mgmt resources server and a simple_agent as 2 Ray actor replicas each, pinned by
`ray_actor_options.resources`; the policy model stays a local process. Checked: every replica lands on the node
its resources name and reports it (head server, ng_status); every rollout's session stays on one resources
replica (replicas have different session secrets and answer 409 to a foreign cookie, so a mis-route fails the
rollout); killing one replica's server process in the middle of a 200-row collection still writes every row once,
and Ray's restart of the actor is picked up by the head server. No mocks of Ray; only the LLM is fake. One
cluster and one stack for the module (starting them takes about a minute on 2 cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_gym.runtime.ray import LOOPBACK_RAY_ENV, LocalCluster
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides, server_instances
from tests.conftest import FIXTURE_STACK, free_port
from tests.integration.test_collect_rollouts import TOOLS, read_jsonl

pytest.importorskip("ray")

SCRIPT = FIXTURE_STACK / "scripts" / "collect.jsonl"
COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
STATUS = [sys.executable, "-c", "from nemo_gym.cli import status; status()"]
RESOURCES = "example_session_state_mgmt_resources_server"
AGENT = "example_session_state_mgmt_simple_agent"
RAY_ENV = LOOPBACK_RAY_ENV  # ng_run and its servers see the cluster's nodes on loopback, as the cluster does

STACK_YAML = """
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${policy_base_url}
      openai_api_key: ${policy_api_key}
      openai_model: ${policy_model_name}

example_session_state_mgmt_resources_server:
  resources_servers:
    example_session_state_mgmt:
      entrypoint: app.py
      domain: agent
      num_replicas: 2
      ray_actor_options:
        num_cpus: 1
        resources: {verifier_node: 1}
      scheduling_strategy: SPREAD
      max_restarts: 3

example_session_state_mgmt_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      num_replicas: 2
      ray_actor_options:
        num_cpus: 1
        resources: {agent_node: 1}
      resources_server:
        type: resources_servers
        name: example_session_state_mgmt_resources_server
      model_server:
        type: responses_api_models
        name: policy_model
      max_steps: 4
"""


def row(i: int) -> dict:
    add = 1 + i % 2
    return {
        "responses_create_params": {"input": f"please add {add}", "tools": TOOLS},
        "initial_count": i,
        "expected_count": i + add,
    }


def poll(condition, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def replicas_of(head_port: int, name: str) -> list[dict]:
    return sorted((i for i in server_instances(head_port) if i["process_name"] == name), key=lambda i: i["replica"])


@pytest.fixture(scope="module")
def cluster():
    nodes = [{"num_cpus": 2, "resources": {"verifier_node": 2}}, {"num_cpus": 2, "resources": {"agent_node": 2}}]
    with LocalCluster(nodes) as cluster:  # in a child process: this test process stays free of Ray
        yield cluster.address, {"head": cluster.head_node_id, "verifier": cluster.node_ids[0],
                                "agent": cluster.node_ids[1]}


@pytest.fixture(scope="module")
def stack(cluster, tmp_path_factory):
    address, nodes = cluster
    work = tmp_path_factory.mktemp("ray_stack")
    (work / "stack.yaml").write_text(STACK_YAML)
    head_port = free_port()
    # Model latency keeps rollouts in flight long enough for the failover test to kill a replica mid-collection.
    with FakeLLMBackend("--script", str(SCRIPT), "--latency-ms", "30") as backend:
        ng_run = NgRunStack(
            [*fake_llm_overrides([str(work / "stack.yaml")], backend.base_url, head_port),
             f"+ray_head_node_address={address}"],
            cwd=work, env=RAY_ENV,
        )
        try:
            ng_run.wait_for("All 5 / 5 servers ready!", timeout=300)
            yield ng_run, head_port, nodes, work
        finally:
            code = ng_run.stop(timeout=90)
        assert code == 0, ng_run.tail(80)


def test_replicas_land_where_their_resources_say_and_ng_status_lists_them(stack):
    ng_run, head_port, nodes, _ = stack
    for name, node in ((RESOURCES, nodes["verifier"]), (AGENT, nodes["agent"])):
        replicas = replicas_of(head_port, name)
        assert [r["replica"] for r in replicas] == [0, 1]
        for r in replicas:
            assert r["state"] == "ready" and r["ray_actor"] is True and r["num_replicas"] == 2, r
            assert r["node_id"] == node, (name, r["node_id"], nodes)
            # Joined a cluster without ray_bind_host: the node's address, which Ray has on loopback here.
            assert r["host"] == "127.0.0.1" and r["url"] == f"http://127.0.0.1:{r['port']}"
        assert len({r["port"] for r in replicas}) == 2 and len({r["pid"] for r in replicas}) == 2
    model = replicas_of(head_port, "policy_model")[0]
    assert model.get("node_id") is None and model["pid"] is not None  # a local process, as without Ray

    status = subprocess.run([*STATUS, f"+head_server.port={head_port}"], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "Ray node" in status.stdout and "in flight" in status.stdout
    rows = [line for line in status.stdout.splitlines() if f"{RESOURCES}[" in line or f"{AGENT}[" in line]
    assert len(rows) == 4, status.stdout
    for line in rows:
        node = nodes["verifier"] if RESOURCES in line else nodes["agent"]
        assert node in line and "ready" in line and "✓" in line, line
    assert "5 servers found (5 healthy, 0 unhealthy)" in status.stdout
    assert ng_run.proc.poll() is None


def test_the_client_spreads_sessions_over_actor_replicas_and_keeps_each_on_its_replica(stack):
    """`ServerClient` reads the actors' addresses from the head server: new sessions go to both replicas, and a
    call carrying a session cookie reaches the replica that minted it (a foreign one would answer 409)."""
    import asyncio

    from nemo_gym.http.client import ServerClient
    from nemo_gym.serving.sessions import replica_of_cookie

    _, head_port, _, _ = stack

    async def main():
        client = ServerClient.load_from_global_config({"host": "127.0.0.1", "port": head_port})
        seeded = []
        for i in range(6):
            resp = await client.post(RESOURCES, "/seed_session", json={"initial_count": i})
            assert resp.status == 200
            seeded.append((i, {k: v.value for k, v in resp.cookies.items()}))
        replicas = [replica_of_cookie(next(iter(c.values()))) for _, c in seeded]
        assert sorted(set(replicas)) == [0, 1], replicas
        for i, cookies in seeded:
            assert (await client.post(RESOURCES, "/increment_counter", json={"count": 10}, cookies=cookies)).status == 200
            got = await client.post(RESOURCES, "/get_counter_value", json={}, cookies=cookies)
            assert got.status == 200 and (await got.json())["count"] == i + 10

    asyncio.run(main())


def collect(work: Path, head_port: int, name: str, rows: list[dict], parallel: int) -> tuple[ChildProcess, Path]:
    (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = work / name / "rollouts.jsonl"
    proc = ChildProcess(
        [*COLLECT, f"+head_server.port={head_port}", f"+agent_name={AGENT}",
         f"+input_jsonl_fpath={work / f'{name}.jsonl'}", f"+output_jsonl_fpath={out}",
         f"+num_samples_in_parallel={parallel}", "+progress_bar=false"],
        cwd=work, name="ng_collect_rollouts",
    )
    return proc, out


def test_every_rollout_keeps_its_session_on_one_resources_replica(stack):
    ng_run, head_port, _, work = stack
    first_line = len(ng_run.lines)
    tasks = [row(i) for i in range(40)]
    proc, out = collect(work, head_port, "sticky", tasks, parallel=8)
    assert proc.wait(timeout=180) == 0, proc.output
    rows = read_jsonl(out)
    assert not out.with_name("rollouts_failures.jsonl").exists()
    assert sorted(r["_ng_task_index"] for r in rows) == list(range(40))
    for r in rows:  # seed, tool call and verify all reached the replica holding the rollout's counter
        assert r["reward"] == 1.0 and r["final_count"] == tasks[r["_ng_task_index"]]["expected_count"], r
    assert not [line for line in ng_run.lines[first_line:] if " 409 " in line]


def test_killing_a_replica_mid_collection_still_writes_every_row_once(stack):
    ng_run, head_port, nodes, work = stack
    victim = replicas_of(head_port, RESOURCES)[0]
    n = 200
    proc, out = collect(work, head_port, "failover", [row(i) for i in range(n)], parallel=16)
    written = lambda: out.read_text().count("\n") if out.exists() else 0  # noqa: E731
    poll(lambda: written() >= 30 or proc.proc.poll() is not None, "the first 30 rollouts")
    assert proc.proc.poll() is None, "the collection ended before a replica could be killed: " + proc.output
    os.kill(victim["pid"], signal.SIGKILL)
    assert proc.wait(timeout=300) == 0, proc.output
    rows = read_jsonl(out)
    assert sorted(r["_ng_task_index"] for r in rows) == list(range(n))  # every row, none twice
    assert all(r["reward"] == 1.0 for r in rows)
    assert not out.with_name("rollouts_failures.jsonl").exists()

    # Ray restarted the actor (a new process on a new port, same node); the head server serves its new address.
    def restarted() -> bool:
        now = replicas_of(head_port, RESOURCES)[0]
        return now["state"] == "ready" and now["pid"] != victim["pid"] and now["restarts"] == 1

    poll(restarted, "the head server to list the restarted replica", timeout=120)
    now = replicas_of(head_port, RESOURCES)[0]
    assert now["node_id"] == nodes["verifier"] and now["url"] != victim["url"]
    ng_run.wait_for(f"Server '{RESOURCES}[0]' (Ray actor) serves again", timeout=30)
