"""gymnasium_agent: runs a Gymnasium-style environment (`resources_servers.gymnasium.GymnasiumServer`) with a model.

`POST /run` takes one dataset row and plays one episode:

1. POST `<resources_server>/reset` with the row; its `observation`, when not empty, is shown to the model as a
   user message after the row's `input` (a string input becomes one user message).
2. Up to `max_steps` times: POST `<model_server>/v1/responses` with the row's parameters and the conversation so
   far; append the response's `output`; POST `<resources_server>/step` with the row plus `response` (this
   response, the action); add its `reward`. Stop when the step says `terminated` or `truncated`; otherwise append
   the step's `info.tool_outputs` as `function_call_output` items and a non-empty `observation` as a user
   message, and go on. Running out of steps ends the episode with `truncated: true`.
3. Answer `GymnasiumRunResponse`: the row's fields, plus `response` (the last model response, with `output` =
   everything after the row's input: the reset observation, every model output, tool output and observation,
   and `usage` summed over the model calls), `reward` (the sum of the step rewards), `terminated`, `truncated`
   and `info` (of the last step).

Cookies: one dict per rollout, filled from every inner response's `Set-Cookie` and sent with every inner call, so
the environment's session (the episode's state) and the model server's session travel together (as in
simple_agent). Inner calls carry the rollout's `/ng-rollout/<id>` prefix when observability is on
(`url_path_for_run`). `POST /v1/responses` plays an episode for a row that is just those parameters;
`POST /aggregate_metrics` is answered by the resources server.
"""

from __future__ import annotations

from typing import Any, Optional

import orjson
from fastapi import Body, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.base_responses_api_agent import (
    AgentRunRequest,
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
)
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollouts.aggregation_parts import AggregationFailed, post_aggregate_metrics
from nemo_gym.servers.agent_calls import add_usage, parse_inner_json, raise_for_inner_status, update_cookies

__all__ = ["GymnasiumAgentConfig", "GymnasiumRunRequest", "GymnasiumRunResponse", "GymnasiumAgent"]


class GymnasiumAgentConfig(BaseResponsesAPIAgentConfig):
    """`resources_server`: the environment (a `GymnasiumServer`); `model_server`: the policy; `max_steps`: at most
    this many model calls (and steps) per episode."""

    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = Field(default=10, ge=1)


class GymnasiumRunRequest(AgentRunRequest):
    """A `/run` body: `responses_create_params` plus the row's other fields (all passed to `/reset` and `/step`)."""


class GymnasiumRunResponse(BaseModel):
    """A `/run` answer (the row's other fields are kept too)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    response: NeMoGymResponse
    reward: float
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class GymnasiumAgent(SimpleResponsesAPIAgent):
    config: GymnasiumAgentConfig

    # -- routes ----------------------------------------------------------------------------------------------

    async def run(self, request: Request, body: GymnasiumRunRequest) -> GymnasiumRunResponse:
        row = orjson.loads(await request.body())
        cookies = dict(request.cookies)
        return _json_response({**row, **await self.run_episode(row, cookies)})

    async def responses(
        self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming = Body()
    ) -> NeMoGymResponse:
        params = orjson.loads(await request.body())
        cookies = dict(request.cookies)
        episode = await self.run_episode({"responses_create_params": params}, cookies)
        response = _json_response(episode["response"])
        own = self.get_session_cookie_name()  # the session middleware sets ours
        for name, value in cookies.items():
            if name != own:
                response.set_cookie(name, value)
        return response

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """The resources server's `/aggregate_metrics` for these results."""
        resources = self.config.resources_server.name
        who = f"resources server `{resources}`"
        try:  # in parts when they are many: one request of them all could be over the server's body limit
            answer = await post_aggregate_metrics(self.server_client, resources, body.verify_responses)
        except AggregationFailed as exc:
            raise RuntimeError(f"{who} gave no /aggregate_metrics: {exc}") from None
        return AggregateMetrics.model_validate(answer)

    # -- the episode -----------------------------------------------------------------------------------------

    async def run_episode(self, row: dict, cookies: dict[str, str]) -> dict:
        """Play one episode for `row` (a plain dict); `cookies` is updated in place. Returns the `/run` fields
        `responses_create_params`, `response`, `reward`, `terminated`, `truncated`, `info`."""
        params = row["responses_create_params"]
        resources = self.config.resources_server.name
        env = f"resources server `{resources}`"

        reset = await self._post(resources, "/reset", row, row, cookies, env)
        info = _object_field(reset, "info", env, "/reset")
        trajectory: list = []
        _append_observation(trajectory, reset.get("observation"))

        original = params.get("input")
        if isinstance(original, str):
            original = [{"role": "user", "content": original}]
        elif not isinstance(original, list):
            original = list(original or ())

        model = self.config.model_server.name
        policy = f"model server `{model}`"
        reward = 0.0
        terminated = truncated = False
        usage: Optional[dict] = None
        last: dict = {}
        for _ in range(self.config.max_steps):
            last = await self._post(model, "/v1/responses", {**params, "input": original + trajectory}, row, cookies, policy)
            output = last.get("output")
            if not isinstance(output, list):
                raise RuntimeError(f"{policy} answered /v1/responses without an `output` list: {last!r:.1000}")
            trajectory.extend(output)
            usage = add_usage(usage, last.get("usage"))

            stepped = await self._post(resources, "/step", {**row, "response": last}, row, cookies, env)
            reward += _number(stepped.get("reward"), env)
            terminated, truncated = bool(stepped.get("terminated")), bool(stepped.get("truncated"))
            info = _object_field(stepped, "info", env, "/step")
            if terminated or truncated:
                break
            trajectory.extend(_tool_outputs(info, env))
            _append_observation(trajectory, stepped.get("observation"))
        else:
            truncated = True  # out of steps

        response = dict(last)
        response["output"] = trajectory
        response["usage"] = usage
        return {
            "responses_create_params": params,
            "response": response,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
        }

    async def _post(self, server: str, path: str, payload: dict, row: dict, cookies: dict[str, str], who: str) -> dict:
        """POST to an inner server within the rollout (its prefix, its cookies); the answer as a JSON object."""
        answer = await self.server_client.post(server, self.url_path_for_run(path, row), json=payload, cookies=cookies)
        if answer.status == 404 and path in ("/reset", "/step"):
            who += " (it has no such route: gymnasium_agent needs a resources server built on GymnasiumServer)"
        raise_for_inner_status(answer, who, path)
        update_cookies(cookies, answer)
        data = parse_inner_json(answer, who, path)
        if not isinstance(data, dict):
            raise RuntimeError(f"{who} answered POST {path} with a non-object: {data!r:.500}")
        return data


# --------------------------------------------------------------------------------------------------------
# Helpers


def _json_response(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


def _append_observation(trajectory: list, observation: Any) -> None:
    """A non-empty observation becomes a user message."""
    if observation:
        trajectory.append({"type": "message", "role": "user", "content": str(observation)})


def _object_field(answer: dict, key: str, who: str, path: str) -> dict:
    value = answer.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RuntimeError(f"{who} answered POST {path} with `{key}` that is not an object: {value!r:.500}")
    return value


def _number(value: Any, who: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RuntimeError(f"{who} answered POST /step with a `reward` that is not a number: {value!r:.200}")
    return float(value)


def _tool_outputs(info: dict, who: str) -> list[dict]:
    """`info.tool_outputs` (each `{"call_id", "output"}`, see `resources_servers.gymnasium.tool_output`) as
    `function_call_output` items."""
    items = info.get("tool_outputs") or []
    if not isinstance(items, list):
        raise RuntimeError(f"{who} answered POST /step with `info.tool_outputs` that is not a list: {items!r:.500}")
    converted = []
    for index, item in enumerate(items):
        call_id = item.get("call_id") if isinstance(item, dict) else None
        if not isinstance(call_id, str) or not call_id:
            raise RuntimeError(
                f"{who} answered POST /step with `info.tool_outputs[{index}]` without a `call_id`: {item!r:.300}. "
                "Build tool outputs with resources_servers.gymnasium.tool_output(call, result)."
            )
        output = item.get("output")
        if not isinstance(output, str):
            output = orjson.dumps(output).decode()
        converted.append({"type": "function_call_output", "call_id": call_id, "output": output})
    return converted


if __name__ == "__main__":
    GymnasiumAgent.run_webserver()
