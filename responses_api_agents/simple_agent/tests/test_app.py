"""simple_agent against real servers over HTTP, all in this process (one uvicorn thread each):

scripted fake LLM backend  <-  openai_model (the real model server)  <-  simple_agent  ->  a resources server whose
tools keep per-session state.

The fake backend's script picks each reply by a tag in the user message (`[multistep]`, `[bad-args]`, ...), so
every test drives its own conversation through one shared stack.
"""

from __future__ import annotations

import asyncio
import json
from typing import Iterator, Optional

import httpx
import pytest
from fastapi import Body, FastAPI, Request
from pydantic import Field

from nemo_gym.http.client import ServerResponse
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.testing.counter_server import (
    CounterResourcesServer,
    CounterVerifyRequest,
    CounterVerifyResponse,
    IncrementCounterRequest,
)
from nemo_gym.testing.fake_openai_server import build_app as build_fake_backend
from nemo_gym.testing.live_server import live_server, live_servers
from nemo_gym.testing.script import tool_call as call
from nemo_gym.testing.servers import make_server, make_server_client, server_config
from nemo_gym.servers.agent_calls import add_usage as _add_usage, update_cookies as _update_cookies
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
from responses_api_models.openai_model.app import SimpleModelServer

# ------------------------------------------------------------------------------------------------------------
# A resources server with per-session state: nemo_gym.testing's counter server, plus tools that read the counter,
# fail and hang, and a record of the calls it got.


class CounterResources(CounterResourcesServer):
    calls: list[str] = Field(default_factory=list)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/get_counter")(self.get_counter)
        app.post("/explode")(self.explode)
        app.post("/slow")(self.slow)
        return app

    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> dict:
        self.calls.append("increment_counter")
        return await super().increment_counter(request, body)

    async def get_counter(self, request: Request) -> dict:
        self.calls.append("get_counter")
        return {"count": self.counters.get(request.session[SESSION_ID_KEY], 0)}

    async def explode(self) -> dict:
        self.calls.append("explode")
        raise RuntimeError("kaboom")

    async def slow(self) -> dict:
        await asyncio.sleep(10)
        return {"slow": True}

    async def verify(self, request: Request, body: CounterVerifyRequest) -> CounterVerifyResponse:
        self.calls.append("verify")
        return await super().verify(request, body)


# ------------------------------------------------------------------------------------------------------------
# The script of the fake LLM


USAGE_1 = {"input_tokens": 11, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 3,
           "output_tokens_details": {"reasoning_tokens": 1}, "total_tokens": 14}
USAGE_3 = {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 5}, "output_tokens": 7,
           "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 37}

RULES = [
    {"name": "multistep", "match": {"last_user_contains": "[multistep]"}, "replies": [
        {"output": [call("increment_counter", {"count": 2})]},
        # two calls in one step, run in order; empty arguments mean {}
        {"output": [call("increment_counter", {"count": 3}), call("get_counter", "")]},
        {"output": ["the counter says {{last_tool_output}}"]},
    ]},
    {"name": "bad-args", "match": {"last_user_contains": "[bad-args]"}, "replies": [
        {"output": [call("increment_counter", '{"count": 2')]},     # malformed JSON
        {"output": [call("increment_counter", "[2]")]},             # JSON, but not an object
        {"output": [call("increment_counter", {"count": "many"})]},  # the tool rejects it (422)
        {"output": [call("increment_counter", {"count": 2})]},
        {"output": ["fixed it"]},
    ]},
    {"name": "unknown-tool", "match": {"last_user_contains": "[unknown-tool]"}, "replies": [
        {"output": [call("teleport", {}), call("verify", {}), call("../seed_session", {})]},
        {"output": ["{{last_tool_output}}"]},
    ]},
    {"name": "tool-500", "match": {"last_user_contains": "[tool-500]"}, "replies": [
        {"output": [call("explode", {})]},
        {"output": ["sorry: {{last_tool_output}}"]},
    ]},
    {"name": "slow", "match": {"last_user_contains": "[slow]"}, "replies": [
        {"output": [call("slow", {})]},
        {"output": ["gave up waiting"]},
    ]},
    {"name": "forever", "match": {"last_user_contains": "[forever]"},
     "output": [{"type": "reasoning", "text": "once more"}, call("increment_counter", {"count": 1})]},
    {"name": "truncated", "match": {"last_user_contains": "[truncated]"},
     "output": [call("increment_counter", '{"count": 5')], "incomplete_details": {"reason": "max_output_tokens"}},
    {"name": "usage", "match": {"last_user_contains": "[usage]"}, "replies": [
        {"output": [call("increment_counter", {"count": 1})], "usage": USAGE_1},
        {"output": [{"type": "reasoning", "text": "thinking only"}], "usage": None},
        {"output": ["done"], "usage": USAGE_3},
    ]},
    {"name": "concurrent", "match": {"last_user_contains": "[concurrent]"}, "replies": [
        {"output": [call("increment_counter", {"count": 1})], "latency_ms": 20},
        {"output": [call("get_counter", {})], "latency_ms": 20},
        {"output": ["final {{last_tool_output}}"]},
    ]},
    {"name": "model-400", "match": {"last_user_contains": "[model-400]"}, "status": 400,
     "error_message": "scripted: prompt too long"},
]

TOOLS = [
    {"type": "function", "name": "increment_counter", "description": "add to the counter", "strict": False,
     "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}}},
    {"type": "function", "name": "get_counter", "description": "read the counter", "strict": False,
     "parameters": {"type": "object", "properties": {}}},
]


def row(tag: str, *, initial: int = 0, expected: int = 0, **extra) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"{tag} please"}], "tools": TOOLS},
        "initial_count": initial,
        "expected_count": expected,
        **extra,
    }


# ------------------------------------------------------------------------------------------------------------
# The stack


SERVE_OPTIONS = {"backlog": 1024, "stop_timeout": 15, "timeout_graceful_shutdown": 1}  # for live_server


class Stack:
    def __init__(self, urls: dict[str, str], resources: CounterResources):
        self.urls = urls
        self.resources = resources

    def post(self, server: str, path: str, body: dict, cookies: Optional[dict] = None) -> httpx.Response:
        return httpx.post(self.urls[server] + path, json=body, cookies=cookies, timeout=60)

    def run(self, body: dict, agent: str = "agent") -> dict:
        r = self.post(agent, "/run", body)
        assert r.status_code == 200, r.text
        return r.json()


class TaggingAgent(SimpleAgent):
    """A subclass that customises /v1/responses: /run must go through it (over HTTP, as the reference does)."""

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        answer = await super().responses(request, body)
        data = json.loads(answer.body)
        data["metadata"] = {"tagged_by": self.config.name}
        answer.body = json.dumps(data).encode()
        answer.headers["content-length"] = str(len(answer.body))
        return answer


REFS = {
    "resources_server": {"type": "resources_servers", "name": "counter_resources"},
    "model_server": {"type": "responses_api_models", "name": "policy_model"},
}


def agent_config(name: str, **extra) -> SimpleAgentConfig:
    return server_config(SimpleAgentConfig, name, **REFS, **extra)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    global_config: dict = {}
    client = make_server_client(global_config)

    def agent(name: str, cls=SimpleAgent, **extra) -> SimpleAgent:
        return make_server(cls, name=name, server_client=client, **REFS, **extra)

    resources = make_server(CounterResources, name="counter_resources", server_client=client, domain="agent")
    with live_server(build_fake_backend(script=RULES), **SERVE_OPTIONS) as backend:
        model = make_server(
            SimpleModelServer, name="policy_model", server_client=client,
            openai_base_url=backend + "/v1", openai_api_key="dummy", openai_model="fake-model",
        )
        servers = {
            "counter_resources": resources,
            "policy_model": model,
            "agent": agent("agent"),
            "capped_agent": agent("capped_agent", max_steps=2),
            "tagging_agent": agent("tagging_agent", TaggingAgent),
            "impatient_agent": agent("impatient_agent", tool_timeout_seconds=0.5),
        }
        with live_servers(servers, global_config, **SERVE_OPTIONS) as urls:
            yield Stack(urls, resources)


def outputs(result: dict) -> list[dict]:
    return result["response"]["output"]


def kinds(items: list[dict]) -> list[str]:
    return [o["type"] for o in items]


def tool_output(item: dict):
    assert item["type"] == "function_call_output"
    return json.loads(item["output"])


# ------------------------------------------------------------------------------------------------------------
# Tests


def test_multi_step_tool_loop_with_per_session_state(stack):
    result = stack.run(row("[multistep]", initial=1, expected=6))
    assert result["reward"] == 1.0 and result["final_count"] == 6
    items = outputs(result)
    assert kinds(items) == [
        "function_call", "function_call_output",
        "function_call", "function_call", "function_call_output", "function_call_output",
        "message",
    ]
    assert tool_output(items[1]) == {"count": 3}
    # both calls of step 2 ran in order, each output answering its own call
    assert items[4]["call_id"] == items[2]["call_id"] and tool_output(items[4]) == {"count": 6}
    assert items[5]["call_id"] == items[3]["call_id"] and tool_output(items[5]) == {"count": 6}
    # the model saw the last tool output on its final turn
    assert items[-1]["content"][0]["text"] == 'the counter says {"count":6}'
    # three model calls, 10 in / 5 out each (the backend's default usage)
    assert result["response"]["usage"]["total_tokens"] == 45


def test_malformed_and_invalid_arguments_become_error_outputs_and_the_loop_goes_on(stack):
    result = stack.run(row("[bad-args]", initial=0, expected=2))
    assert result["reward"] == 1.0 and result["final_count"] == 2  # only the good call changed anything
    items = outputs(result)
    assert kinds(items) == ["function_call", "function_call_output"] * 4 + ["message"]

    malformed = tool_output(items[1])
    assert malformed["tool"] == "increment_counter" and "not valid JSON" in malformed["error"]
    assert "status" not in malformed  # no call was made
    not_object = tool_output(items[3])
    assert "must be a JSON object" in not_object["error"]
    rejected = tool_output(items[5])
    assert rejected["status"] == 422 and rejected["tool"] == "increment_counter"
    assert rejected["detail"]["detail"][0]["loc"] == ["body", "count"]  # FastAPI's validation detail, for the model
    assert tool_output(items[7]) == {"count": 2}
    assert items[-1]["content"][0]["text"] == "fixed it"


def test_unknown_tool_and_reserved_routes_become_error_outputs(stack):
    result = stack.run(row("[unknown-tool]", initial=4, expected=4))
    # `verify` was not reached as a tool (it would have popped the session's counter)
    assert result["reward"] == 1.0 and result["final_count"] == 4
    items = outputs(result)
    assert kinds(items) == ["function_call"] * 3 + ["function_call_output"] * 3 + ["message"]
    teleport, verify, traversal = (tool_output(o) for o in items[3:6])
    assert teleport == {"error": "unknown tool 'teleport': the resources server has no such tool", "tool": "teleport", "status": 404}
    assert verify["tool"] == "verify" and "unknown tool" in verify["error"] and "status" not in verify
    assert traversal["tool"] == "../seed_session" and "unknown tool" in traversal["error"]
    assert json.loads(items[-1]["content"][0]["text"]) == traversal  # the model read the error


def test_tool_500_becomes_an_error_output(stack):
    result = stack.run(row("[tool-500]", initial=1, expected=1))
    assert result["reward"] == 1.0
    items = outputs(result)
    assert kinds(items) == ["function_call", "function_call_output", "message"]
    error = tool_output(items[1])
    assert error["status"] == 500 and error["tool"] == "explode"
    assert error["detail"] == "RuntimeError: kaboom"  # the resources server's exception middleware body
    assert items[2]["content"][0]["text"].startswith("sorry: {")


def test_tool_timeout_becomes_an_error_output(stack):
    result = stack.run(row("[slow]", initial=0, expected=0), agent="impatient_agent")
    assert result["reward"] == 1.0
    items = outputs(result)
    assert kinds(items) == ["function_call", "function_call_output", "message"]
    error = tool_output(items[1])
    assert error["tool"] == "slow" and "did not answer within 0.5 s" in error["error"]


def test_max_steps_stops_after_that_many_model_calls(stack):
    result = stack.run(row("[forever]", initial=10, expected=12), agent="capped_agent")
    # max_steps is checked after the step's tool calls: both steps' increments took effect
    assert result["reward"] == 1.0 and result["final_count"] == 12
    items = outputs(result)
    assert kinds(items) == ["reasoning", "function_call", "function_call_output"] * 2
    assert tool_output(items[-1]) == {"count": 12}
    assert result["response"]["usage"]["total_tokens"] == 2 * 15  # exactly two model calls


def test_incomplete_details_stops_without_running_the_cut_off_call(stack):
    calls_before = len(stack.resources.calls)
    result = stack.run(row("[truncated]", initial=3, expected=3))
    assert result["reward"] == 1.0 and result["final_count"] == 3
    assert stack.resources.calls[calls_before:] == ["verify"]
    response = result["response"]
    assert kinds(response["output"]) == ["function_call"]
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["status"] == "incomplete"


def test_usage_is_summed_exactly_once_per_model_call_and_tolerates_null(stack):
    result = stack.run(row("[usage]", initial=0, expected=1))
    assert result["reward"] == 1.0
    assert kinds(outputs(result)) == ["function_call", "function_call_output", "reasoning", "message"]
    # step 1 (11/3/14, cached 2, reasoning 1) + step 2 (usage: null) + step 3 (30/7/37, cached 5)
    assert result["response"]["usage"] == {
        "input_tokens": 41,
        "input_tokens_details": {"cached_tokens": 7},
        "output_tokens": 10,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 51,
    }


def test_run_keeps_every_input_field_and_every_verifier_field(stack):
    body = row(
        "[multistep]", initial=1, expected=6,
        uuid="row-17", agent_ref={"type": "responses_api_agents", "name": "agent"},
        meta={"nested": [1, {"a": None}]}, _ng_task_index=3, _ng_rollout_index=1,
    )
    result = stack.run(body)
    for key, value in body.items():
        if key != "responses_create_params":
            assert result[key] == value, key
    # the verifier's fields: its (re-dumped) params, the response, reward and its own metric
    assert result["reward"] == 1.0 and result["final_count"] == 6
    assert result["responses_create_params"]["input"][0]["content"] == "[multistep] please"
    assert result["responses_create_params"]["tools"][0]["name"] == "increment_counter"
    assert result["response"]["object"] == "response"
    assert list(result)[: len(body)] == list(body)  # row order first, verifier-only fields after


def test_concurrent_rollouts_keep_separate_session_state(stack):
    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(client.post(stack.urls["agent"] + "/run", json=row("[concurrent]", initial=100 * i, expected=100 * i + 1))
                  for i in range(6))
            )

    answers = asyncio.run(go())
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["reward"] == 1.0 and result["final_count"] == 100 * i + 1
        assert outputs(result)[-1]["content"][0]["text"] == f'final {{"count":{100 * i + 1}}}'


def test_v1_responses_directly_returns_the_episode_and_the_inner_sessions(stack):
    r = stack.post("agent", "/v1/responses", {"input": "[multistep] direct", "tools": TOOLS})
    assert r.status_code == 200, r.text
    response = r.json()
    assert response["object"] == "response" and response["model"] == "fake-model"
    assert kinds(response["output"])[-1] == "message"
    assert response["output"][-1]["content"][0]["text"] == 'the counter says {"count":5}'
    # the agent hands back the resources and model sessions it used (plus its own)
    assert {"CounterResources___counter_resources", "SimpleModelServer___policy_model", "SimpleAgent___agent"} <= set(r.cookies)
    # ... so the caller can continue the same rollout, e.g. look at its state
    state = stack.post("counter_resources", "/get_counter", {}, cookies=dict(r.cookies))
    assert state.json() == {"count": 5}

    strict = stack.post("agent", "/v1/responses", {"input": "x", "bogus_param": 1})
    assert strict.status_code == 422 and "bogus_param" in strict.text


def test_a_model_server_error_fails_the_rollout_naming_the_model_server(stack):
    r = stack.post("agent", "/run", row("[model-400]"))
    assert r.status_code == 500
    message = r.json()
    assert message.startswith("Hit an exception in SimpleAgent___agent calling an inner server: ")
    assert "model server `policy_model` answered POST /v1/responses with HTTP 400" in message
    assert "scripted: prompt too long" in message


def test_run_goes_through_a_subclass_that_overrides_v1_responses(stack):
    result = stack.run(row("[multistep]", initial=0, expected=5), agent="tagging_agent")
    assert result["reward"] == 1.0 and result["final_count"] == 5  # the resources session survived the extra hop
    assert result["response"]["metadata"] == {"tagged_by": "tagging_agent"}


def test_run_rejects_a_row_without_valid_params(stack):
    r = stack.post("agent", "/run", {"expected_count": 1})
    assert r.status_code == 422
    r = stack.post("agent", "/run", {"responses_create_params": {"input": "x", "nope": 1}})
    assert r.status_code == 422 and "nope" in r.text


# ------------------------------------------------------------------------------------------------------------
# Helpers in isolation


def test_add_usage_helper():
    assert _add_usage(None, None) is None
    total = _add_usage(None, {"input_tokens": 1, "output_tokens": 2})
    assert total == {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 2,
                     "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 3}
    total = _add_usage(total, {"input_tokens": None, "output_tokens": 4, "total_tokens": 4, "output_tokens_details": None})
    assert total["output_tokens"] == 6 and total["total_tokens"] == 7 and total["input_tokens"] == 1


def test_update_cookies_takes_set_cookie_and_honours_deletion():
    response = ServerResponse.from_httpx(httpx.Response(
        200,
        headers=[
            ("set-cookie", "A___a=abc.def; path=/; Max-Age=1209600; httponly; samesite=lax"),
            ("set-cookie", "B___b=null; path=/; expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=0; httponly"),
        ],
    ))
    cookies = {"B___b": "old", "C___c": "keep"}
    _update_cookies(cookies, response)
    assert cookies == {"A___a": "abc.def", "C___c": "keep"}


def test_config_defaults_and_validation():
    config = agent_config("a")
    assert config.max_steps is None and config.tool_timeout_seconds is None and config.datasets is None
    with pytest.raises(ValueError):
        agent_config("a", max_steps=0)
