"""What the collector sends to `/aggregate_metrics` after a run (`nemo_gym.rollouts.aggregation`): each agent's
successful rollouts, stripped of the big payloads, in (task, rollout) order; and the bound on how many one
request may carry."""

from __future__ import annotations

import json

import pytest

from nemo_gym.rollouts.aggregation import TooManyToAggregate, read_results_by_agent, stripped_for_aggregation


def result(task: int, rollout: int, agent: str = "a", **extra) -> dict:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, "agent_ref": {"name": agent},
            "responses_create_params": {"input": "long prompt"}, "ng_model_call_capture": {"calls": []},
            "response": {"output": ["lots"], "usage": {"input_tokens": 3}}, **extra}  # fmt: skip


def test_stripped_keeps_scores_and_usage_only():
    stripped = stripped_for_aggregation(result(0, 0, extracted_answer="4"))
    assert stripped == {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "agent_ref": {"name": "a"},
                        "extracted_answer": "4", "response": {"usage": {"input_tokens": 3}}}  # fmt: skip
    assert "response" not in stripped_for_aggregation({**result(0, 0), "response": {"output": []}})


def test_grouped_by_agent_in_task_order_with_a_torn_line_skipped_and_a_bound(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    lines = [result(1, 0), result(0, 1), result(0, 0, agent="b"), result(0, 0), {"reward": 0.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn": ')
    groups = read_results_by_agent(path)
    assert sorted(groups) == ["a", "b"]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in groups["a"]] == [(0, 0), (0, 1), (1, 0)]
    assert sorted(read_results_by_agent(path, default_agent="a")["a"], key=len)[0] == {"reward": 0.0}
    with pytest.raises(TooManyToAggregate, match="more than 3 rollouts"):
        read_results_by_agent(path, max_rollouts=3)
    assert sum(map(len, read_results_by_agent(path, max_rollouts=4).values())) == 4
