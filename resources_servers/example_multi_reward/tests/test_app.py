"""example_multi_reward: the three components, their weighted sum, and the `/aggregate_metrics` hooks."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import BaseMultiRewardVerifyResponse
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.responses import function_call, make_response, message, reasoning
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from resources_servers.example_multi_reward.app import (
    COMPONENTS,
    ExampleMultiRewardResourcesServer,
    ExampleMultiRewardVerifyRequest,
    brevity_score,
    extract_answer,
    format_score,
)

QUESTION = "A baker puts 12 muffins on each tray and bakes 7 trays. How many muffins does she bake?"
PARAMS = {"input": [{"role": "user", "content": QUESTION}]}


def new_server(**config) -> ExampleMultiRewardResourcesServer:
    return make_server(ExampleMultiRewardResourcesServer, name="example_multi_reward", domain="math", **config)


VERIFY = Verifier(new_server, ExampleMultiRewardVerifyRequest, PARAMS, expected_answer=84, max_words=10)


def components(result) -> tuple:
    return tuple(result.reward_components[name] for name in COMPONENTS)


# ----------------------------------------------------------------------------------------------- the pieces


@pytest.mark.parametrize(
    "text, answer",
    [
        ("12 x 7 = 84.\nAnswer: 84", "84"),
        ("Answer: 80\nno wait\nAnswer: 84", "84"),  # the last answer
        ("The answer is 84 muffins, from 12 and 7.", "84"),  # an answer phrase beats a later number
        ("12 times 7 makes 84", "84"),  # else the last number
        ("about 1,000.", "1000"),
        ("half: 16.5", "16.5"),
        ("-3 degrees", "-3"),
        ("no idea", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "text, score",
    [
        ("12 x 7 = 84.\nAnswer: 84", 1.0),
        ("Answer: 84\n\n", 1.0),
        ("Answer: -4", 1.0),
        ("Answer: 84 muffins", 0.0),
        ("Answer: 1,000", 0.0),
        ("answer: 84", 0.0),
        ("Answer: 84\nThanks!", 0.0),  # not the last line
        ("84", 0.0),
        ("", 0.0),
    ],
)
def test_format_score(text, score):
    assert format_score(text) == score


def test_brevity_score():
    assert [brevity_score(n, 10) for n in (0, 10, 11, 15, 20, 25)] == [1.0, 1.0, 0.9, 0.5, 0.0, 0.0]


# ----------------------------------------------------------------------------------------------- verify


def test_components_differ_between_answers():
    perfect = VERIFY("12 x 7 = 84.\nAnswer: 84")
    unformatted = VERIFY("Twelve muffins times seven trays gives 84.")
    wrong = VERIFY("Answer: 85")
    verbose = VERIFY("Each tray holds twelve muffins and there are seven trays in total, so she bakes 84.\nAnswer: 84")
    assert components(perfect) == (1.0, 1.0, 1.0)
    assert components(unformatted) == (1.0, 0.0, 1.0)
    assert components(wrong) == (0.0, 1.0, 1.0)
    assert components(verbose) == (1.0, 1.0, pytest.approx(0.2))  # 18 words for 10: 1 - 8/10
    # reward = 1.0 * correctness + 0.5 * format + 0.5 * brevity
    assert [r.reward for r in (perfect, unformatted, wrong)] == [2.0, 1.5, 1.0]
    assert verbose.reward == pytest.approx(1.6)


def test_response_is_a_multi_reward_response_with_top_level_copies():
    result = VERIFY("12 x 7 = 84.\nAnswer: 84")
    assert isinstance(result, BaseMultiRewardVerifyResponse)
    assert set(result.reward_components) == set(COMPONENTS)
    for name in COMPONENTS:
        assert getattr(result, name) == result.reward_components[name]
    assert result.extracted_answer == "84" and result.word_count == 7
    assert result.expected_answer == 84 and result.max_words == 10  # the request is echoed


@pytest.mark.parametrize("output", [(), ("  ",), (reasoning("Answer: 84"),), (function_call("calc", "{}"),)])
def test_no_text_scores_zero_everywhere(output):
    result = VERIFY(*output)
    assert components(result) == (0.0, 0.0, 0.0) and result.reward == 0.0
    assert result.extracted_answer is None and result.word_count == 0


def test_weights_come_from_the_config():
    server = new_server(reward_weights={"correctness": 2.0, "format": 0.0, "brevity": 1.0})
    assert VERIFY("Twelve times seven is 84.", server=server).reward == 3.0


@pytest.mark.parametrize(
    "weights, named",
    [
        ({"correctness": 1.0, "format": 1.0}, "missing: ['brevity']"),
        ({**dict.fromkeys(COMPONENTS, 1.0), "style": 1}, "unknown: ['style']"),
    ],
)
def test_weights_must_name_each_component_once(weights, named):
    with pytest.raises(ValueError, match=r"reward_weights must give exactly one weight per component") as info:
        new_server(reward_weights=weights)
    assert named in str(info.value)


# ----------------------------------------------------------------------------------------------- /aggregate_metrics

# Two tasks, two rollouts each; (answer text, expected answer, max_words).
ROLLOUTS = {
    (0, 0): ("12 x 7 = 84.\nAnswer: 84", 84, 40),  # 1 / 1 / 1
    (0, 1): ("Answer: 85", 84, 40),  # 0 / 1 / 1
    (1, 0): ("From 09:40 to 11:40 is 120 minutes, minus 25 minutes gives 95 minutes in total.", 95, 10),  # 1 / 0 / .5
    (1, 1): ("", 95, 10),  # no answer: 0 / 0 / 0
}


def usage(n_in: int, n_out: int) -> dict:
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": n_in + n_out}


def collected(client) -> list[dict]:
    """The four verify responses, as the collector sends them to /aggregate_metrics (indices added)."""
    results = []
    for (task, rollout), (text, expected, max_words) in ROLLOUTS.items():
        response = make_response(*((text,) if text else ()), usage=usage(10 + task, 5 + rollout))
        body = VERIFY.body(response=response, expected_answer=expected, max_words=max_words)
        answer = client.post("/verify", json=body)
        assert answer.status_code == 200, answer.text
        results.append({**answer.json(), "_ng_task_index": task, "_ng_rollout_index": rollout})
    return results


def test_aggregate_metrics_over_http():
    with live_server(new_server().build_app()) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            results = collected(client)
            answer = client.post("/aggregate_metrics", json={"verify_responses": results})
    assert answer.status_code == 200, answer.text
    metrics = answer.json()
    agent = metrics["agent_metrics"]

    # The components are profiled because they are top-level numbers.
    assert agent["mean/correctness"] == pytest.approx(0.5)
    assert agent["mean/format"] == pytest.approx(0.5)
    assert agent["mean/brevity"] == pytest.approx(0.625)
    assert agent["mean/reward"] == pytest.approx((2.0 + 1.0 + 1.25 + 0.0) / 4)

    # compute_metrics: pass@k per component (binary -> unbiased estimate; brevity is not binary -> best of k).
    assert agent["pass@1/correctness"] == pytest.approx(50.0)
    assert agent["pass@2/correctness"] == pytest.approx(100.0)
    assert agent["pass@1/brevity"] == pytest.approx(75.0)
    assert agent["pass@2/brevity"] == pytest.approx(75.0)
    assert agent["pass@2/format"] == pytest.approx(50.0)  # task 1 never has the answer line
    assert agent["pass@1[avg-of-2]/correctness"] == pytest.approx(50.0)
    # majority@2 by extracted answer: task 0 ties "84" (1) with "85" (0) -> 0.5; task 1 has one answer -> 1.
    assert agent["majority@2/correctness"] == pytest.approx(75.0)
    assert agent["pass@1/no_answer"] == pytest.approx(25.0)
    assert agent["per_sample_aggregate"]["correctness"] == pytest.approx([100.0, 0.0])

    # get_key_metrics: the means and each family at its largest k, without no_answer.
    key = metrics["key_metrics"]
    assert set(key) == {
        "mean/reward", "mean/correctness", "mean/format", "mean/brevity", "mean/input_tokens", "mean/output_tokens",
        *(f"{family}/{name}" for family in ("pass@2", "pass@1[avg-of-2]", "majority@2") for name in COMPONENTS),
    }
    assert key["pass@2/correctness"] == agent["pass@2/correctness"]
    assert key["mean/input_tokens"] == pytest.approx(10.5) and key["mean/output_tokens"] == pytest.approx(5.5)

    groups = metrics["group_level_metrics"]
    assert [g["_ng_task_index"] for g in groups] == [0, 1]
    assert groups[0]["mean/correctness"] == pytest.approx(0.5) and groups[1]["mean/brevity"] == pytest.approx(0.25)


def test_aggregate_metrics_of_nothing_is_empty():
    with TestClient(new_server().build_app()) as client:
        answer = client.post("/aggregate_metrics", json={"verify_responses": []})
    assert answer.status_code == 200
    assert answer.json() == {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}


# ----------------------------------------------------------------------------------------------- HTTP and data


def test_http_verify_and_reverify_mode():
    with TestClient(new_server().build_app()) as client:
        answer = client.post("/verify", json=VERIFY.body("Answer: 84"))
        assert answer.status_code == 200
        data = answer.json()
        assert data["reward_components"] == {"correctness": 1.0, "format": 1.0, "brevity": 1.0}
        assert (data["correctness"], data["format"], data["brevity"], data["reward"]) == (1.0, 1.0, 1.0, 2.0)
        assert client.get("/reverify_mode").json() == "stateless"
        bad = client.post("/verify", json=VERIFY.body("Answer: 84", expected_answer="eighty-four"))
        assert bad.status_code == 422 and "expected_answer" in bad.text


def test_example_rows_validate_and_score():
    rows = example_rows(__file__)
    assert len(rows) == 5
    server = new_server()
    for row in rows:
        result = VERIFY.verify_row(row, message(f"Working.\nAnswer: {row['expected_answer']}"), server=server)
        assert components(result) == (1.0, 1.0, 1.0)
        result = VERIFY.verify_row(row, "I am not sure.", server=server)
        assert components(result) == (0.0, 0.0, 1.0)
