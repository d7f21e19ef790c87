"""The three server kinds as environment code writes them: a resources server with a tool and per-session state,
a model server, and an agent that calls both by server id with cookies threaded through (all over real HTTP)."""

from __future__ import annotations

import json
from unittest.mock import MagicMock

import httpx
import pytest
from fastapi import Body, Request, Response
from pydantic import Field

from nemo_gym.servers.resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.servers.agent_server import (
    AgentRunRequest,
    AgentVerifyResponse,
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
)
from nemo_gym.servers.model_server import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.config.types import ModelServerRef, ResourcesServerRef
from nemo_gym.api.schemas import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.servers.base import SESSION_ID_KEY, ServerClient, get_response_json, raise_for_status
from nemo_gym.testing.counter_server import CounterResourcesServer, CounterSeedSessionRequest
from nemo_gym.testing.live_server import live_servers
from nemo_gym.testing.responses import function_call, make_response
from nemo_gym.testing.servers import make_server, make_server_client
from tests.unit.test_server_utils import live_server

# ------------------------------------------------------------------------------------------------------------
# A tiny resources server: a counter per session, a tool that increments it, verify compares with the target
# (nemo_gym.testing's counter server), plus a config field of its own.


class CounterConfig(BaseResourcesServerConfig):
    start_at: int = 0


class CounterServer(CounterResourcesServer):
    config: CounterConfig

    def initial_count(self, body: CounterSeedSessionRequest) -> int:
        return self.config.start_at + body.initial_count


class DefaultSeedServer(SimpleResourcesServer):
    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.5)


def response_dict(text: str, *, call: dict | None = None, rid: str = "resp_1") -> dict:
    output = function_call(call["name"], call["arguments"]) if call is not None else text
    return make_response(output, response_id=rid, model="scripted").model_dump(mode="json")


ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "add two to the counter"}]},
    "expected_count": 5,
}


def test_resources_server_tool_route_and_per_session_state_end_to_end():
    server = make_server(CounterServer, name="counter", start_at=1)
    with live_server(server.build_app()) as url:
        with httpx.Client(base_url=url) as rollout_a, httpx.Client(base_url=url) as rollout_b:
            assert rollout_a.post("/seed_session", json={"initial_count": 2}).json() == {}
            assert rollout_b.post("/seed_session", json={"initial_count": 100}).json() == {}
            assert rollout_a.post("/increment_counter", json={"count": 1}).json() == {"count": 4}
            assert rollout_b.post("/increment_counter", json={}).json() == {"count": 102}
            assert rollout_a.post("/increment_counter", json={"count": 1}).json() == {"count": 5}

            verify_body = {**ROW, "response": response_dict("done"), "unknown_field": "dropped"}
            verified = rollout_a.post("/verify", json=verify_body)
            assert verified.status_code == 200, verified.text
            result = verified.json()
            assert result["reward"] == 1.0 and result["final_count"] == 5 and result["expected_count"] == 5
            assert result["response"]["output"][0]["content"][0]["text"] == "done"
            assert result["responses_create_params"]["input"][0]["content"] == "add two to the counter"
            assert "unknown_field" not in result  # extra="ignore", as in the reference

            lost = rollout_b.post("/verify", json={**ROW, "expected_count": 0, "response": response_dict("x")})
            assert lost.json()["reward"] == 0.0 and lost.json()["final_count"] == 102
            assert "/health" in [r.path for r in server_app_routes(server)]
        assert server.counters == {}


def server_app_routes(server):
    return server.build_app().router.routes


def test_resources_server_default_seed_session_and_validation():
    server = make_server(DefaultSeedServer, name="plain")
    with live_server(server.build_app()) as url:
        seeded = httpx.post(f"{url}/seed_session", json={"anything": [1, 2]})
        assert seeded.status_code == 200 and seeded.json() == {}
        assert "DefaultSeedServer___plain" in seeded.cookies
        bad = httpx.post(f"{url}/verify", json={"responses_create_params": {"input": "hi", "not_a_param": 1}, "response": response_dict("x")})
        assert bad.status_code == 422  # strict Responses create params
        ok = httpx.post(f"{url}/verify", json={"responses_create_params": {"input": "hi"}, "response": response_dict("x")})
        assert ok.status_code == 200 and ok.json()["reward"] == 0.5


def test_resources_server_verify_is_abstract():
    class NoVerify(SimpleResourcesServer):
        pass

    with pytest.raises(TypeError):
        make_server(NoVerify, name="x")


def test_reference_style_direct_construction_and_call():
    """Environment tests build servers with a mocked client and call handlers directly."""
    server = DefaultSeedServer(
        config=BaseResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name=""),
        server_client=MagicMock(spec=ServerClient),
    )
    import asyncio

    body = BaseVerifyRequest.model_validate({"responses_create_params": {"input": "hi"}, "response": response_dict("x")})
    result = asyncio.run(server.verify(body))
    assert result.reward == 0.5 and result.response.output[0].type == "message"


# ------------------------------------------------------------------------------------------------------------
# A model server with scripted answers


class ScriptedModelConfig(BaseResponsesAPIModelConfig):
    tool_name: str = "increment_counter"


class ScriptedModel(SimpleResponsesAPIModel):
    """First call of a session asks for the tool; the next one answers. Pinned per session, like vllm_model."""

    config: ScriptedModelConfig
    calls: dict[str, int] = Field(default_factory=dict)

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        session_id = request.session[SESSION_ID_KEY]
        n = self.calls[session_id] = self.calls.get(session_id, 0) + 1
        if n == 1:
            return NeMoGymResponse.model_validate(response_dict("", call={"name": self.config.tool_name, "arguments": {"count": 2}}))
        return NeMoGymResponse.model_validate(response_dict(f"done after {len(body.input)} items", rid=f"resp_{n}"))

    async def chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()
    ) -> NeMoGymChatCompletion:
        return NeMoGymChatCompletion.model_validate(
            {
                "id": "chat_1",
                "created": 1,
                "model": body.model or "scripted",
                "object": "chat.completion",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": f"{len(body.messages)} messages"}}],
            }
        )


def test_model_server_routes():
    model = make_server(ScriptedModel, name="policy")
    with live_server(model.build_app()) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "ignored": 1})
        assert chat.status_code == 200, chat.text
        assert chat.json()["choices"][0]["message"]["content"] == "1 messages"
        first = httpx.post(f"{url}/v1/responses", json={"input": "hi"})
        assert first.status_code == 200 and first.json()["output"][0]["type"] == "function_call"
        strict = httpx.post(f"{url}/v1/responses", json={"input": "hi", "nonsense": True})
        assert strict.status_code == 422


def test_model_server_is_abstract():
    class Half(SimpleResponsesAPIModel):
        async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
            raise NotImplementedError

    with pytest.raises(TypeError):
        make_server(Half, name="m")


# ------------------------------------------------------------------------------------------------------------
# An agent calling both by server id, threading cookies


class LoopAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = 4


class LoopAgent(SimpleResponsesAPIAgent):
    config: LoopAgentConfig

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming = Body()
    ) -> NeMoGymResponse:
        cookies = dict(request.cookies)
        params = body.model_dump(exclude_unset=True)
        items = params["input"] if isinstance(params["input"], list) else [{"role": "user", "content": params["input"]}]
        new_items: list = []
        last: dict = {}
        for _ in range(self.config.max_steps):
            r = await self.server_client.post(
                self.config.model_server.name, "/v1/responses", json={**params, "input": items + new_items}, cookies=cookies
            )
            await raise_for_status(r)
            cookies.update(dict(r.cookies))
            last = await get_response_json(r)
            new_items.extend(last["output"])
            calls = [o for o in last["output"] if o["type"] == "function_call"]
            if not calls:
                break
            for call in calls:
                t = await self.server_client.post(
                    self.config.resources_server.name, f"/{call['name']}", json=json.loads(call["arguments"]), cookies=cookies
                )
                cookies.update(dict(t.cookies))
                new_items.append({"type": "function_call_output", "call_id": call["call_id"], "output": await t.text()})
        for name, value in cookies.items():  # hand the inner sessions back to /run
            response.set_cookie(name, value)
        return NeMoGymResponse.model_validate({**last, "output": new_items})

    async def run(self, request: Request, body: AgentRunRequest) -> AgentVerifyResponse:
        row = body.model_dump(exclude_unset=True)
        seed = await self.server_client.post(self.config.resources_server.name, "/seed_session", json=row)
        await raise_for_status(seed)
        cookies = dict(seed.cookies)
        episode = await self.server_client.post(
            self.config.name, "/v1/responses", json=row["responses_create_params"], cookies=cookies
        )
        await raise_for_status(episode)
        cookies.update(dict(episode.cookies))
        verify = await self.server_client.post(
            self.config.resources_server.name, "/verify", json={**row, "response": await get_response_json(episode)}, cookies=cookies
        )
        await raise_for_status(verify)
        result = await get_response_json(verify)
        return AgentVerifyResponse.model_validate({**row, **result})


def loop_agent(name: str, client: ServerClient) -> LoopAgent:
    return make_server(
        LoopAgent,
        name=name,
        server_client=client,
        resources_server={"type": "resources_servers", "name": "counter"},
        model_server={"type": "responses_api_models", "name": "policy"},
    )


def serve(servers: dict, global_config: dict):
    """The servers over real HTTP (uvicorn's httptools parser, as run_webserver serves apps), by name."""
    return live_servers(servers, global_config, http="httptools", start_timeout=10)


def test_agent_run_end_to_end_with_cookies_threaded():
    global_config: dict = {}
    client = make_server_client(global_config)
    resources = make_server(CounterServer, name="counter", server_client=client)
    model = make_server(ScriptedModel, name="policy", server_client=client)
    agent = loop_agent("counter_agent", client)
    with serve({"counter": resources, "policy": model, "counter_agent": agent}, global_config) as urls:
        rows = [{**ROW, "expected_count": 2, "dataset_field": i} for i in range(3)]
        results = [httpx.post(f"{urls['counter_agent']}/run", json=row, timeout=30) for row in rows]
        for i, r in enumerate(results):
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["reward"] == 1.0 and out["final_count"] == 2
            assert out["dataset_field"] == i  # AgentRunRequest / AgentVerifyResponse keep extra fields
            kinds = [o["type"] for o in out["response"]["output"]]
            assert kinds == ["function_call", "function_call_output", "message"]
            assert json.loads(out["response"]["output"][1]["output"]) == {"count": 2}
        # Each rollout had its own session on the resources and model servers; nothing leaked.
        assert resources.counters == {}
        assert len(model.calls) == 3 and set(model.calls.values()) == {2}

        # The agent's own /v1/responses returns the inner servers' cookies alongside its own.
        episode = httpx.post(f"{urls['counter_agent']}/v1/responses", json={"input": "go"}, timeout=30)
        assert episode.status_code == 200
        assert {"CounterServer___counter", "ScriptedModel___policy", "LoopAgent___counter_agent"} <= set(episode.cookies)


def test_agent_relays_inner_server_errors_as_500():
    global_config: dict = {}
    client = make_server_client(global_config)
    servers = {"counter": make_server(CounterServer, name="counter", server_client=client), "agent": loop_agent("agent", client)}
    with serve(servers, global_config) as urls:
        agent_url = urls["agent"]
        # The row reaches the resources server's /seed_session, which rejects it (422); the agent's
        # raise_for_status turns that into a 500 that carries the inner body.
        bad_seed = httpx.post(
            f"{agent_url}/run", json={"responses_create_params": {"input": "x"}, "initial_count": "bad"}, timeout=30
        )
        # The model server id is not in the config: the agent's own /v1/responses fails with a plain exception
        # ("<Type>: <message>"), which /run, its caller, relays as an inner-server error.
        no_model = httpx.post(f"{agent_url}/run", json={"responses_create_params": {"input": "x"}}, timeout=30)
    assert bad_seed.status_code == 500
    body = bad_seed.json()
    assert body.startswith("Hit an exception in LoopAgent___agent calling an inner server: ")
    inner = json.loads(body.split("calling an inner server: ", 1)[1])
    assert inner["detail"][0]["loc"] == ["body", "initial_count"]
    assert no_model.status_code == 500
    relayed = no_model.json()
    assert relayed.startswith('Hit an exception in LoopAgent___agent calling an inner server: "')
    inner_text = json.loads(relayed.split("calling an inner server: ", 1)[1])  # the inner 500 body: "<Type>: <msg>"
    error_type, _, message = inner_text.partition(": ")
    assert error_type.isidentifier() and "Unknown server `policy`" in message


def test_agent_run_request_keeps_extra_fields():
    req = AgentRunRequest.model_validate({"responses_create_params": {"input": "x"}, "extra": {"a": 1}})
    assert req.model_dump(exclude_unset=True)["extra"] == {"a": 1}
    plain = BaseRunRequest.model_validate({"responses_create_params": {"input": "x"}, "extra": 1})
    assert "extra" not in plain.model_dump()
