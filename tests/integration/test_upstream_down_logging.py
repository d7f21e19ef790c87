"""A model server that dies (and, with no restarts allowed, stays dead) while 64 rollouts hit its agent: every /run
is answered 500 naming the dead server, and the agent's log says so in one line per failed call, with the retry
lines collapsed and no retries once the head server marks the server failed, instead of a traceback per request in
flight."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances
from tests.conftest import FIXTURE_STACK

CALLS = 64


def test_a_dead_model_server_is_one_line_per_failed_call_in_the_agent_not_a_traceback_each():
    head = free_port()
    with FakeLLMBackend("--tool-args", '{"count": 2}') as backend:
        overrides = fake_llm_overrides(["configs/collect.yaml"], backend.base_url, head)
        with NgRunStack([*overrides, "+restart_policy.max_restarts=0"], cwd=FIXTURE_STACK) as run:
            run.wait_for("servers ready", timeout=120)
            servers = {s["process_name"]: s for s in server_instances(head)}
            os.kill(servers["policy_model"]["pid"], signal.SIGKILL)
            run.wait_for("policy_model", timeout=30)
            seen = len(run.lines)
            url = servers["counter_simple_agent"]["url"].rstrip("/") + "/run"

            async def many() -> list:
                async with httpx.AsyncClient(timeout=120) as client:
                    body = {"responses_create_params": {"input": "hi"}}
                    return await asyncio.gather(*(client.post(url, json=body) for _ in range(CALLS)))

            answers = asyncio.run(many())
            deadline = time.monotonic() + 30  # ng_run forwards the agent's lines as they come
            while time.monotonic() < deadline and sum("another server failed" in x for x in run.lines[seen:]) < CALLS:
                time.sleep(0.2)
            time.sleep(0.5)
            lines = run.lines[seen:]
    assert [a.status_code for a in answers] == [500] * CALLS
    assert all("policy_model" in a.json() for a in answers)
    agent_lines = [line for line in lines if line.startswith("(counter_simple_agent)")]
    assert not any("Traceback" in line for line in lines)
    failed = [line for line in agent_lines if "a call to another server failed" in line]
    retries = [line for line in agent_lines if "retrying in" in line]
    assert len(failed) == CALLS and all("policy_model" in line for line in failed)
    # At most one retry line per kind and interval, not one per attempt; once the head server says the model server
    # has failed for good (no restarts allowed), calls stop retrying it at all and say so.
    # (A call on a kept-alive connection that the dying server reset is not retried at all: it may have run.)
    assert len(retries) <= 3, "\n".join(retries)
