"""Reward profiling: numeric fields, statistics, the std rule, pass@k / mean@k on hand-computed examples, files,
and the `ng_reward_profile` command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nemo_gym.cli import find_command
from nemo_gym.rollouts.reward_profile import (
    compute_profile,
    pass_at_k,
    print_profile_table,
    profile_rollouts,
    rollout_numeric_fields,
    summary_stats,
)

T, R = "_ng_task_index", "_ng_rollout_index"


def inputs(tasks: dict[int, int], agent_of=lambda t: "agent") -> list[dict]:
    """Materialized rows: `tasks` maps task index -> number of rollouts."""
    return [
        {"responses_create_params": {"input": f"q{t}"}, "agent_ref": {"name": agent_of(t)}, "q": t, T: t, R: r}
        for t, n in tasks.items()
        for r in range(n)
    ]


def rollout(t: int, r: int, reward: float, **extra) -> dict:
    return {T: t, R: r, "reward": reward, **extra}


# -------------------------------------------------------------------------------------------- primitives


def test_numeric_fields_merge_usage_count_bools_and_drop_the_rest():
    row = {
        T: 3,
        R: 1,
        "reward": 1,
        "correct": True,
        "wrong": False,
        "accuracy": 0.5,
        "extracted_answer": "B",
        "options": [1, 2],
        "verifier_metadata": {"score": 3},
        "none": None,
        "response": {
            "output": [],
            "usage": {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 2},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 1},
                "total_tokens": 15,
            },
        },
    }
    assert rollout_numeric_fields(row) == {
        "reward": 1.0,
        "correct": 1.0,
        "wrong": 0.0,
        "accuracy": 0.5,
        "input_tokens": 10.0,
        "output_tokens": 5.0,
        "total_tokens": 15.0,
    }


def test_summary_stats():
    assert summary_stats([1.0, 0.0, 1.0, 0.0]) == {
        "mean": 0.5,
        "max": 1.0,
        "min": 0.0,
        "median": 0.5,
        "std": pytest.approx(math.sqrt(1 / 3)),
    }
    one = summary_stats([2.0, float("nan")])
    assert one["mean"] == one["median"] == 2.0 and math.isnan(one["std"])


def test_pass_at_k_matches_the_closed_form():
    # n=4, c=2: pass@1 = 1 - C(2,1)/C(4,1) = 1/2; pass@2 = 1 - C(2,2)/C(4,2) = 5/6; pass@3 = 1 (C(2,3) = 0).
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(4, 2, 3) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(1, 1, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


# ------------------------------------------------------------------------------------ hand-computed profile


def test_task_and_agent_metrics_with_pass_and_mean_at_k_on_a_hand_computed_example():
    # Task 0 rewards [1, 0, 1, 0] (c=2), task 1 rewards [0, 0, 0, 1] (c=1), n=4 each.
    rewards = {0: [1.0, 0.0, 1.0, 0.0], 1: [0.0, 0.0, 0.0, 1.0]}
    rollouts = [
        rollout(t, r, v, correct=v == 1.0, response={"usage": {"input_tokens": 10 * (t + 1), "output_tokens": r}})
        for t, vals in rewards.items()
        for r, v in enumerate(vals)
    ]
    rollouts.reverse()  # completion order is arbitrary
    tasks, agents = compute_profile(inputs({0: 4, 1: 4}), rollouts)

    assert [t[T] for t in tasks] == [0, 1]
    t0, t1 = tasks
    assert t0["num_rollouts"] == 4
    assert t0["mean/reward"] == 0.5 and t0["median/reward"] == 0.5
    assert t0["min/reward"] == 0.0 and t0["max/reward"] == 1.0
    assert t0["std/reward"] == pytest.approx(math.sqrt(1 / 3))
    assert t0["mean/correct"] == 0.5
    assert t0["mean/input_tokens"] == 10.0 and t0["std/input_tokens"] == 0.0
    assert t0["mean/output_tokens"] == 1.5 and t0["median/output_tokens"] == 1.5
    assert t0["pass@1"] == pytest.approx(1 / 2)
    assert t0["pass@2"] == pytest.approx(5 / 6)
    assert t0["pass@3"] == 1.0 and t0["pass@4"] == 1.0
    assert [t0[f"mean@{k}"] for k in range(1, 5)] == [0.5] * 4
    # Task 1: c=1. pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1/2; pass@3 = 1 - C(3,3)/C(4,3) = 3/4.
    assert t1["pass@1"] == pytest.approx(0.25)
    assert t1["pass@2"] == pytest.approx(0.5)
    assert t1["pass@3"] == pytest.approx(0.75)
    assert t1["pass@4"] == 1.0
    assert t1["mean/reward"] == 0.25 and t1["median/reward"] == 0.0
    assert t0["sample"] == {"responses_create_params": {"input": "q0"}, "agent_ref": {"name": "agent"}, "q": 0}
    # Stat keys only for numeric fields; the index keys are never profiled.
    assert not any(k.endswith(("/" + T, "/" + R)) for k in t0)

    (agent,) = agents
    assert agent["agent_ref"] == {"name": "agent"}
    assert agent["num_tasks"] == 2 and agent["num_rollouts"] == 8
    assert agent["mean/reward"] == pytest.approx(3 / 8)
    assert agent["median/reward"] == 0.0
    assert agent["std/reward"] == pytest.approx(math.sqrt((3 * (5 / 8) ** 2 + 5 * (3 / 8) ** 2) / 7))
    assert agent["mean/input_tokens"] == 15.0
    assert agent["pass@1"] == pytest.approx(0.375)
    assert agent["pass@2"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert agent["pass@3"] == pytest.approx(0.875)
    assert agent["pass@4"] == 1.0
    assert agent["mean@1"] == pytest.approx(0.375) and agent["mean@4"] == pytest.approx(0.375)


def test_pass_threshold_decides_what_passes():
    rollouts = [rollout(0, 0, 0.5), rollout(0, 1, 0.9), rollout(0, 2, 1.0)]
    tasks, _ = compute_profile(inputs({0: 3}), rollouts)
    assert tasks[0]["pass@1"] == pytest.approx(1 / 3)
    tasks, _ = compute_profile(inputs({0: 3}), rollouts, pass_threshold=0.5)
    assert tasks[0]["pass@1"] == 1.0


def test_one_rollout_per_task_gives_std_zero_and_no_pass_at_k():
    rollouts = [rollout(0, 0, 1.0, tokens=3), rollout(1, 0, 0.0, tokens=5)]
    tasks, agents = compute_profile(inputs({0: 1, 1: 1}), rollouts)
    for t in tasks:
        assert t["std/reward"] == 0.0 and t["std/tokens"] == 0.0
        assert t["mean/reward"] == t["median/reward"] == t["min/reward"] == t["max/reward"]
        assert not any(k.startswith(("pass@", "mean@")) for k in t)
    assert agents[0]["std/reward"] == pytest.approx(math.sqrt(0.5))
    assert not any(k.startswith("pass@") for k in agents[0])


def test_undefined_std_is_dropped_when_other_tasks_define_it_and_zero_for_a_single_agent_rollout():
    rollouts = [rollout(0, 0, 1.0), rollout(0, 1, 0.0), rollout(1, 0, 1.0)]
    tasks, _ = compute_profile(inputs({0: 2, 1: 1}), rollouts)
    assert tasks[0]["std/reward"] == pytest.approx(math.sqrt(0.5))
    assert "std/reward" not in tasks[1]
    assert all(not isinstance(v, float) or not math.isnan(v) for t in tasks for v in t.values())
    # Task 1 has one rollout: pass@2 is undefined for it and left out; pass@1 is there.
    assert tasks[1]["pass@1"] == 1.0 and "pass@2" not in tasks[1]

    _, agents = compute_profile(inputs({0: 1, 1: 1}, agent_of=lambda t: f"a{t}"), [rollout(0, 0, 1.0), rollout(1, 0, 0.0)])
    assert [a["agent_ref"]["name"] for a in agents] == ["a0", "a1"]
    assert [a["std/reward"] for a in agents] == [0.0, 0.0]


def test_rows_with_mismatched_fields_are_averaged_over_the_rows_that_have_them():
    rollouts = [rollout(0, 0, 1.0, accuracy=0.5), rollout(0, 1, 0.0), rollout(0, 2, 1.0, accuracy=1.0, judge=True)]
    tasks, agents = compute_profile(inputs({0: 3}), rollouts)
    assert tasks[0]["mean/accuracy"] == 0.75 and tasks[0]["mean/judge"] == 1.0
    # `judge` has one value in the whole file: every std/judge is undefined, so the rule writes 0.
    assert tasks[0]["std/judge"] == 0.0
    assert agents[0]["mean/accuracy"] == 0.75


def test_several_agents_duplicate_tasks_and_rollouts_without_inputs():
    rows = inputs({0: 2, 1: 2}, agent_of=lambda t: "math" if t == 0 else "code")
    rows += [dict(rows[0], **{R: 2})]  # a duplicate line of task 0 later in the file
    rollouts = [rollout(0, 0, 1.0), rollout(0, 1, 1.0), rollout(0, 2, 0.0), rollout(1, 0, 0.0), rollout(1, 1, 0.0), rollout(7, 0, 1.0)]
    tasks, agents = compute_profile(rows, rollouts)
    assert [(t[T], t["num_rollouts"]) for t in tasks] == [(0, 3), (1, 2)]
    by_name = {a["agent_ref"]["name"]: a for a in agents}
    assert by_name["math"]["num_rollouts"] == 3 and by_name["math"]["mean/reward"] == pytest.approx(2 / 3)
    assert by_name["code"]["num_rollouts"] == 2 and by_name["code"]["pass@2"] == 0.0
    # math's task has 3 rollouts, code's 2: pass@3 exists only for math.
    assert "pass@3" in by_name["math"] and "pass@3" not in by_name["code"]


def test_tasks_without_rollouts_are_left_out():
    tasks, agents = compute_profile(inputs({0: 1, 1: 1}), [rollout(1, 0, 1.0)])
    assert [t[T] for t in tasks] == [1]
    assert agents[0]["num_tasks"] == 1
    assert compute_profile(inputs({0: 1}), []) == ([], [])


# ------------------------------------------------------------------------------------------- files and CLI


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_profile_rollouts_writes_both_files_next_to_the_rollouts(tmp_path, capsys):
    mat = write_jsonl(tmp_path / "r_materialized_inputs.jsonl", inputs({0: 2, 1: 2}))
    out = write_jsonl(
        tmp_path / "r.jsonl",
        [rollout(1, 1, 0.0), rollout(0, 0, 1.0), "not json", rollout(0, 1, 0.0), rollout(1, 0, 1.0)],
    )
    summary = profile_rollouts(mat, out)
    assert summary.reward_profiling_path == tmp_path / "r_reward_profiling.jsonl"
    assert summary.agent_metrics_path == tmp_path / "r_agent_metrics.json"
    lines = [json.loads(x) for x in summary.reward_profiling_path.read_text().splitlines()]
    assert [(x[T], x["mean/reward"], x["pass@2"]) for x in lines] == [(0, 0.5, 1.0), (1, 0.5, 1.0)]
    metrics = json.loads(summary.agent_metrics_path.read_text())
    assert isinstance(metrics, list) and metrics[0]["agent_ref"] == {"name": "agent"}
    assert summary.unreadable_lines == 1
    assert "unreadable" in capsys.readouterr().err
    print_profile_table(summary)
    table = capsys.readouterr().out
    assert "agent" in table and "pass@2" in table and "0.500" in table


def cut_short(t: int, r: int, reward: float) -> dict:
    """A rollout whose response stopped at max_output_tokens: verified, so it has a reward."""
    response = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": []}
    return rollout(t, r, reward, response=response)


def test_the_profile_counts_ok_incomplete_and_failed_rollouts_per_agent(tmp_path, capsys):
    """The outcome vocabulary (`nemo_gym.rollouts.outcome`): incomplete rollouts are in the statistics (they have a
    reward) and counted apart; failed ones come from the failures sidecar, once per rollout however many attempt
    lines it has; an agent whose rollouts all failed is in the table, not in the metrics file."""
    agent_of = {0: "a", 1: "a", 2: "b"}.get
    mat = write_jsonl(tmp_path / "r_materialized_inputs.jsonl", inputs({0: 2, 1: 2, 2: 1}, agent_of))
    complete = {"status": "completed", "output": []}
    out = write_jsonl(
        tmp_path / "r.jsonl",
        [rollout(0, 0, 1.0, response=complete), cut_short(0, 1, 0.0), cut_short(1, 0, 1.0)],
    )
    failure = {T: 1, R: 1, "error_type": "Timeout", "message": "/run did not answer", "agent_name": "a", "row": {}}
    write_jsonl(
        tmp_path / "r_failures.jsonl",
        [failure, {**failure, "error_type": "HTTPError"}, {**failure, T: 2, R: 0, "agent_name": "b"}],
    )
    summary = profile_rollouts(mat, out)
    (metrics,) = json.loads(summary.agent_metrics_path.read_text())
    assert (metrics["num_rollouts"], metrics["num_ok"], metrics["num_incomplete"], metrics["num_failed"]) == (3, 1, 2, 1)
    assert metrics["mean/reward"] == pytest.approx(2 / 3)  # the incomplete rollouts' rewards are in the mean
    assert summary.agent_outcomes == {"a": {"ok": 1, "incomplete": 2, "failed": 1}, "b": {"ok": 0, "incomplete": 0, "failed": 1}}
    assert summary.outcomes.describe() == "5 rollouts: 1 ok, 2 incomplete (max_output_tokens), 2 failed (Timeout)"
    print_profile_table(summary)
    printed = capsys.readouterr().out
    assert "5 rollouts: 1 ok, 2 incomplete (max_output_tokens), 2 failed (Timeout)." in printed
    assert "they have a reward and are kept in the output" in printed
    row_b = next(line for line in printed.splitlines() if line.strip("│ ").startswith("b "))
    assert [c.strip() for c in row_b.split("│")[2:7]] == ["0", "0", "0", "0", "1"]  # tasks, rollouts, ok, incomplete, failed


def test_reward_profile_command(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "x_materialized_inputs.jsonl", inputs({0: 1}))
    write_jsonl(tmp_path / "x.jsonl", [rollout(0, 0, 1.0)])
    code = find_command("reward_profile").main(
        ["+materialized_inputs_jsonl_fpath=x_materialized_inputs.jsonl", "+rollouts_jsonl_fpath=x.jsonl"]
    )
    assert code == 0
    assert (tmp_path / "x_reward_profiling.jsonl").exists() and (tmp_path / "x_agent_metrics.json").exists()
    assert "x_agent_metrics.json" in capsys.readouterr().out

    assert find_command("reward_profile").main(["+materialized_inputs_jsonl_fpath=nope.jsonl", "+rollouts_jsonl_fpath=x.jsonl"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
    assert find_command("reward_profile").main(["+h=true"]) == 0
    assert "+rollouts_jsonl_fpath" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- bounded memory


def random_run(seed: int, n_tasks: int) -> tuple[list[dict], list[dict]]:
    """Materialized rows and shuffled rollouts: 1-6 rollouts per task, three agents, fields that come and go, bools,
    ints, usage, low- and high-cardinality values, a duplicate input line, rollouts without an input row."""
    import random

    rng = random.Random(seed)
    rows, rollouts = [], []
    for t in range(n_tasks):
        agent = rng.choice(["a", "b", "c"])
        for r in range(rng.randint(1, 6)):
            rows.append({"responses_create_params": {"input": f"q{t}"}, "agent_ref": {"name": agent}, T: t, R: r})
            if rng.random() < 0.1:
                continue  # a rollout that failed: no row in the output
            x: dict = {T: t, R: r}
            if rng.random() < 0.95:
                x["reward"] = rng.choice([0.0, 1.0, 1, 0, 0.5, rng.random()])
            if rng.random() < 0.5:
                x["score"] = rng.uniform(-50, 50)
            if rng.random() < 0.3:
                x["flag"] = rng.random() < 0.5
            if rng.random() < 0.1:
                x[f"rare{rng.randint(0, 3)}"] = rng.randint(-5, 5)
            if rng.random() < 0.7:
                x["response"] = {"usage": {"input_tokens": rng.randint(1, 9), "output_tokens": rng.randint(1, 500)}}
            rollouts.append(x)
    rows.append(dict(rows[0], **{R: 99}))
    rollouts += [rollout(n_tasks + 3, 0, 1.0), {T: "x"}]
    rng.shuffle(rollouts)
    return rows, rollouts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spilling_to_sqlite_gives_the_same_bytes_as_in_memory_on_random_runs(seed):
    rows, rollouts = random_run(seed, 1500)
    in_memory = compute_profile(rows, rollouts)
    for spill_after in (0, 7, 1000):
        spilled = compute_profile(rows, rollouts, spill_after=spill_after)
        assert json.dumps(spilled) == json.dumps(in_memory), spill_after


def test_agent_statistics_equal_those_of_every_value_in_a_list():
    rows, rollouts = random_run(4, 3000)
    agent_of = {r[T]: r["agent_ref"]["name"] for r in rows}
    values: dict[tuple[str, str], list[float]] = {}
    for x in rollouts:
        if isinstance(x.get(T), int) and x[T] in agent_of:
            for name, v in rollout_numeric_fields(x).items():
                values.setdefault((agent_of[x[T]], name), []).append(v)
    _, agents = compute_profile(rows, rollouts, spill_after=10)
    checked = 0
    for agent in agents:
        for (name, fld), vals in values.items():
            if name != agent["agent_ref"]["name"]:
                continue
            want = summary_stats(vals)
            for stat in ("mean", "max", "min", "median"):
                assert agent[f"{stat}/{fld}"] == want[stat], (name, fld, stat)
            assert agent.get(f"std/{fld}") == (want["std"] if len(vals) >= 2 else 0.0)
            checked += 1
    assert checked >= 15


def test_counted_stats_match_summary_stats():
    import random
    from collections import Counter

    from nemo_gym.rollouts.reward_profile import counted_stats

    rng = random.Random(5)
    for size in (1, 2, 3, 10, 101, 1000):
        for kind in ("binary", "ints", "floats"):
            vals = [
                float(rng.random() < 0.3) if kind == "binary" else float(rng.randint(0, 9)) if kind == "ints" else rng.gauss(0, 1e6)
                for _ in range(size)
            ]
            pairs = sorted(Counter(vals).items())
            got, want = counted_stats(lambda pairs=pairs: pairs), summary_stats(vals)
            assert {k: v for k, v in got.items() if k != "std"} == {k: v for k, v in want.items() if k != "std"}
            assert got["std"] == want["std"] or (math.isnan(got["std"]) and math.isnan(want["std"]))
    assert all(math.isnan(v) for v in counted_stats(list).values())


def test_profile_files_are_identical_with_and_without_spilling(tmp_path):
    rows, rollouts = random_run(6, 800)
    mat = write_jsonl(tmp_path / "r_materialized_inputs.jsonl", rows)
    out = write_jsonl(tmp_path / "r.jsonl", rollouts)
    a = profile_rollouts(mat, out, reward_profiling_path=tmp_path / "a.jsonl", agent_metrics_path=tmp_path / "a.json")
    b = profile_rollouts(
        mat, out, reward_profiling_path=tmp_path / "b.jsonl", agent_metrics_path=tmp_path / "b.json", spill_after=50
    )
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert (a.num_tasks, a.num_rollouts, a.unmatched_rollouts) == (b.num_tasks, b.num_rollouts, b.unmatched_rollouts)
    assert a.unmatched_rollouts == 1 and a.unreadable_lines == 1


def test_the_stores_move_to_sqlite_past_their_threshold_and_keep_file_order_within_a_task():
    from nemo_gym.rollouts.reward_profile import _TaskRollouts, _ValueCounts

    store = _TaskRollouts(spill_after=3)
    for i, task in enumerate([2, 0, 2, 1]):
        assert store.spilled == (i > 3)
        store.add(task, {"reward": float(i)})
    assert store.spilled
    store.add(2, {"reward": 9.0, "late": 1.0})
    assert [(t, [list(r) for r in rows]) for t, rows in store.groups()] == [
        (0, [[1.0]]), (1, [[3.0]]), (2, [[0.0], [2.0], [9.0, 1.0]])
    ]
    assert [list(r) for r in store.lookup(1)] == [[3.0]] and store.lookup(7) == []
    assert [list(r) for r in store.lookup(0)] == [[1.0]]  # out of order: a direct query
    store.close()

    counts = _ValueCounts(spill_after=2)
    counts.add((0, 0), [1.0, 1.0, 0.0])
    assert not counts.spilled
    counts.add((0, 0), [0.5])
    assert counts.spilled
    counts.add((0, 0), [1.0])
    assert list(counts.sorted_counts((0, 0))()) == [(0.0, 1), (0.5, 1), (1.0, 3)]
    counts.close()


def test_each_reward_component_of_a_multi_reward_verifier_is_profiled_as_its_own_field():
    fields = rollout_numeric_fields({"reward": 1.5, "reward_components": {"correctness": 1.0, "format": 0.5}, "note": {}})
    assert fields == {"reward": 1.5, "reward_components.correctness": 1.0, "reward_components.format": 0.5}
