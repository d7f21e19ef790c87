"""Rollout correlation and model-call capture under `ng_run` (NeMo Gym v0.5 §7.1, §7.2).

The stack of test_simple_agent.py (openai_model in front of the scripted fake backend, the shopping-list resources
server, simple_agent): with `observability_enabled: true` and a `model_call_capture_dir`, rollouts collected by
`ng_collect_rollouts` leave one capture file per rollout id with one line per model call, and the collector's
summary of it (`merge_model_call_capture_into_record`) adds up to the usage the agent reported. With observability
off nothing is written and no call is prefixed, yet a prefixed call to the model server is still answered; with
observability on and no capture dir, the model server refuses to start and says what to set.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from nemo_gym.base_responses_api_model import merge_model_call_capture_into_record
from nemo_gym.testing.stack import ChildProcess, NgRunStack, server_instances
from tests.conftest import FIXTURE_STACK, free_port, wait_http_ok

SCRIPT = FIXTURE_STACK / "scripts" / "simple_agent.jsonl"
COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
AGENT, MODEL = "shopping_simple_agent", "policy_model"

TOOLS = [
    {"type": "function", "name": "append_item", "description": "add an item to the shopping list", "strict": False,
     "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}},
    {"type": "function", "name": "read_items", "description": "read the shopping list", "strict": False,
     "parameters": {"type": "object", "properties": {}}},
]


@pytest.fixture(scope="module")
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
    return NgRunStack(
        [
            "+config_paths=[configs/simple_agent.yaml]",
            f"+policy_base_url={backend_url}",
            "+policy_api_key=dummy-key",
            "+policy_model_name=fake-model",
            f"+head_server.port={head_port}",
            "+uvicorn_logging_show_200_ok=true",  # access lines: which paths the servers were called on
            *extra,
        ],
        cwd=FIXTURE_STACK,
    )


def shopping_row(initial: list[str]) -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Please fix my shopping list: add milk and eggs."}],
            "tools": TOOLS,
            "temperature": 0.0,
        },
        "initial_items": initial,
        "expected_items": [*initial, "milk", "eggs"],
    }


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_collected_rollouts_leave_one_capture_file_each(backend, tmp_path):
    capture_dir = tmp_path / "captures"
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(shopping_row([i])) + "\n" for i in ("bread", "tea")))
    head_port = free_port()
    stack = start_stack(backend, head_port, "+observability_enabled=true", f"+model_call_capture_dir={capture_dir}")
    try:
        stack.wait_for("All 3 / 3 servers ready!", timeout=180)
        collect = ChildProcess(
            [
                *COLLECT,
                f"+head_server.port={head_port}",
                f"+agent_name={AGENT}",
                f"+input_jsonl_fpath={tmp_path / 'tasks.jsonl'}",
                f"+output_jsonl_fpath={tmp_path / 'out' / 'rollouts.jsonl'}",
                "+num_repeats=2",
            ],
            cwd=tmp_path,
        )
        assert collect.wait(timeout=300) == 0, collect.output
    finally:
        assert stack.stop(timeout=60) == 0, stack.output

    rollouts = read_jsonl(tmp_path / "out" / "rollouts.jsonl")
    ids = sorted(f"{r['_ng_task_index']}-{r['_ng_rollout_index']}" for r in rollouts)
    assert ids == ["0-0", "0-1", "1-0", "1-1"]
    assert sorted(p.name for p in capture_dir.iterdir()) == [f"{i}.capture.jsonl" for i in ids]

    for rollout_id in ids:
        lines = read_jsonl(capture_dir / f"{rollout_id}.capture.jsonl")
        # The script's five model calls: four at 10 in / 5 out, the last at 100 / 9.
        assert [(e["dialect"], e["status_code"], e["error_category"], e["model_ref"]) for e in lines] == [
            ("responses", 200, None, MODEL)] * 5
        assert [(e["response"]["usage"]["input_tokens"], e["response"]["usage"]["output_tokens"]) for e in lines] == [
            (10, 5)] * 4 + [(100, 9)]
        assert all(e["rollout_id"] == rollout_id for e in lines)
        # Each call sent what came before: the input grows call after call.
        sizes = [len(e["request"]["input"]) for e in lines]
        assert sizes == sorted(sizes) and sizes[0] == 1

    for rollout in rollouts:
        # The collector merged each rollout's calls into its line; merging again gives the same summary.
        collected_summary = rollout.pop("ng_model_call_capture")
        reward, response = rollout["reward"], dict(rollout["response"])
        merged = merge_model_call_capture_into_record(rollout, str(capture_dir))
        assert merged["reward"] == reward == 1.0 and merged["response"] == response
        summary = merged["ng_model_call_capture"]
        assert summary == collected_summary
        usage = response["usage"]
        assert summary["metrics"]["num_calls"] == 5 and "gaps" not in summary
        assert (summary["metrics"]["tokens_in"], summary["metrics"]["tokens_out"], summary["metrics"]["tokens_total"]) == (
            usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (140, 29, 169)
        assert [c["call_index"] for c in summary["calls"]] == [0, 1, 2, 3, 4]
        assert [c["finish_reason"] for c in summary["calls"]] == ["tool_calls"] * 4 + ["stop"]
        assert all("request" not in c and "response" not in c for c in summary["calls"])

    # Every call the agent made for a rollout carried its id: to the model and to the resources server.
    access = stack.output
    assert access.count("POST /ng-rollout/0-1/v1/responses") == 5
    assert "POST /ng-rollout/0-1/seed_session" in access and "POST /ng-rollout/0-1/verify" in access
    assert "POST /ng-rollout/0-1/append_item" in access


def test_observability_off_writes_nothing_and_prefixes_nothing(backend, tmp_path):
    capture_dir = tmp_path / "captures"
    head_port = free_port()
    stack = start_stack(backend, head_port, f"++model_call_capture_dir={capture_dir}")
    try:
        stack.wait_for("All 3 / 3 servers ready!", timeout=180)
        urls = {i["process_name"]: i["url"] for i in server_instances(head_port)}
        row = {**shopping_row(["bread"]), "_ng_task_index": 3, "_ng_rollout_index": 0}
        answer = httpx.post(urls[AGENT] + "/run", json=row, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["reward"] == 1.0
        # A prefixed call to a model server is served even so (the prefix is stripped), and not captured.
        prefixed = httpx.post(urls[MODEL] + "/ng-rollout/3-0/v1/responses", json={"input": "hello from a harness"},
                              timeout=60)
        assert prefixed.status_code == 200, prefixed.text
        assert prefixed.json()["output"][-1]["content"][0]["text"] == "harness says: hello from a harness"
    finally:
        assert stack.stop(timeout=60) == 0, stack.output
    assert not capture_dir.exists()
    assert stack.output.count("POST /v1/responses") >= 5
    assert stack.output.count("/ng-rollout/") == 1  # only the call this test prefixed itself


def test_observability_without_a_capture_dir_stops_the_model_server_with_the_fix(backend):
    stack = start_stack(backend, free_port(), "+observability_enabled=true")
    code = stack.wait(timeout=120)
    assert code != 0
    assert "needs `model_call_capture_dir`" in stack.output and "(policy_model)" in stack.output, stack.output
