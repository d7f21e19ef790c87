"""NeMo Gym v0.5 metric helpers (`nemo_gym.reward_profile`): pass@k, pass@1[avg-of-k], majority@k, spread across
runs, subsets, highest-k selection, and the `/aggregate_metrics` body (`compute_aggregate_metrics`)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from nemo_gym.config.types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.reward_profile import (
    AggregateMetricsMixin,
    RewardProfiler,
    add_avg_sample_std_dev,
    compute_aggregate_metrics,
    compute_pass_majority_metrics,
    compute_subset_metrics,
    highest_k_metrics,
    pass_at_k,
)

TOL = 0.01


def result(reward, answer="unset", **fields) -> dict:
    row = {"reward": reward, **fields}
    if answer != "unset":
        row["extracted_answer"] = answer
    return row


# The spec's test vector: task0 rewards [1,0,1] answers ["4","5","4"]; task1 [0,0,1] answers [None,"7","8"].
SPEC_TASKS = [
    [result(1, "4"), result(0, "5"), result(1, "4")],
    [result(0, None), result(0, "7"), result(1, "8")],
]


def assert_close(actual: dict, expected: dict) -> None:
    for key, value in expected.items():
        assert key in actual, f"{key} missing; keys: {sorted(actual)}"
        assert actual[key] == pytest.approx(value, abs=TOL), key


# ------------------------------------------------------------------------------------------------------------
# compute_pass_majority_metrics


def test_spec_test_vector():
    metrics, all_score_dicts, score_names, max_k = compute_pass_majority_metrics(SPEC_TASKS, answer_key="extracted_answer")
    assert_close(
        metrics,
        {
            "pass@1/accuracy": 50.0,
            "pass@2/accuracy": 83.33,
            "pass@3/accuracy": 100.0,
            "pass@1[avg-of-2]/accuracy": 25.0,
            "majority@2/accuracy": 25.0,
            "majority@3/accuracy": 75.0,
            "pass@1/no_answer": 16.67,
            "pass@1[avg-of-3]/accuracy/std_dev_across_runs": 50.0,
            "pass@1[avg-of-3]/accuracy/std_err_across_runs": 28.87,
        },
    )
    assert metrics["per_sample_aggregate"]["accuracy"] == pytest.approx([50.0, 0.0, 100.0], abs=TOL)
    assert score_names == ["accuracy", "no_answer"]
    assert max_k == 3
    assert all_score_dicts[1][0] == {"accuracy": 0.0, "no_answer": 1.0}
    assert [len(task) for task in all_score_dicts] == [3, 3]


def test_more_values_of_the_vector_worked_by_hand():
    metrics = compute_pass_majority_metrics(SPEC_TASKS, answer_key="extracted_answer")[0]
    assert_close(
        metrics,
        {
            # first rollout: task0 "4" right, task1 no answer -> 0
            "majority@1/accuracy": 50.0,
            "pass@1[avg-of-1]/accuracy": 50.0,
            "pass@1[avg-of-3]/accuracy": 50.0,
            # no_answer is 0/1: task0 never, task1 1 of 3 -> pass@2 = (0 + 2/3) / 2
            "pass@2/no_answer": 33.33,
            "majority@3/no_answer": 0.0,
            # run means [50, 0] -> stdev 35.36, / sqrt 2 = 25
            "pass@1[avg-of-2]/accuracy/std_dev_across_runs": 35.36,
            "pass@1[avg-of-2]/accuracy/std_err_across_runs": 25.0,
        },
    )
    assert metrics["per_sample_aggregate"]["no_answer"] == pytest.approx([50.0, 0.0, 0.0], abs=TOL)


def test_key_order_is_by_k_then_name_then_metric():
    metrics = compute_pass_majority_metrics(SPEC_TASKS, answer_key="extracted_answer")[0]
    assert list(metrics)[:6] == [
        "pass@1/accuracy",
        "pass@1[avg-of-1]/accuracy",
        "majority@1/accuracy",
        "pass@1/no_answer",
        "pass@1[avg-of-1]/no_answer",
        "majority@1/no_answer",
    ]
    assert list(metrics).index("per_sample_aggregate") < list(metrics).index(
        "pass@1[avg-of-2]/accuracy/std_dev_across_runs"
    )


def test_pass_at_k_is_the_reward_profile_estimator():
    tasks = [[result(1), result(0), result(0), result(1), result(0)]]
    metrics = compute_pass_majority_metrics(tasks)[0]
    for k in range(1, 6):
        assert metrics[f"pass@{k}/accuracy"] == pytest.approx(100 * pass_at_k(5, 2, k))


def test_empty_tasks():
    assert compute_pass_majority_metrics([]) == ({}, [], [], 0)
    metrics, all_score_dicts, score_names, max_k = compute_pass_majority_metrics([[], []])
    assert (metrics, all_score_dicts, score_names, max_k) == ({}, [[], []], [], 0)


def test_without_answer_key_there_is_no_majority_and_no_no_answer():
    metrics, _, score_names, _ = compute_pass_majority_metrics(SPEC_TASKS)
    assert score_names == ["accuracy"]
    assert not [key for key in metrics if key.startswith("majority@") or "no_answer" in key]
    assert metrics["pass@2/accuracy"] == pytest.approx(83.33, abs=TOL)


def test_bool_scores_count_as_0_and_1():
    as_bools = [[{"ok": v == 1, "reward": 0} for v in rewards] for rewards in ([1, 0, 1], [0, 0, 1])]
    metrics, all_score_dicts, score_names, _ = compute_pass_majority_metrics(as_bools, score_fn=lambda r: {"ok": r["ok"]})
    assert score_names == ["ok"]
    assert all_score_dicts[0] == [{"ok": 1.0}, {"ok": 0.0}, {"ok": 1.0}]
    assert metrics["pass@2/ok"] == pytest.approx(83.33, abs=TOL)
    assert metrics["pass@1/ok"] == pytest.approx(50.0, abs=TOL)


def test_non_binary_scores_take_the_best_of_the_first_k():
    tasks = [[result(0.5), result(0.2), result(0.9)], [result(0.1), result(0.3), result(0.0)]]
    metrics = compute_pass_majority_metrics(tasks)[0]
    assert metrics["pass@1/accuracy"] == pytest.approx((50 + 10) / 2)
    assert metrics["pass@2/accuracy"] == pytest.approx((50 + 30) / 2)
    assert metrics["pass@3/accuracy"] == pytest.approx((90 + 30) / 2)


def test_all_answers_none():
    tasks = [[result(1, None), result(0, None)], [result(1, None)]]
    metrics = compute_pass_majority_metrics(tasks, answer_key="extracted_answer")[0]
    assert metrics["majority@1/accuracy"] == 0.0
    assert metrics["majority@2/accuracy"] == 0.0
    assert metrics["pass@1/no_answer"] == 100.0
    assert metrics["pass@1/accuracy"] == pytest.approx((50 + 100) / 2)


def test_majority_counts_answer_score_pairs_and_averages_ties():
    # the same answer scored differently makes two pairs; with a tie at the top, their scores are averaged
    tasks = [[result(1, "a"), result(0, "a"), result(1, "b"), result(1, "b"), result(0, "c")]]
    metrics = compute_pass_majority_metrics(tasks, answer_key="extracted_answer")[0]
    assert metrics["majority@2/accuracy"] == 50.0  # ("a",1) vs ("a",0): tie
    assert metrics["majority@4/accuracy"] == 100.0  # ("b",1) twice
    # unhashable answers are compared by value
    listy = [[result(1, [1, 2]), result(0, [3]), result(1, [1, 2])]]
    assert compute_pass_majority_metrics(listy, answer_key="extracted_answer")[0]["majority@3/accuracy"] == 100.0


def test_tasks_with_fewer_rollouts_than_k():
    tasks = [[result(1), result(0), result(1)], [result(0)]]
    metrics, _, _, max_k = compute_pass_majority_metrics(tasks)
    assert max_k == 3
    assert metrics["pass@1/accuracy"] == pytest.approx((2 / 3 + 0) / 2 * 100)
    assert metrics["pass@2/accuracy"] == 100.0  # only task 0 has 2 values
    assert metrics["pass@3/accuracy"] == 100.0
    assert metrics["pass@1[avg-of-2]/accuracy"] == pytest.approx((0.5 + 0.0) / 2 * 100)  # task 1 with its one
    assert metrics["per_sample_aggregate"]["accuracy"] == pytest.approx([50.0, 0.0, 100.0])
    # a score no task has at index >= k: no entry for it
    sparse = [[result(1)], [result(0)]]
    sparse_metrics, _, _, sparse_k = compute_pass_majority_metrics(sparse)
    assert sparse_k == 1
    assert not [key for key in sparse_metrics if "across_runs" in key]


def test_score_errors_are_clear():
    with pytest.raises(ValueError, match="no 'reward'.*score_fn"):
        compute_pass_majority_metrics([[{"score": 1}]])
    with pytest.raises(TypeError, match="score 'x' is a str"):
        compute_pass_majority_metrics([[{"reward": 1}]], score_fn=lambda r: {"x": "yes"})


def test_multiple_score_names_from_score_fn():
    tasks = [[{"reward": 1, "fmt": 0}, {"reward": 0, "fmt": 1}]]
    metrics, _, names, _ = compute_pass_majority_metrics(tasks, score_fn=lambda r: {"acc": r["reward"], "fmt": r["fmt"]})
    assert names == ["acc", "fmt"]
    assert metrics["pass@1/acc"] == 50.0 and metrics["pass@2/fmt"] == 100.0


# ------------------------------------------------------------------------------------------------------------
# add_avg_sample_std_dev


def test_avg_sample_std_dev_in_raw_units():
    metrics, all_score_dicts, names, max_k = compute_pass_majority_metrics(SPEC_TASKS, answer_key="extracted_answer")
    before = dict(metrics)
    assert add_avg_sample_std_dev(metrics, all_score_dicts, names, max_k) is None
    # k=2: std([1,0]) = 0.7071, std([0,0]) = 0 -> 0.3536; k=3: both tasks std of two 0s and a 1 = 0.5774
    assert metrics["pass@1[avg-of-2]/accuracy/avg_sample_std_dev"] == pytest.approx(0.3536, abs=1e-4)
    assert metrics["pass@1[avg-of-3]/accuracy/avg_sample_std_dev"] == pytest.approx(0.5774, abs=1e-4)
    assert {k: v for k, v in metrics.items() if k in before} == before
    assert not any(key.startswith("pass@1[avg-of-1]") and key.endswith("avg_sample_std_dev") for key in metrics)


def test_avg_sample_std_dev_skips_tasks_with_one_value():
    tasks = [[result(1), result(0)], [result(1)]]
    metrics, dicts, names, max_k = compute_pass_majority_metrics(tasks)
    add_avg_sample_std_dev(metrics, dicts, names, max_k)
    assert metrics["pass@1[avg-of-2]/accuracy/avg_sample_std_dev"] == pytest.approx(statistics.stdev([1, 0]))


# ------------------------------------------------------------------------------------------------------------
# compute_subset_metrics


def test_subset_metrics_prefix_keys_and_skip_falsy_subsets():
    easy = [result(1, "4", difficulty="easy"), result(1, "4", difficulty="easy")]
    hard = [result(0, "1", difficulty="hard"), result(1, "2", difficulty="hard")]
    no_subset = [result(1, "x", difficulty=""), result(1, "x")]
    missing = [result(0, "y")]
    out = compute_subset_metrics([easy, hard, no_subset, missing, []], "difficulty", answer_key="extracted_answer")
    assert {key.split("/")[0] for key in out} == {"easy", "hard"}
    assert out["easy/pass@1/accuracy"] == 100.0
    assert out["hard/pass@1/accuracy"] == 50.0
    assert out["hard/majority@2/accuracy"] == 50.0
    assert not [key for key in out if "per_sample_aggregate" in key]
    expected_hard = compute_pass_majority_metrics([hard], answer_key="extracted_answer")[0]
    expected_hard.pop("per_sample_aggregate")
    assert {key[len("hard/") :]: v for key, v in out.items() if key.startswith("hard/")} == expected_hard


# ------------------------------------------------------------------------------------------------------------
# highest_k_metrics


def spec_metrics() -> dict:
    metrics, dicts, names, max_k = compute_pass_majority_metrics(SPEC_TASKS, answer_key="extracted_answer")
    add_avg_sample_std_dev(metrics, dicts, names, max_k)
    return metrics


def test_highest_k_of_each_pattern():
    metrics = spec_metrics()
    assert highest_k_metrics(metrics, "pass@{k}") == {
        "pass@3/accuracy": metrics["pass@3/accuracy"],
        "pass@3/no_answer": metrics["pass@3/no_answer"],
    }
    assert set(highest_k_metrics(metrics, "pass@1[avg-of-{k}]", exclude_names=["no_answer"])) == {
        "pass@1[avg-of-3]/accuracy"
    }
    assert highest_k_metrics(metrics, "majority@{k}", score_names=["accuracy"]) == {"majority@3/accuracy": 75.0}


def test_highest_k_filters():
    metrics = {
        "pass@1/a": 1,
        "pass@12/a": 2,
        "pass@12/b": 3,
        "pass@12/a/std_dev_across_runs": 4,
        "pass@12/b/std_err_across_runs": 5,
        "pass@12/b/avg_sample_std_dev": 6,
        "easy/pass@40/a": 7,  # subset-prefixed: never matches
        "pass@1[avg-of-40]/a": 8,  # another pattern
        "pass@x/a": 9,
        "pass@50": 10,  # no name
    }
    assert highest_k_metrics(metrics, "pass@{k}") == {"pass@12/a": 2, "pass@12/b": 3}
    assert highest_k_metrics(metrics, "pass@{k}", score_names=["a"]) == {"pass@12/a": 2}
    assert highest_k_metrics(metrics, "pass@{k}", exclude_names=["a", "b"]) == {}
    # the largest k left after filtering
    assert highest_k_metrics({"pass@1/a": 1, "pass@3/b": 2}, "pass@{k}", score_names=["a"]) == {"pass@1/a": 1}
    assert highest_k_metrics({}, "majority@{k}") == {}
    with pytest.raises(ValueError, match="no '\\{k\\}' placeholder"):
        highest_k_metrics(metrics, "pass@1")


# ------------------------------------------------------------------------------------------------------------
# compute_aggregate_metrics


def usage(inp: int, out: int) -> dict:
    return {"usage": {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out,
                      "input_tokens_details": {"cached_tokens": 0}}}


def verify_responses() -> list[dict]:
    # out of order on purpose; task 1 has one rollout
    return [
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "extracted_answer": "x", "response": usage(4, 2)},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "extracted_answer": "5", "response": usage(10, 4),
         "correct": False, "label": "ignored"},
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "extracted_answer": "4", "response": usage(10, 6),
         "correct": True, "nested": {"ignored": 1}},
    ]


def test_aggregate_empty():
    assert compute_aggregate_metrics([]) == AggregateMetrics()


def test_aggregate_baseline_statistics():
    out = compute_aggregate_metrics(verify_responses())
    agent = out.agent_metrics
    assert agent["mean/reward"] == pytest.approx(1 / 3)
    assert agent["median/reward"] == 0.0 and agent["max/reward"] == 1.0 and agent["min/reward"] == 0.0
    assert agent["std/reward"] == pytest.approx(statistics.stdev([0, 0, 1]))
    assert agent["mean/input_tokens"] == pytest.approx(8.0)
    assert agent["mean/output_tokens"] == pytest.approx(4.0)
    assert agent["mean/correct"] == 0.5  # bools as 0/1, over the rollouts that have the field
    assert not [k for k in agent if k.endswith(("/label", "/nested", "/cached_tokens", "/extracted_answer"))]
    assert not [k for k in agent if "_ng_" in k]
    assert out.key_metrics == {k: v for k, v in agent.items() if k.startswith("mean/")}
    assert set(out.key_metrics) == {"mean/reward", "mean/input_tokens", "mean/output_tokens", "mean/total_tokens",
                                    "mean/correct"}


def test_aggregate_group_rows():
    groups = compute_aggregate_metrics(verify_responses()).group_level_metrics
    assert [g["_ng_task_index"] for g in groups] == [0, 1]
    task0, task1 = groups
    assert task0["mean/reward"] == 0.5 and task0["std/reward"] == pytest.approx(math.sqrt(0.5))
    assert task0["sample"] == {"agent_ref": {"name": "agent"}}
    assert (task0["num_rollouts"], task0["expected_num_rollouts"], task0["missing_num_rollouts"]) == (2, 2, 0)
    assert task0["reward_profile_completion_pct"] == 100.0
    assert task0["rollout_infos"] == [
        {"rollout_id": "0:0", "_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "correct": 1.0,
         "input_tokens": 10.0, "output_tokens": 6.0, "total_tokens": 16.0},
        {"rollout_id": "0:1", "_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "correct": 0.0,
         "input_tokens": 10.0, "output_tokens": 4.0, "total_tokens": 14.0},
    ]
    # NaN rule: task 1's std/reward is undefined but defined elsewhere -> left out, never NaN
    assert "std/reward" not in task1 and task1["num_rollouts"] == 1
    json.dumps(groups, allow_nan=False)


def test_aggregate_one_rollout_each_writes_std_zero():
    out = compute_aggregate_metrics([{"_ng_task_index": t, "reward": 1.0} for t in range(3)])
    assert all(g["std/reward"] == 0.0 for g in out.group_level_metrics)
    assert out.agent_metrics["std/reward"] == 0.0
    single = compute_aggregate_metrics([{"reward": 0.5}])
    assert single.agent_metrics["std/reward"] == 0.0
    assert single.group_level_metrics[0]["rollout_infos"][0]["rollout_id"] == "0:0"


def test_aggregate_custom_metrics_merge():
    seen_tasks: list = []

    def compute(tasks):
        seen_tasks.extend(tasks)
        metrics = compute_pass_majority_metrics(tasks, answer_key="extracted_answer")[0]
        per_task = [{"_ng_task_index": task[0]["_ng_task_index"], "tries": len(task)} for task in tasks]
        return {**metrics, "mean/reward": 99.0, "per_task_metrics": per_task, "undefined": float("nan")}

    def key(agent_metrics):
        return {**highest_k_metrics(agent_metrics, "pass@{k}", exclude_names=["no_answer"]), "nan": float("inf")}

    out = compute_aggregate_metrics(verify_responses(), compute, key)
    # tasks are grouped by task index, in rollout order, with every field
    assert [[(r["_ng_task_index"], r["_ng_rollout_index"]) for r in task] for task in seen_tasks] == [
        [(0, 0), (0, 1)],
        [(1, 0)],
    ]
    assert seen_tasks[0][0]["response"] == usage(10, 6) and seen_tasks[0][0]["extracted_answer"] == "4"
    assert out.agent_metrics["mean/reward"] == 99.0  # custom wins
    assert out.agent_metrics["std/reward"] == pytest.approx(statistics.stdev([0, 0, 1]))  # baseline kept
    assert out.agent_metrics["pass@1/accuracy"] == pytest.approx(25.0)
    assert out.agent_metrics["per_sample_aggregate"]["accuracy"] == pytest.approx([50.0, 0.0])
    assert "per_task_metrics" not in out.agent_metrics and "undefined" not in out.agent_metrics
    assert [g["tries"] for g in out.group_level_metrics] == [2, 1]
    assert out.key_metrics == {"pass@2/accuracy": 100.0}
    json.dumps(out.model_dump(), allow_nan=False)


def test_aggregate_duplicate_keys_raise():
    with pytest.raises(ValueError, match=r"verify_responses\[0\] and verify_responses\[1\].*_ng_task_index=0, "
                                         r"_ng_rollout_index=0"):
        compute_aggregate_metrics([{"reward": 1.0}, {"reward": 0.0}])
    with pytest.raises(ValueError, match=r"_ng_task_index=3, _ng_rollout_index=1"):
        compute_aggregate_metrics([{"_ng_task_index": 3, "_ng_rollout_index": 1, "reward": 1.0}] * 2)


def test_aggregate_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"verify_responses\[1\] has _ng_task_index='2'"):
        compute_aggregate_metrics([{"reward": 1.0}, {"_ng_task_index": "2", "reward": 1.0}])
    with pytest.raises(ValueError, match=r"verify_responses\[0\] is a list"):
        compute_aggregate_metrics([[1, 2]])
    with pytest.raises(ValueError, match=r"per_task_metrics\[0\].*names no task"):
        compute_aggregate_metrics([{"reward": 1.0}], lambda tasks: {"per_task_metrics": [{"_ng_task_index": 7}]})
    with pytest.raises(ValueError, match="per_task_metrics as a dict"):
        compute_aggregate_metrics([{"reward": 1.0}], lambda tasks: {"per_task_metrics": {"_ng_task_index": 0}})


def test_reward_profiler_directly():
    per_task, overall = RewardProfiler().profile({5: [{"reward": 1, "flag": True}, {"reward": 0}], 2: [{"reward": 1}]})
    assert list(per_task) == [5, 2]
    assert per_task[5]["mean/reward"] == 0.5 and per_task[5]["mean/flag"] == 1.0
    assert per_task[5]["std/flag"] == 0.0  # flag's std is undefined in every task
    assert "std/reward" not in per_task[2]
    assert overall["mean/reward"] == pytest.approx(2 / 3) and overall["median/reward"] == 1.0


# ------------------------------------------------------------------------------------------------------------
# The mixin


class PassAtKHooks(AggregateMetricsMixin):
    def compute_metrics(self, tasks):
        return compute_pass_majority_metrics(tasks, answer_key="extracted_answer")[0]

    def get_key_metrics(self, agent_metrics):
        return highest_k_metrics(agent_metrics, "majority@{k}", exclude_names=["no_answer"])


async def test_mixin_defaults_and_overrides():
    body = AggregateMetricsRequest(verify_responses=verify_responses())
    default = await AggregateMetricsMixin().aggregate_metrics(body)
    assert default == compute_aggregate_metrics(verify_responses())
    assert set(default.key_metrics) == {k for k in default.agent_metrics if k.startswith("mean/")}
    assert AggregateMetricsMixin().compute_metrics([[{"reward": 1}]]) == {}

    custom = await PassAtKHooks().aggregate_metrics(body)
    # task 0: ("4", 1) and ("5", 0) tie -> 0.5; task 1: ("x", 0) -> 0
    assert custom.key_metrics == {"majority@2/accuracy": 25.0}
    assert custom.agent_metrics["majority@1/accuracy"] == 50.0
