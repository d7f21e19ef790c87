"""Model servers (NeMo Gym v0.2 `base_responses_api_model`).

Routes: `POST /v1/responses` (`NeMoGymResponseCreateParamsNonStreaming` -> `NeMoGymResponse`) and
`POST /v1/chat/completions` (`NeMoGymChatCompletionCreateParamsNonStreaming` -> `NeMoGymChatCompletion`), which a
server implements, and `POST /v1/messages` (Anthropic Messages) and `"stream": true` on all three, which every
model server gets from this base (`servers/dialects.py`). The session's `session_id` identifies a rollout (e.g.
to pin it to one backend).
"""

from __future__ import annotations

from abc import abstractmethod

from fastapi import Body, FastAPI

from nemo_gym.config.types import BaseRunServerInstanceConfig
from nemo_gym.api.schemas import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.servers.base import BaseServer, SimpleServer
from nemo_gym.servers.dialects import DialectsMixin

__all__ = ["BaseResponsesAPIModelConfig", "BaseResponsesAPIModel", "SimpleResponsesAPIModel"]


class BaseResponsesAPIModelConfig(BaseRunServerInstanceConfig):
    """The config block of a model server (subclasses add backend URL, key, model name, ...)."""


class BaseResponsesAPIModel(BaseServer):
    config: BaseResponsesAPIModelConfig


class SimpleResponsesAPIModel(DialectsMixin, BaseResponsesAPIModel, SimpleServer):
    """A model server as a FastAPI app with `/v1/chat/completions` and `/v1/responses` (plus `/v1/messages` and
    streaming from `DialectsMixin`)."""

    def setup_webserver(self) -> FastAPI:
        return self._app_with_post_routes(
            {"/v1/chat/completions": self.chat_completions, "/v1/responses": self.responses}
        )

    @abstractmethod
    async def chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()
    ) -> NeMoGymChatCompletion:
        """One Chat Completions call."""

    @abstractmethod
    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        """One Responses API call."""
