"""The trainer API (`nemo_gym.training`, issue 26) against real processes: `ng_run` stacks of the fixture configs in
front of the fake LLM backend (the only fake). Checks: groups complete with the right counts, rewards and failures
as data; the in-flight bound holds and tasks are pulled lazily (rollouts held inside the resources server); leaving
a batch early cancels it (no /run left running, no new one started); a resources server killed mid-batch loses no
rollout (ng_run restarts it, the collector's retry policy rides through); a stack with `num_replicas: 2` works
unchanged (started by `SyncRolloutClient.start`); the sync client; token trajectories in training mode (vllm_model)
and None otherwise. No timed assertions: counts and outcomes, with generous bounded waits."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from nemo_gym.errors import NeMoGymConfigError, NeMoGymStackError
from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, server_instances
from nemo_gym.training import Rollout, RolloutClient, RolloutGroup, SyncRolloutClient
from tests.conftest import FIXTURE_STACK, free_port
from tests.integration.test_collect_rollouts import TOOLS

SCRIPT = FIXTURE_STACK / "scripts" / "collect.jsonl"
AGENT = "counter_simple_agent"
GATED = "gated_counter_resources_server"
FAST_RETRY = dict(retry_backoff_s=0.05, retry_backoff_max_s=0.5)


def row(add: int, initial: int, expected: int | None = None, **extra) -> dict:
    return {
        "responses_create_params": {"input": f"please add {add}", "tools": TOOLS},
        "initial_count": initial,
        "expected_count": initial + add if expected is None else expected,
        **extra,
    }


def instances(head_port: int) -> dict[str, list[dict]]:
    by_name: dict[str, list[dict]] = {}
    for inst in server_instances(head_port):
        by_name.setdefault(inst["process_name"], []).append(inst)
    return by_name


def get_json(url: str) -> dict:
    return httpx.get(url, timeout=30).json()


async def until(condition, what: str, timeout: float = 120.0) -> None:
    """Poll `condition()` (blocking calls run in a thread) until it holds; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------------------------------------------
# configs/collect.yaml: openai_model, the gated counter (holds rows marked `hold`), two simple_agents


@pytest.fixture(scope="module")
def collect_stack():
    head_port = free_port()
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = NgRunStack(
            [*fake_llm_overrides(["configs/collect.yaml"], backend.base_url, head_port),
             f"+{GATED}.resources_servers.gated_counter.hold_rows=true"],
            cwd=FIXTURE_STACK,
        )
        try:
            stack.wait_for("All 4 / 4 servers ready!", timeout=180)
            yield stack, head_port
        finally:
            stack.stop(sig=signal.SIGTERM, timeout=120)


async def test_groups_complete_with_counts_rewards_and_failures_as_data(collect_stack):
    _, head_port = collect_stack
    tasks = [
        row(2, 1),  # reward 1
        row(1, 0, expected=5),  # 0 + 1 != 5: reward 0
        {"initial_count": 3},  # no responses_create_params: refused before any /run
        row(1, 2, agent_ref={"type": "responses_api_agents", "name": "other_counter_agent"}),  # its own agent
        row(1, "not a number", expected=0),  # the resources server refuses the seed: /run fails, retried, then failure data
        row(2, 7),
    ]
    pulled: list[int] = []

    def source():
        for i, task in enumerate(tasks):
            pulled.append(i)
            yield task

    client = await RolloutClient.attach(f"http://127.0.0.1:{head_port}", max_in_flight=4, **FAST_RETRY)
    try:
        with pytest.raises(NeMoGymConfigError, match="not an agent of the stack"):
            client.rollouts(tasks, agent="counter_simple_agnet")
        groups = [g async for g in client.rollouts(source(), num_repeats=3, agent=AGENT)]
    finally:
        await client.aclose()

    assert sorted(g.task_index for g in groups) == list(range(len(tasks))) and pulled == list(range(len(tasks)))
    by_task = {g.task_index: g for g in groups}
    for index, group in by_task.items():
        assert isinstance(group, RolloutGroup) and group.task is tasks[index]
        assert [r.repeat_index for r in group.rollouts] == [0, 1, 2]
        assert all(isinstance(r, Rollout) and r.task_index == index for r in group.rollouts)
        assert all(r.trajectory is None and r.token_problem is None for r in group.rollouts)  # not training mode
    for index, reward in ((0, 1.0), (1, 0.0), (3, 1.0), (5, 1.0)):
        group = by_task[index]
        assert group.rewards == [reward] * 3 and not group.failed, group
        for r in group.rollouts:
            assert r.ok and r.result["final_count"] == tasks[index]["initial_count"] + (2 if index in (0, 5) else 1)
            assert r.response["output"] and r.attempts == 1 and r.reward_components is None
    assert {r.agent for r in by_task[3].rollouts} == {"other_counter_agent"}
    assert {r.agent for r in by_task[0].rollouts} == {AGENT}

    invalid = by_task[2].rollouts
    assert all(r.failure.error_type == "InvalidTask" and r.failure.attempts == 0 for r in invalid)
    assert "responses_create_params" in invalid[0].failure.message and invalid[0].reward is None

    failed = by_task[4].rollouts
    assert all(not r.ok and r.reward is None for r in failed), failed
    # The collector's policy: a 5xx from /run is retried up to max_attempts (3), then the rollout is a failure.
    assert {(r.failure.error_type, r.failure.status_code, r.failure.attempts) for r in failed} == {("HTTPError", 500, 3)}


async def test_in_flight_bound_lazy_pull_and_cancellation_with_held_rollouts(collect_stack):
    """Every task waits inside the resources server (`hold`), so what is in flight stays in flight: the bound and
    the read-ahead are read off while nothing completes. Then the consumer's task is cancelled."""
    _, head_port = collect_stack
    by_name = instances(head_port)
    gated, agent = by_name[GATED][0]["url"], by_name[AGENT][0]["url"]
    held_before = get_json(gated + "/held")["held"]
    limit, total = 3, 40
    pulled: list[int] = []

    def source():
        for i in range(total):
            pulled.append(i)
            yield row(1, 100 + i, hold=True)

    client = await RolloutClient.attach(f"http://127.0.0.1:{head_port}", max_in_flight=limit, **FAST_RETRY)
    got: list[RolloutGroup] = []

    async def consume() -> None:
        async for group in client.rollouts(source(), agent=AGENT):
            got.append(group)

    consumer = asyncio.ensure_future(consume())
    try:
        held = lambda: get_json(gated + "/held")["held"] - held_before  # noqa: E731
        await until(lambda: held() >= limit and client.in_flight >= limit, f"{limit} rollouts held")
        await asyncio.sleep(1.0)  # room for a broken bound to show
        assert held() == limit and client.in_flight == limit
        assert get_json(agent + "/health")["in_flight"] == limit  # the agent's own count of /run calls
        # Lazily pulled: the calls in flight plus the collector's read-ahead queue (one per slot) and one waiting.
        assert limit < len(pulled) <= 2 * limit + 1, len(pulled)
        assert not got and not consumer.done()

        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert client.in_flight == 0  # the /run calls were cancelled with the batch
        await asyncio.sleep(1.0)
        assert held() == limit and len(pulled) <= 2 * limit + 1  # nothing new started, nothing more read

        # The client goes on: a new batch runs.
        [group] = [g async for g in client.rollouts([row(2, 1)], num_repeats=2, agent=AGENT)]
        assert group.rewards == [1.0, 1.0]
    finally:
        consumer.cancel()
        await client.aclose()


def test_sync_client_lists_and_iterates_groups(collect_stack):
    _, head_port = collect_stack
    with SyncRolloutClient(f"http://127.0.0.1:{head_port}", max_in_flight=2, **FAST_RETRY) as client:
        assert client.agents == sorted([AGENT, "other_counter_agent"])
        groups = client.rollouts([row(1, i) for i in range(4)], num_repeats=2, agent=AGENT)
        assert sorted(g.task_index for g in groups) == [0, 1, 2, 3]
        assert all(g.rewards == [1.0, 1.0] for g in groups)

        seen = []
        for group in client.iter_rollouts([row(2, i) for i in range(10)], agent=AGENT):
            seen.append(group)
            if len(seen) == 2:
                break
        assert len(seen) == 2 and all(g.rewards == [1.0] for g in seen)
        assert client.in_flight == 0  # leaving the loop cancelled the rest
    with pytest.raises(NeMoGymStackError, match="Could not reach the NeMo Gym head server"):
        SyncRolloutClient(f"http://127.0.0.1:{free_port()}")


# --------------------------------------------------------------------------------------------------------------
# configs/replicas.yaml: resources server and agent with num_replicas: 2, started by SyncRolloutClient.start

REPLICA_RESOURCES = "replica_counter_resources_server"


@pytest.fixture(scope="module")
def replica_client():
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        overrides = [f"+policy_base_url={backend.base_url}", "+policy_api_key=dummy", "+policy_model_name=fake-model"]
        with SyncRolloutClient.start(["configs/replicas.yaml"], overrides, cwd=FIXTURE_STACK, max_in_flight=8,
                                     ready_timeout_s=300, **FAST_RETRY) as client:
            yield client
        assert "All 5 / 5 servers ready!" in Path(client.stack_log).read_text()


def head_port_of(client) -> int:
    return int(client.head_server.rsplit(":", 1)[1])


def test_a_stack_with_replicas_works_unchanged(replica_client):
    by_name = instances(head_port_of(replica_client))
    assert len(by_name[REPLICA_RESOURCES]) == 2 and len(by_name[AGENT]) == 2
    tasks = [row(1 + i % 2, i) for i in range(20)]
    groups = replica_client.rollouts(tasks, num_repeats=2)  # the stack's only agent
    assert sorted(g.task_index for g in groups) == list(range(20))
    replicas_seen = set()
    for group in groups:
        assert group.rewards == [1.0, 1.0], group
        for r in group.rollouts:
            # Seed, tool call and verify reached the replica that holds the session's counter.
            assert r.result["replica"] == r.result["seeded_by"] and r.agent == AGENT
            replicas_seen.add(r.result["replica"])
    assert replicas_seen == {0, 1}


def test_leaving_a_batch_early_leaves_no_run_running_and_starts_none(replica_client):
    by_name = instances(head_port_of(replica_client))
    resources = [r["url"] for r in by_name[REPLICA_RESOURCES]]
    agents = [a["url"] for a in by_name[AGENT]]
    seeds = lambda: sum(get_json(url + "/stats")["seeds"] for url in resources)  # noqa: E731  rollouts started
    agent_in_flight = lambda: sum(get_json(url + "/health")["in_flight"] for url in agents)  # noqa: E731
    before = seeds()
    seen = []
    for group in replica_client.iter_rollouts([row(1, i) for i in range(200)]):
        seen.append(group)
        if len(seen) == 3:
            break
    assert replica_client.in_flight == 0
    deadline = time.monotonic() + 60
    while agent_in_flight() != 0:  # a /run the client gave up on may still finish on the agent
        assert time.monotonic() < deadline, "a /run still running 60 s after the batch was left"
        time.sleep(0.1)
    started = seeds() - before
    time.sleep(1.0)
    assert seeds() - before == started and agent_in_flight() == 0  # nothing new started
    # Started: the 3 yielded, those in flight (8) and the results queued for the consumer when it left.
    assert 3 <= started <= 3 + 4 * 8 < 200, started


# --------------------------------------------------------------------------------------------------------------
# configs/self_healing.yaml: a resources server killed mid-batch


async def test_a_server_killed_mid_batch_loses_no_rollout(tmp_path):
    resources = "restart_counter_resources_server"
    head_port = free_port()
    tasks = [row(1, i) for i in range(6)] + [row(1, 10 + i, hold=True) for i in range(3)]  # 6-8 wait in seed_session
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = NgRunStack(
            [*fake_llm_overrides(["configs/self_healing.yaml"], backend.base_url, head_port),
             f"+{resources}.resources_servers.restart_counter.hold_marker={tmp_path / 'first_process'}"],
            cwd=FIXTURE_STACK,
        )
        try:
            stack.wait_for("All 3 / 3 servers ready!", timeout=180)
            victim = instances(head_port)[resources][0]
            client = await RolloutClient.attach(f"http://127.0.0.1:{head_port}", max_in_flight=9, **FAST_RETRY)
            got: list[RolloutGroup] = []

            async def consume() -> None:
                async for group in client.rollouts(tasks):
                    got.append(group)

            consumer = asyncio.ensure_future(consume())
            try:
                await until(lambda: len(got) == 6 and get_json(victim["url"] + "/held")["held"] == 3,
                            "6 groups done and 3 rollouts held", timeout=180)
                os.kill(victim["pid"], signal.SIGKILL)

                def restarted() -> bool:
                    info = instances(head_port)[resources][0]
                    return info["state"] == "ready" and info["restarts"] == 1 and info["pid"] != victim["pid"]

                await until(restarted, "the resources server to be restarted", timeout=180)
                await asyncio.wait_for(consumer, timeout=300)
            finally:
                consumer.cancel()
                await client.aclose()
        finally:
            code = stack.stop(timeout=60)
    assert code == 0, stack.output
    assert sorted(g.task_index for g in got) == list(range(9))
    for group in got:
        [r] = group.rollouts
        assert r.ok and r.reward == 1.0 and r.result["final_count"] == tasks[group.task_index]["expected_count"], r
    retried = sum(r.attempts - 1 for g in got for r in g.rollouts)
    assert 1 <= retried <= 3 and all(g.rollouts[0].attempts == 1 for g in got if g.task_index < 6)


async def test_a_server_ng_run_gave_up_on_stops_the_batch_with_one_message():
    resources = "restart_counter_resources_server"
    head_port = free_port()
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = NgRunStack(
            [*fake_llm_overrides(["configs/self_healing.yaml"], backend.base_url, head_port),
             f"+{resources}.resources_servers.restart_counter.restart_policy.max_restarts=0"],
            cwd=FIXTURE_STACK,
        )
        try:
            stack.wait_for("All 3 / 3 servers ready!", timeout=180)
            client = await RolloutClient.attach(f"http://127.0.0.1:{head_port}", max_in_flight=4, **FAST_RETRY)
            try:
                os.kill(instances(head_port)[resources][0]["pid"], signal.SIGKILL)
                await until(lambda: instances(head_port)[resources][0]["state"] == "failed",
                            "the resources server to be marked failed")
                with pytest.raises(NeMoGymStackError) as caught:
                    [g async for g in client.rollouts([row(1, i) for i in range(5)])]
                assert client.in_flight == 0
            finally:
                await client.aclose()
        finally:
            stack.stop(timeout=60)
    message = str(caught.value)
    assert f"server `{resources}` (needed by agent `{AGENT}`) has failed" in message, message
    assert "The batch stopped after 0 group(s)" in message and f"+head_server.port={head_port}" in message


# --------------------------------------------------------------------------------------------------------------
# Training mode: vllm_model with return_token_id_information, started by RolloutClient.start

TRAINING_STACK = """\
policy_model:
  responses_api_models:
    vllm_model:
      entrypoint: app.py
      base_url: ${policy_base_url}
      api_key: ${policy_api_key}
      model: ${policy_model_name}
      return_token_id_information: true
      uses_reasoning_parser: false
gated_counter_resources_server:
  resources_servers:
    gated_counter:
      entrypoint: app.py
      domain: agent
counter_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: gated_counter_resources_server}
      model_server: {type: responses_api_models, name: policy_model}
      max_steps: 4
"""


async def test_token_trajectories_in_training_mode(tmp_path):
    config = tmp_path / "training_stack.yaml"
    config.write_text(TRAINING_STACK)
    # The backend answers chat completions as vLLM does with `return_token_ids` (the prompt's ids, each choice's).
    with FakeLLMBackend("--script", str(SCRIPT), "--chat-prompt-token-ids") as backend:
        overrides = [f"+policy_base_url={backend.base_url}", "+policy_api_key=dummy", "+policy_model_name=fake-model"]
        async with RolloutClient.start([str(config)], overrides, cwd=FIXTURE_STACK, max_in_flight=4,
                                       ready_timeout_s=300, **FAST_RETRY) as client:
            groups = [g async for g in client.rollouts([row(1, 0), row(2, 5)], num_repeats=2)]
            log = Path(client.stack_log)
        assert "All 3 / 3 servers ready!" in log.read_text()
    assert sorted(g.task_index for g in groups) == [0, 1]
    for group in groups:
        assert group.rewards == [1.0, 1.0], group
        for r in group.rollouts:
            t = r.trajectory
            assert t is not None, (r.token_problem, r.response["output"])
            # vllm_model's chat route re-tokenizes a prompt that holds an earlier assistant turn: call 2 says so.
            assert t.drift == "retokenized" and t.retokenized_calls == [2] and t.num_model_calls == 2 and t.prompt_ids
            assert len(t.completion_ids) == len(t.logprobs) == len(t.loss_mask) > 0
            assert set(t.loss_mask) == {0, 1}  # generated tokens, and the tool output in between
            assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if m == 0)
    with pytest.raises(NeMoGymStackError, match="Could not reach"):
        await RolloutClient.attach(client.head_server)  # the stack was stopped on exit


# --------------------------------------------------------------------------------------------------------------
# A Ray cluster (3 nodes on loopback): resources server and agent as 2 Ray actor replicas each, started by
# RolloutClient.start with the cluster's address; the client code is the same as for a local stack.


async def test_a_stack_on_a_ray_cluster_works_unchanged(tmp_path):
    pytest.importorskip("ray")
    from nemo_gym.runtime.ray import LocalCluster
    from tests.integration.test_ray_cluster import AGENT as RAY_AGENT, RAY_ENV, STACK_YAML, row as ray_row

    (tmp_path / "stack.yaml").write_text(STACK_YAML)
    nodes = [{"num_cpus": 2, "resources": {"verifier_node": 2}}, {"num_cpus": 2, "resources": {"agent_node": 2}}]
    with LocalCluster(nodes) as cluster, FakeLLMBackend("--script", str(SCRIPT)) as backend:
        overrides = [f"+policy_base_url={backend.base_url}", "+policy_api_key=dummy", "+policy_model_name=fake-model",
                     f"+ray_head_node_address={cluster.address}"]
        async with RolloutClient.start(["stack.yaml"], overrides, cwd=tmp_path, env=RAY_ENV, max_in_flight=8,
                                       ready_timeout_s=300, **FAST_RETRY) as client:
            replicas = instances(int(client.head_server.rsplit(":", 1)[1]))[RAY_AGENT]
            assert len(replicas) == 2
            tasks = [ray_row(i) for i in range(12)]
            groups = [g async for g in client.rollouts(tasks, num_repeats=2)]
    assert sorted(g.task_index for g in groups) == list(range(12))
    for group in groups:
        # A mis-routed session call would fail the rollout (409) or give a wrong count.
        assert group.rewards == [1.0, 1.0] and not group.failed, group
        assert {r.result["final_count"] for r in group.rollouts} == {tasks[group.task_index]["expected_count"]}


# --------------------------------------------------------------------------------------------------------------
# No process: the pieces


def test_head_server_addresses_and_task_checks():
    from nemo_gym.training.client import parse_head_server
    from nemo_gym.training.tasks import InvalidTask, TaskChecker

    assert parse_head_server("http://127.0.0.1:11000") == {"host": "127.0.0.1", "port": 11000}
    assert parse_head_server("node-3:12000") == {"host": "node-3", "port": 12000}
    assert parse_head_server("12001") == {"host": "127.0.0.1", "port": 12001}
    with pytest.raises(ValueError, match="expected http://<host>:<port>"):
        parse_head_server("http://:x")

    checker = TaskChecker(agent=None, known_agents=[AGENT], responses_create_params={"temperature": 0.5})
    body = checker.check(row(1, 0, agent_ref={"name": AGENT}))
    assert body["responses_create_params"]["temperature"] == 0.5
    assert [(b["_ng_task_index"], b["_ng_rollout_index"]) for b in checker.repeats(body, 7, 3)] == [(7, 0), (7, 1), (7, 2)]
    for task, problem in (
        (["not", "a", "dict"], "must be a dict"),
        (row(1, 0), "no agent: the row has no `agent_ref.name`; pass agent=<agent server id>"),
        (row(1, 0, agent_ref={"name": "nope"}), "unknown agent `nope`"),
        ({"responses_create_params": {"input": "x", "top_p": "high"}, "agent_ref": {"name": AGENT}},
         "invalid responses_create_params"),
    ):
        with pytest.raises(InvalidTask, match=problem.replace("(", r"\(").replace(")", r"\)")):
            checker.check(task)


def test_a_rollout_carries_the_joined_token_trajectory_of_ng_export_tokens():
    from nemo_gym.rollouts.collection import RolloutResult
    from nemo_gym.training.rollout import rollout_from_result

    def result(second_prompt: list[int]) -> RolloutResult:
        output = [
            {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c",
             "prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1, -0.2]},
            {"type": "function_call_output", "call_id": "c", "output": "5"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}],
             "prompt_token_ids": second_prompt, "generation_token_ids": [7], "generation_log_probs": [-0.3],
             "token_trajectory": "exact"},
        ]
        answer = {"response": {"output": output}, "reward": 0.5, "reward_components": {"a": 1, "b": 0.0},
                  "_ng_task_index": 4, "_ng_rollout_index": 1}
        return RolloutResult({"_ng_task_index": 4, "_ng_rollout_index": 1}, result=answer, agent_name=AGENT,
                             attempts=1)

    r = rollout_from_result(result([1, 2, 3, 4, 5, 6]))
    assert (r.task_index, r.repeat_index, r.reward, r.reward_components) == (4, 1, 0.5, {"a": 1.0, "b": 0.0})
    t = r.trajectory
    assert (t.prompt_ids, t.completion_ids, t.loss_mask, t.drift) == ([1, 2], [3, 4, 5, 6, 7], [1, 1, 0, 0, 1], "exact")
    assert t.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3] and r.token_problem is None

    broken = rollout_from_result(result([9, 9, 9]))  # call 2 does not continue call 1
    assert broken.trajectory is None and broken.token_problem.startswith("unusable: tokens_not_contiguous")
