"""openai_model: forwards `/v1/responses` and `/v1/chat/completions` to any OpenAI-compatible endpoint.

The request (only the keys the caller set) is merged over `extra_body`, `model` is forced to `openai_model`, and the
upstream answer is returned as it came. A Responses request's `seed` is dropped (OpenAI's Responses API refuses it)
unless `extra_body` has a `seed` key: then the request's seed, or else that one, is sent. Upstream errors come back
with the upstream status and message; 429 and 5xx are retried with backoff by the client (bounded).

Streaming (`"stream": true`) is passed through: the upstream is called with `stream: true` and its server-sent
events (Responses events, chat chunks) go to the client as they come (`serving/stream_adapter.py`; `/v1/messages`
gets them as Messages events).
"""

from typing import Any, AsyncIterator, Optional

import httpx
import orjson
from fastapi import Body, Request
from fastapi.responses import Response
from pydantic import PrivateAttr

from nemo_gym.api.streaming import DONE
from nemo_gym.base_responses_api_model import (
    BaseResponsesAPIModelConfig,
    SimpleResponsesAPIModel,
)
from nemo_gym.openai_utils import (
    NeMoGymAsyncOpenAI,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymOpenAIError,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.http.sse_client import upstream_sse
from nemo_gym.serving.stream_adapter import StreamRefused


class SimpleModelServerConfig(BaseResponsesAPIModelConfig):
    openai_base_url: str
    openai_api_key: Optional[str] = None
    openai_model: str
    extra_body: dict[str, Any] = {}
    max_attempts: int = 3


def _json_response(data: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status_code, media_type="application/json")


class SimpleModelServer(SimpleResponsesAPIModel):
    config: SimpleModelServerConfig
    _client: Optional[NeMoGymAsyncOpenAI] = PrivateAttr(default=None)

    @property
    def client(self) -> NeMoGymAsyncOpenAI:
        if self._client is None:
            self._client = NeMoGymAsyncOpenAI(
                base_url=self.config.openai_base_url,
                api_key=self.config.openai_api_key,
                max_attempts=self.config.max_attempts,
            )
        return self._client

    def _params(self, body: Any) -> dict:
        params = {**self.config.extra_body, **body.model_dump(exclude_unset=True)}
        params["model"] = self.config.openai_model
        return params

    async def _forward(self, call, params: dict) -> Response:
        try:
            return _json_response(await call(**params))
        except NeMoGymOpenAIError as exc:
            return _json_response({"error": {"upstream_status": exc.status, "message": exc.body}}, exc.status)

    def _responses_params(self, body: Any) -> dict:
        """`_params` for the Responses API, which has no `seed` at OpenAI (it refuses the key): a request's seed (e.g.
        from `num_repeats_add_seed`) is sent only when `extra_body` names `seed`, for upstreams that take it."""
        params = self._params(body)
        if "seed" not in self.config.extra_body:
            params.pop("seed", None)
        return params

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> Response:
        return await self._forward(self.client.create_response, self._responses_params(body))

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()) -> Response:
        return await self._forward(self.client.create_chat_completion, self._params(body))

    # -- streaming: the upstream's events passed through (serving/stream_adapter.py calls these) ------------

    async def stream_responses(
        self, body: NeMoGymResponseCreateParamsNonStreaming, request: Request
    ) -> AsyncIterator[dict]:
        async for payload in self._stream("responses", self._responses_params(body)):
            yield payload

    async def stream_chat_completions(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming, request: Request
    ) -> AsyncIterator[dict]:
        async for payload in self._stream("chat/completions", self._params(body)):
            yield payload

    async def _stream(self, route: str, params: dict) -> AsyncIterator[dict]:
        """The upstream's event payloads up to `[DONE]`; an upstream error before the first one is answered like a
        non-streamed call's (`StreamRefused`)."""
        events = upstream_sse(f"{self.client.base_url}/{route}", {**params, "stream": True},
                              api_key=self.config.openai_api_key, retry_policy=self.client.retry_policy)
        try:
            try:
                first = await events.__anext__()
            except StopAsyncIteration:
                return
            except NeMoGymOpenAIError as exc:
                raise StreamRefused(_json_response({"error": {"upstream_status": exc.status, "message": exc.body}},
                                                   exc.status)) from None
            except httpx.TransportError as exc:
                unreachable = {"error": {"message": f"upstream unreachable: {exc}"}}
                raise StreamRefused(_json_response(unreachable, 502)) from None
            if first[1] is DONE:
                return
            yield first[1]
            async for _, payload in events:
                if payload is DONE:
                    return
                yield payload
        finally:
            await events.aclose()


if __name__ == "__main__":
    SimpleModelServer.run_webserver()
