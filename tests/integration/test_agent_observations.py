"""A harness-style agent's `ng_agent_observations` through the collector (NeMo Gym v0.5 §7.2).

The stack, served by uvicorn on loopback: the fake LLM backend, `policy_model` (openai_model) capturing into a
folder, and an agent written the way SDK-driven harnesses are (Claude Code, Codex): inside `/run` it calls the model
with the openai SDK on `resolve_model_base_url(..., rollout_id)`, then reports in its answer an
`AgentObservationBundle` naming those calls by the ids of the answers it got. The collector (`iter_rollouts`, the
core of `ng_collect_rollouts`) joins each bundle with the rollout's captured calls: references get the capture's
`model_call_id`; a reference to a call the harness made outside the rollout (no prefix, so never captured) becomes
an `agent_observation_join_failed` gap, and the rollout is still a success with its reward.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Iterator

import openai
import pytest
from fastapi import HTTPException
from fastapi.responses import JSONResponse

from nemo_gym.base_responses_api_agent import AgentRunRequest, BaseResponsesAPIAgentConfig, Body, SimpleResponsesAPIAgent
from nemo_gym.config_types import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_collection import iter_rollouts
from nemo_gym.rollout_observability import AgentObservationBundle
from nemo_gym.testing.fake_openai_server import build_app as build_fake_llm
from nemo_gym.testing.live_server import live_server, live_servers
from nemo_gym.testing.servers import make_server, make_server_client
from responses_api_models.openai_model.app import SimpleModelServer

SERVE = {"stop_timeout": 15, "timeout_graceful_shutdown": 1}


class HarnessAgentConfig(BaseResponsesAPIAgentConfig):
    model_server: ModelServerRef


class HarnessAgent(SimpleResponsesAPIAgent):
    """A main agent that plans with one Responses call and hands a subtask to a subagent (one Chat call); with
    `outside_call` in the row it also makes a call without the rollout's prefix and reports it all the same."""

    config: HarnessAgentConfig

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        raise HTTPException(status_code=501, detail="this harness only runs whole rows (/run)")

    async def run(self, body: AgentRunRequest) -> JSONResponse:
        row = body.model_dump(mode="json", exclude_unset=True)
        model = self.config.model_server.name
        rollout_id = self.rollout_id_from_run(body)
        sdk = openai.AsyncOpenAI(base_url=self.resolve_model_base_url(model, rollout_id), api_key="x", max_retries=0)
        plan = await sdk.responses.create(model="m", input=row["question"])
        sub = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "look around"}])
        main_calls = [{"model_ref": model, "response_id": plan.id}]
        if row.get("outside_call"):
            outside = openai.AsyncOpenAI(base_url=self.resolve_model_base_url(model), api_key="x", max_retries=0)
            main_calls.append({"model_ref": model, "response_id": (await outside.responses.create(model="m", input="aside")).id})
        observations = {
            "source": "harness_agent",
            "records": [
                {"kind": "agent_invocation", "invocation_id": "main", "agent": "harness", "status": "completed",
                 "model_calls": main_calls},
                {"kind": "agent_invocation", "invocation_id": "sub", "parent_invocation_id": "main",
                 "agent": "explorer", "status": "completed", "model_calls": [{"model_ref": model, "response_id": sub.id}]},
                {"kind": "tool_call", "invocation_id": "main", "name": "delegate",
                 "model_call": {"model_ref": model, "response_id": plan.id}},
            ],
        }
        reward = 1.0 if row["expected"] in plan.output_text else 0.0
        return JSONResponse({**row, "reward": reward, "response": plan.model_dump(mode="json"),
                             "ng_agent_observations": observations})


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[dict, Path]]:
    capture_dir = tmp_path_factory.mktemp("captures")
    global_config: dict = {"observability_enabled": True, "model_call_capture_dir": str(capture_dir)}
    client = make_server_client(global_config)
    with live_server(build_fake_llm(), **SERVE) as backend:
        servers = {
            "policy_model": make_server(SimpleModelServer, name="policy_model", server_client=client,
                                        openai_base_url=backend + "/v1", openai_api_key="k", openai_model="fake-model"),
            "harness_agent": make_server(HarnessAgent, name="harness_agent", server_client=client,
                                         model_server={"type": "responses_api_models", "name": "policy_model"}),
        }
        with live_servers(servers, global_config, **SERVE):
            yield global_config, capture_dir


def collect(global_config: dict, rows: list[dict]) -> list:
    async def run() -> list:
        return [r async for r in iter_rollouts(rows, server_client=make_server_client(global_config),
                                               agent_name="harness_agent")]

    return sorted(asyncio.run(run()), key=lambda r: r.row["_ng_task_index"])


def captured(capture_dir: Path, rollout_id: str) -> dict[str, str]:
    """answer id -> the capture's model_call_id, from the rollout's capture file."""
    lines = [json.loads(line) for line in (capture_dir / f"{rollout_id}.capture.jsonl").read_text().splitlines()]
    return {line["response"]["id"]: line["model_call_id"] for line in lines}


def row(task: int, **fields) -> dict:
    return {"responses_create_params": {"input": "plan"}, "question": f"task {task}", "expected": f"task {task}",
            "_ng_task_index": task, "_ng_rollout_index": 0, **fields}


def test_the_collector_joins_each_bundle_with_its_rollouts_captured_calls(stack):
    global_config, capture_dir = stack
    joined, partly = collect(global_config, [row(0), row(1, outside_call=True)])

    assert joined.ok and joined.result["reward"] == 1.0
    ids = captured(capture_dir, "0-0")
    assert len(ids) == 2  # the plan and the subagent's call
    capture = joined.result["ng_model_call_capture"]
    assert "gaps" not in capture and sorted(c["model_call_id"] for c in capture["calls"]) == sorted(ids.values())
    bundle = joined.result["ng_agent_observations"]
    refs = [bundle["records"][0]["model_calls"][0], bundle["records"][1]["model_calls"][0], bundle["records"][2]["model_call"]]
    assert [r["model_call_id"] for r in refs] == [ids[r["response_id"]] for r in refs]
    assert refs[0]["model_call_id"] == refs[2]["model_call_id"] != refs[1]["model_call_id"]
    main, sub = AgentObservationBundle.model_validate(bundle).episodes(capture["calls"])
    assert (main.num_model_calls, sub.num_model_calls, sub.depth, main.child_invocation_ids) == (1, 1, 1, ["sub"])
    assert main.tokens_total + sub.tokens_total == capture["metrics"]["tokens_total"]

    # The call made without the prefix was answered but not captured: the gap says which reference, the rollout
    # is a success all the same and keeps its reward.
    assert partly.ok and partly.error_type is None and partly.result["reward"] == 1.0
    ids = captured(capture_dir, "1-0")
    assert len(ids) == 2
    (gap,) = partly.result["ng_model_call_capture"]["gaps"]
    assert (gap["code"], gap["invocation_id"]) == ("agent_observation_join_failed", "main")
    main_calls = partly.result["ng_agent_observations"]["records"][0]["model_calls"]
    outside = main_calls[1]["response_id"]
    assert outside not in ids and "model_call_id" not in main_calls[1]
    assert gap["detail"] == (
        "1 model call reference(s) not joined with the 2 captured call(s) of rollout 1-0: records[0] "
        f"(agent_invocation 'main') model_ref='policy_model' response_id='{outside}': no captured call of that "
        "model server answered with this id"
    )
    assert main_calls[0]["model_call_id"] == ids[main_calls[0]["response_id"]]
