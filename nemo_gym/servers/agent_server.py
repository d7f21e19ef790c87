"""Agent servers (NeMo Gym v0.2 `base_responses_api_agent`).

Routes: `POST /v1/responses` (one whole episode presented as a single Responses API response) and `POST /run`
(one dataset row: seed the resources server, run the episode, verify, return the verify response). Like a model
server, an agent also answers `POST /v1/messages` and `"stream": true` on top of its `/v1/responses`
(`servers/dialects.py`), so a harness pointed at an agent works as if it were pointed at a model.

`AgentRunRequest` / `AgentVerifyResponse` are `extra="allow"` variants of the resources-server models, for
agents that pass the whole dataset row through to `/seed_session` and `/verify` and return every field the
verifier added (what `simple_agent` does).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Optional

from fastapi import Body, FastAPI, Request
from pydantic import ConfigDict

from nemo_gym.config.types import ROLLOUT_PATH_PREFIX, AggregateMetrics, AggregateMetricsRequest
from nemo_gym.rollouts.aggregation_parts import aggregate_metrics_route
from nemo_gym.rollouts.metrics import AggregateMetricsMixin
from nemo_gym.servers.resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.serving.endpoint_wrapping import wraps_endpoint
from nemo_gym.servers.rollout_context import (
    RolloutContextMiddleware,
    apply_rollout_prefix,
    maybe_rollout_id_from_run_body,
    observability_enabled,
    rollout_context,
    rollout_path_prefix,
)
from nemo_gym.config.types import BaseRunServerInstanceConfig
from nemo_gym.api.schemas import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.servers.base import BaseServer, SimpleServer
from nemo_gym.servers.dialects import DialectsMixin

__all__ = [
    "BaseResponsesAPIAgentConfig",
    "BaseResponsesAPIAgent",
    "SimpleResponsesAPIAgent",
    "AgentRunRequest",
    "AgentVerifyResponse",
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "Body",
    "FastAPI",
    "Request",
]


class BaseResponsesAPIAgentConfig(BaseRunServerInstanceConfig):
    """The config block of an agent server (subclasses add `resources_server`, `model_server`, ...)."""


class AgentRunRequest(BaseRunRequest):
    """A `/run` body that keeps every field of the dataset row."""

    model_config = ConfigDict(extra="allow")


class AgentVerifyResponse(BaseVerifyResponse):
    """A `/run` answer that keeps every field the verifier returned."""

    model_config = ConfigDict(extra="allow")


class BaseResponsesAPIAgent(BaseServer):
    config: BaseResponsesAPIAgentConfig


class SimpleResponsesAPIAgent(AggregateMetricsMixin, DialectsMixin, BaseResponsesAPIAgent, SimpleServer):
    """An agent as a FastAPI app with `/v1/responses` and `/run` (plus `/v1/messages` and streaming from
    `DialectsMixin`), and NeMo Gym v0.5's `/aggregate_metrics` and `/ng-rollout/{rollout_id}/v1/responses` (the
    same handler, for calls that carry their rollout id). `/run` runs inside the rollout's context, so the calls
    it makes carry the rollout id when the global `observability_enabled` is on (`servers/rollout_context.py`)."""

    def setup_webserver(self) -> FastAPI:
        app = self._app_with_post_routes(
            {
                "/v1/responses": self.responses,
                f"/{ROLLOUT_PATH_PREFIX}/{{rollout_id}}/v1/responses": self.responses,
                "/run": self._run_in_rollout_context(self.run),
                "/aggregate_metrics": aggregate_metrics_route(self),  # whole, or in parts
            }
        )
        # The twin route's handler runs in its rollout's context, so its tool and model calls carry the id too.
        app.add_middleware(RolloutContextMiddleware, strip_prefix=False)
        return app

    @abstractmethod
    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        """Run one episode for these model parameters."""

    @abstractmethod
    async def run(self, body: BaseRunRequest) -> BaseVerifyResponse:
        """Run one dataset row end to end (seed, episode, verify)."""

    # -- the rollout id (inert unless `observability_enabled: true`) -----------------------------------------

    def _observability_enabled(self) -> bool:
        """The global `observability_enabled`, read once (every `/run` asks)."""
        enabled = self.__dict__.get("_nemo_gym_observability")
        if enabled is None:
            enabled = observability_enabled(getattr(self.server_client, "global_config_dict", None))
            self.__dict__["_nemo_gym_observability"] = enabled
        return enabled

    def _run_in_rollout_context(self, run: Any) -> Any:
        """`run` wrapped so its body's rollout id is the current one while it runs (same signature for FastAPI)."""

        @wraps_endpoint(run)
        async def run_in_context(*args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("body", args[0] if args else None)
            with rollout_context(self.rollout_id_from_run(body)):
                return await run(*args, **kwargs)

        return run_in_context

    def rollout_id_from_run(self, body: Any) -> Optional[str]:
        """The rollout id of a `/run` body (`"<task>-<rollout>"`), or None when observability is off or the body
        has no indices."""
        if body is None or not self._observability_enabled():
            return None
        return maybe_rollout_id_from_run_body(body)

    def url_path_for_run(self, url_path: str, body: Any) -> str:
        """`/ng-rollout/<id><url_path>` for a call made inside `/run` (observability on, indices in the body), else
        `url_path` unchanged."""
        return rollout_path_prefix(self.rollout_id_from_run(body)) + url_path

    def url_path_for_request(self, url_path: str, request: Any) -> str:
        """Re-apply the `rollout_id` of an inbound prefixed request (the `/ng-rollout/{rollout_id}/...` route) to a
        downstream `url_path`; unprefixed requests leave it unchanged."""
        path_params = getattr(request, "path_params", None) or {}
        rollout_id = path_params.get("rollout_id")
        if rollout_id is None or url_path.startswith(f"/{ROLLOUT_PATH_PREFIX}/"):
            return url_path
        return rollout_path_prefix(rollout_id) + url_path

    def base_url_for_run(self, base_url: str, body: Any) -> str:
        """`base_url` with the rollout prefix inserted before its path (for SDK-style clients inside `/run`)."""
        return apply_rollout_prefix(base_url, self.rollout_id_from_run(body))

    def resolve_model_base_url(self, server_name: str, rollout_id: Optional[str] = None) -> str:
        """`http://host:port[/ng-rollout/<id>]/v1` of a model server of the stack (for OpenAI-SDK-style clients)."""
        base = self.server_client.base_url(server_name).rstrip("/")
        return base + rollout_path_prefix(rollout_id) + "/v1"
