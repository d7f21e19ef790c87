"""The CLI driven as a job script drives it (NeMo Skills' rollout job, reference v0.5 section 16): `ng_run` in the
background with the job's extra `+key=value` list, `ng_status` polled until its count line says `0 unhealthy`, then
`ng_collect_rollouts` with the SAME extra list, then `ng_run` stopped. Every step is a real process; only the LLM is
the scripted fake backend. The stack is tests/fixtures/stack/configs/collect.yaml (gated_counter: reward 1 when the
model's tool calls bring the counter from `initial_count` to `expected_count`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, process_tree
from tests.conftest import FIXTURE_STACK, free_port
from tests.integration.test_collect_rollouts import TOOLS

SCRIPT = FIXTURE_STACK / "scripts" / "collect.jsonl"
SUMMARY = re.compile(r"^(\d+) servers found \((\d+) healthy, (\d+) unhealthy\)$", re.MULTILINE)
# (what to ask, initial count, expected count): the model adds 1 or 2, so the reward is 1 when they differ by that.
TASKS = [("add 1", 0, 1), ("add 2", 1, 3), ("add 1", 5, 9), ("add 2", 0, 2), ("add 1", 7, 8)]


def console_script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`ng_<name> args...` as a shell in a job script runs it."""
    code = f"from nemo_gym.cli import {name}; {name}()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def wait_until_status_says_ready(head_port: int, stack: NgRunStack, cwd: Path, timeout: float = 240.0) -> str:
    """Poll `ng_status` as job scripts do, until its count line says `0 unhealthy`; returns that output."""
    deadline = time.monotonic() + timeout
    while True:
        status = console_script("status", f"+head_server.port={head_port}", cwd=cwd)
        match = SUMMARY.search(status.stdout)
        if match and match.group(3) == "0":
            return status.stdout
        assert stack.proc.poll() is None, f"ng_run exited ({stack.proc.returncode}):\n{stack.output}"
        assert time.monotonic() < deadline, f"ng_status never said 0 unhealthy:\n{status.stdout}{status.stderr}"
        time.sleep(0.5)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_job_script_passes_the_same_extra_keys_to_ng_run_and_ng_collect_rollouts(tmp_path):
    (tmp_path / "prompt.yaml").write_text('system: You keep a counter.\nuser: "please {ask}"\n')
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(
        json.dumps({"ask": ask, "initial_count": initial, "expected_count": expected,
                    "responses_create_params": {"tools": TOOLS}}) + "\n"
        for ask, initial, expected in TASKS
    ))
    output = tmp_path / "out" / "rollouts.jsonl"
    head_port = free_port()
    extras = [
        f"+head_server.port={head_port}",
        "+agent_name=counter_simple_agent",
        "+num_samples_in_parallel=3",
        "+num_repeats=2",
        "+limit=3",
        f"+prompt_config={tmp_path / 'prompt.yaml'}",
        "+resume_from_cache=true",
        "+responses_create_params.temperature=0.5",
        f"+input_jsonl_fpath={tasks}",
        f"+output_jsonl_fpath={output}",
    ]
    with FakeLLMBackend("--script", str(SCRIPT)) as backend:
        stack = NgRunStack(
            ["+config_paths=[configs/collect.yaml]", f"+policy_base_url={backend.base_url}",
             "+policy_api_key=dummy-key", "+policy_model_name=fake-model", *extras],
            cwd=FIXTURE_STACK,
        )
        try:
            status = wait_until_status_says_ready(head_port, stack, tmp_path)
            assert "4 servers found (4 healthy, 0 unhealthy)" in status, status
            tree = process_tree(stack.proc.pid)
            assert len(tree) >= 5, tree  # ng_run and its four servers

            for attempt in ("first", "resumed"):
                collect = console_script("collect_rollouts", *extras, cwd=tmp_path)
                assert collect.returncode == 0, f"{attempt}:\n{collect.stdout}{collect.stderr}"
        finally:
            code = stack.stop(timeout=60)
        assert code == 0, stack.output
        left = [p for p in tree if p.is_running() and p.status() != "zombie"]
        assert not left, left

    rollouts = read_jsonl(output)
    got = sorted((r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in rollouts)
    # limit=3: the first three tasks only; num_repeats=2: two rollouts each; the resumed run added none.
    assert got == [(0, 0, 1.0), (0, 1, 1.0), (1, 0, 1.0), (1, 1, 1.0), (2, 0, 0.0), (2, 1, 0.0)]
    for r in rollouts:
        assert r["responses_create_params"]["temperature"] == 0.5
        assert r["agent_ref"]["name"] == "counter_simple_agent"
        user_turns = [m for m in r["responses_create_params"]["input"] if m.get("role") == "user"]
        assert user_turns[-1]["content"] == f"please {TASKS[r['_ng_task_index']][0]}"
