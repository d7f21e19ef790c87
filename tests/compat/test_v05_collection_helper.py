"""`RolloutCollectionHelper` and `VLLMConverter` as NeMo Gym v0.5 driver-style code and trainers use them (our own
code, from the spec): `run_examples` against real agent servers found through a real head server, as NeMo RL and
TRL call it (awaitables of `(row, result)` in completion order; a failed `/run` raises aiohttp's
`ClientResponseError` with `.status` and `.response_content`, untried again, so the trainer's policy applies), its
`run_from_config` writing the collector's files, and the vllm_model server's converter turning a Responses request
into Chat Completions parameters."""

from __future__ import annotations

import asyncio
import json
import pickle
import socket

import aiohttp
import pytest
import yaml
from fastapi import HTTPException

from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, Body, SimpleResponsesAPIAgent
from nemo_gym.http import external
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
from nemo_gym.runtime.head_server import HeadServer
from nemo_gym.server_utils import BaseServerConfig, ServerClient, get_global_aiohttp_client
from nemo_gym.testing.live_server import live_servers
from nemo_gym.testing.servers import make_server
from nemo_gym.testing.stack import free_port
from responses_api_models.vllm_model.app import VLLMConverter

CONNECTOR_LIMIT = 321
CONNECTOR_LIMIT_PER_HOST = 123


class EchoAgent(SimpleResponsesAPIAgent):
    """Rewards a row with its `score`; a row whose `score` is negative fails (HTTP 400). Counts its `/run`s and
    the most it ran at once."""

    config: BaseResponsesAPIAgentConfig
    calls: int = 0
    running: int = 0
    most_at_once: int = 0

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        raise HTTPException(status_code=501, detail="not used")

    async def run(self, body: dict = Body()) -> dict:
        self.calls += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await asyncio.sleep(0.02)  # long enough for unbounded runs to overlap
        finally:
            self.running -= 1
        if body["score"] < 0:
            raise HTTPException(status_code=400, detail="negative score")
        return {**body, "reward": float(body["score"])}


class CrashingAgent(EchoAgent):
    """Its `/run` raises, which the errors layer answers with a 500 naming the exception."""

    async def run(self, body: dict = Body()) -> dict:
        self.calls += 1
        raise RuntimeError("the agent crashed on purpose")


@pytest.fixture(autouse=True)
def no_loaded_client_config(monkeypatch):
    """`setup_server_client` (which run_examples calls) keeps the head server's config for the global client."""
    monkeypatch.setattr(external, "_configured", None)


@pytest.fixture(scope="module")
def stack():
    """Real agent servers and a real head server that serves their config, as `ng_run` would."""
    agents = {"echo_agent": make_server(EchoAgent, name="echo_agent"),
              "crashing_agent": make_server(CrashingAgent, name="crashing_agent")}  # fmt: skip
    config: dict = {
        "global_aiohttp_connector_limit": CONNECTOR_LIMIT,
        "global_aiohttp_connector_limit_per_host": CONNECTOR_LIMIT_PER_HOST,
    }
    with live_servers(agents, config):
        port = free_port()
        config["head_server"] = {"host": "127.0.0.1", "port": port}
        head = HeadServer(yaml.safe_dump(config), lambda: [])
        head.start(socket.create_server(("127.0.0.1", port)))
        try:
            yield BaseServerConfig(host="127.0.0.1", port=port), agents
        finally:
            head.stop()


@pytest.fixture()
def client(stack):
    _, agents = stack
    config: dict = {}
    with live_servers({"echo_agent": agents["echo_agent"]}, config):
        yield ServerClient(global_config_dict=config)


def row(score: float, agent: str = "echo_agent") -> dict:
    return {"responses_create_params": {"input": f"score {score}"}, "agent_ref": {"name": agent}, "score": score}


async def collect(helper: RolloutCollectionHelper, rows: list[dict], **kwargs) -> tuple[list, list]:
    """Await every task as a trainer does; returns (successes as (score, reward), failures as exceptions)."""
    done, failed = [], []
    for task in helper.run_examples(examples=rows, **kwargs):
        try:
            sent, result = await task
        except aiohttp.ClientResponseError as error:
            failed.append(error)
            continue
        done.append((sent["score"], result["reward"]))
    return done, failed


async def test_run_examples_gives_rows_and_the_agents_answers_as_they_complete(stack):
    head, _ = stack
    done, failed = await collect(RolloutCollectionHelper(), [row(2), row(1), row(0)], head_server_config=head,
                                 semaphore=None)  # fmt: skip
    assert sorted(done) == [(0, 0.0), (1, 1.0), (2, 2.0)] and failed == []


async def test_a_run_answered_500_raises_with_its_status_and_body_once_and_the_others_finish(stack):
    head, agents = stack
    crashing = agents["crashing_agent"]
    before = crashing.calls
    done, failed = await collect(RolloutCollectionHelper(), [row(1), row(7, "crashing_agent"), row(2)],
                                 head_server_config=head)  # fmt: skip
    assert sorted(done) == [(1, 1.0), (2, 2.0)]
    assert [error.status for error in failed] == [500]
    assert "the agent crashed on purpose" in failed[0].response_content
    assert crashing.calls - before == 1  # not retried: the trainer decides


async def test_the_error_crosses_a_process_boundary_with_its_status_and_body(stack):
    """Trainers collect inside a Ray actor: the error must pickle (aiohttp's own does not: its header proxies)."""
    head, _ = stack
    _, failed = await collect(RolloutCollectionHelper(), [row(7, "crashing_agent")], head_server_config=head)
    copy = pickle.loads(pickle.dumps(failed[0]))
    assert isinstance(copy, aiohttp.ClientResponseError) and copy.status == 500
    assert copy.response_content == failed[0].response_content and str(copy) == str(failed[0])


async def test_a_run_answered_4xx_raises_with_its_status_and_body(stack):
    head, _ = stack
    done, failed = await collect(RolloutCollectionHelper(), [row(-1)], head_server_config=head)
    assert done == [] and [error.status for error in failed] == [400]
    assert "negative score" in failed[0].response_content


async def test_a_semaphore_bounds_how_many_run_at_once(stack):
    head, agents = stack
    echo = agents["echo_agent"]
    echo.most_at_once = 0
    done, _ = await collect(RolloutCollectionHelper(), [row(i) for i in range(6)], head_server_config=head,
                            semaphore=asyncio.Semaphore(1))  # fmt: skip
    assert len(done) == 6 and echo.most_at_once == 1


async def test_the_global_client_is_sized_by_the_stacks_connector_limits(stack):
    head, _ = stack
    await collect(RolloutCollectionHelper(), [row(1)], head_server_config=head)
    connector = get_global_aiohttp_client().connector
    assert (connector.limit, connector.limit_per_host) == (CONNECTOR_LIMIT, CONNECTOR_LIMIT_PER_HOST)


async def test_a_row_without_an_agent_is_refused_before_anything_runs(stack):
    head, agents = stack
    before = agents["echo_agent"].calls
    with pytest.raises(ValueError, match=r"example 1 names no agent.*agent_ref"):
        RolloutCollectionHelper().run_examples([row(1), {"score": 2}], head_server_config=head)
    assert agents["echo_agent"].calls == before


def test_run_examples_outside_an_event_loop_says_so(stack):
    head, _ = stack
    with pytest.raises(RuntimeError, match="running event loop"):
        RolloutCollectionHelper().run_examples([row(1)], head_server_config=head)


def test_iter_results_keeps_the_collectors_retries_and_failures_as_results(client):
    async def go() -> list:
        helper = RolloutCollectionHelper(server_client=client)
        results = helper.iter_results([row(1), row(-1)], max_attempts=1)
        return [(r.row["score"], r.ok, r.status_code) async for r in results]

    assert sorted(asyncio.run(go())) == [(-1, False, 400), (1, True, None)]


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
