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

from fastapi import Body, FastAPI
from pydantic import ConfigDict

from nemo_gym.servers.resources_server import BaseRunRequest, BaseVerifyResponse
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


class SimpleResponsesAPIAgent(DialectsMixin, BaseResponsesAPIAgent, SimpleServer):
    """An agent as a FastAPI app with `/v1/responses` and `/run` (plus `/v1/messages` and streaming from
    `DialectsMixin`)."""

    def setup_webserver(self) -> FastAPI:
        return self._app_with_post_routes({"/v1/responses": self.responses, "/run": self.run})

    @abstractmethod
    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        """Run one episode for these model parameters."""

    @abstractmethod
    async def run(self, body: BaseRunRequest) -> BaseVerifyResponse:
        """Run one dataset row end to end (seed, episode, verify)."""
