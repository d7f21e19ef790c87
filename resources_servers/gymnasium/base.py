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

The routes, not the hooks, refuse a client's mistakes, so every environment answers them alike (`episodes.py`,
`limits.py`): a `/step` with no game in its session is a 409 (no `/reset` yet, or the episode ended) or a 410 (the
server dropped the game: idle for `game_idle_timeout_s`, or over `max_live_games`); a response with more output
items than `max_step_output_items` is a 413 before `step` sees it; an answer over `max_env_answer_bytes` is a 413
and ends the episode. A hook that finds the row wrong raises `HTTPException(422, ...)`. Hooks run on the event
loop (they are `async` and may call other servers), so the cap on output items is what bounds one step's work.
"""

from __future__ import annotations

import asyncio
import json
import logging
from abc import abstractmethod
from typing import Any, Optional

import orjson
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from nemo_gym.api.schemas import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollouts.aggregation_parts import aggregate_metrics_route
from nemo_gym.serving.sessions import SESSION_ID_KEY
from nemo_gym.servers.resources_server import SimpleResourcesServer
from nemo_gym.servers.rollout_context import RolloutContextMiddleware
from resources_servers.gymnasium.episodes import Episodes
from resources_servers.gymnasium.limits import MAX_ENV_ANSWER_BYTES_KEY, MAX_STEP_OUTPUT_ITEMS_KEY, EnvLimits

__all__ = [
    "EnvResetRequest",
    "EnvResetResponse",
    "EnvStepRequest",
    "EnvStepResponse",
    "GymnasiumServer",
    "extract_text",
    "tool_output",
]

logger = logging.getLogger(__name__)
_SWEEP_INTERVAL_MAX_S = 60.0  # idle games are closed within game_idle_timeout_s plus at most this


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
    _episodes: Optional[Episodes] = PrivateAttr(default=None)
    _sweep: Optional[asyncio.TimerHandle] = PrivateAttr(default=None)
    _sweeping: set = PrivateAttr(default_factory=set)

    def setup_webserver(self) -> FastAPI:
        self._episodes = Episodes(EnvLimits.from_config(self.config))  # a bad limit stops the server at start
        app = self._app_with_post_routes(
            {
                "/reset": self.handle_reset,
                "/step": self.handle_step,
                "/aggregate_metrics": aggregate_metrics_route(self),  # whole, or in parts
            }
        )
        app.add_middleware(RolloutContextMiddleware)  # `/ng-rollout/<id>/<route>` is served as `/<route>`
        return app

    @property
    def episodes(self) -> Episodes:
        """Which sessions have a game going (`episodes.py`), under this server's limits."""
        if self._episodes is None:
            self._episodes = Episodes(EnvLimits.from_config(self.config))
        return self._episodes

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
        """Forget the session's state (called after a step that terminated or truncated the episode, and for a game
        the server drops: idle too long, or over `max_live_games`)."""
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
        """`POST /reset`: `reset(row fields, session id)`. A reset that fails leaves the session without a game."""
        session_id = request.session[SESSION_ID_KEY]
        episodes = self.episodes
        for dropped in [*episodes.idle(), *episodes.begin_reset(session_id)]:
            await self._close(dropped)
        self._schedule_sweep()
        try:
            observation, info = await self.reset(_metadata(body), session_id)
            content = _dump(EnvResetResponse(observation=observation, info=info or {}))
            self._check_answer_size(content, "/reset", "the episode was not started")
        except BaseException:
            episodes.forget(session_id)
            if session_id in self.session_state:  # an earlier game of the session, or what the hook left
                await self._close(session_id)
            raise
        episodes.finish(session_id)
        return Response(content, media_type="application/json")

    async def handle_step(self, request: Request) -> EnvStepResponse:
        """`POST /step`: `step(response, row fields, session id)`; the session is closed once the episode ends.
        The body is read here, not by FastAPI, so that an oversized response is refused before it is validated
        (validating 200,000 output items alone takes seconds)."""
        raw = await request.body()
        self._check_output_items(_json_body(raw))
        try:
            body = EnvStepRequest.model_validate_json(raw)  # from the bytes, exactly as FastAPI validates a body
        except ValidationError as exc:
            raise RequestValidationError(_body_errors(exc), body=raw) from None
        session_id = request.session[SESSION_ID_KEY]
        episodes = self.episodes
        for dropped in episodes.idle():  # this session's own game too, when it sat unplayed too long
            await self._close(dropped)
        episodes.begin_step(session_id)
        ended: Optional[str] = None
        too_large: Optional[HTTPException] = None
        try:
            observation, reward, terminated, truncated, info = await self.step(
                body.response, _metadata(body), session_id
            )
            # Gymnasium envs hand out numpy scalars: answer with plain Python values.
            content = _dump(
                EnvStepResponse(
                    observation=observation,
                    reward=float(reward),
                    terminated=bool(terminated),
                    truncated=bool(truncated),
                    info=info or {},
                )
            )
            number = episodes.steps(session_id)
            if terminated or truncated:
                ended = f"at step {number} ({'terminated' if terminated else 'truncated'})"
            try:
                self._check_answer_size(content, "/step", "the episode was ended")
            except HTTPException as exc:
                too_large = exc
                ended = f"at step {number}, whose answer was over {MAX_ENV_ANSWER_BYTES_KEY}"
        finally:
            episodes.finish(session_id, ended=ended)
        if ended is not None:
            await self._close(session_id)
        if too_large is not None:
            raise too_large
        return Response(content, media_type="application/json")

    # -- the limits ----------------------------------------------------------------------------------------------

    def _check_output_items(self, data: Any) -> None:
        """413 for a response with more output items than `max_step_output_items`, counted on the parsed JSON."""
        response = data.get("response") if isinstance(data, dict) else None
        output = response.get("output") if isinstance(response, dict) else None
        limit = self.episodes.limits.max_step_output_items
        if isinstance(output, list) and len(output) > limit:
            raise HTTPException(
                413,
                f"/step refused: the response has {len(output)} output items, over this server's limit of {limit} "
                f"({MAX_STEP_OUTPUT_ITEMS_KEY}); nothing was played and the game is as it was. Send fewer items "
                f"per step, or raise `{MAX_STEP_OUTPUT_ITEMS_KEY}` in the server's config block.",
            )

    def _check_answer_size(self, content: bytes, route: str, outcome: str) -> None:
        limit = self.episodes.limits.max_env_answer_bytes
        if len(content) > limit:
            raise HTTPException(
                413,
                f"{route}: the environment's answer is {len(content)} bytes, over this server's limit of {limit} "
                f"bytes ({MAX_ENV_ANSWER_BYTES_KEY}); {outcome}. Send a smaller action, or raise "
                f"`{MAX_ENV_ANSWER_BYTES_KEY}` in the server's config block.",
            )

    # -- dropping games ----------------------------------------------------------------------------------------

    async def _close(self, session_id: str) -> None:
        """`close_session`, and the session's `session_state` gone even when an override keeps it."""
        try:
            await self.close_session(session_id)
        except Exception:
            logger.exception("close_session(%r) failed; its session_state is dropped anyway", session_id)
        self.session_state.pop(session_id, None)

    def _schedule_sweep(self) -> None:
        """Look for idle games again later while any are live: their memory comes back without further traffic."""
        if self._sweep is not None or not len(self.episodes):
            return
        interval = min(self.episodes.limits.game_idle_timeout_s / 2, _SWEEP_INTERVAL_MAX_S)
        self._sweep = asyncio.get_running_loop().call_later(interval, self._sweep_now)

    def _sweep_now(self) -> None:
        self._sweep = None
        task = asyncio.get_running_loop().create_task(self._close_idle())
        self._sweeping.add(task)  # a reference until it is done
        task.add_done_callback(self._sweeping.discard)

    async def _close_idle(self) -> None:
        for session_id in self.episodes.idle():
            await self._close(session_id)
        self._schedule_sweep()


def _dump(answer: BaseModel) -> bytes:
    return answer.__pydantic_serializer__.to_json(answer)


def _json_body(raw: bytes) -> Any:
    """The request body as JSON, or FastAPI's own 422 for a body that is not."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {},
                 "ctx": {"error": exc.msg}}  # fmt: skip
        raise RequestValidationError([error], body=raw[:2000]) from None


def _body_errors(exc: ValidationError) -> list[dict]:
    """pydantic's errors as FastAPI reports a body's: located under `body`."""
    return [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]


def _metadata(body: BaseModel) -> dict[str, Any]:
    """The row's own fields: everything but `responses_create_params` and `response` (the declared fields)."""
    return dict(body.model_extra or {})
