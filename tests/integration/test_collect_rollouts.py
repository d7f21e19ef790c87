"""`ng_collect_rollouts` against real processes: `ng_run` with openai_model in front of the scripted fake backend,
a resources server with per-session state (tests/fixtures/stack/resources_servers/gated_counter) and two
simple_agents (configs/collect.yaml). Checks exact rows and rewards with repeats and parallelism, and that killing
the resources server mid-run records failures, after which `resume_from_cache` on a restarted stack completes the
file with no duplicates and nothing lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, server_instances
from tests.conftest import FIXTURE_STACK, free_port, wait_http_ok

SCRIPT = FIXTURE_STACK / "scripts" / "collect.jsonl"
COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
T, R = "_ng_task_index", "_ng_rollout_index"
GATED = "gated_counter_resources_server"

TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "add to the counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        "strict": False,
    }
]


@pytest.fixture
def backend():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.testing.fake_openai_server", "--port", str(port), "--script", str(SCRIPT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health", timeout=60)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def start_stack(backend_url: str, head_port: int, *extra: str) -> NgRunStack:
    stack = NgRunStack(
        [
            "+config_paths=[configs/collect.yaml]",
            f"+policy_base_url={backend_url}",
            "+policy_api_key=dummy-key",
            "+policy_model_name=fake-model",
            f"+head_server.port={head_port}",
            *extra,
        ],
        cwd=FIXTURE_STACK,
    )
    stack.wait_for("All 4 / 4 servers ready!", timeout=180)
    return stack


def row(text: str, initial: int, expected: int, **extra) -> dict:
    return {
        "responses_create_params": {"input": text, "tools": TOOLS},
        "initial_count": initial,
        "expected_count": expected,
        **extra,
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collect_args(head_port: int, tmp_path: Path, *extra: str) -> list[str]:
    return [
        *COLLECT,
        f"+head_server.port={head_port}",
        "+agent_name=counter_simple_agent",
        f"+input_jsonl_fpath={tmp_path / 'tasks.jsonl'}",
        f"+output_jsonl_fpath={tmp_path / 'out' / 'rollouts.jsonl'}",
        "+retry_backoff_s=0.05",
        "+retry_backoff_max_s=0.2",
        *extra,
    ]


def test_collect_with_repeats_and_parallelism_gives_exact_rows_rewards_and_profile(backend, tmp_path):
    a = row("please add 2", 1, 3)  # 1 + 2 = 3: reward 1
    tasks = [
        a,
        row("please add 1", 0, 5),  # 0 + 1 != 5: reward 0
        row("this one is broken", 5, 5),  # malformed tool call -> error output, count stays 5: reward 1
        a,  # identical line: same task as the first
        row("please add 1", 2, 3, agent_ref={"type": "responses_api_agents", "name": "other_counter_agent"}),
    ]
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    head_port = free_port()
    stack = start_stack(backend, head_port)
    try:
        collect = ChildProcess(
            collect_args(
                head_port,
                tmp_path,
                "+num_repeats=2",
                "+num_repeats_add_seed=true",
                "+num_samples_in_parallel=3",
                "+responses_create_params.temperature=0.5",
            ),
            cwd=tmp_path,
        )
        code = collect.wait(timeout=300)
        assert code == 0, collect.output
    finally:
        assert stack.stop(timeout=60) == 0, stack.output

    out = tmp_path / "out"
    rollouts = read_jsonl(out / "rollouts.jsonl")
    got = sorted((r[T], r[R], r["reward"], r["final_count"], r["expected_count"]) for r in rollouts)
    assert got == [
        (0, 0, 1.0, 3, 3), (0, 1, 1.0, 3, 3), (0, 2, 1.0, 3, 3), (0, 3, 1.0, 3, 3),
        (1, 0, 0.0, 1, 5), (1, 1, 0.0, 1, 5),
        (2, 0, 1.0, 5, 5), (2, 1, 1.0, 5, 5),
        (3, 0, 1.0, 3, 3), (3, 1, 1.0, 3, 3),
    ]
    for r in rollouts:
        params = r["responses_create_params"]
        assert params["seed"] == r[R] and params["temperature"] == 0.5
        types = [o["type"] for o in r["response"]["output"]]
        assert types == ["function_call", "function_call_output", "message"]
        assert r["response"]["usage"]["total_tokens"] == 30  # two model calls of 10 in + 5 out
    broken = next(r for r in rollouts if r[T] == 2)
    assert "error" in json.loads(broken["response"]["output"][1]["output"])

    materialized = read_jsonl(out / "rollouts_materialized_inputs.jsonl")
    assert [(m[T], m[R]) for m in materialized] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (0, 2), (0, 3), (3, 0), (3, 1),
    ]
    assert {m["agent_ref"]["name"] for m in materialized if m[T] != 3} == {"counter_simple_agent"}
    assert not (out / "rollouts_failures.jsonl").exists()

    profile = read_jsonl(out / "rollouts_reward_profiling.jsonl")
    assert [(p[T], p["num_rollouts"], p["mean/reward"]) for p in profile] == [(0, 4, 1.0), (1, 2, 0.0), (2, 2, 1.0), (3, 2, 1.0)]
    assert profile[0]["sample"]["initial_count"] == 1 and T not in profile[0]["sample"]
    assert all(p["mean/total_tokens"] == 30.0 for p in profile)
    agents = {m["agent_ref"]["name"]: m for m in json.loads((out / "rollouts_agent_metrics.json").read_text())}
    main, other = agents["counter_simple_agent"], agents["other_counter_agent"]
    assert (main["num_tasks"], main["num_rollouts"], main["mean/reward"]) == (3, 8, 0.75)
    assert main["pass@1"] == pytest.approx(2 / 3) and main["pass@2"] == pytest.approx(2 / 3)
    assert (other["num_tasks"], other["num_rollouts"], other["mean/reward"], other["std/reward"]) == (1, 2, 1.0, 0.0)
    assert "Collected 10 / 10 rollouts" in collect.output


def test_killing_the_resources_server_for_good_stops_the_collection_and_resume_completes_the_file(backend, tmp_path):
    tasks = [row("please add 1", i, i + 1) for i in range(4)]
    tasks += [row("please add 2", 10 + i, 12 + i, hold=True) for i in range(2)]  # tasks 4 and 5 hang in seed_session
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    output = tmp_path / "out" / "rollouts.jsonl"
    failures_path = tmp_path / "out" / "rollouts_failures.jsonl"
    head_port = free_port()

    # No restarts (test_self_healing.py covers them): the held rollouts fail and resume completes the file.
    stack = start_stack(
        backend, head_port, f"+{GATED}.resources_servers.gated_counter.hold_rows=true", "+restart_policy.max_restarts=0"
    )
    try:
        collect = ChildProcess(collect_args(head_port, tmp_path, "+num_samples_in_parallel=6", "+max_attempts=3"), cwd=tmp_path)
        servers = {i["process_name"]: i for i in server_instances(head_port)}
        held_url = servers[GATED]["url"] + "/held"
        # Wait (no timing assumptions) until the four free rollouts are written and both held ones are in flight.
        deadline = time.monotonic() + 180
        while True:
            done = len(read_jsonl(output)) if output.exists() else 0
            held = httpx.get(held_url, timeout=5).json()["held"]
            if done == 4 and held == 2:
                break
            assert collect.proc.poll() is None, collect.output
            assert time.monotonic() < deadline, f"done={done} held={held}\n{collect.output}"
            time.sleep(0.05)
        os.kill(servers[GATED]["pid"], signal.SIGKILL)
        code = collect.wait(timeout=300)
        assert code == 1, collect.output
        assert stack.stop(timeout=60) == 1  # a server failed: ng_run exits 1
    finally:
        stack.stop(timeout=60)

    first = read_jsonl(output)
    assert sorted((r[T], r[R]) for r in first) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    # The head server marks the server failed (no restarts allowed): the collection stops with one message naming
    # it, and the 2 held rows are not run, so not failures either: the resume below runs them.
    assert not failures_path.exists(), collect.output
    assert "server `gated_counter_resources_server`" in collect.output and "2 not run" in collect.output

    # A crash while writing would leave a torn line: resume must cope with it.
    with open(output, "a") as f:
        f.write('{"reward": 1.0, "_ng_task_index": 4, "_ng_rollout_')

    stack = start_stack(backend, head_port)
    try:
        resume = ChildProcess(collect_args(head_port, tmp_path, "+resume_from_cache=true"), cwd=tmp_path)
        assert resume.wait(timeout=300) == 0, resume.output
    finally:
        assert stack.stop(timeout=60) == 0, stack.output

    final = read_jsonl(output)  # every line parses
    keys = [(r[T], r[R]) for r in final]
    assert sorted(keys) == [(t, 0) for t in range(6)] and len(set(keys)) == len(keys)
    assert final[:4] == first  # finished rollouts were kept as they were, not rerun
    assert all(r["reward"] == 1.0 for r in final)
    assert {r[T]: r["final_count"] for r in final} == {0: 1, 1: 2, 2: 3, 3: 4, 4: 12, 5: 13}
    assert not failures_path.exists(), collect.output
    assert "Collected 6 / 6 rollouts" in resume.output and "4 from an earlier run, 2 new" in resume.output
    profile = read_jsonl(tmp_path / "out" / "rollouts_reward_profiling.jsonl")
    assert [p[T] for p in profile] == list(range(6))


def test_the_terminal_summary_counts_incomplete_rollouts(tmp_path):
    """Responses cut at max_output_tokens (the fake LLM's `incomplete_details`: `status: incomplete`, Chat's
    finish_reason `length`) are verified and kept: the collector's summary and the reward profile count them as
    incomplete, apart from ok and failed, in the words every tool uses (`nemo_gym/rollouts/outcome.py`)."""
    cut = {"name": "cut", "match": {"last_user_contains": "at length"}, "output": ["Let me explain at length"],
           "incomplete_details": {"reason": "max_output_tokens"}}  # fmt: skip
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps(cut) + "\n" + SCRIPT.read_text())
    write_jsonl(
        tmp_path / "tasks.jsonl",
        [row("please add 2", 1, 3), row("please add 1", 0, 5), row("please add 1", 2, 3),
         row("please explain at length", 4, 4), row("please add 2, explaining at length", 0, 2)],
    )  # fmt: skip
    with FakeLLMBackend("--script", str(script)) as backend:
        head_port = free_port()
        stack = start_stack(backend.base_url, head_port)
        try:
            collect = ChildProcess(collect_args(head_port, tmp_path, "+progress_bar=false"), cwd=tmp_path)
            assert collect.wait(timeout=300) == 0, collect.output  # incomplete is not a failure
        finally:
            assert stack.stop(timeout=60) == 0, stack.output

    assert "5 rollouts: 3 ok, 2 incomplete (max_output_tokens), 0 failed." in collect.output, collect.output
    assert "they have a reward and are kept in the output" in collect.output
    rollouts = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    cut_short = sorted(r[T] for r in rollouts if r["response"]["status"] == "incomplete")
    assert len(rollouts) == 5 and cut_short == [3, 4]
    assert {r[T]: r["reward"] for r in rollouts if r[T] in cut_short} == {3: 1.0, 4: 0.0}  # verified: 4 == 4, 0 != 2
    (metrics,) = json.loads((tmp_path / "out" / "rollouts_agent_metrics.json").read_text())
    assert (metrics["num_rollouts"], metrics["num_ok"], metrics["num_incomplete"], metrics["num_failed"]) == (5, 3, 2, 0)
