"""Gymnasium-style environments: a resources server driven by `reset` and `step` instead of tools plus `/verify`.

An environment that is a sequence of observations and actions (a game, a simulator) fits the Gymnasium API
better than a tool server scored once at the end: the agent (`responses_api_agents/gymnasium_agent`) asks
`POST /reset` for the first observation, then sends every model response to `POST /step`, which answers with
the next observation, a reward and whether the episode ended. The rollout's reward is the sum of the step rewards.

Write one by subclassing `GymnasiumServer` and implementing the hooks:

    class MyEnv(GymnasiumServer):
        async def reset(self, metadata, session_id):
            self.session_state[session_id] = new_game(seed=metadata["seed"])
            return "the board ...", {}

        async def step(self, action, metadata, session_id):
            game = self.session_state[session_id]
            ...  # read the model's move from `action` (a NeMoGymResponse): extract_text(action), its function calls
            return observation, reward, terminated, truncated, {"tool_outputs": [tool_output(call, result)]}

`metadata` is the dataset row without `responses_create_params` (and `response`): the fields the row adds.
`session_id` identifies the rollout (the agent keeps one session cookie per rollout). After a step that
terminates or truncates the episode, `close_session(session_id)` runs (by default it drops
`session_state[session_id]`).

Routes: `POST /reset`, `POST /step`, `POST /aggregate_metrics`, plus sessions and the `/ng-rollout/<id>/` prefix
(`RolloutContextMiddleware`). There is no `/seed_session`, `/verify` or `/reverify_mode`: `reset` is the seeding
and `step` the scoring.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import Any, Optional

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.api.schemas import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.serving.sessions import SESSION_ID_KEY
from nemo_gym.servers.resources_server import SimpleResourcesServer
from nemo_gym.servers.rollout_context import RolloutContextMiddleware

__all__ = [
    "EnvResetRequest",
    "EnvResetResponse",
    "EnvStepRequest",
    "EnvStepResponse",
    "GymnasiumServer",
    "extract_text",
    "tool_output",
]


class EnvResetRequest(BaseModel):
    """`POST /reset` body: the dataset row (`responses_create_params` plus whatever fields the row has)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class EnvResetResponse(BaseModel):
    """`POST /reset` answer: the first observation (None: nothing to show the model before its first turn)."""

    observation: Optional[str] = None
    info: dict[str, Any] = Field(default_factory=dict)


class EnvStepRequest(EnvResetRequest):
    """`POST /step` body: the row plus `response`, the model's latest response (the action)."""

    response: NeMoGymResponse


class EnvStepResponse(BaseModel):
    """`POST /step` answer, Gymnasium's step tuple. `info["tool_outputs"]` (from `tool_output`) answers the
    response's function calls; the agent hands them and a non-empty `observation` to the model next turn."""

    observation: Optional[str] = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


def tool_output(call: Any, result: Any) -> dict[str, str]:
    """The answer to one function call of the action, for `info["tool_outputs"]`: `{"call_id", "output"}` with
    `result` as JSON text. `call` is the function-call item (a model or a dict)."""
    call_id = call.get("call_id") if isinstance(call, dict) else getattr(call, "call_id", None)
    if not call_id:
        raise ValueError(f"tool_output: the call has no call_id to answer: {call!r}")
    return {"call_id": call_id, "output": json.dumps(result)}


def extract_text(response: Any) -> str:
    """The text the model wrote: every `output_text` part of the response's assistant messages, joined (as the
    OpenAI SDK's `output_text`). Reasoning and function calls are not text. Takes a `NeMoGymResponse` or a dict."""
    if isinstance(response, NeMoGymResponse):
        return response.output_text
    output = response.get("output") if isinstance(response, dict) else getattr(response, "output", None)
    texts: list[str] = []
    for item in output or ():
        get = item.get if isinstance(item, dict) else lambda key, item=item: getattr(item, key, None)
        if get("type") not in (None, "message") or get("role") != "assistant":
            continue
        content = get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        for part in content or ():
            kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
            if kind == "output_text":
                texts.append(part["text"] if isinstance(part, dict) else part.text)
    return "".join(texts)


class GymnasiumServer(SimpleResourcesServer):
    """A resources server with Gymnasium's `reset` / `step` (see the module docstring for how to write one).

    `session_state` maps session ids to whatever the environment keeps per rollout."""

    session_state: dict[str, Any] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = self._app_with_post_routes(
            {
                "/reset": self.handle_reset,
                "/step": self.handle_step,
                "/aggregate_metrics": self.aggregate_metrics,
            }
        )
        app.add_middleware(RolloutContextMiddleware)  # `/ng-rollout/<id>/<route>` is served as `/<route>`
        return app

    # -- the hooks ---------------------------------------------------------------------------------------------

    async def reset(self, metadata: dict[str, Any], session_id: str) -> tuple[Optional[str], dict[str, Any]]:
        """Start the episode of this session; return (first observation, info). Default: `(None, {})`."""
        return None, {}

    @abstractmethod
    async def step(
        self, action: NeMoGymResponse, metadata: dict[str, Any], session_id: str
    ) -> tuple[Optional[str], float, bool, bool, dict[str, Any]]:
        """Apply the model's response to the episode; return (observation, reward, terminated, truncated, info).
        `info` must be JSON-serialisable; its `tool_outputs` (a list of `tool_output(call, result)`) answer the
        response's function calls."""

    async def close_session(self, session_id: str) -> None:
        """Forget the session's state (called after a step that terminated or truncated the episode)."""
        self.session_state.pop(session_id, None)

    async def verify(self, body: EnvStepRequest) -> EnvStepResponse:
        """Not served: a gymnasium environment is scored by `/step`. It is defined so the class is concrete, and
        so tools that read a server's verify body model (ng_prepare_data, ng_test's data check) check the rows as
        `EnvStepRequest`."""
        raise NotImplementedError(
            f"{type(self).__name__} is a gymnasium environment: it has no /verify; its rewards come from /step. "
            "Run it with responses_api_agents/gymnasium_agent."
        )

    # -- the routes --------------------------------------------------------------------------------------------

    async def handle_reset(self, request: Request, body: EnvResetRequest) -> EnvResetResponse:
        """`POST /reset`: `reset(row fields, session id)`."""
        observation, info = await self.reset(_metadata(body), request.session[SESSION_ID_KEY])
        return EnvResetResponse(observation=observation, info=info or {})

    async def handle_step(self, request: Request, body: EnvStepRequest) -> EnvStepResponse:
        """`POST /step`: `step(response, row fields, session id)`; the session is closed once the episode ends."""
        session_id = request.session[SESSION_ID_KEY]
        observation, reward, terminated, truncated, info = await self.step(body.response, _metadata(body), session_id)
        if terminated or truncated:
            await self.close_session(session_id)
        # Gymnasium envs hand out numpy scalars: answer with plain Python values.
        return EnvStepResponse(
            observation=observation,
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=info or {},
        )


def _metadata(body: BaseModel) -> dict[str, Any]:
    """The row's own fields: everything but `responses_create_params` and `response` (the declared fields)."""
    return dict(body.model_extra or {})
