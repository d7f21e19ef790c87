"""`ng export` on rollouts collected from a real stack: `ng_run` (openai_model in front of the scripted fake LLM, the
gated_counter resources server, simple_agent), `ng_collect_rollouts` with repeats, then `ng_export` as a child
process for each kind. The fake LLM answers the first repeat of the counting task with reasoning, a correct tool
call and token data (as vllm_model attaches it in training mode), the others with a wrong tool call, so the rewards
differ between repeats and the exports have something to choose from. Every exported row is checked against the
rollout it came from. And `ng_export` as a child process without pyarrow, asked for Parquet, says how to install it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from nemo_gym.testing.script import rule, step, steps_rule, tool_call
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides
from tests.conftest import FIXTURE_STACK, free_port
from tests.unit.test_export import rollout, write_jsonl

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
EXPORT = [sys.executable, "-c", "from nemo_gym.cli import export; export()"]
T, R = "_ng_task_index", "_ng_rollout_index"

TOOLS = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "add to the counter",
        "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]},
        "strict": False,
    }
]


def with_tokens(item: dict, prompt: list[int], generation: list[int], log_probs: list[float]) -> dict:
    return {**item, "prompt_token_ids": prompt, "generation_token_ids": generation, "generation_log_probs": log_probs}


SCRIPT = [
    # Used by the first rollout only (two model calls, then `times` is spent; rollouts run one at a time).
    {
        **steps_rule(
            "add 2",
            step({"type": "reasoning", "text": "Two more makes three."},
                 with_tokens(tool_call("increment_counter", {"count": 2}), [1, 2, 3], [4, 5], [-0.1, -0.2])),
            step(with_tokens({"type": "message", "text": "done: {{last_tool_output}}"}, [1, 2, 3, 4, 5, 6, 7], [8, 9],
                             [-0.3, -0.4])),
            name="right",
        ),
        "times": 2,
    },
    steps_rule(
        "add 2", step(tool_call("increment_counter", {"count": 1})), step("done: {{last_tool_output}}"), name="wrong"
    ),
    rule("nothing to do", name="fallback"),
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collect_rollouts(tmp_path: Path) -> Path:
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps(r) + "\n" for r in SCRIPT))
    tasks = [
        {
            "responses_create_params": {
                "input": [
                    {"role": "system", "content": "You keep a counter."},
                    {"role": "user", "content": "please add 2"},
                ],
                "tools": TOOLS,
            },
            "initial_count": 1,
            "expected_count": 3,
        },
        {"responses_create_params": {"input": "hello"}, "initial_count": 0, "expected_count": 0},
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    output = tmp_path / "out" / "rollouts.jsonl"
    head_port = free_port()
    with FakeLLMBackend("--script", str(script)) as backend:
        stack = NgRunStack(fake_llm_overrides(["configs/collect.yaml"], backend.base_url, head_port), cwd=FIXTURE_STACK)
        try:
            stack.wait_for("All 4 / 4 servers ready!", timeout=180)
            collect = ChildProcess(
                [*COLLECT, f"+head_server.port={head_port}", "+agent_name=counter_simple_agent",
                 f"+input_jsonl_fpath={tmp_path / 'tasks.jsonl'}", f"+output_jsonl_fpath={output}",
                 "+num_repeats=3", "+num_samples_in_parallel=1"],
                cwd=tmp_path,
            )
            assert collect.wait(timeout=300) == 0, collect.output
        finally:
            assert stack.stop(timeout=60) == 0, stack.output
    return output


def run_export(tmp_path: Path, *args: str) -> ChildProcess:
    proc = ChildProcess([*EXPORT, *args], cwd=tmp_path, name="ng_export")
    proc.wait(timeout=120)
    return proc


def test_exports_of_collected_rollouts_match_the_rollouts(tmp_path):
    rollouts_path = collect_rollouts(tmp_path)
    rollouts = {(r[T], r[R]): r for r in read_jsonl(rollouts_path)}
    assert sorted((k, r["reward"]) for k, r in rollouts.items()) == [
        ((0, 0), 1.0), ((0, 1), 0.0), ((0, 2), 0.0), ((1, 0), 1.0), ((1, 1), 1.0), ((1, 2), 1.0)
    ]

    # sft, Parquet: the rollouts with reward 1, their conversations rebuilt from the source items.
    sft = run_export(tmp_path, "sft", str(rollouts_path), "-o", "sft.parquet", "--min-reward", "1")
    assert sft.proc.returncode == 0, sft.output
    assert "kept 4 rows" in sft.output and "below_min_reward" in sft.output
    rows = pq.read_table(tmp_path / "sft.parquet").to_pylist()
    assert sorted((r[T], r[R]) for r in rows) == [(0, 0), (1, 0), (1, 1), (1, 2)]
    for row in rows:
        source = rollouts[(row[T], row[R])]
        assert row["reward"] == source["reward"] and row["agent_name"] == "counter_simple_agent"
        output = source["response"]["output"]
        final_text = output[-1]["content"][0]["text"]
        assert row["messages"][-1]["role"] == "assistant" and row["messages"][-1]["content"] == final_text
    tool_row = next(r for r in rows if r[T] == 0)
    source_items = {item["type"]: item for item in rollouts[(0, 0)]["response"]["output"]}
    system, user, call, tool, answer = tool_row["messages"]
    assert (system["role"], system["content"]) == ("system", "You keep a counter.")
    assert (user["role"], user["content"]) == ("user", "please add 2")
    assert call["content"] == "<think>Two more makes three.</think>"
    (tool_call_out,) = call["tool_calls"]
    assert tool_call_out == {
        "id": source_items["function_call"]["call_id"],
        "type": "function",
        "function": {"name": "increment_counter", "arguments": source_items["function_call"]["arguments"]},
    }
    assert tool["role"] == "tool" and tool["tool_call_id"] == tool_call_out["id"]
    assert tool["content"] == source_items["function_call_output"]["output"] == '{"count":3}'
    assert json.loads(tool_row["tools"])[0]["function"]["name"] == "increment_counter"
    hello = next(r for r in rows if r[T] == 1)
    assert [m["role"] for m in hello["messages"]] == ["user", "assistant"] and hello["tools"] is None

    # dpo, Parquet: one pair from the counting task (1.0 against 0.0); the hello task's rewards are all equal.
    dpo = run_export(tmp_path, "dpo", str(rollouts_path), "-o", "dpo.parquet", "--min-margin", "0.5")
    assert dpo.proc.returncode == 0, dpo.output
    assert "kept 1 pair (from 2 rollouts)" in dpo.output and "margin_below_min" in dpo.output
    (pair,) = pq.read_table(tmp_path / "dpo.parquet").to_pylist()
    chosen_src = rollouts[(0, pair["chosen_rollout_index"])]
    rejected_src = rollouts[(0, pair["rejected_rollout_index"])]
    rewards = (pair["chosen_reward"], pair["rejected_reward"])
    assert rewards == (chosen_src["reward"], rejected_src["reward"]) == (1.0, 0.0)
    assert pair["chosen_reward"] - pair["rejected_reward"] >= 0.5
    prompt = [(m["role"], m["content"]) for m in pair["prompt"]]
    assert prompt == [("system", "You keep a counter."), ("user", "please add 2")]
    assert pair["chosen"][:-1] == tool_row["messages"][2:-1]
    assert pair["chosen"][-1]["content"] == 'done: {"count":3}'
    assert pair["rejected"][-1]["content"] == 'done: {"count":2}'
    assert json.loads(pair["rejected"][0]["tool_calls"][0]["function"]["arguments"]) == {"count": 1}

    # tokens, JSONL: only the first rollout carried token data.
    tokens = run_export(tmp_path, "tokens", str(rollouts_path), "-o", "tokens.jsonl")
    assert tokens.proc.returncode == 0, tokens.output
    assert "kept 1 row " in tokens.output and "5  no_token_data" in tokens.output
    (row,) = read_jsonl(tmp_path / "tokens.jsonl")
    assert (row[T], row[R], row["reward"], row["num_model_calls"]) == (0, 0, 1.0, 2)
    assert row["prompt_token_ids"] == [1, 2, 3]
    assert row["generation_token_ids"] == [4, 5, 6, 7, 8, 9]
    assert row["generation_log_probs"] == [-0.1, -0.2, 0.0, 0.0, -0.3, -0.4]
    assert row["loss_mask"] == [1, 1, 0, 0, 1, 1]


def test_parquet_without_pyarrow_says_how_to_install_it(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [rollout(0, 0, 1.0)])
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"  # as if pyarrow were not installed
        "from nemo_gym.cli import export; export()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "sft", str(a), "-o", str(tmp_path / "o.parquet")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "nemo-gym[parquet]" in proc.stderr and "-o OUT.jsonl" in proc.stderr
    assert not (tmp_path / "o.parquet").exists()
    proc = subprocess.run(
        [sys.executable, "-c", code, "sft", str(a), "-o", str(tmp_path / "o.jsonl")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0 and len(read_jsonl(tmp_path / "o.jsonl")) == 1
