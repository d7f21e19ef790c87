"""A hung LLM judge, and an abandoned rollout, on a real `ng_run` stack (issue 37).

The stack: example_llm_judge + its simple_agent + openai_model `policy_model` (also the judge) in front of the
scripted fake LLM, whose `hang` replies never answer and record when their client goes away (`GET /fake/hangs`).

- A judge that never answers: the rollout ends within the bound as a judge failure (`judge_failed`: rerun, then the
  failures file), nothing is scored or lost, the resources server says so in one line naming the judge server and
  `judge_timeout_s`, and the hung backend call is closed (the judge's model server stopped waiting on it).
- A policy model that never answers, with the collector's `+request_timeout_s`: after the rollout is abandoned, the
  backend sees its client go away, so the cancellation reached the last hop (collector -> agent -> model server ->
  backend) instead of leaving the call in flight.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.testing.e2e import OPENAI_MODEL_CONFIG
from nemo_gym.testing.script import answer_rule
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
SERVER_KEY = "example_llm_judge.resources_servers.example_llm_judge"
JUDGE_TIMEOUT_S = 3

SCRIPT = [
    # Judge prompts first (they also hold the question the policy rules look for).
    {"name": "hung judge", "match": {"last_user_contains": "Candidate answer: Hung judge answer"}, "hang": True},
    answer_rule("Candidate answer: Paris", "Same city.\nVERDICT: CORRECT", name="judge: Paris"),
    {"name": "hung policy", "match": {"last_user_contains": "policy never answers"}, "hang": True},
    answer_rule("judge never answers", "Hung judge answer.", name="policy: judge case"),
    answer_rule("capital of France", "Paris.", name="policy: France"),
]


def row(question: str, expected: str) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": question}]},
            "question": question, "expected_answer": expected}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def hangs(backend: FakeLLMBackend) -> list[dict]:
    return httpx.get(f"{backend.url}/fake/hangs", timeout=5).json()


def wait_for_hangs(backend: FakeLLMBackend, rule: str, count: int, state: str, timeout: float = 30.0) -> list[dict]:
    """The hung calls of `rule` once `count` of them are in `state` (bounded wait; AssertionError after)."""
    deadline = time.monotonic() + timeout
    while True:
        records = [r for r in hangs(backend) if r["rule"] == rule]
        if sum(r["state"] == state for r in records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("judge_hangs")
    script = tmp / "script.json"
    script.write_text(json.dumps(SCRIPT))
    head_port = free_port()
    configs = [f"resources_servers/example_llm_judge/configs/example_llm_judge.yaml", OPENAI_MODEL_CONFIG]
    with FakeLLMBackend("--script", str(script)) as backend:
        overrides = [*fake_llm_overrides(configs, backend.base_url, head_port),
                     f"++{SERVER_KEY}.judge_timeout_s={JUDGE_TIMEOUT_S}"]
        ng_run = NgRunStack(overrides, cwd=PARENT_DIR)
        try:
            ng_run.wait_for("servers ready!", timeout=180)
            yield tmp, head_port, backend, ng_run
        finally:
            assert ng_run.stop(timeout=60) == 0, ng_run.tail()


def collect(tmp: Path, head_port: int, name: str, rows: list[dict], *overrides: str,
            max_rollout_attempts: int = 2) -> tuple[ChildProcess, Path]:
    inputs = tmp / f"{name}_in.jsonl"
    inputs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    output = tmp / f"{name}.jsonl"
    run = ChildProcess(
        [*COLLECT, "+agent_name=example_llm_judge_simple_agent", f"+input_jsonl_fpath={inputs}",
         f"+output_jsonl_fpath={output}", f"+head_server.port={head_port}", "+progress_bar=false", *overrides],
        cwd=tmp, env={"NEMO_GYM_MAX_ROLLOUT_ATTEMPTS": str(max_rollout_attempts)}, name="ng_collect_rollouts",
    )
    run.wait(timeout=180)  # the hang guard: a judge or rollout that hangs must not stall the collection
    return run, output


def test_a_hung_judge_is_a_judge_failure_within_judge_timeout_s(stack):
    tmp, head_port, backend, ng_run = stack
    rows = [row("What is the capital of France?", "Paris"), row("The judge never answers this one.", "x")]
    run, output = collect(tmp, head_port, "hung_judge", rows)

    assert run.proc.returncode == 1, run.output  # a rollout failed: exit 1 at the end, the rest kept
    scored = read_jsonl(output)
    assert [r["reward"] for r in scored] == [1.0] and scored[0]["judge_verdict"] == "correct"
    failures = read_jsonl(output.with_name("hung_judge_failures.jsonl"))
    assert len(failures) == 1, failures  # the hung row, after its 2 attempts: recorded, not scored
    assert failures[0]["_ng_failure_class"] == "judge_failed" and failures[0]["_ng_attempt_index"] == 1
    error = failures[0]["result"]["_ng_failure_judge_error"]
    assert f"judge server `policy_model` gave no answer within {JUDGE_TIMEOUT_S} s (judge_timeout_s" in error
    assert "judge_failed" in run.output

    # One line per failed attempt in the resources server's output, naming the judge server and the key.
    lines = [line for line in ng_run.lines if "judge failed" in line and "judge_timeout_s" in line]
    assert len(lines) == 2 and all("policy_model" in line for line in lines), ng_run.tail(80)

    # Each hung judge call was closed upstream: the judge's model server stopped waiting on the backend.
    records = wait_for_hangs(backend, "hung judge", 2, "client_gone")
    assert [r["state"] for r in records] == ["client_gone", "client_gone"], records


def test_an_abandoned_rollout_is_cancelled_on_every_hop(stack):
    tmp, head_port, backend, ng_run = stack
    run, output = collect(tmp, head_port, "hung_policy", [row("The policy never answers this one.", "x")],
                          "+request_timeout_s=2", "+max_attempts=1", max_rollout_attempts=1)

    assert run.proc.returncode == 1, run.output
    assert read_jsonl(output) == []
    failures = read_jsonl(output.with_name("hung_policy_failures.jsonl"))
    assert len(failures) == 1 and "did not answer within 2" in json.dumps(failures[0]), failures

    # The collector gave up on /run; the agent's model call, and the model server's backend call, ended with it.
    records = wait_for_hangs(backend, "hung policy", 1, "client_gone")
    assert [r["state"] for r in records] == ["client_gone"], (records, ng_run.tail(60))
    assert "Exception in ASGI application" not in ng_run.output  # cancelled quietly, not as a crash
