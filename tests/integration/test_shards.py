"""A collection split into shards (`ng_collect_rollouts +shard=i/2`) on the real stack of test_collect_rollouts.py
(ng_run, openai_model over the scripted fake backend, the gated_counter resources server, two simple_agents), then
`ng merge`: the merged rows equal those of an unsharded run of the same input (sorted by their keys, ids left out),
and so do the materialized inputs, the reward profile and the agent metrics."""

from __future__ import annotations

import json
import sys
from typing import Any

from nemo_gym.testing.stack import ChildProcess
from tests.conftest import free_port
from tests.integration.test_collect_rollouts import (  # noqa: F401
    backend,
    read_jsonl,
    row,
    start_stack,
    write_jsonl,
)

COLLECT = [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()"]
MERGE = [sys.executable, "-c", "from nemo_gym.cli import merge; merge()"]
T, R = "_ng_task_index", "_ng_rollout_index"
# Fields that differ between two runs of the same row: ids and timestamps the model server makes up.
RUN_SPECIFIC = {"id", "call_id", "created_at"}


def without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in RUN_SPECIFIC}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def by_key(rows: list[dict]) -> list[dict]:
    return [without_ids(r) for r in sorted(rows, key=lambda r: (r[T], r[R]))]


def test_two_shards_merged_equal_the_unsharded_run(backend, tmp_path):  # noqa: F811 (the fixture imported above)
    tasks = [row(f"please add {1 + i % 2}", i, i + 1 + i % 2) for i in range(6)]
    tasks[4] = row("please add 1", 9, 5)  # reward 0
    tasks.append(tasks[0])  # a duplicate line: task 0 again, rollouts 2 and 3
    tasks.append(row("please add 2", 3, 5, agent_ref={"type": "responses_api_agents", "name": "other_counter_agent"}))
    write_jsonl(tmp_path / "tasks.jsonl", tasks)
    head_port = free_port()
    stack = start_stack(backend, head_port)
    outputs = {name: tmp_path / name / "rollouts.jsonl" for name in ("full", "shard1", "shard2")}
    try:
        for name, out in outputs.items():
            shard = [] if name == "full" else [f"+shard={name[-1]}/2"]
            collect = ChildProcess(
                [
                    *COLLECT,
                    f"+head_server.port={head_port}",
                    "+agent_name=counter_simple_agent",
                    f"+input_jsonl_fpath={tmp_path / 'tasks.jsonl'}",
                    f"+output_jsonl_fpath={out}",
                    "+num_repeats=2",
                    "+num_samples_in_parallel=4",
                    "+progress_bar=false",
                    *shard,
                ],
                cwd=tmp_path,
            )
            assert collect.wait(timeout=300) == 0, collect.output
            if shard:
                # Tasks 0 (4 rollouts: its line is there twice), 2, 4, 6 / tasks 1, 3, 5; 2 rollouts each otherwise.
                assert f"Shard {name[-1]}/2: {10 if name == 'shard1' else 6} of the 16 rollouts" in collect.output
    finally:
        assert stack.stop(timeout=60) == 0, stack.output

    full, shard1, shard2 = (read_jsonl(p) for p in outputs.values())
    assert {r[T] % 2 for r in shard1} == {0} and {r[T] % 2 for r in shard2} == {1}
    assert (len(full), len(shard1), len(shard2)) == (16, 10, 6)

    merged = tmp_path / "merged" / "rollouts.jsonl"
    merge = ChildProcess([*MERGE, str(outputs["shard1"]), str(outputs["shard2"]), "-o", str(merged)], cwd=tmp_path)
    assert merge.wait(timeout=120) == 0, merge.output
    assert f"Merged 2 shard(s) into {merged}: 16 / 16 rollouts." in merge.output

    assert by_key(read_jsonl(merged)) == by_key(full)
    assert sorted((r[T], r[R], r["reward"]) for r in read_jsonl(merged)) == sorted((r[T], r[R], r["reward"]) for r in full)
    stem = lambda p, suffix: p.with_name(p.stem + suffix)
    src = outputs["full"]
    assert stem(merged, "_materialized_inputs.jsonl").read_bytes() == stem(src, "_materialized_inputs.jsonl").read_bytes()
    assert read_jsonl(stem(merged, "_reward_profiling.jsonl")) == read_jsonl(stem(src, "_reward_profiling.jsonl"))
    merged_metrics = json.loads(stem(merged, "_agent_metrics.json").read_text())
    assert merged_metrics == json.loads(stem(src, "_agent_metrics.json").read_text())
    assert {m["agent_ref"]["name"]: m["num_rollouts"] for m in merged_metrics} == {
        "counter_simple_agent": 14,
        "other_counter_agent": 2,
    }
    assert not stem(merged, "_failures.jsonl").exists()
