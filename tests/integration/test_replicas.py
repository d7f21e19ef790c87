"""Replicas on one machine (issue 12, first slice; docs/design.md, decision 22), with real processes: `ng_run`
starts a `num_replicas: 2` resources server (a per-session counter) and a `num_replicas: 2` simple_agent as two
processes each, `/server_instances` and `ng_status` list every replica, and a collection spreads rollouts over
both resources replicas while every rollout's calls stay on the replica that seeded it. Replicas have different
session secrets and a resources server answers 409 to a cookie it did not mint, so a mis-routed call would fail
loudly (the rollout's reward or final count would be wrong, or it would land in the failures file). Only the LLM
is fake."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides, server_instances
from tests.conftest import FIXTURE_STACK, free_port
from tests.integration.test_collect_rollouts import TOOLS, read_jsonl

SCRIPT = FIXTURE_STACK / "scripts" / "collect.jsonl"
COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
STATUS = [sys.executable, "-c", "from nemo_gym.cli import status; status()"]
RESOURCES = "replica_counter_resources_server"
AGENT = "counter_simple_agent"
COOKIE = f"ReplicaCounterServer___{RESOURCES}"
ROWS = 40


def row(i: int) -> dict:
    add = 1 + i % 2
    return {
        "responses_create_params": {"input": f"please add {add}", "tools": TOOLS},
        "initial_count": i,
        "expected_count": i + add,
    }


@pytest.fixture(scope="module")
def stack():
    head_port = free_port()
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        ng_run = NgRunStack(fake_llm_overrides(["configs/replicas.yaml"], backend.base_url, head_port),
                            cwd=FIXTURE_STACK)
        try:
            ng_run.wait_for("All 5 / 5 servers ready!", timeout=180)
            yield ng_run, head_port
        finally:
            code = ng_run.stop(timeout=60)
        assert code == 0, ng_run.output


def test_server_instances_and_ng_status_list_every_replica(stack):
    ng_run, head_port = stack
    instances = server_instances(head_port)
    by_name: dict[str, list[dict]] = {}
    for inst in instances:
        by_name.setdefault(inst["process_name"], []).append(inst)
    assert sorted(by_name) == sorted([RESOURCES, AGENT, "policy_model"])
    for name in (RESOURCES, AGENT):
        replicas = by_name[name]
        assert [r["replica"] for r in replicas] == [0, 1]
        assert all(r["num_replicas"] == 2 and r["state"] == "ready" for r in replicas)
        assert len({r["port"] for r in replicas}) == 2 and len({r["pid"] for r in replicas}) == 2
        for r in replicas:
            assert httpx.get(r["url"] + "/health", timeout=10).status_code == 200
    model = by_name["policy_model"][0]
    assert model["replica"] == 0 and model["num_replicas"] == 1
    status = subprocess.run([*STATUS, f"+head_server.port={head_port}"], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    for name in (RESOURCES, AGENT):
        for r in by_name[name]:
            line = next(line for line in status.stdout.splitlines() if f"{name}[{r['replica']}]" in line)
            assert r["url"] in line and str(r["pid"]) in line and "ready" in line
    assert "5 servers found (5 healthy, 0 unhealthy)" in status.stdout
    # Replica 0 keeps the block's own port: clients that know only host/port still reach a replica.
    assert ng_run.proc.poll() is None


def test_a_cookie_of_one_replica_is_refused_by_the_other(stack):
    """What makes a mis-route loud: replica 1 answers 409 to a session replica 0 minted."""
    _, head_port = stack
    r0, r1 = sorted((i for i in server_instances(head_port) if i["process_name"] == RESOURCES),
                    key=lambda i: i["replica"])
    seeded = httpx.post(r0["url"] + "/seed_session", json={"initial_count": 5}, timeout=10)
    assert seeded.status_code == 200
    cookie = {COOKIE: seeded.cookies[COOKIE]}
    assert httpx.post(r1["url"] + "/increment_counter", json={"count": 1}, cookies=cookie, timeout=10).status_code == 409
    assert httpx.post(r0["url"] + "/increment_counter", json={"count": 1}, cookies=cookie, timeout=10).json() == {
        "count": 6
    }


def test_every_rollout_stays_on_one_replica_and_both_replicas_serve(stack, tmp_path: Path):
    ng_run, head_port = stack
    replicas = sorted((i for i in server_instances(head_port) if i["process_name"] == RESOURCES),
                      key=lambda i: i["replica"])
    before = [httpx.get(r["url"] + "/stats", timeout=10).json() for r in replicas]
    first_line = len(ng_run.lines)
    tasks = [row(i) for i in range(ROWS)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    collect = ChildProcess(
        [
            *COLLECT,
            f"+head_server.port={head_port}",
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={tmp_path / 'tasks.jsonl'}",
            f"+output_jsonl_fpath={tmp_path / 'out' / 'rollouts.jsonl'}",
            "+num_samples_in_parallel=8",
            "+progress_bar=false",
        ],
        cwd=tmp_path,
        name="ng_collect_rollouts",
    )
    assert collect.wait(timeout=180) == 0, collect.output
    rows = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    assert not (tmp_path / "out" / "rollouts_failures.jsonl").exists()
    assert sorted(r["_ng_task_index"] for r in rows) == list(range(ROWS))
    for r in rows:
        task = tasks[r["_ng_task_index"]]
        # Seed, tool call and verify all reached the replica that holds the session's counter.
        assert r["reward"] == 1.0 and r["final_count"] == task["expected_count"], r
        assert r["replica"] == r["seeded_by"] and r["replica"] in (0, 1), r
    served = Counter(r["replica"] for r in rows)
    assert served[0] > 0 and served[1] > 0, served
    after = [httpx.get(r["url"] + "/stats", timeout=10).json() for r in replicas]
    seeds = [a["seeds"] - b["seeds"] for a, b in zip(after, before)]
    verifies = [a["verifies"] - b["verifies"] for a, b in zip(after, before)]
    assert seeds == verifies == [served[0], served[1]]  # each rollout seeded once, nothing retried
    assert not [line for line in ng_run.lines[first_line:] if " 409 " in line]  # no call was refused
