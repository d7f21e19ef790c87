"""Resources servers: tools, per-rollout state and the verifier (NeMo Gym v0.2 `base_resources_server`).

Routes: `POST /seed_session` (default answers `{}`), `POST /verify` (abstract), plus the tool routes a subclass
adds in `setup_webserver` (`app.post("/<tool_name>")(self.<tool>)`). Handlers may take FastAPI's `Request`
to read `request.session[SESSION_ID_KEY]`, which identifies the rollout: key per-rollout state by it.

Request/response models keep pydantic's default `extra="ignore"`: fields a subclass does not declare are
dropped. The usual verifier pattern::

    class MyRunRequest(BaseRunRequest):
        expected_answer: str

    class MyVerifyRequest(MyRunRequest, BaseVerifyRequest):
        pass

    class MyVerifyResponse(MyVerifyRequest, BaseVerifyResponse):
        extracted_answer: Optional[str] = None

    async def verify(self, body: MyVerifyRequest) -> MyVerifyResponse:
        return MyVerifyResponse(**body.model_dump(), reward=..., extracted_answer=...)
"""

from __future__ import annotations

from abc import abstractmethod
from enum import Enum
from typing import ClassVar

from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.config.types import AggregateMetrics, AggregateMetricsRequest, BaseRunServerInstanceConfig
from nemo_gym.api.schemas import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming, ShareTokenArraysOnDump
from nemo_gym.rollouts.aggregation_parts import aggregate_metrics_route
from nemo_gym.rollouts.metrics import AggregateMetricsMixin
from nemo_gym.servers.base import BaseServer, SimpleServer
from nemo_gym.servers.mcp_exposure import (
    NEMO_GYM_MCP_METADATA_KEY,
    NEMO_GYM_MCP_SESSION_TOKEN_HEADER,
    MCPServerMetadata,
    MCPToolHooks,
)
from nemo_gym.servers.rollout_context import RolloutContextMiddleware
from nemo_gym.verifiers.judge import judge_failsafe

__all__ = [
    "BaseResourcesServerConfig",
    "BaseResourcesServer",
    "BaseRunRequest",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "SimpleResourcesServer",
    "ReverifyMode",
    "BaseMultiRewardVerifyResponse",
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "MCPServerMetadata",
    "NEMO_GYM_MCP_METADATA_KEY",
    "NEMO_GYM_MCP_SESSION_TOKEN_HEADER",
]


class ReverifyMode(str, Enum):
    """Whether `ng reverify` may re-score this server's rollouts from the stored request and response alone:
    `stateless` (verify reads nothing but its body), `unsupported` (it needs state the rollout built), `unknown`."""

    STATELESS = "stateless"
    UNSUPPORTED = "unsupported"
    UNKNOWN = "unknown"


class BaseResourcesServerConfig(BaseRunServerInstanceConfig):
    """The config block of a resources server (`domain` is checked when the global config is built).

    `REVERIFY_MODE` is a class constant of the config class (as in NeMo Gym v0.5): a server whose verify depends
    only on its request sets `STATELESS` on its config class. `expose_tools_over_mcp: true` also serves the tool
    routes over MCP at `/mcp` (`nemo_gym.mcp_auto_exposure`)."""

    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.UNKNOWN
    expose_tools_over_mcp: bool = False


class BaseRunRequest(ShareTokenArraysOnDump):
    """One dataset row as sent to an agent's `/run`: at least the model call parameters. Its `model_dump()` shares
    the token arrays of training items instead of copying them (so the verify idiom below costs what the rest of the
    rollout costs, not a copy of 64k-token arrays; `nemo_gym.api.schemas.ShareTokenArraysOnDump`)."""

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class BaseVerifyRequest(BaseRunRequest):
    """`/verify` body: the row plus the agent's final `response`."""

    response: NeMoGymResponse


class BaseVerifyResponse(BaseVerifyRequest):
    """`/verify` answer: the request echoed back plus `reward` (and any metrics a subclass adds)."""

    reward: float


class BaseMultiRewardVerifyResponse(BaseVerifyResponse):
    """A verify answer with several named rewards: `reward_components` (the same names for every task) beside the
    scalar `reward` (their aggregate, e.g. the sum), which is still what training uses."""

    reward_components: dict[str, float]


class BaseSeedSessionRequest(BaseModel):
    """`/seed_session` body (the agent sends the whole row; declare the fields you need)."""


class BaseSeedSessionResponse(BaseModel):
    pass


class BaseResourcesServer(BaseServer):
    config: BaseResourcesServerConfig


class SimpleResourcesServer(AggregateMetricsMixin, MCPToolHooks, BaseResourcesServer, SimpleServer):
    """A resources server as a FastAPI app: `/seed_session`, `/verify`, the subclass's tool routes, and NeMo Gym
    v0.5's `POST /aggregate_metrics` and `GET /reverify_mode`. `/verify` is wrapped in `judge_failsafe`: a
    `JudgeError` raised by verify becomes a `judge_failed` answer, not a 500 (a server that registers its own
    `/verify` wraps its handler itself)."""

    # Per-rollout state lives in this process: a cookie from a process that is gone must not get a fresh,
    # empty session half-way through a rollout (409 instead; the rollout is rerun from its seed).
    refuse_unknown_session_cookies = True

    def setup_webserver(self) -> FastAPI:
        app = self._app_with_post_routes(
            {
                "/seed_session": self.seed_session,
                "/verify": judge_failsafe(self.verify),
                "/aggregate_metrics": aggregate_metrics_route(self),  # whole, or in parts
            }
        )
        app.get("/reverify_mode")(self.reverify_mode)
        app.add_middleware(RolloutContextMiddleware)  # `/ng-rollout/<id>/<route>` is served as `/<route>`
        return app

    async def reverify_mode(self) -> ReverifyMode:
        """`GET /reverify_mode`: this server's config class's `REVERIFY_MODE` (a JSON string)."""
        return getattr(type(self.config), "REVERIFY_MODE", ReverifyMode.UNKNOWN)

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Prepare per-rollout state before the first tool call. The default keeps nothing."""
        return BaseSeedSessionResponse()

    @abstractmethod
    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        """Score the rollout: return the request echoed back with `reward`."""
