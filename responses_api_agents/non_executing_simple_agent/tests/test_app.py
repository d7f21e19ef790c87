"""non_executing_simple_agent against real servers over HTTP, all in this process (one uvicorn thread each):
scripted fake LLM backend <- openai_model <- the agent -> a counter resources server that records every call.

The model answers with function calls (one with malformed arguments); the agent must hand them to `/verify` as
written, never calling a tool."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import Field

from nemo_gym.testing.counter_server import (
    CounterResourcesServer,
    CounterVerifyRequest,
    CounterVerifyResponse,
    IncrementCounterRequest,
)
from nemo_gym.testing.fake_openai_server import build_app as build_fake_backend
from nemo_gym.testing.live_server import live_server, live_servers
from nemo_gym.testing.script import answer_rule, tool_call
from nemo_gym.testing.servers import make_server, make_server_client
from responses_api_agents.non_executing_simple_agent.app import NonExecutingSimpleAgent
from responses_api_models.openai_model.app import SimpleModelServer


class RecordingCounter(CounterResourcesServer):
    """The counter server, recording the routes it was asked for and the outputs `/verify` got."""

    calls: list[str] = Field(default_factory=list)
    verified_outputs: list[list[dict]] = Field(default_factory=list)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/get_counter")(self.get_counter)
        return app

    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> dict:
        self.calls.append("increment_counter")
        return await super().increment_counter(request, body)

    async def get_counter(self) -> dict:
        self.calls.append("get_counter")
        return {"count": 0}

    async def verify(self, request: Request, body: CounterVerifyRequest) -> CounterVerifyResponse:
        self.calls.append("verify")
        self.verified_outputs.append([item.model_dump(mode="json", exclude_none=True) for item in body.response.output])
        return await super().verify(request, body)


SCRIPT = [
    answer_rule("[calls]", {"type": "reasoning", "text": "two calls"}, tool_call("increment_counter", '{"count": 2'),
                tool_call("get_counter", {})),
    answer_rule("[text]", "no tools needed"),
]
TOOLS = [
    {"type": "function", "name": "increment_counter", "strict": False,
     "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}}},
    {"type": "function", "name": "get_counter", "strict": False, "parameters": {"type": "object", "properties": {}}},
]
SERVE = {"stop_timeout": 15, "timeout_graceful_shutdown": 1}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[dict, RecordingCounter]]:
    global_config: dict = {}
    client = make_server_client(global_config)
    resources = make_server(RecordingCounter, name="counter", server_client=client, domain="agent")
    with live_server(build_fake_backend(script=SCRIPT), **SERVE) as backend:
        servers = {
            "counter": resources,
            "policy_model": make_server(SimpleModelServer, name="policy_model", server_client=client,
                                        openai_base_url=backend + "/v1", openai_api_key="dummy",
                                        openai_model="fake-model"),
            "agent": make_server(NonExecutingSimpleAgent, name="agent", server_client=client,
                                 resources_server={"type": "resources_servers", "name": "counter"},
                                 model_server={"type": "responses_api_models", "name": "policy_model"}),
        }
        with live_servers(servers, global_config, **SERVE) as urls:
            yield urls, resources


def test_run_verifies_the_tool_calls_without_running_them(stack):
    urls, resources = stack
    resources.calls.clear()
    row = {"responses_create_params": {"input": [{"role": "user", "content": "[calls] count up"}], "tools": TOOLS},
           "initial_count": 5, "expected_count": 5, "task": "kept"}
    answer = httpx.post(urls["agent"] + "/run", json=row, timeout=60)
    assert answer.status_code == 200, answer.text
    result = answer.json()

    assert resources.calls == ["verify"]  # no tool route was called
    assert result["final_count"] == 5 and result["reward"] == 1.0  # the seeded session reached /verify untouched
    assert result["task"] == "kept"
    output = result["response"]["output"]
    assert [o["type"] for o in output] == ["reasoning", "function_call", "function_call"]
    assert output[1]["arguments"] == '{"count": 2'  # malformed, as the model wrote it: never parsed
    assert resources.verified_outputs[-1] == [{k: v for k, v in o.items() if v is not None} for o in output]


def test_v1_responses_answers_the_models_one_reply(stack):
    urls, resources = stack
    resources.calls.clear()
    answer = httpx.post(urls["agent"] + "/v1/responses", json={"input": "[calls] a string input", "tools": TOOLS},
                        timeout=60)
    assert answer.status_code == 200, answer.text
    assert [o["type"] for o in answer.json()["output"]] == ["reasoning", "function_call", "function_call"]
    assert resources.calls == []
    assert "SimpleModelServer___policy_model" in answer.cookies  # the model server's session comes back

    plain = httpx.post(urls["agent"] + "/v1/responses", json={"input": "[text] hi"}, timeout=60)
    assert plain.status_code == 200, plain.text
    assert plain.json()["output"][0]["content"][0]["text"] == "no tools needed"
