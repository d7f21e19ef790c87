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


# ------------------------------------------------------------------------------------------------------------
# NeMo Gym v0.5's own benchmark configs (same keys and values, tests/fixtures/v05_benchmarks/<name>/), run from a
# working directory laid out like a v0.5 checkout (`benchmarks/` there), as `ng_run` + `ng_collect_rollouts`.

V05_FIXTURES = PARENT_DIR / FIXTURES


def _v05_tree(tmp_path):
    tree = tmp_path / "v05"
    tree.mkdir()
    (tree / "benchmarks").symlink_to(V05_FIXTURES, target_is_directory=True)
    return tree


def _run_v05_benchmark(tmp_path, config: str, agent: str, data: str, prompt: str, script: list, expected_servers: int,
                       repeats: int = 1) -> list[dict]:
    tree = _v05_tree(tmp_path)
    script_path = tmp_path / "script.json"
    script_path.write_text(json.dumps(script))
    head_port = free_port()
    output = tmp_path / "rollouts.jsonl"
    with FakeLLMBackend("--script", str(script_path)) as backend:
        stack = NgRunStack(fake_llm_overrides([config, OPENAI_MODEL_CONFIG], backend.base_url, head_port), cwd=tree)
        try:
            stack.wait_for(f"All {expected_servers} / {expected_servers} servers ready!", timeout=180)
            collect = _command(
                "collect_rollouts", f"+agent_name={agent}", f"+input_jsonl_fpath={data}", f"+prompt_config={prompt}",
                f"+num_repeats={repeats}", f"+output_jsonl_fpath={output}", f"+head_server.port={head_port}",
                "+progress_bar=false", cwd=tree,
            )
            assert collect.returncode == 0, f"{collect.stdout}\n{collect.stderr}\n{stack.tail(80)}"
        finally:
            assert stack.stop(timeout=60) == 0, stack.tail(80)
    return [json.loads(line) for line in output.read_text().splitlines() if line.strip()]


def test_v05s_gpqa_config_runs_with_the_markdown_answer_mode(tmp_path):
    # Markdown around the `Answer:` line, as the mode is made for; strict boxed grading would read nothing here.
    script = [
        {"match": {"last_user_contains": "most of Earth's atmosphere"},
         "output": ["Nitrogen is about 78% of air; oxygen 21%.\n\n**Answer:** B"]},
        {"match": {"last_user_contains": "negative charge"}, "output": ["Protons are positive.\n\n**Answer: C**"]},
    ]
    rows = _run_v05_benchmark(
        tmp_path, "benchmarks/gpqa/config.yaml", "gpqa_mcqa_simple_agent",
        "benchmarks/gpqa/data/gpqa_diamond_benchmark.jsonl", "benchmarks/gpqa/prompts/default.yaml", script,
        expected_servers=3, repeats=2,
    )
    assert len(rows) == 4
    for row in rows:
        assert row["agent_ref"]["name"] == "gpqa_mcqa_simple_agent"
        assert row["grading_mode"] == "lenient_answer_colon_md", row
        assert (row["reward"], row["extracted_answer"]) == (1.0, row["expected_answer"]), row
    # the prompt template of the benchmark was applied (its options block reached the model)
    assert any("C: Electron" in json.dumps(row["responses_create_params"]["input"]) for row in rows)


def test_v05s_hle_config_runs_with_its_judge_labels_and_template_file(tmp_path):
    # The policy model is also the judge (hle's judge_model_server). Judge calls are told apart by the benchmark's
    # own template file (`Correct answer: ...` is its wording): right for the first row, wrong for the second.
    script = [
        {"match": {"last_user_contains": "Correct answer: Au"}, "output": ["Same element.\nJudgement: yes"]},
        {"match": {"last_user_contains": "Correct answer: 6"}, "output": ["Five is not six.\nJudgement: no"]},
        {"match": {"last_user_contains": "symbol of gold"}, "output": ["Explanation: from aurum.\nAnswer: Au"]},
        {"match": {"last_user_contains": "hexagon"}, "output": ["Explanation: I counted.\nAnswer: 5"]},
    ]
    rows = _run_v05_benchmark(
        tmp_path, "benchmarks/hle/config.yaml", "hle_equivalence_llm_judge_simple_agent",
        "benchmarks/hle/data/hle_benchmark.jsonl", "benchmarks/hle/prompts/default.yaml", script, expected_servers=3,
    )
    by_uuid = {row["uuid"]: row for row in rows}
    assert set(by_uuid) == {"hle-test-1", "hle-test-2"}
    assert by_uuid["hle-test-1"]["reward"] == 1.0, by_uuid["hle-test-1"]
    assert by_uuid["hle-test-2"]["reward"] == 0.0, by_uuid["hle-test-2"]
    # the system line of the benchmark's prompt reached the model
    assert "Explanation: ..." in json.dumps(by_uuid["hle-test-1"]["responses_create_params"]["input"])
