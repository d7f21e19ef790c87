"""`RolloutCollectionHelper` and `VLLMConverter` as NeMo Gym v0.5 driver-style code uses them (our own code, from
the spec): the helper's `run_examples` against a real agent server (awaitables of `(row, result)`, failures as
`None` after retries), its `run_from_config` writing the collector's files, and the vllm_model
server's converter turning a Responses request into Chat Completions parameters."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import HTTPException

from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, Body, SimpleResponsesAPIAgent
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing.live_server import live_servers
from nemo_gym.testing.servers import make_server
from responses_api_models.vllm_model.app import VLLMConverter


class EchoAgent(SimpleResponsesAPIAgent):
    """Rewards a row with its `score`; a row whose `score` is negative fails (HTTP 400, not retried)."""

    config: BaseResponsesAPIAgentConfig

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        raise HTTPException(status_code=501, detail="not used")

    async def run(self, body: dict = Body()) -> dict:
        if body["score"] < 0:
            raise HTTPException(status_code=400, detail="negative score")
        return {**body, "reward": float(body["score"])}


@pytest.fixture()
def client():
    config: dict = {}
    with live_servers({"echo_agent": make_server(EchoAgent, name="echo_agent")}, config):
        yield ServerClient(global_config_dict=config)


def row(score: float) -> dict:
    return {"responses_create_params": {"input": f"score {score}"}, "agent_ref": {"name": "echo_agent"}, "score": score}


def test_run_examples_yields_rows_and_results_as_they_complete_and_none_for_a_failure(client):
    async def go() -> list:
        helper = RolloutCollectionHelper(server_client=client)
        out = []
        for future in helper.run_examples([row(2), row(1), row(-1)], max_attempts=1):
            sent, result = await future
            out.append((sent["score"], None if result is None else result["reward"]))
        return out

    assert sorted(asyncio.run(go())) == [(-1, None), (1, 1.0), (2, 2.0)]


def test_run_from_config_is_the_collector(client, tmp_path):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(row(s)) + "\n" for s in (1, 0)))
    config = RolloutCollectionConfig(
        input_jsonl_fpath=str(tmp_path / "in.jsonl"), output_jsonl_fpath=str(tmp_path / "out.jsonl"),
        num_repeats=2, progress_bar=False,
    )
    code = asyncio.run(RolloutCollectionHelper(server_client=client).run_from_config(config))
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"], r["reward"]) for r in rows) == [
        (0, 0, 1.0), (0, 1, 1.0), (1, 0, 0.0), (1, 1, 0.0)]  # fmt: skip
    assert (tmp_path / "out_materialized_inputs.jsonl").exists()


def test_vllm_converter_turns_a_responses_request_into_chat_completion_params():
    converter = VLLMConverter(return_token_id_information=False)
    chat = converter.responses_to_chat_completion_create_params(
        {"model": "m", "instructions": "Be brief.", "input": [{"role": "user", "content": "hi"}], "temperature": 0.5}
    )
    dumped = chat.model_dump(exclude_unset=True)
    assert dumped["model"] == "m" and dumped["temperature"] == 0.5
    assert [(m["role"], m["content"]) for m in dumped["messages"]] == [("system", "Be brief."), ("user", "hi")]
    same = converter.responses_to_chat_completion_create_params(
        NeMoGymResponseCreateParamsNonStreaming(model="m", instructions="Be brief.", input="hi", temperature=0.5)
    )
    assert [(m["role"], m["content"]) for m in same.model_dump(exclude_unset=True)["messages"]] == [
        ("system", "Be brief."), ("user", "hi")]  # fmt: skip
