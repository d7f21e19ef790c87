"""Every model server's dialects with the official SDKs: Anthropic Messages (`anthropic`), and streaming on
Responses, Chat Completions and Messages (`openai`, `anthropic`).

The model servers run for real (uvicorn, served the way `ng_run` serves them) in front of the fake LLM (a real
OpenAI-compatible HTTP server); only the LLM is fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import ClassVar, Iterator

import anthropic
import httpx
import openai
import pytest
from fastapi import Body

from nemo_gym.api.anthropic_messages import MessagesConversionError, messages_to_responses_params, response_to_message
from nemo_gym.api.schemas import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.servers.base import serving_app
from nemo_gym.servers.model_server import SimpleResponsesAPIModel
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


FACTORIES = {"openai_model": _openai_model, "vllm_model": _vllm_model}


@pytest.fixture(params=list(FACTORIES))
def client(request, upstream):
    with serve(FACTORIES[request.param](upstream)) as sdk:
        yield sdk


@pytest.fixture(params=list(FACTORIES))
def openai_client(request, upstream):
    with live_server(serving_app(FACTORIES[request.param](upstream).build_app())) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="not-checked", max_retries=0)


OPENAI_WEATHER_TOOL = {"type": "function", "name": WEATHER_TOOL["name"], "description": WEATHER_TOOL["description"],
                       "parameters": WEATHER_TOOL["input_schema"], "strict": False}
CHAT_WEATHER_TOOL = {"type": "function", "function": {"name": WEATHER_TOOL["name"],
                                                      "parameters": WEATHER_TOOL["input_schema"]}}


def test_streamed_messages_round_trip_matches_the_unstreamed_answer(client):
    request = dict(model="claude-like", max_tokens=64, tools=[WEATHER_TOOL],
                   messages=[{"role": "user", "content": "Weather in Oslo?"}])
    with client.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    unstreamed = client.messages.create(**request)
    assert streamed.stop_reason == unstreamed.stop_reason == "tool_use"
    assert [b.model_dump(exclude={"id"}) for b in streamed.content] == [b.model_dump(exclude={"id"}) for b in unstreamed.content]
    tool_use = streamed.content[-1]
    with client.messages.stream(model="claude-like", max_tokens=64, tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [block.model_dump() for block in streamed.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "cold"}]},
    ]) as stream:
        assert stream.get_final_text() == "echo: Weather in Oslo?"


def test_streamed_responses_with_the_openai_sdk(openai_client):
    events = list(openai_client.responses.create(model="m", input="Weather in Oslo?", tools=[OPENAI_WEATHER_TOOL],
                                                 stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    call = events[-1].response.output[0]
    assert call.type == "function_call" and call.name == "get_weather"

    with openai_client.responses.stream(model="m", tools=[OPENAI_WEATHER_TOOL], input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "cold"},
    ]) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "echo: Weather in Oslo?"


def test_streamed_chat_completions_with_the_openai_sdk(openai_client):
    chunks = list(openai_client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[CHAT_WEATHER_TOOL],
        stream=True, stream_options={"include_usage": True},
    ))
    calls = [call for chunk in chunks if chunk.choices for call in (chunk.choices[0].delta.tool_calls or ())]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(call.function.arguments or "" for call in calls)) == {"city": "Oslo"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0

    text = "".join(
        chunk.choices[0].delta.content or "" for chunk in openai_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hello"}], stream=True) if chunk.choices
    )
    assert text.startswith("echo: Hello")


def test_streamed_errors_are_the_sdks_typed_errors(openai_client):
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        openai_client.responses.create(model="m", input="hi", max_output_tokens="many", stream=True)
    assert "max_output_tokens" in caught.value.message


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
    with pytest.raises(anthropic.BadRequestError, match="role must be"):
        with client.messages.stream(model="m", max_tokens=16, messages=[{"role": "robot", "content": "hi"}]) as stream:
            stream.get_final_message()


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


class SlowModel(SimpleResponsesAPIModel):
    """Answers after 30 s unless cancelled; records what happened."""

    outcome: ClassVar[list] = []

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.outcome.append("cancelled")
            raise
        self.outcome.append("finished")  # pragma: no cover - the test hangs up first

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming = Body()) -> NeMoGymChatCompletion:
        raise NotImplementedError  # pragma: no cover


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"input": "hi", "stream": True}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": True}),
])
def test_a_client_that_hangs_up_cancels_the_backend_call(path, body):
    SlowModel.outcome.clear()
    server = make_server(SlowModel, name="slow_model")
    with live_server(serving_app(server.build_app())) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + path, json=body, timeout=httpx.Timeout(5.0, read=0.5))  # hangs up after 0.5 s
        deadline = time.monotonic() + 10
        while not SlowModel.outcome and time.monotonic() < deadline:
            time.sleep(0.05)
    assert SlowModel.outcome == ["cancelled"]


def test_error_messages_are_read_from_every_error_shape():
    from nemo_gym.serving.stream_adapter import error_message, json_or_text, openai_error_body

    assert error_message({"error": {"message": "quota", "type": "x"}}) == "quota"
    assert error_message({"detail": "not found"}) == "not found"
    assert error_message({"detail": [{"loc": ["body", "x"]}]}) == '[{"loc":["body","x"]}]'
    assert error_message({"error": {"upstream_status": 400}}) == '{"upstream_status":400}'
    assert error_message(json_or_text(b"plain text " * 500)) == ("plain text " * 500)[:2000]
    already = b'{"error":{"message":"m","type":"t","param":null,"code":null}}'
    assert openai_error_body(400, already) == already
    assert json.loads(openai_error_body(502, b'{"detail":"bad gateway"}'))["error"] == {
        "message": "bad gateway", "type": "server_error", "param": None, "code": None}
