"""Self-healing with real processes (issue 15): `ng_run` restarts a server that was killed with SIGKILL (or that
stopped answering /health) on the same address, clients ride through the restart, and a collection that was
running completes with every row written once and no resume. Only the LLM is fake. No timed assertions: counts
and outcomes, with generous bounded waits. At the end, the restart budget of ng_run's supervisor on a real exited
process (the rest of its decisions are tests/unit/test_self_healing.py)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from omegaconf import OmegaConf

from nemo_gym.config.types import RestartPolicy
from nemo_gym.runtime import launcher
from nemo_gym.runtime.launcher import RunHelper, ServerProcess
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides, server_instances
from tests.conftest import FIXTURE_STACK, free_port
from tests.integration.test_collect_rollouts import TOOLS, read_jsonl as _read_jsonl
from tests.unit.test_self_healing import spec


def read_jsonl(path: Path) -> list[dict]:
    return _read_jsonl(path) if path.exists() else []

SCRIPT = FIXTURE_STACK / "scripts" / "collect.jsonl"
COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
STATUS = [sys.executable, "-c", "from nemo_gym.cli import status; status()"]
T, R = "_ng_task_index", "_ng_rollout_index"
RESOURCES = "restart_counter_resources_server"
RESOURCES_IMPL = f"{RESOURCES}.resources_servers.restart_counter"
AGENT = "counter_simple_agent"
MODEL = "policy_model"
# The collector logs one line per failed /run attempt that it retries (nemo_gym.http.retry).
RETRY_LINE = re.compile(r"POST /run on agent .*\(attempt \d+/\d+, retrying in")


def row(initial: int, **extra) -> dict:
    return {
        "responses_create_params": {"input": "please add 1", "tools": TOOLS},
        "initial_count": initial,
        "expected_count": initial + 1,
        **extra,
    }


def poll(condition, what: str, timeout: float = 180.0, check=lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        check()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_stack(backend: FakeLLMBackend, head_port: int, *extra: str) -> NgRunStack:
    stack = NgRunStack([*fake_llm_overrides(["configs/self_healing.yaml"], backend.base_url, head_port), *extra],
                       cwd=FIXTURE_STACK)
    stack.wait_for("All 3 / 3 servers ready!", timeout=180)
    return stack


def instances(head_port: int) -> dict[str, dict]:
    return {i["process_name"]: i for i in server_instances(head_port)}


def start_collect(head_port: int, tmp_path: Path, tasks: list[dict], parallel: int) -> ChildProcess:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return ChildProcess(
        [
            *COLLECT,
            f"+head_server.port={head_port}",
            f"+agent_name={AGENT}",
            f"+input_jsonl_fpath={tmp_path / 'tasks.jsonl'}",
            f"+output_jsonl_fpath={tmp_path / 'out' / 'rollouts.jsonl'}",
            f"+num_samples_in_parallel={parallel}",
            "+retry_backoff_s=0.05",
            "+retry_backoff_max_s=0.5",
            "+progress_bar=false",
        ],
        cwd=tmp_path,
        name="ng_collect_rollouts",
    )


def assert_every_row_written_once(tmp_path: Path, collect: ChildProcess, tasks: list[dict]) -> int:
    """The collection succeeded without resume: each task once, each reward right. Returns the failed attempts."""
    assert collect.wait(timeout=300) == 0, collect.output
    out = tmp_path / "out"
    rows = read_jsonl(out / "rollouts.jsonl")
    assert sorted((r[T], r[R]) for r in rows) == [(i, 0) for i in range(len(tasks))], collect.output
    assert {r[T]: r["final_count"] for r in rows} == {i: t["expected_count"] for i, t in enumerate(tasks)}
    assert all(r["reward"] == 1.0 for r in rows)
    assert not (out / "rollouts_failures.jsonl").exists()
    return sum(1 for line in collect.lines if RETRY_LINE.search(line))


def wait_restarted(stack: NgRunStack, head_port: int, server: str, old_pid: int, restarts: int = 1) -> dict:
    def back() -> bool:
        info = instances(head_port)[server]
        return info["state"] == "ready" and info["restarts"] == restarts and info["pid"] != old_pid

    poll(back, f"{server} to be restarted", check=lambda: stack.proc.poll() is None or pytest.fail(stack.output))
    return instances(head_port)[server]


def kill_mid_collection(tmp_path: Path, victim_name: str, tasks: list[dict], parallel: int, in_flight,
                        backend_args: tuple = (), stack_args: tuple = ()) -> tuple[int, str]:
    """Run a collection, SIGKILL `victim_name` once `in_flight(victim_info, output_rows, stack)` holds, check it is
    restarted on its port and that every row is written once. Returns (failed /run attempts, ng_run's output)."""
    head_port = free_port()
    with FakeLLMBackend("--script", str(SCRIPT), *backend_args) as backend:
        stack = start_stack(backend, head_port, *stack_args)
        try:
            collect = start_collect(head_port, tmp_path, tasks, parallel=parallel)
            victim = instances(head_port)[victim_name]
            output = tmp_path / "out" / "rollouts.jsonl"
            poll(lambda: in_flight(victim, read_jsonl(output), stack), "rollouts in flight in the victim",
                 check=lambda: collect.proc.poll() is None or pytest.fail(collect.output))
            os.kill(victim["pid"], signal.SIGKILL)
            info = wait_restarted(stack, head_port, victim_name, victim["pid"])
            assert info["port"] == victim["port"] and info["last_exit_code"] == -9
            failed_attempts = assert_every_row_written_once(tmp_path, collect, tasks)
        finally:
            code = stack.stop(timeout=60)
    assert code == 0, stack.output
    assert f"Server '{victim_name}' restarted and healthy again" in stack.output
    print(f"\n{victim_name} killed: {failed_attempts} failed /run attempt(s)")
    return failed_attempts, stack.output


def test_killing_the_resources_server_costs_only_the_rollouts_inside_it(tmp_path):
    tasks = [row(i) for i in range(6)] + [row(10 + i, hold=True) for i in range(3)]  # 6, 7, 8 wait in seed_session

    def only_held_in_flight(victim: dict, rows: list, stack: NgRunStack) -> bool:
        return len(rows) == 6 and httpx.get(victim["url"] + "/held", timeout=5).json()["held"] == 3

    failed_attempts, output = kill_mid_collection(
        tmp_path, RESOURCES, tasks, len(tasks), only_held_in_flight,
        stack_args=(f"+{RESOURCES_IMPL}.hold_marker={tmp_path / 'first_process'}",),
    )
    assert 1 <= failed_attempts <= 3  # the 3 held rollouts were inside it, nothing else was in flight
    assert f"Server '{RESOURCES}' (resources_servers/restart_counter) exited with code -9" in output


@pytest.mark.parametrize("victim_name", [MODEL, AGENT])
def test_killing_the_model_or_agent_server_mid_collection_costs_at_most_its_rollouts_in_flight(victim_name, tmp_path):
    parallel = 4
    # Model calls take a while, so rollouts are in flight inside the agent and the model server when one is killed.
    failed_attempts, _ = kill_mid_collection(
        tmp_path, victim_name, [row(i) for i in range(24)], parallel, lambda victim, rows, stack: len(rows) >= 4,
        backend_args=("--latency-ms", "200"),
    )
    assert failed_attempts <= parallel


def test_a_rollout_seeded_before_a_resources_server_restart_is_rerun_not_resumed(tmp_path):
    tasks = [row(i + 1) for i in range(4)]

    def all_seeded(victim: dict, rows: list, stack: NgRunStack) -> bool:
        return sum('"POST /seed_session' in line for line in stack.lines) >= len(tasks)

    # The kill follows the 4th /seed_session within a poll; each model call then takes 5 s before the tool call.
    failed_attempts, _ = kill_mid_collection(
        tmp_path, RESOURCES, tasks, len(tasks), all_seeded,
        backend_args=("--latency-ms", "5000"), stack_args=("+uvicorn_logging_show_200_ok=true",),
    )
    assert failed_attempts <= len(tasks)


def test_restart_budget_spent_marks_the_server_failed_and_status_shows_it(tmp_path):
    head_port = free_port()
    with FakeLLMBackend() as backend:
        # Per-server policy: one restart allowed.
        stack = start_stack(backend, head_port, f"+{RESOURCES_IMPL}.restart_policy.max_restarts=1",
                            "+restart_policy.backoff_s=0")
        try:
            first = instances(head_port)[RESOURCES]
            os.kill(first["pid"], signal.SIGKILL)
            second = wait_restarted(stack, head_port, RESOURCES, first["pid"])
            os.kill(second["pid"], signal.SIGKILL)
            poll(lambda: instances(head_port)[RESOURCES]["state"] == "failed", "the server to be marked failed")
            info = instances(head_port)[RESOURCES]
            assert info["restarts"] == 1 and info["last_exit_code"] == -9
            # Its socket is closed: clients fail fast with a connection error instead of waiting.
            with pytest.raises(httpx.ConnectError):
                httpx.get(first["url"] + "/health", timeout=10)
            status = subprocess.run([*STATUS, f"+head_server.port={head_port}"], capture_output=True, text=True,
                                    timeout=60)
            assert status.returncode == 1, status.stdout
            assert "3 servers found (2 healthy, 1 unhealthy)" in status.stdout and "failed" in status.stdout
            assert instances(head_port)[AGENT]["state"] == "ready"  # the rest of the stack stays up
        finally:
            code = stack.stop(timeout=60)
    assert code == 1, stack.output
    assert "Restart budget spent" in stack.output and f"1 server(s) had failed: {RESOURCES}" in stack.output


def test_a_server_that_stops_answering_health_is_killed_and_restarted(tmp_path):
    head_port = free_port()
    with FakeLLMBackend() as backend:
        stack = start_stack(backend, head_port, "+restart_policy.health_check_interval_s=0.5",
                            "+restart_policy.health_check_timeout_s=2", "+restart_policy.health_check_failures=2")
        try:
            victim = instances(head_port)[RESOURCES]
            os.kill(victim["pid"], signal.SIGSTOP)  # alive, but answers nothing
            info = wait_restarted(stack, head_port, RESOURCES, victim["pid"])
            assert info["last_exit_code"] == -9
            assert httpx.get(info["url"] + "/health", timeout=10).status_code == 200
        finally:
            code = stack.stop(timeout=60)
    assert code == 0, stack.output
    assert f"server '{RESOURCES}' stopped answering /health" in stack.output


def test_a_server_that_crashes_on_start_is_not_restarted_and_ng_run_exits_with_its_error():
    stack = NgRunStack(["+config_paths=[configs/crashing.yaml]", f"+head_server.port={free_port()}"],
                       cwd=FIXTURE_STACK)
    code = stack.wait(timeout=120)
    assert code == 1, stack.output
    assert "simulated start-up failure" in stack.output
    assert "Restarting" not in stack.output and stack.output.count("ERROR: Server 'crashing_server'") == 1  # one report
    assert stack.output.rstrip().splitlines()[-1].startswith("error: ng_run: Server 'crashing_server'")


# ------------------------------------------------------------------- the restart budget, on a real exited process


def exited_server(policy: RestartPolicy, tmp_path: Path) -> ServerProcess:
    server = ServerProcess(spec=spec({}), server_dir=tmp_path, host="127.0.0.1", port=1, policy=policy)
    server.popen = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    server.popen.wait()
    server.tail.append("boom")
    server.state = launcher.READY
    return server


def test_exits_are_restarted_until_the_budget_in_the_window_is_spent(tmp_path):
    out = io.StringIO()
    helper = RunHelper(OmegaConf.create({}), cwd=tmp_path, out=out)
    server = exited_server(RestartPolicy(max_restarts=2, window_s=100, backoff_s=1, backoff_max_s=10), tmp_path)
    helper.servers = [server]

    helper._on_exit(server, now=1000.0)
    assert (server.state, server.restarts, server.last_exit_code, server.next_restart_at) == (launcher.WAITING, 1, 3, 1001.0)
    assert "exited with code 3" in out.getvalue() and "boom" in out.getvalue() and "Restarting it on" in out.getvalue()

    helper._on_exit(server, now=1010.0)
    assert (server.state, server.restarts, server.next_restart_at) == (launcher.WAITING, 2, 1012.0)

    # A restart older than the window no longer counts.
    helper._on_exit(server, now=1105.0)
    assert (server.state, server.restarts) == (launcher.WAITING, 3)

    helper._on_exit(server, now=1106.0)
    assert server.state == launcher.FAILED and server.restarts == 3
    assert "Restart budget spent" in out.getvalue()
    assert helper.failed_servers() == [server]
    assert server.display()["state"] == "failed" and server.display()["last_exit_code"] == 3


def test_no_restarts_allowed_fails_at_once(tmp_path):
    helper = RunHelper(OmegaConf.create({}), cwd=tmp_path, out=io.StringIO())
    server = exited_server(RestartPolicy(max_restarts=0), tmp_path)
    helper._on_exit(server, now=0.0)
    assert server.state == launcher.FAILED and server.restarts == 0
