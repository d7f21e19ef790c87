"""Aggregate metrics that scale (issue 37), on real processes: `ng_run` (openai_model in front of the scripted fake
LLM, the v0.5-style judged verifier of tests/fixtures/stack, a simple_agent that passes `/aggregate_metrics` on to
it), `ng_collect_rollouts` and `ng_aggregate_rollouts` as child processes.

- 250,000 synthetic rollouts (written as a file, not collected) through `ng_aggregate_rollouts`: one request of
  them would be far over the servers' 32 MiB body limit; they go in parts, and pass@k / majority@k equal the
  in-process computation over the same rows.
- A real collection whose judge answers with 40 MB of text: the rollouts' aggregation step gives pass@k /
  majority@k (one request of them was a 413 before, and the metrics were silently missing).
- An agent that gives no metrics is one line naming it, and exit 1.
"""

from __future__ import annotations

import importlib.util
import json
import resource
import sys
import time
from pathlib import Path

import orjson
import pytest

from nemo_gym.rollouts.metrics import compute_pass_majority_metrics
from nemo_gym.testing.script import answer_rule
from nemo_gym.testing.stack import ChildProcess, FakeLLMBackend, NgRunStack, fake_llm_overrides, server_instances
from tests.conftest import FIXTURE_STACK, free_port

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
AGGREGATE = [sys.executable, "-c", "import sys; from nemo_gym.cli.commands.aggregate_rollouts import COMMAND; "
             "sys.exit(COMMAND.main(sys.argv[1:]))"]
T, R = "_ng_task_index", "_ng_rollout_index"
HUGE_JUDGE_TEXT = "YES, " + "because " * (40 * 1024 * 1024 // 8)  # 40 MB

# question -> (the policy's answer, the judge's reply)
QUESTIONS = {
    "Q: Italy": ("Rome", HUGE_JUDGE_TEXT),
    "Q: Germany": ("Bonn", "NO"),
    "Q: France": ("Paris", "YES"),
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    with open(path, "rb") as f:
        return [orjson.loads(line) for line in f if line.strip()]


def judged_server_class():
    """The fixture's resources server class, so the in-process computation uses its very hooks."""
    spec = importlib.util.spec_from_file_location("v05_judged_app", FIXTURE_STACK / "resources_servers/v05_judged/app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.JudgedServer


def in_process_metrics(rows: list[dict]) -> tuple[dict, dict]:
    """(pass@k / majority@k metrics, key metrics) of the fixture's hooks over `rows`, grouped by task in rollout order."""
    tasks: dict[int, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (r[T], r[R])):
        tasks.setdefault(row[T], []).append(row)
    metrics = compute_pass_majority_metrics(list(tasks.values()), answer_key="extracted_answer")[0]
    server = judged_server_class().model_construct()
    return metrics, server.get_key_metrics({**metrics, "mean/reward": 0.0})


def assert_same_pass_majority(agent_metrics: dict, expected: dict) -> None:
    names = [k for k in expected if k.startswith(("pass@", "majority@"))]
    assert names and any(k.startswith("majority@") for k in names)
    for name in names:
        assert agent_metrics[name] == pytest.approx(expected[name], abs=1e-9), name


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aggscale")
    rules = []
    for question, (answer, judge_reply) in QUESTIONS.items():
        rules.append(answer_rule(f"JUDGE: {answer} ||", judge_reply, name=f"{question} judge"))
        rules.append(answer_rule(question, answer, name=question))
    script = write_jsonl(tmp / "script.jsonl", rules)
    write_jsonl(tmp / "tasks.jsonl", [
        {"responses_create_params": {"input": [{"role": "user", "content": q}]}, "expected_answer": a}
        for q, (a, _) in QUESTIONS.items()
    ])
    head_port = free_port()
    with FakeLLMBackend("--script", str(script)) as backend:
        overrides = fake_llm_overrides(["configs/v05_judged.yaml"], backend.base_url, head_port)
        ng_run = NgRunStack(overrides, cwd=FIXTURE_STACK)
        try:
            ng_run.wait_for("All 3 / 3 servers ready!", timeout=180)
            yield tmp, head_port
        finally:
            assert ng_run.stop(timeout=60) == 0, ng_run.tail()


def synthetic_rollouts(n_tasks: int, repeats: int) -> list[dict]:
    """Rows shaped like the judged stack's output: the prompt, the response with usage, the verifier's fields."""
    rows = []
    for task in range(n_tasks):
        expected = str(task % 97)
        for rollout in range(repeats):
            answer = None if (task + rollout) % 11 == 0 else str((task * 7 + rollout * (task % 3)) % 97)
            rows.append({
                "responses_create_params": {"input": [{"role": "user", "content": f"What is task {task}? Think."}]},
                "response": {"id": f"resp_{task}_{rollout}", "object": "response", "output": [
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"{answer}"}]}
                ], "usage": {"input_tokens": 20 + task % 5, "output_tokens": 3 + rollout, "total_tokens": 23}},
                "expected_answer": expected, "reward": float(answer == expected), "extracted_answer": answer,
                "judge_text": "YES" if answer == expected else "NO", T: task, R: rollout,
                "agent_ref": {"name": "judged_agent"},
            })  # fmt: skip
    return rows


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def test_250000_rollouts_aggregate_in_parts_with_the_in_process_metrics(stack, tmp_path):
    tmp, head_port = stack
    rows = synthetic_rollouts(62_500, 4)
    assert len(rows) == 250_000
    write_jsonl(tmp_path / "shards" / "s1.jsonl", rows[: len(rows) // 2])
    write_jsonl(tmp_path / "shards" / "s2.jsonl", rows[len(rows) // 2 :])
    # One request of the stripped rows would be this big: several times the servers' 32 MiB limit.
    assert sum(len(orjson.dumps({k: v for k, v in r.items() if k not in ("response", "responses_create_params")}))
               for r in rows) > 32 * 1024 * 1024  # fmt: skip

    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    aggregate = ChildProcess(
        [*AGGREGATE, f"+head_server.port={head_port}", f"+input_glob={tmp_path / 'shards'}/*.jsonl",
         f"+output_jsonl_fpath={tmp_path / 'all.jsonl'}", "+merge_shards=false"],
        cwd=tmp_path,
    )
    assert aggregate.wait(timeout=900) == 0, aggregate.tail()
    elapsed = time.monotonic() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    servers = {s["name"]: vm_hwm_mb(s["pid"]) for s in server_instances(head_port) if s.get("pid")}
    print(f"\n250,000 rollouts aggregated in {elapsed:.1f} s; ng_aggregate_rollouts peak RSS "
          f"{max(peak, before) / 1024:.0f} MB; servers' peak RSS (MB): {servers}")

    entries = json.loads((tmp_path / "all_aggregate_metrics.json").read_text())
    assert [e["agent_ref"] for e in entries] == [{"name": "judged_agent"}]
    expected, expected_key = in_process_metrics(rows)
    assert_same_pass_majority(entries[0]["agent_metrics"], expected)
    assert {k: v for k, v in entries[0]["key_metrics"].items() if k != "mean/reward"} == pytest.approx(
        {k: v for k, v in expected_key.items() if k != "mean/reward"})
    assert len(entries[0]["group_level_metrics"]) == 62_500
    assert entries[0]["agent_metrics"]["mean/reward"] == pytest.approx(
        sum(r["reward"] for r in rows) / len(rows))


def test_a_40_mb_judge_text_still_gives_pass_and_majority_at_k(stack):
    tmp, head_port = stack
    collect = ChildProcess(
        [*COLLECT, f"+head_server.port={head_port}", "+agent_name=judged_agent",
         f"+input_jsonl_fpath={tmp / 'tasks.jsonl'}", f"+output_jsonl_fpath={tmp / 'huge.jsonl'}",
         "+num_repeats=2", "+num_samples_in_parallel=2", "+progress_bar=false"],
        cwd=tmp,
    )
    assert collect.wait(timeout=600) == 0, collect.tail()
    rows = read_jsonl(tmp / "huge.jsonl")
    assert len(rows) == 6 and max(len(r["judge_text"]) for r in rows) >= 40 * 1024 * 1024
    entries = json.loads((tmp / "huge_aggregate_metrics.json").read_text())
    expected, _ = in_process_metrics(rows)
    assert_same_pass_majority(entries[0]["agent_metrics"], expected)
    assert entries[0]["key_metrics"]["pass@2/accuracy"] == pytest.approx(200 / 3)
    assert "majority@2/accuracy" in entries[0]["key_metrics"]


def test_an_agent_that_gives_no_metrics_is_one_line_and_exit_1(stack, tmp_path):
    tmp, head_port = stack
    rows = [{**r, "agent_ref": {"name": "ghost_agent"}} for r in synthetic_rollouts(2, 2)]
    write_jsonl(tmp_path / "ghost.jsonl", rows + synthetic_rollouts(2, 2))
    aggregate = ChildProcess(
        [*AGGREGATE, f"+head_server.port={head_port}", f"+input_glob={tmp_path}/ghost.jsonl", "+merge_shards=false",
         f"+output_jsonl_fpath={tmp_path / 'out.jsonl'}"],
        cwd=tmp_path,
    )
    assert aggregate.wait(timeout=300) == 1, aggregate.output
    lines = [line for line in aggregate.output.splitlines() if "no aggregate metrics" in line]
    assert len(lines) == 1 and "`ghost_agent` gave no metrics for its 4 rollout(s)" in lines[0], aggregate.output
    entries = json.loads((tmp_path / "out_aggregate_metrics.json").read_text())
    assert [e["agent_ref"]["name"] for e in entries] == ["judged_agent"]
