"""Benchmark configs written as NeMo Gym v0.5 writes them (`tests/fixtures/v05_benchmarks/`, built on the bundled
ids `mcqa`, `math_with_judge`, `instruction_following` with `_inherit_from`) validate with `ng_validate` and run on
a real `ng_run` stack; v0.5's documented `++mcqa.resources_servers.mcqa.grading_mode=...` reaches the mcqa server.

The fake LLM answers each question with the option's *text* in a box (`\\boxed{7}`): the rows ask for strict
grading (a boxed letter), so a reward of 1 shows that the server-wide `lenient_boxed` set on the command line was
applied by the server that graded them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.testing.e2e import OPENAI_MODEL_CONFIG
from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances

FIXTURES = "tests/fixtures/v05_benchmarks"
BENCHMARKS = ("number_facts", "word_sums", "short_instructions")
LENIENT = "++mcqa.resources_servers.mcqa.grading_mode=lenient_boxed"
# The option text of each fixture question's right answer, boxed (strict grading reads no letter in it).
SCRIPT = [
    {"match": {"last_user_contains": "Which number is prime"}, "output": ["It is seven: \\boxed{7}"]},
    {"match": {"last_user_contains": "Which number is even"}, "output": ["It is eight: \\boxed{8}"]},
]


def _command(name: str, *args: str, cwd=PARENT_DIR) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", f"from nemo_gym.cli import {name}; {name}()", *args],
        cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=600,
    )


@pytest.mark.parametrize("name", BENCHMARKS)
def test_ng_validate_accepts_the_v05_benchmark_config(name):
    result = _command("validate", f"+config_paths=[{FIXTURES}/{name}/config.yaml]")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Config OK" in result.stdout
    assert f"{name}_" in result.stdout


def test_a_v05_benchmark_config_runs_with_v05s_mcqa_override(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    head_port = free_port()
    output = tmp_path / "rollouts.jsonl"
    config = f"{FIXTURES}/number_facts/config.yaml"
    with FakeLLMBackend("--script", str(script)) as backend:
        stack = NgRunStack([*fake_llm_overrides([config, OPENAI_MODEL_CONFIG], backend.base_url, head_port), LENIENT],
                           cwd=PARENT_DIR)
        try:
            stack.wait_for("All 3 / 3 servers ready!", timeout=180)
            collect = _command(
                "collect_rollouts",
                "+agent_name=number_facts_mcqa_simple_agent",
                f"+input_jsonl_fpath={PARENT_DIR / FIXTURES / 'number_facts/data/number_facts_benchmark.jsonl'}",
                f"+prompt_config={PARENT_DIR / FIXTURES / 'number_facts/prompts/default.yaml'}",
                "+num_repeats=2", f"+output_jsonl_fpath={output}", f"+head_server.port={head_port}",
                "+progress_bar=false", cwd=tmp_path,
            )
            assert collect.returncode == 0, f"{collect.stdout}\n{collect.stderr}\n{stack.tail(80)}"
        finally:
            assert stack.stop(timeout=60) == 0, stack.tail(80)
    rows = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    assert len(rows) == 4
    for row in rows:
        assert row["agent_ref"]["name"] == "number_facts_mcqa_simple_agent"
        assert row["grading_mode"] == "lenient_boxed", row
        assert (row["reward"], row["extracted_answer"]) == (1.0, row["expected_answer"]), row


def test_v05s_mcqa_override_reaches_the_bundled_mcqa_server(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    head_port = free_port()
    config = "resources_servers/mcqa/configs/mcqa.yaml"
    question = json.loads((PARENT_DIR / FIXTURES / "number_facts/data/number_facts_benchmark.jsonl").read_text()
                          .splitlines()[0])
    answer = {"id": "resp_1", "created_at": 0, "model": "m", "object": "response", "parallel_tool_calls": False,
              "tool_choice": "auto", "tools": [],
              "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": "\\boxed{7}", "annotations": []}]}]}
    body = {**question, "responses_create_params": {"input": [{"role": "user", "content": question["question"]}]},
            "response": answer}
    with FakeLLMBackend("--script", str(script)) as backend:
        stack = NgRunStack([*fake_llm_overrides([config, OPENAI_MODEL_CONFIG], backend.base_url, head_port), LENIENT],
                           cwd=PARENT_DIR)
        try:
            stack.wait_for("All 3 / 3 servers ready!", timeout=180)
            urls = {i["process_name"]: i["url"] for i in server_instances(head_port)}
            verified = httpx.post(f"{urls['mcqa']}/verify", json=body, timeout=60)
        finally:
            assert stack.stop(timeout=60) == 0, stack.tail(80)
    assert verified.status_code == 200, verified.text
    assert verified.json()["grading_mode"] == "lenient_boxed"
    assert (verified.json()["reward"], verified.json()["extracted_answer"]) == (1.0, "B")
