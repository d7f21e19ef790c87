"""The drift check of a rollout's token trajectory (`nemo_gym.workbench.tokens.classify_trajectory`), the one
classification `ng export tokens`, `ng view` and the collector's summary use: exact, re-tokenized (the model
server's `token_trajectory` flag), unusable with its reason. Hand-built rollouts, no processes."""

from __future__ import annotations

from typing import Any, Optional

from nemo_gym.testing.responses import function_call, function_call_output, message, reasoning
from nemo_gym.workbench.tokens import TrajectoryCounts, classify_trajectory, has_token_data


def tokens(item: dict, prompt: list[int], generation: list[int], flag: Optional[str] = None) -> dict:
    out = {**item, "prompt_token_ids": prompt, "generation_token_ids": generation,
           "generation_log_probs": [-0.25] * len(generation)}  # fmt: skip
    if flag is not None:
        out["token_trajectory"] = flag
    return out


def rollout(*output: Any, **extra: Any) -> dict:
    return {"responses_create_params": {"input": "add 2"}, "response": {"output": list(output)}, "reward": 1.0, **extra}


def three_calls(second: Optional[str] = None, third: Optional[str] = None, third_prompt=None) -> dict:
    """Three model calls, each prompt continuing the one before (unless `third_prompt` says otherwise)."""
    return rollout(
        reasoning("hm"),
        tokens(function_call("add", {"count": 1}), [1, 2, 3], [10, 11]),
        function_call_output({"count": 1}),
        tokens(function_call("add", {"count": 1}, call_id="c2"), [1, 2, 3, 10, 11, 20], [12], second),
        function_call_output({"count": 2}, call_id="c2"),
        tokens(message("2"), third_prompt or [1, 2, 3, 10, 11, 20, 12, 21, 22], [13], third),
    )


def test_contiguous_calls_without_flags_are_exact_and_joined():
    got = classify_trajectory(three_calls())
    assert (got.kind, got.reason, got.label, got.usable, got.token_data) == ("exact", None, "exact", True, True)
    assert got.trajectory.generation_token_ids == [10, 11, 20, 12, 21, 22, 13]
    assert got.trajectory.loss_mask == [1, 1, 0, 1, 0, 0, 1]
    assert got.trajectory.num_model_calls == 3 and got.trajectory.retokenized_calls == []
    assert classify_trajectory(three_calls("exact", "exact")).kind == "exact"


def test_a_call_flagged_retokenized_makes_a_contiguous_trajectory_retokenized():
    got = classify_trajectory(three_calls(second="exact", third="retokenized"))
    assert (got.kind, got.reason, got.usable) == ("retokenized", None, True)
    assert got.trajectory.retokenized_calls == [3]
    assert "model call(s) 3" in got.detail
    assert got.trajectory.generation_token_ids == [10, 11, 20, 12, 21, 22, 13]  # still one trajectory
    # A value the server should not send is not taken as exact; the detail names it.
    odd = classify_trajectory(three_calls(second="partial"))
    assert odd.kind == "retokenized" and "token_trajectory='partial'" in odd.detail


def test_the_first_calls_flag_is_not_read():
    first = three_calls()
    first["response"]["output"][1]["token_trajectory"] = "retokenized"  # nothing before it to continue
    assert classify_trajectory(first).kind == "exact"


def test_a_prompt_that_does_not_continue_is_unusable_flagged_or_not():
    broken = [1, 2, 3, 10, 99, 20, 12, 21, 22]  # call 3's prompt re-rendered the first generation
    for flag in (None, "retokenized", "exact"):
        got = classify_trajectory(three_calls(third=flag, third_prompt=broken))
        assert (got.kind, got.reason, got.trajectory, got.usable) == ("unusable", "tokens_not_contiguous", None, False)
        assert "model call 3" in got.detail and got.label == "unusable: tokens_not_contiguous"
        assert ("flagged it" in got.detail) == (flag is not None)


def test_no_token_data_and_other_unusable_reasons():
    plain = rollout(function_call("add", {}), function_call_output("x"), message("done"))
    got = classify_trajectory(plain)
    assert (got.kind, got.reason, got.token_data) == ("unusable", "no_token_data", False)
    assert has_token_data(plain) is False and has_token_data({"response": None}) is False
    half = rollout(tokens(function_call("add", {}), [1], [5]), function_call_output("x"), message("no ids"))
    got = classify_trajectory(half)
    assert (got.kind, got.reason, got.token_data) == ("unusable", "token_data_mismatch", True)
    failed = {**three_calls(), "_ng_failure_class": "judge_failed"}
    got = classify_trajectory(failed)
    assert (got.reason, got.token_data) == ("failed_rollout", True)
    assert classify_trajectory({"reward": 1}).reason == "no_response"


def test_counts_keep_one_number_per_class_and_the_reasons():
    counts = TrajectoryCounts()
    for row in (three_calls(), three_calls(third="retokenized"), three_calls(third_prompt=[7]), rollout(message("x"))):
        counts.add(classify_trajectory(row))
    assert (counts.exact, counts.retokenized, dict(counts.unusable)) == (
        1, 1, {"tokens_not_contiguous": 1, "no_token_data": 1}
    )
    assert counts.total == 4 and counts.with_token_data == 3
    assert counts.summary() == (
        "token trajectories: 1 exact, 1 re-tokenized, 2 unusable (no_token_data 1, tokens_not_contiguous 1)"
    )
