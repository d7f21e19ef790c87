"""Model servers (NeMo Gym v0.2 `base_responses_api_model`).

Routes: `POST /v1/responses` (`NeMoGymResponseCreateParamsNonStreaming` -> `NeMoGymResponse`) and
`POST /v1/chat/completions` (`NeMoGymChatCompletionCreateParamsNonStreaming` -> `NeMoGymChatCompletion`), which a
server implements, and `POST /v1/messages` (Anthropic Messages) and `"stream": true` on all three, which every
model server gets from this base (`servers/dialects.py`). The session's `session_id` identifies a rollout (e.g.
to pin it to one backend).

Every model server also has `ModelCallCaptureMiddleware` (`servers/model_call_capture.py`): a call prefixed with
`/ng-rollout/<rollout id>` is served as the unprefixed route, and with the global `observability_enabled: true`
its exchange is written to `<model_call_capture_dir>/<rollout id>.capture.jsonl`.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from fastapi import Body, FastAPI

from nemo_gym.config.types import BaseRunServerInstanceConfig
from nemo_gym.config.values import is_mapping
from nemo_gym.api.schemas import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.servers.base import BaseServer, SimpleServer
from nemo_gym.servers.dialects import DialectsMixin
from nemo_gym.servers.model_call_capture import (
    CaptureStore,
    ModelCallCaptureConfig,
    ModelCallCaptureMiddleware,
    ModelCallRecord,
    clear_capture,
    install_model_call_capture,
    merge_model_call_capture_into_record,
)

__all__ = [
    "BaseResponsesAPIModelConfig",
    "BaseResponsesAPIModel",
    "SimpleResponsesAPIModel",
    "CaptureStore",
    "ModelCallCaptureConfig",
    "ModelCallCaptureMiddleware",
    "ModelCallRecord",
    "clear_capture",
    "merge_model_call_capture_into_record",
]


class BaseResponsesAPIModelConfig(BaseRunServerInstanceConfig):
    """The config block of a model server (subclasses add backend URL, key, model name, ...)."""


class BaseResponsesAPIModel(BaseServer):
    config: BaseResponsesAPIModelConfig

    @classmethod
    def load_config_from_global_config(cls) -> BaseResponsesAPIModelConfig:
        """The server's block, after checking the capture keys (`observability_enabled` needs an absolute
        `model_call_capture_dir`), so a bad setting stops the server at start with the fix in the message."""
        config = super().load_config_from_global_config()
        ModelCallCaptureConfig.from_global_config()
        return config  # type: ignore[return-value]


class SimpleResponsesAPIModel(DialectsMixin, BaseResponsesAPIModel, SimpleServer):
    """A model server as a FastAPI app with `/v1/chat/completions` and `/v1/responses` (plus `/v1/messages` and
    streaming from `DialectsMixin`)."""

    def setup_webserver(self) -> FastAPI:
        return self._app_with_post_routes(
            {"/v1/chat/completions": self.chat_completions, "/v1/responses": self.responses}
        )

    def prepare_app(self, app: FastAPI) -> FastAPI:
        """The usual final steps, then `ModelCallCaptureMiddleware` as the outermost layer: prefixed calls are
        served (always) and captured (observability on). Unprefixed calls never pass through it."""
        app = super().prepare_app(app)
        install_model_call_capture(
            app, model_ref=self.config.name, config=ModelCallCaptureConfig.from_global_config(self._global_config())
        )
        return app

    def _global_config(self) -> Any:
        """The global config the server was started with (its client's); `{}` when it has none (tests)."""
        try:
            config = self.server_client.global_config_dict if self.server_client is not None else None
        except Exception:
            config = None
        return config if is_mapping(config) else {}

    @abstractmethod
    async def chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()
    ) -> NeMoGymChatCompletion:
        """One Chat Completions call."""

    @abstractmethod
    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        """One Responses API call."""
