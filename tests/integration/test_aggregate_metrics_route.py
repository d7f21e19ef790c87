"""`POST /aggregate_metrics` over real HTTP (the framework's app under uvicorn): a resources server whose hooks use
the v0.5 helpers scores rollouts through its own `/verify`, then aggregates them the way the collector sends them
(indices added, `response` cut down to its usage); an agent with hooks of its own; the default hooks; and the
duplicate-key error as the HTTP 500 a caller sees."""

from __future__ import annotations

import json
import re
from typing import Optional

import httpx
import pytest

from nemo_gym.reward_profile import (
    compute_pass_majority_metrics,
    compute_subset_metrics,
    highest_k_metrics,
)
from nemo_gym.servers.agent_server import AgentRunRequest, AgentVerifyResponse, SimpleResponsesAPIAgent
from nemo_gym.servers.resources_server import (
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.api.schemas import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.responses import make_response
from nemo_gym.testing.servers import make_server

# ------------------------------------------------------------------------------------------------------------
# A resources server as a v0.5 environment writes one: verify extracts "ANSWER: <x>", metrics by pass@k/majority@k


class AnswerRunRequest(BaseRunRequest):
    expected_answer: str
    difficulty: str = ""


class AnswerVerifyRequest(AnswerRunRequest, BaseVerifyRequest):
    pass


class AnswerVerifyResponse(AnswerVerifyRequest, BaseVerifyResponse):
    extracted_answer: Optional[str] = None


class AnswerServer(SimpleResourcesServer):
    async def verify(self, body: AnswerVerifyRequest) -> AnswerVerifyResponse:
        found = re.findall(r"ANSWER:\s*(\S+)", body.response.output_text)
        answer = found[-1] if found else None
        return AnswerVerifyResponse(
            **body.model_dump(), reward=float(answer == body.expected_answer), extracted_answer=answer
        )

    def compute_metrics(self, tasks: list[list[dict]]) -> dict:
        metrics = compute_pass_majority_metrics(tasks, answer_key="extracted_answer")[0]
        return {**metrics, **compute_subset_metrics(tasks, "difficulty", answer_key="extracted_answer")}

    def get_key_metrics(self, agent_metrics: dict) -> dict:
        key = {name: agent_metrics[name] for name in ("mean/input_tokens", "mean/output_tokens")}
        for pattern in ("pass@{k}", "pass@1[avg-of-{k}]", "majority@{k}"):
            key.update(highest_k_metrics(agent_metrics, pattern, exclude_names=["no_answer"]))
        return key


class PlainServer(SimpleResourcesServer):
    """No metric hooks of its own: the defaults."""

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


# The spec's vector as model output: task 0 expects "4" (answers 4, 5, 4), task 1 expects "8" (none, 7, 8).
ROLLOUT_TEXTS = [
    ("4", "easy", ["ANSWER: 4", "ANSWER: 5", "I think ANSWER: 4"]),
    ("8", "hard", ["no idea", "ANSWER: 7", "ANSWER: 8"]),
]


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def verified_rollouts(client: httpx.Client) -> list[dict]:
    """Score every rollout with the server's `/verify`, then strip each result as the collector does."""
    results = []
    for task, (expected, difficulty, texts) in enumerate(ROLLOUT_TEXTS):
        for rollout, text in enumerate(texts):
            response = make_response(text, response_id=f"resp_{task}_{rollout}", usage=usage(10 + task, 2 + rollout))
            body = {
                "responses_create_params": {"input": [{"role": "user", "content": "what is it?"}]},
                "expected_answer": expected,
                "difficulty": difficulty,
                "response": response.model_dump(mode="json"),
            }
            verified = client.post("/verify", json=body)
            assert verified.status_code == 200, verified.text
            row = verified.json()
            stripped = {k: v for k, v in row.items() if k not in ("response", "responses_create_params")}
            stripped["response"] = {"usage": row["response"]["usage"]}
            results.append({"_ng_task_index": task, "_ng_rollout_index": rollout, **stripped})
    results.reverse()  # the server must not rely on the order it receives them in
    return results


@pytest.fixture(scope="module")
def answer_server_url():
    with live_server(make_server(AnswerServer, name="answers", domain="math").build_app()) as url:
        yield url


def test_resources_server_aggregates_its_own_verify_responses(answer_server_url):
    with httpx.Client(base_url=answer_server_url, timeout=30) as client:
        responses = verified_rollouts(client)
        answer = client.post("/aggregate_metrics", json={"verify_responses": responses})
    assert answer.status_code == 200, answer.text
    assert "NaN" not in answer.text
    out = answer.json()
    assert set(out) == {"group_level_metrics", "agent_metrics", "key_metrics"}

    key = out["key_metrics"]
    assert set(key) == {
        "mean/input_tokens",
        "mean/output_tokens",
        "pass@3/accuracy",
        "pass@1[avg-of-3]/accuracy",
        "majority@3/accuracy",
    }
    assert key["pass@3/accuracy"] == pytest.approx(100.0, abs=0.01)
    assert key["pass@1[avg-of-3]/accuracy"] == pytest.approx(50.0, abs=0.01)
    assert key["majority@3/accuracy"] == pytest.approx(75.0, abs=0.01)
    assert key["mean/input_tokens"] == pytest.approx(10.5)
    assert key["mean/output_tokens"] == pytest.approx(3.0)

    agent = out["agent_metrics"]
    assert agent["pass@2/accuracy"] == pytest.approx(83.33, abs=0.01)
    assert agent["pass@1/no_answer"] == pytest.approx(16.67, abs=0.01)
    assert agent["pass@1[avg-of-3]/accuracy/std_err_across_runs"] == pytest.approx(28.87, abs=0.01)
    assert agent["per_sample_aggregate"]["accuracy"] == pytest.approx([50.0, 0.0, 100.0], abs=0.01)
    assert agent["easy/pass@1/accuracy"] == pytest.approx(66.67, abs=0.01)
    assert agent["hard/majority@3/accuracy"] == pytest.approx(50.0, abs=0.01)
    assert agent["mean/reward"] == pytest.approx(0.5) and agent["max/reward"] == 1.0

    groups = out["group_level_metrics"]
    assert [g["_ng_task_index"] for g in groups] == [0, 1]
    assert [[info["reward"] for info in g["rollout_infos"]] for g in groups] == [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
    assert [info["rollout_id"] for info in groups[1]["rollout_infos"]] == ["1:0", "1:1", "1:2"]
    assert groups[1]["rollout_infos"][2]["output_tokens"] == 4.0
    assert groups[0]["mean/reward"] == pytest.approx(2 / 3)
    assert groups[0]["num_rollouts"] == 3 and groups[0]["reward_profile_completion_pct"] == 100.0


def test_duplicate_keys_are_an_http_500_naming_the_key(answer_server_url):
    rows = [{"_ng_task_index": 2, "_ng_rollout_index": 1, "reward": 1.0}, {"_ng_task_index": 2, "_ng_rollout_index": 1}]
    with httpx.Client(base_url=answer_server_url, timeout=30) as client:
        answer = client.post("/aggregate_metrics", json={"verify_responses": rows})
    assert answer.status_code == 500
    message = answer.json()
    assert message.startswith("ValueError: ")
    assert "_ng_task_index=2, _ng_rollout_index=1" in message


def test_empty_request_and_default_hooks():
    with live_server(make_server(PlainServer, name="plain", domain="other").build_app()) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            empty = client.post("/aggregate_metrics", json={"verify_responses": []})
            rows = [
                {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {"usage": usage(5, 1)}},
                {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "response": {"usage": usage(7, 3)}},
            ]
            answer = client.post("/aggregate_metrics", json={"verify_responses": rows})
    assert empty.status_code == 200 and empty.json() == {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["key_metrics"] == {k: v for k, v in out["agent_metrics"].items() if k.startswith("mean/")}
    assert out["key_metrics"]["mean/input_tokens"] == 6.0
    assert not [k for k in out["agent_metrics"] if "@" in k]


# ------------------------------------------------------------------------------------------------------------
# An agent with its own hooks (the aggregation runs in the agent, not proxied)


class CountingAgent(SimpleResponsesAPIAgent):
    """An agent that is never run here: only its `/aggregate_metrics` hooks are under test."""

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        raise NotImplementedError("not used by this test")

    async def run(self, body: AgentRunRequest) -> AgentVerifyResponse:
        raise NotImplementedError("not used by this test")

    def compute_metrics(self, tasks: list[list[dict]]) -> dict:
        metrics = compute_pass_majority_metrics(tasks, score_fn=lambda r: {"solved": r["reward"] >= 1.0})[0]
        per_task = [{"_ng_task_index": t[0]["_ng_task_index"], "turns": sum(r["turns"] for r in t)} for t in tasks]
        return {**metrics, "per_task_metrics": per_task, "mean/turns": -1.0}

    def get_key_metrics(self, agent_metrics: dict) -> dict:
        return highest_k_metrics(agent_metrics, "pass@{k}", score_names=["solved"])


def test_agent_aggregates_with_its_own_hooks():
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "turns": 3},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "turns": 5},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "turns": 2},
        {"_ng_task_index": 1, "_ng_rollout_index": 1, "reward": 0.0, "turns": 2},
    ]
    with live_server(make_server(CountingAgent, name="counting_agent").build_app()) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            answer = client.post("/aggregate_metrics", json={"verify_responses": rows})
            duplicate = client.post("/aggregate_metrics", json={"verify_responses": [{"reward": 1}, {"reward": 0}]})
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["key_metrics"] == {"pass@2/solved": 50.0}
    assert out["agent_metrics"]["pass@1/solved"] == 25.0
    assert out["agent_metrics"]["mean/turns"] == -1.0  # the agent's own metric wins over the baseline
    assert out["agent_metrics"]["max/turns"] == 5.0
    assert [g["turns"] for g in out["group_level_metrics"]] == [8, 4]
    assert [g["mean/turns"] for g in out["group_level_metrics"]] == [4.0, 2.0]
    json.dumps(out, allow_nan=False)
    assert duplicate.status_code == 500 and "_ng_task_index=0, _ng_rollout_index=0" in duplicate.json()
