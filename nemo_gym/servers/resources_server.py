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

from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.config.types import BaseRunServerInstanceConfig
from nemo_gym.api.schemas import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.servers.base import BaseServer, SimpleServer

__all__ = [
    "BaseResourcesServerConfig",
    "BaseResourcesServer",
    "BaseRunRequest",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "SimpleResourcesServer",
]


class BaseResourcesServerConfig(BaseRunServerInstanceConfig):
    """The config block of a resources server (`domain` is checked when the global config is built)."""


class BaseRunRequest(BaseModel):
    """One dataset row as sent to an agent's `/run`: at least the model call parameters."""

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class BaseVerifyRequest(BaseRunRequest):
    """`/verify` body: the row plus the agent's final `response`."""

    response: NeMoGymResponse


class BaseVerifyResponse(BaseVerifyRequest):
    """`/verify` answer: the request echoed back plus `reward` (and any metrics a subclass adds)."""

    reward: float


class BaseSeedSessionRequest(BaseModel):
    """`/seed_session` body (the agent sends the whole row; declare the fields you need)."""


class BaseSeedSessionResponse(BaseModel):
    pass


class BaseResourcesServer(BaseServer):
    config: BaseResourcesServerConfig


class SimpleResourcesServer(BaseResourcesServer, SimpleServer):
    """A resources server as a FastAPI app: `/seed_session`, `/verify`, and the subclass's tool routes."""

    # Per-rollout state lives in this process: a cookie from a process that is gone must not get a fresh,
    # empty session half-way through a rollout (409 instead; the rollout is rerun from its seed).
    refuse_unknown_session_cookies = True

    def setup_webserver(self) -> FastAPI:
        return self._app_with_post_routes({"/seed_session": self.seed_session, "/verify": self.verify})

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        """Prepare per-rollout state before the first tool call. The default keeps nothing."""
        return BaseSeedSessionResponse()

    @abstractmethod
    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        """Score the rollout: return the request echoed back with `reward`."""
