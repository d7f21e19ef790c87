"""`POST /v1/messages` on every model server, called with the official `anthropic` SDK.

The model servers run for real (uvicorn, served the way `ng_run` serves them) in front of the fake LLM (a real
OpenAI-compatible HTTP server); only the LLM is fake.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import anthropic
import pytest

from nemo_gym.api.anthropic_messages import MessagesConversionError, messages_to_responses_params, response_to_message
from nemo_gym.servers.base import serving_app
from nemo_gym.testing.fake_openai_server import build_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server
from responses_api_models.openai_model.app import SimpleModelServer
from responses_api_models.vllm_model.app import VLLMModel

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def upstream():
    with live_server(build_app(tool_args='{"city": "Oslo"}')) as url:
        yield f"{url}/v1"


def _openai_model(upstream_url: str):
    return make_server(SimpleModelServer, name="policy_model", openai_base_url=upstream_url, openai_api_key="k",
                       openai_model="served-model")


def _vllm_model(upstream_url: str):
    return make_server(VLLMModel, name="policy_model", base_url=upstream_url, api_key="k", model="served-model",
                       return_token_id_information=False, uses_reasoning_parser=False)


@contextlib.contextmanager
def serve(server) -> Iterator[anthropic.Anthropic]:
    with live_server(serving_app(server.build_app())) as url:
        yield anthropic.Anthropic(base_url=url, api_key="not-checked", max_retries=0)


@pytest.fixture(params=["openai_model", "vllm_model"])
def client(request, upstream):
    factory = {"openai_model": _openai_model, "vllm_model": _vllm_model}[request.param]
    with serve(factory(upstream)) as sdk:
        yield sdk


def test_tool_use_then_tool_result_round_trip(client):
    first = client.messages.create(
        model="claude-like", max_tokens=64, system="You check the weather.", tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
    )
    assert first.type == "message" and first.role == "assistant" and first.stop_reason == "tool_use"
    tool_use = next(block for block in first.content if block.type == "tool_use")
    assert tool_use.name == "get_weather" and tool_use.input == {"city": "Oslo"} and tool_use.id
    assert first.usage.input_tokens >= 0 and first.usage.output_tokens >= 0

    second = client.messages.create(
        model="claude-like", max_tokens=64, tools=[WEATHER_TOOL],
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "cold"}]},
        ],
    )
    assert second.stop_reason == "end_turn"
    assert [block.type for block in second.content] == ["text"]
    assert second.content[0].text == "echo: Weather in Oslo?"


def test_bad_requests_raise_the_sdks_typed_errors(client):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="m", max_tokens=16, messages=[{"role": "system", "content": "no such role"}])
    assert "role must be" in caught.value.message
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError, match="streaming"):
        client.messages.create(model="m", max_tokens=16, stream=True, messages=[{"role": "user", "content": "hi"}])


def test_a_backend_error_comes_back_in_anthropics_shape():
    dead_upstream = "http://127.0.0.1:9/v1"  # nothing listens on the discard port: the backend call fails
    server = make_server(SimpleModelServer, name="policy_model", openai_base_url=dead_upstream, openai_model="m",
                         max_attempts=1)
    with serve(server) as sdk:
        with pytest.raises(anthropic.InternalServerError) as caught:
            sdk.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 500 and caught.value.body["error"]["type"] == "api_error"
    assert "ConnectError" in caught.value.body["error"]["message"]


def test_conversion_of_every_supported_block_and_field():
    params, dropped = messages_to_responses_params({
        "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "sys"}], "temperature": 0.5,
        "stop_sequences": ["END"], "top_k": 3, "metadata": {"user_id": "u1"},
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                          "content": [{"type": "text", "text": "down"}]}]},
        ],
    })
    assert sorted(dropped) == ["stop_sequences", "top_k"]
    assert params["instructions"] == "sys" and params["max_output_tokens"] == 10 and params["user"] == "u1"
    assert params["tool_choice"] == {"type": "function", "name": "get_weather"} and params["parallel_tool_calls"] is False
    assert params["tools"][0]["parameters"] == WEATHER_TOOL["input_schema"]
    assert [item["type"] for item in params["input"]] == [
        "message", "reasoning", "message", "function_call", "function_call_output"]
    assert params["input"][0]["content"][1] == {"type": "input_image", "image_url": "data:image/png;base64,AAAA",
                                                "detail": "auto"}
    assert params["input"][3]["arguments"] == '{"city":"Oslo"}'
    assert params["input"][4] == {"type": "function_call_output", "call_id": "t1", "output": "Error: down"}
    with pytest.raises(MessagesConversionError, match="max_tokens"):
        messages_to_responses_params({"messages": [{"role": "user", "content": "x"}]})

    message = response_to_message({
        "id": "resp_1", "model": "served", "incomplete_details": {"reason": "max_output_tokens"},
        "usage": {"input_tokens": 3, "output_tokens": 4},
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "cut"}],
             "generation_token_ids": [1, 2]},
        ],
    })
    assert message["id"] == "msg_resp_1" and message["stop_reason"] == "max_tokens"
    assert message["content"][0] == {"type": "thinking", "thinking": "think", "signature": ""}
    assert message["content"][1] == {"type": "text", "text": "cut", "generation_token_ids": [1, 2]}
    assert message["usage"] == {"input_tokens": 3, "output_tokens": 4}
