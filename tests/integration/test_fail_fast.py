"""Fail fast (issue 24): a collection against a stack where `ng_run` has marked a needed server failed (restart
budget spent) stops with one message naming the server and the `ng_status` hint, exits 1, records nothing for the
rollouts it did not run, keeps what it wrote, and a resume on a repaired stack runs the rest. Real processes; only
the LLM is fake. The cheapest honest failure: `restart_policy.max_restarts=0` on the resources server, so one
SIGKILL after the stack is ready marks it failed. No timed assertions: counts and outcomes, bounded waits."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest

from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack
from tests.conftest import free_port
from tests.integration.test_self_healing import (
    AGENT,
    RESOURCES,
    RESOURCES_IMPL,
    RETRY_LINE,
    SCRIPT,
    R,
    T,
    instances,
    poll,
    COLLECT,
    read_jsonl,
    row,
    start_stack,
)

NO_RESTARTS = f"+{RESOURCES_IMPL}.restart_policy.max_restarts=0"
ERROR_LINE = "error: ng_collect_rollouts:"


def start_collect(head_port: int, tmp_path: Path, tasks: list[dict], parallel: int, extra=(),
                  retries=("+retry_backoff_s=0.05", "+retry_backoff_max_s=0.5")) -> ChildProcess:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return ChildProcess(
        [
            *COLLECT,
            f"+head_server.port={head_port}",
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={tmp_path / 'tasks.jsonl'}",
            f"+output_jsonl_fpath={tmp_path / 'out' / 'rollouts.jsonl'}",
            f"+num_samples_in_parallel={parallel}",
            *retries,
            "+progress_bar=false",
            *extra,
        ],
        cwd=tmp_path,
        name="ng_collect_rollouts",
    )


def kill_until_failed(stack: NgRunStack, head_port: int) -> dict:
    """SIGKILL the resources server once; with no restarts allowed ng_run marks it failed."""
    victim = instances(head_port)[RESOURCES]
    os.kill(victim["pid"], signal.SIGKILL)
    poll(lambda: instances(head_port)[RESOURCES]["state"] == "failed", "the resources server to be marked failed",
         check=lambda: stack.proc.poll() is None or pytest.fail(stack.output))
    return victim


def assert_one_stop_message(collect: ChildProcess, head_port: int) -> str:
    errors = [line for line in collect.lines if ERROR_LINE in line]
    assert len(errors) == 1, collect.output
    message = errors[0]
    assert f"server `{RESOURCES}` (needed by agent `{AGENT}`) has failed" in message, message
    assert f"ng_status +head_server.port={head_port}" in message, message
    assert "restart budget spent" in message, message
    return message


def resume(tmp_path: Path, tasks: list[dict], *extra: str) -> ChildProcess:
    """A repaired stack (a new ng_run, nothing killed) and the same collection with +resume_from_cache=true."""
    head_port = free_port()
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = start_stack(backend, head_port, *extra)
        try:
            collect = start_collect(head_port, tmp_path, tasks, parallel=4, extra=("+resume_from_cache=true",))
            assert collect.wait(timeout=300) == 0, collect.output
        finally:
            assert stack.stop(timeout=60) == 0, stack.output
    return collect


def assert_all_written_once(tmp_path: Path, tasks: list[dict]) -> None:
    out = tmp_path / "out"
    rows = read_jsonl(out / "rollouts.jsonl")
    assert sorted((r[T], r[R]) for r in rows) == [(i, 0) for i in range(len(tasks))]
    assert all(r["reward"] == 1.0 for r in rows)
    assert not (out / "rollouts_failures.jsonl").exists()


def test_a_failed_server_stops_the_collection_before_it_starts_and_resume_runs_everything(tmp_path):
    tasks = [row(i) for i in range(40)]
    head_port = free_port()
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = start_stack(backend, head_port, NO_RESTARTS)
        try:
            kill_until_failed(stack, head_port)
            collect = start_collect(head_port, tmp_path, tasks, parallel=8)
            code = collect.wait(timeout=120)
        finally:
            stack.stop(timeout=60)
    assert code == 1, collect.output
    message = assert_one_stop_message(collect, head_port)
    assert "No rollout was started" in message
    assert not any(RETRY_LINE.search(line) for line in collect.lines), collect.output  # no row was tried
    out = tmp_path / "out"
    assert read_jsonl(out / "rollouts.jsonl") == []
    assert not (out / "rollouts_failures.jsonl").exists()

    collect = resume(tmp_path, tasks)
    assert_all_written_once(tmp_path, tasks)


def test_a_server_failing_mid_collection_stops_it_keeps_what_was_written_and_resume_runs_the_rest(tmp_path):
    # Parallel 3: tasks 0-3 finish, then 4-6 wait inside the resources server (its first process holds them) and
    # take every slot, so 7-26 are not started when the server is killed and marked failed.
    tasks = [row(i) for i in range(4)] + [row(10 + i, hold=True) for i in range(3)] + [row(20 + i) for i in range(20)]
    marker = f"+{RESOURCES_IMPL}.hold_marker={tmp_path / 'first_process'}"
    head_port = free_port()
    output = tmp_path / "out" / "rollouts.jsonl"
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = start_stack(backend, head_port, NO_RESTARTS, marker)
        try:
            # The held rows fail when the server dies, a moment before ng_run marks it failed: their retries
            # (about 8 s of backoff in all) outlast that moment, so they are stopped, not recorded as failures.
            collect = start_collect(head_port, tmp_path, tasks, parallel=3, retries=(
                "+max_attempts=10", "+retry_backoff_s=0.5", "+retry_backoff_max_s=2"))
            victim = instances(head_port)[RESOURCES]
            poll(lambda: len(read_jsonl(output)) == 4
                 and httpx.get(victim["url"] + "/held", timeout=5).json()["held"] == 3,
                 "4 rollouts written and 3 held in the resources server",
                 check=lambda: collect.proc.poll() is None or pytest.fail(collect.output))
            kill_until_failed(stack, head_port)
            code = collect.wait(timeout=120)
        finally:
            stack.stop(timeout=60)
    assert code == 1, collect.output
    message = assert_one_stop_message(collect, head_port)
    assert "The collection stopped: 4 new rollout(s) saved" in message and "23 not run" in message, message
    rows = read_jsonl(output)
    assert sorted(r[T] for r in rows) == [0, 1, 2, 3]  # kept; nothing of the unstarted (or cancelled) rows
    assert not (tmp_path / "out" / "rollouts_failures.jsonl").exists()

    # The hold marker exists now, so the repaired stack's resources server holds nothing.
    collect = resume(tmp_path, tasks, marker)
    assert "4 from an earlier run, 23 new" in collect.output, collect.output
    assert_all_written_once(tmp_path, tasks)


def test_needed_servers_follow_references_and_a_server_fails_only_with_all_its_replicas():
    """No process: which servers a collection needs, and when the head server's records say one has failed."""
    from nemo_gym.http.stack_health import failed_among, needed_servers

    config = {
        "agent": {"responses_api_agents": {"simple_agent": {
            "resources_server": {"type": "resources_servers", "name": "env"},
            "model_server": {"type": "responses_api_models", "name": "policy"}}}},
        "env": {"resources_servers": {"judged": {"judge": {"type": "responses_api_models", "name": "judge"}}}},
        "policy": {"responses_api_models": {"openai_model": {}}},
        "judge": {"responses_api_models": {"openai_model": {}}},
        "unused": {"resources_servers": {"other": {}}},
    }
    needed = needed_servers(config, ["agent"])
    assert needed == {"agent": "agent", "env": "agent", "policy": "agent", "judge": "agent"}

    def inst(name, state, replica=0, n=1):
        return {"process_name": name, "state": state, "replica": replica, "num_replicas": n, "restarts": 5,
                "last_exit_code": 1}

    # One replica of two failed: the client routes around it, nothing stops.
    assert failed_among([inst("env", "failed", 0, 2), inst("env", "ready", 1, 2)], needed) == []
    assert failed_among([inst("unused", "failed"), inst("judge", "restarting")], needed) == []
    [judge] = failed_among([inst("judge", "failed"), inst("env", "ready")], needed)
    assert (judge.server, judge.needed_by, judge.restarts, judge.last_exit_code) == ("judge", "agent", 5, 1)
    assert "server `judge` (needed by agent `agent`) has failed" in judge.describe()
