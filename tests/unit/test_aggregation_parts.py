"""`/aggregate_metrics` in bounded parts (`nemo_gym.rollouts.aggregation_parts`), in process: a caller's parts each
stay under the budget, the server's route hands `aggregate_metrics` the whole list once, in order, and every way
it can go wrong is an `AggregationFailed` / 409 with the reason."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from nemo_gym.config.types import AggregateMetricsRequest
from nemo_gym.rollouts.aggregation import MAX_STRING_CHARS, stripped_for_aggregation
from nemo_gym.rollouts.aggregation_parts import (
    PART_KEY,
    AggregationFailed,
    AggregationPart,
    AggregationUploads,
    aggregate_metrics_route,
    post_aggregate_metrics,
)
from nemo_gym.rollouts.metrics import compute_aggregate_metrics, compute_pass_majority_metrics


class Recorder:
    """A server whose `aggregate_metrics` records what it was given (as a v0.5 override would see it)."""

    def __init__(self) -> None:
        self.calls: list[list[dict]] = []

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> Any:
        self.calls.append(list(body.verify_responses))
        return compute_aggregate_metrics(
            body.verify_responses, lambda tasks: compute_pass_majority_metrics(tasks, answer_key="answer")[0]
        )


class Client:
    """`ServerClient.post` over a TestClient: records each body's size and passes cookies through."""

    def __init__(self, app: FastAPI) -> None:
        self.http = TestClient(app)
        self.sizes: list[int] = []
        self.global_config_dict = {"max_request_body_bytes": 4096}

    async def post(self, server: str, path: str, *, content: bytes, headers: dict, cookies: Any = None) -> Any:
        self.sizes.append(len(content))
        if cookies:
            self.http.cookies = cookies
        return self.http.post(path, content=content, headers=headers)


def app_for(server: Any) -> FastAPI:
    app = FastAPI()
    app.post("/aggregate_metrics")(aggregate_metrics_route(server))
    return app


def rows(n: int) -> list[dict]:
    return [{"_ng_task_index": i // 4, "_ng_rollout_index": i % 4, "reward": float(i % 3 == 0), "answer": str(i % 2)}
            for i in range(n)]  # fmt: skip


def test_many_rows_go_in_parts_under_the_limit_and_the_server_sees_them_all_once():
    server = Recorder()
    client = Client(app_for(server))
    sent = rows(400)
    answer = asyncio.run(post_aggregate_metrics(client, "agent", sent))
    assert len(client.sizes) > 5 and max(client.sizes) <= 4096
    assert server.calls == [sent]  # one call, every row, in the order sent
    expected = compute_aggregate_metrics(sent, lambda t: compute_pass_majority_metrics(t, answer_key="answer")[0])
    assert answer == orjson.loads(orjson.dumps(expected.model_dump(mode="json")))
    assert answer["agent_metrics"]["majority@4/accuracy"] == expected.agent_metrics["majority@4/accuracy"]


def test_few_rows_go_as_one_plain_v05_body():
    server = Recorder()
    client = Client(app_for(server))
    asyncio.run(post_aggregate_metrics(client, "agent", [orjson.dumps(r) for r in rows(3)]))
    assert len(client.sizes) == 1 and server.calls == [rows(3)]


def test_a_server_without_parts_is_named_not_half_aggregated():
    class OldRoute:  # a v0.5 custom route: takes the body as a plain AggregateMetricsRequest
        async def handler(self, body: AggregateMetricsRequest) -> dict:
            return {"agent_metrics": {"n": len(body.verify_responses)}}

    app = FastAPI()
    app.post("/aggregate_metrics")(OldRoute().handler)
    with pytest.raises(AggregationFailed, match="does not take /aggregate_metrics in parts"):
        asyncio.run(post_aggregate_metrics(Client(app), "agent", rows(400)))


def test_one_row_over_the_limit_is_named():
    client = Client(app_for(Recorder()))
    with pytest.raises(AggregationFailed, match="verify response 1 is .* over `agent`'s max_request_body_bytes"):
        asyncio.run(post_aggregate_metrics(client, "agent", [rows(1)[0], {"x": "y" * 5000}]))


def test_a_part_out_of_order_or_unknown_is_a_409_with_the_reason():
    app = app_for(Recorder())
    http = TestClient(app)
    part = {"verify_responses": rows(2), PART_KEY: {"upload": "u1", "index": 1, "last": False}}
    answer = http.post("/aggregate_metrics", json=part)
    assert answer.status_code == 409 and "holds 0 part(s)" in answer.json()["detail"]


def test_an_idle_upload_expires():
    uploads = AggregationUploads(idle_s=0.0)
    assert uploads.add(AggregationPart(upload="u", index=0, last=False), rows(1)) is None
    with pytest.raises(LookupError, match="sat idle"):
        uploads.add(AggregationPart(upload="u", index=1, last=True), rows(1))
    assert len(uploads) == 0


def test_a_huge_string_is_cut_but_still_compares_exactly():
    huge = "x" * (MAX_STRING_CHARS * 3)
    a = stripped_for_aggregation({"reward": 1.0, "judge": [{"text": huge}], "answer": huge})
    b = stripped_for_aggregation({"reward": 1.0, "judge": [{"text": huge}], "answer": huge[:-1] + "y"})
    assert len(a["judge"][0]["text"]) < MAX_STRING_CHARS + 200 and str(len(huge)) in a["answer"]
    assert a["answer"] != b["answer"] and a["judge"] == stripped_for_aggregation({"judge": [{"text": huge}]})["judge"]
    assert stripped_for_aggregation({"answer": "short"}) == {"answer": "short"}
