"""vllm_model's chat route in training mode takes the prompt's ids from the engine's answer (vLLM >= 0.10.2 with
`return_token_ids`) and asks the upstream's `/tokenize` only when the answer has none; `routed_experts` passes
through. In-process servers (threads): vllm_model in front of the fake backend (its opt-in
`chat_prompt_token_ids`), and a small vLLM-like upstream for `routed_experts`."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import httpx
import openai
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.servers.base import serving_app
from nemo_gym.testing.fake_openai_server import build_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server
from responses_api_models.vllm_model.app import VLLMModel


@contextlib.contextmanager
def stack(backend: Any) -> Iterator[openai.OpenAI]:
    with live_server(backend) as upstream:
        server = make_server(VLLMModel, name="policy_model", base_url=f"{upstream}/v1", api_key="k", model="served",
                             return_token_id_information=True, uses_reasoning_parser=False, max_attempts=1)
        with live_server(serving_app(server.build_app())) as url:
            yield openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30)


def _four_calls(client: openai.OpenAI) -> list[dict]:
    """One call of each kind (Responses and chat, whole and streamed); the token data of each."""
    messages = [{"role": "user", "content": "Hello there friend"}]
    got = [client.responses.create(model="m", input="Hello there friend").output[-1].model_extra]
    with client.responses.stream(model="m", input="Hello there friend") as stream:
        got.append(stream.get_final_response().output[-1].model_extra)
    chat = client.chat.completions.create(model="m", messages=messages)
    assert "prompt_token_ids" not in (chat.model_extra or {})  # the engine's copy moved onto the message
    assert "token_ids" not in (chat.choices[0].model_extra or {})
    got.append(chat.choices[0].message.model_extra)
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))
    assert all("prompt_token_ids" not in (c.model_extra or {}) for c in chunks)
    deltas = [c.choices[0].delta.model_extra or {} for c in chunks if c.choices]
    finishing = [d for d in deltas if "prompt_token_ids" in d]
    assert len(finishing) == 1
    got.append({**finishing[0], "generation_token_ids": [i for d in deltas for i in d.get("generation_token_ids", ())]})
    return got


@pytest.mark.parametrize("engine_ids", [True, False], ids=["engine-supplies-ids", "engine-without-ids"])
def test_tokenize_is_asked_only_when_the_answer_has_no_prompt_ids(engine_ids):
    backend = build_app(chat_prompt_token_ids=engine_ids)
    with stack(backend) as client:
        calls = _four_calls(client)
    for data in calls:
        assert data["prompt_token_ids"] == [100]  # one message (the fake's made-up ids are the same both ways)
        assert data["generation_token_ids"] == [1000, 1001, 1002, 1003]  # "echo: Hello there friend", by word
        assert data["token_trajectory"] == "exact"
    assert len(backend.state.tokenize_requests) == (0 if engine_ids else 4)


# A vLLM-like upstream: `prompt_token_ids` and `routed_experts` as vLLM sends them (top level of the completion / of
# the first chunk; `routed_experts` on the choice).
ROUTED = [[[1, 2]], [[3, 0]]]


async def _vllm_like(request: Request) -> Response:
    body = orjson.loads(await request.body())
    assert body["return_token_ids"] is True and body["logprobs"] is True
    logprobs = {"content": [{"token": "token_id:7", "logprob": -0.25, "bytes": None, "top_logprobs": []}]}
    base = {"id": "chatcmpl-1", "created": 1, "model": body["model"]}
    if not body.get("stream"):
        return Response(orjson.dumps({**base, "object": "chat.completion", "prompt_token_ids": [5, 6, 7], "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
             "logprobs": logprobs, "token_ids": [7], "routed_experts": ROUTED}], "usage": None}),
            media_type="application/json")
    chunks = [
        {**base, "object": "chat.completion.chunk", "prompt_token_ids": [5, 6, 7],
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {**base, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": "ok"}, "logprobs": logprobs, "token_ids": [7], "finish_reason": None}]},
        {**base, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "stop", "routed_experts": ROUTED}]},
    ]
    text = "".join(f"data: {orjson.dumps(c).decode()}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return Response(text, media_type="text/event-stream")


def test_engine_prompt_ids_and_routed_experts_pass_through_whole_and_streamed():
    tokenized: list = []

    async def tokenize(request: Request) -> Response:
        tokenized.append(1)
        return Response(orjson.dumps({"tokens": [0]}), media_type="application/json")

    upstream = Starlette(routes=[Route("/v1/chat/completions", _vllm_like, methods=["POST"]),
                                 Route("/tokenize", tokenize, methods=["POST"])])
    with stack(upstream) as client:
        calls = _four_calls(client)
        url = str(client.base_url).rstrip("/")
        raw = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    for data in calls:
        assert data["prompt_token_ids"] == [5, 6, 7] and data["generation_token_ids"] == [7]
        assert data["routed_experts"] == ROUTED
    assert tokenized == []
    assert set(raw) >= {"choices"} and "prompt_token_ids" not in raw and "routed_experts" not in raw
    assert "routed_experts" not in raw["choices"][0] and raw["choices"][0]["message"]["routed_experts"] == ROUTED
