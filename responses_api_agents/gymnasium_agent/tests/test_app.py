"""gymnasium_agent against real servers over HTTP, all in this process (one uvicorn thread each):

scripted fake LLM backend  <-  openai_model (the real model server)  <-  gymnasium_agent  ->  a GymnasiumServer that
records what it is asked.

The probe environment's behaviour is set by row fields (`terminate_at`, `truncate_at`, `reward_per_step`, ...), and
the fake LLM's script picks its replies by a tag in the row's input (`[play]`, `[forever]`, ...).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Iterator, Optional

import httpx
import pytest
from pydantic import Field

from nemo_gym.base_resources_server import AggregateMetrics, AggregateMetricsRequest, BaseResourcesServerConfig
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.servers.rollout_context import current_rollout_id
from nemo_gym.testing.fake_openai_server import build_app as build_fake_backend
from nemo_gym.testing.live_server import live_server, live_servers
from nemo_gym.testing.script import rule, tool_call
from nemo_gym.testing.servers import make_server, make_server_client, server_config
from resources_servers.gymnasium import GymnasiumServer, extract_text, tool_output
from responses_api_agents.gymnasium_agent.app import GymnasiumAgent, GymnasiumAgentConfig, GymnasiumRunResponse
from responses_api_models.openai_model.app import SimpleModelServer

# ------------------------------------------------------------------------------------------------------------
# The probe environment


class ProbeEnv(GymnasiumServer):
    """Counts steps per session; answers every function call with a tool output; rewards `reward_per_step` per
    step; ends the episode at step `terminate_at` / `truncate_at` (row fields)."""

    config: BaseResourcesServerConfig
    log: list[dict] = Field(default_factory=list)
    closed: list[str] = Field(default_factory=list)

    async def reset(self, metadata: dict[str, Any], session_id: str) -> tuple[Optional[str], dict[str, Any]]:
        self.log.append({"call": "reset", "session": session_id, "metadata": metadata, "rollout": current_rollout_id()})
        if metadata.get("fail_reset"):
            raise ValueError("probe: this row cannot start an episode")
        self.session_state[session_id] = 0
        return metadata.get("reset_observation"), {"started": True}

    async def step(self, action: NeMoGymResponse, metadata: dict[str, Any], session_id: str):
        n = self.session_state[session_id] + 1
        self.session_state[session_id] = n
        self.log.append({"call": "step", "session": session_id, "metadata": metadata, "rollout": current_rollout_id(),
                         "response_id": action.id})
        calls = [item for item in action.output if item.type == "function_call"]
        outputs = [tool_output(call, {"step": n, "args": json.loads(call.arguments)}) for call in calls]
        observation = None if metadata.get("quiet") else f"observation {n}: you wrote {extract_text(action)!r}"
        terminated = n == metadata.get("terminate_at")
        truncated = n == metadata.get("truncate_at")
        return observation, metadata.get("reward_per_step", 0.0), terminated, truncated, {"tool_outputs": outputs, "step": n}

    async def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)
        await super().close_session(session_id)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        rewards = [r["reward"] for r in body.verify_responses]
        return AggregateMetrics(agent_metrics={"probe/sum": sum(rewards)}, key_metrics={"probe/count": len(rewards)})


# ------------------------------------------------------------------------------------------------------------
# The script of the fake LLM


def act(n: int) -> dict:
    return tool_call("act", {"n": n})


RULES = [
    # [play]: a tool call (with a message that shows what the model saw), a text turn, then two calls at once.
    rule("saw: {{last_user}}", act(1), name="play-1", input_contains="[play]", tool_outputs=0),
    rule("I read {{last_tool_output}}", name="play-2", input_contains="[play]", last_user_contains="observation 1:"),
    rule(act(3), act(4), name="play-3", input_contains="[play]", last_user_contains="observation 2:"),
    rule(act(0), name="forever", input_contains="[forever]"),
    rule("just text", name="text", input_contains="[text]"),
    {"name": "model-400", "match": {"input_contains": "[model-400]"}, "status": 400,
     "error_message": "scripted: prompt too long"},
]

TOOLS = [{"type": "function", "name": "act", "description": "do something", "strict": False,
          "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}]


def row(tag: str, **fields: Any) -> dict:
    return {"responses_create_params": {"input": f"{tag} go", "tools": TOOLS}, **fields}


PLAY = dict(reset_observation="the board", terminate_at=3, reward_per_step=0.5)


# ------------------------------------------------------------------------------------------------------------
# The stack


SERVE_OPTIONS = {"backlog": 1024, "stop_timeout": 15, "timeout_graceful_shutdown": 1}
REFS = {
    "resources_server": {"type": "resources_servers", "name": "probe_env"},
    "model_server": {"type": "responses_api_models", "name": "policy_model"},
}


class Stack:
    def __init__(self, urls: dict[str, str], env: ProbeEnv):
        self.urls = urls
        self.env = env

    def post(self, server: str, path: str, body: dict, cookies: Optional[dict] = None) -> httpx.Response:
        return httpx.post(self.urls[server] + path, json=body, cookies=cookies, timeout=60)

    def run(self, body: dict, agent: str = "agent") -> dict:
        answer = self.post(agent, "/run", body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def log_of(self, session: str) -> list[dict]:
        return [entry for entry in self.env.log if entry["session"] == session]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    global_config: dict = {}
    client = make_server_client(global_config)
    # An agent whose config turns observability on: its calls carry the rollout's `/ng-rollout/<id>` prefix.
    observed_config: dict = {"observability_enabled": True}
    observed_client = make_server_client(observed_config)

    def agent(name: str, server_client=client, **extra) -> GymnasiumAgent:
        return make_server(GymnasiumAgent, name=name, server_client=server_client, **REFS, **extra)

    env = make_server(ProbeEnv, name="probe_env", server_client=client, domain="games")
    with live_server(build_fake_backend(script=RULES), **SERVE_OPTIONS) as backend:
        model = make_server(
            SimpleModelServer, name="policy_model", server_client=client,
            openai_base_url=backend + "/v1", openai_api_key="dummy", openai_model="fake-model",
        )
        servers = {
            "probe_env": env,
            "policy_model": model,
            "agent": agent("agent"),
            "capped_agent": agent("capped_agent", max_steps=2),
            "observed_agent": agent("observed_agent", server_client=observed_client),
            # pointed at a server that is not a gymnasium environment
            "misconfigured_agent": make_server(
                GymnasiumAgent, name="misconfigured_agent", server_client=client,
                resources_server={"type": "resources_servers", "name": "policy_model"},
                model_server=REFS["model_server"],
            ),
        }
        with live_servers(servers, global_config, **SERVE_OPTIONS) as urls:
            observed_config.update({name: block for name, block in global_config.items() if name in servers})
            yield Stack(urls, env)


def kinds(items: list[dict]) -> list[str]:
    return [f"{item['type']}:{item['role']}" if item["type"] == "message" else item["type"] for item in items]


# ------------------------------------------------------------------------------------------------------------
# Tests


def test_an_episode_until_the_environment_terminates_it(stack):
    result = stack.run(row("[play]", **PLAY, uuid="r-1"))
    assert result["reward"] == 1.5  # three steps at 0.5
    assert (result["terminated"], result["truncated"]) == (True, False)
    output = result["response"]["output"]
    assert kinds(output) == [
        "message:user",                                                       # the reset observation
        "message:assistant", "function_call", "function_call_output", "message:user",  # step 1
        "message:assistant", "message:user",                                  # step 2: text only
        "function_call", "function_call",                                     # step 3 ends the episode
    ]
    assert output[0]["content"] == "the board"
    assert output[1]["content"][0]["text"] == "saw: the board"  # the model saw the reset observation
    assert output[3]["call_id"] == output[2]["call_id"]
    assert json.loads(output[3]["output"]) == {"step": 1, "args": {"n": 1}}
    assert output[4]["content"] == "observation 1: you wrote 'saw: the board'"
    assert output[5]["content"][0]["text"] == 'I read {"step": 1, "args": {"n": 1}}'  # it saw the tool output
    # the last step's info; its tool outputs were not handed to the model (the episode was over)
    assert result["info"]["step"] == 3
    assert [json.loads(o["output"])["args"] for o in result["info"]["tool_outputs"]] == [{"n": 3}, {"n": 4}]
    assert result["response"]["usage"]["total_tokens"] == 3 * 15  # three model calls, 10 in / 5 out each
    assert result["uuid"] == "r-1" and result["responses_create_params"]["input"] == "[play] go"
    GymnasiumRunResponse.model_validate(result)


def test_reset_and_every_step_get_the_row_fields_and_one_session(stack):
    body = row("[play]", **PLAY, uuid="r-2", meta={"nested": [1, None]})
    stack.run(body)
    reset = next(e for e in reversed(stack.env.log) if e["call"] == "reset" and e["metadata"].get("uuid") == "r-2")
    entries = stack.log_of(reset["session"])
    assert [e["call"] for e in entries] == ["reset", "step", "step", "step"]
    expected = {k: v for k, v in body.items() if k != "responses_create_params"}
    assert all(e["metadata"] == expected for e in entries)  # no responses_create_params, no response
    assert len({e["response_id"] for e in entries[1:]}) == 3  # each step got that turn's response
    # the session was closed after the terminating step, and its state dropped
    assert stack.env.closed.count(reset["session"]) == 1 and reset["session"] not in stack.env.session_state


def test_running_out_of_steps_truncates(stack):
    result = stack.run(row("[forever]", quiet=True, reward_per_step=0.25), agent="capped_agent")
    assert (result["terminated"], result["truncated"]) == (False, True)
    assert result["reward"] == 0.5
    # no reset observation, so the output starts with the model's; every step's tool output was handed back
    assert kinds(result["response"]["output"]) == ["function_call", "function_call_output"] * 2
    assert result["response"]["usage"]["total_tokens"] == 2 * 15
    assert result["info"]["step"] == 2


def test_the_environment_can_truncate(stack):
    result = stack.run(row("[text]", truncate_at=1, reward_per_step=-1.0))
    assert (result["terminated"], result["truncated"], result["reward"]) == (False, True, -1.0)
    assert kinds(result["response"]["output"]) == ["message:assistant"]


def test_concurrent_rollouts_keep_their_own_sessions(stack):
    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(
                *(client.post(stack.urls["agent"] + "/run", json=row("[play]", **PLAY, n=i)) for i in range(6))
            )

    sessions = set()
    for i, answer in enumerate(asyncio.run(go())):
        assert answer.status_code == 200, answer.text
        result = answer.json()
        assert result["n"] == i and result["reward"] == 1.5 and result["terminated"]
        reset = next(e for e in stack.env.log if e["call"] == "reset" and e["metadata"].get("n") == i)
        assert [e["call"] for e in stack.log_of(reset["session"])] == ["reset", "step", "step", "step"]
        sessions.add(reset["session"])
    assert len(sessions) == 6


def test_inner_calls_carry_the_rollout_prefix_when_observability_is_on(stack):
    result = stack.run(row("[play]", **PLAY, uuid="r-obs", _ng_task_index=7, _ng_rollout_index=2), agent="observed_agent")
    assert result["reward"] == 1.5
    reset = next(e for e in stack.env.log if e["call"] == "reset" and e["metadata"].get("uuid") == "r-obs")
    assert [e["rollout"] for e in stack.log_of(reset["session"])] == ["7-2"] * 4
    # without observability the same row carries no prefix
    stack.run(row("[play]", **PLAY, uuid="r-plain", _ng_task_index=7, _ng_rollout_index=2))
    reset = next(e for e in stack.env.log if e["call"] == "reset" and e["metadata"].get("uuid") == "r-plain")
    assert [e["rollout"] for e in stack.log_of(reset["session"])] == [None] * 4


def test_v1_responses_plays_an_episode_for_just_those_parameters(stack):
    answer = stack.post("capped_agent", "/v1/responses", {"input": "[forever] direct", "tools": TOOLS})
    assert answer.status_code == 200, answer.text
    response = answer.json()
    assert response["object"] == "response" and response["model"] == "fake-model"
    assert kinds(response["output"]) == ["function_call", "function_call_output", "message:user"] * 2
    # the environment's session comes back, so a caller can go on with the same episode
    assert "ProbeEnv___probe_env" in answer.cookies


def test_aggregate_metrics_is_answered_by_the_resources_server(stack):
    body = {"verify_responses": [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.5},
    ]}
    answer = stack.post("agent", "/aggregate_metrics", body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"group_level_metrics": [], "agent_metrics": {"probe/sum": 1.5}, "key_metrics": {"probe/count": 2}}


def test_a_model_error_fails_the_rollout_naming_the_model_server(stack):
    answer = stack.post("agent", "/run", row("[model-400]", **PLAY))
    assert answer.status_code == 500
    message = answer.json()
    assert "model server `policy_model` answered POST /v1/responses with HTTP 400" in message
    assert "scripted: prompt too long" in message


def test_a_reset_error_fails_the_rollout_naming_the_resources_server(stack):
    answer = stack.post("agent", "/run", row("[play]", fail_reset=True))
    assert answer.status_code == 500
    message = answer.json()
    assert "resources server `probe_env` answered POST /reset with HTTP 500" in message
    assert "probe: this row cannot start an episode" in message


def test_an_environment_without_reset_is_named_as_such(stack):
    answer = stack.post("misconfigured_agent", "/run", row("[play]"))
    assert answer.status_code == 500
    assert "resources server `policy_model` (it has no such route: gymnasium_agent needs a resources server built on " \
           "GymnasiumServer) answered POST /reset with HTTP 404" in answer.json()


def test_run_rejects_a_row_without_valid_params(stack):
    assert stack.post("agent", "/run", {"map_seed": 1}).status_code == 422
    answer = stack.post("agent", "/run", {"responses_create_params": {"input": "x", "nope": 1}})
    assert answer.status_code == 422 and "nope" in answer.text


def test_config_defaults_and_validation():
    config = server_config(GymnasiumAgentConfig, "a", **REFS)
    assert config.max_steps == 10
    with pytest.raises(ValueError, match="max_steps"):
        server_config(GymnasiumAgentConfig, "a", **REFS, max_steps=0)
