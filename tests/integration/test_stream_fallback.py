"""`"stream": true` on a model server whose backend does not stream: the events are made from the whole answer.

`ng_run` serves two `openai_model`s, each a real process: `whole_model` in front of the fake LLM started with
`--no-stream` (it answers a streamed request with the whole JSON answer, as some OpenAI-compatible servers do) and
`streaming_model` in front of a fake LLM that streams. The official `openai` and `anthropic` SDKs stream from both
and get the whole text, the tool calls and the final object; from `whole_model` each text comes as one delta (made
from the whole answer), from `streaming_model` in several (the backend's own, passed through).
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, free_port, server_instances
from tests.conftest import REPO_ROOT

TOOL_ARGS = '{"city": "Oslo"}'
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "strict": False, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": RESPONSES_TOOL["parameters"]}}
MESSAGES_TOOL = {"name": "get_weather", "input_schema": RESPONSES_TOOL["parameters"]}
MODEL_BLOCK = """{name}:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: {url}
      openai_api_key: dummy
      openai_model: fake-model
      max_attempts: 1
"""


class Stack:
    def __init__(self, run: NgRunStack, urls: dict) -> None:
        self.run = run
        self.urls = urls

    def openai(self, name: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.urls[name]}/v1", api_key="k", max_retries=0, timeout=60)

    def anthropic(self, name: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.urls[name], api_key="k", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    config = tmp_path_factory.mktemp("stream_fallback") / "models.yaml"
    with FakeLLMBackend("--no-stream", "--tool-args", TOOL_ARGS) as whole, \
            FakeLLMBackend("--tool-args", TOOL_ARGS) as streaming:
        config.write_text(MODEL_BLOCK.format(name="whole_model", url=whole.base_url) + "\n"
                          + MODEL_BLOCK.format(name="streaming_model", url=streaming.base_url))
        head_port = free_port()
        run = NgRunStack([f"+config_paths=[{config}]", f"+head_server.port={head_port}"], cwd=REPO_ROOT)
        try:
            run.wait_for("All 2 / 2 servers ready!", timeout=180)
            urls = {i["process_name"]: i["url"].rstrip("/") for i in server_instances(head_port)}
            assert set(urls) == {"whole_model", "streaming_model"}, urls
            yield Stack(run, urls)
        finally:
            assert run.stop() == 0, run.output


MODELS = ["whole_model", "streaming_model"]


def _text_deltas_expected(name: str, deltas: list) -> None:
    if name == "whole_model":
        assert len(deltas) == 1, deltas  # made from the whole answer
    else:
        assert len(deltas) > 1, deltas  # the backend's own deltas, passed through


@pytest.mark.parametrize("name", MODELS)
def test_responses_stream_with_the_openai_sdk(stack, name):
    client = stack.openai(name)
    events = list(client.responses.create(model="m", input="Weather in Oslo?", tools=[RESPONSES_TOOL], stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"], kinds
    assert kinds[-2:] == ["response.output_item.done", "response.completed"], kinds
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    call = events[-1].response.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}

    request = dict(model="m", tools=[RESPONSES_TOOL], input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "cold"},
    ])
    with client.responses.stream(**request) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "echo: Weather in Oslo?"
    assert final.status == "completed" and final.usage.total_tokens == 15
    _text_deltas_expected(name, deltas)
    assert client.responses.create(**request).output_text == final.output_text


@pytest.mark.parametrize("name", MODELS)
def test_chat_completions_stream_with_the_openai_sdk(stack, name):
    client = stack.openai(name)
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[CHAT_TOOL], stream=True,
        stream_options={"include_usage": True}))
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    assert calls[0].function.name == "get_weather" and calls[0].id
    assert json.loads("".join(call.function.arguments or "" for call in calls)) == {"city": "Oslo"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 15

    texts = [c.choices[0].delta.content for c in client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello there"}], stream=True)
        if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == "echo: Hello there"
    _text_deltas_expected(name, texts)


@pytest.mark.parametrize("name", MODELS)
def test_messages_stream_with_the_anthropic_sdk(stack, name):
    client = stack.anthropic(name)
    request = dict(model="claude-like", max_tokens=64, tools=[MESSAGES_TOOL],
                   messages=[{"role": "user", "content": "Weather in Oslo?"}])
    with client.messages.stream(**request) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert message.stop_reason == "tool_use"
    tool_use = message.content[-1]
    assert tool_use.type == "tool_use" and tool_use.name == "get_weather" and tool_use.input == {"city": "Oslo"}

    raw = list(client.messages.create(model="claude-like", max_tokens=64, stream=True, tools=[MESSAGES_TOOL], messages=[
        *request["messages"],
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "cold"}]},
    ]))
    assert [e.type for e in raw][0] == "message_start" and [e.type for e in raw][-2:] == ["message_delta",
                                                                                           "message_stop"]
    deltas = [e.delta.text for e in raw if e.type == "content_block_delta"]
    assert "".join(deltas) == "echo: Weather in Oslo?"
    assert raw[-2].delta.stop_reason == "end_turn" and raw[-2].usage.output_tokens == 5
    _text_deltas_expected(name, deltas)


def test_the_fallback_is_said_once_and_only_for_the_backend_that_does_not_stream(stack):
    for _ in range(2):
        with stack.openai("whole_model").responses.stream(model="m", input="hi") as stream:
            assert stream.get_final_response().output_text == "echo: hi"
        with stack.openai("streaming_model").responses.stream(model="m", input="hi") as stream:
            assert stream.get_final_response().output_text == "echo: hi"
    text = "`stream_responses` serves are answered from the whole answer"
    stack.run.wait_for(text, timeout=30)  # the server's log line comes through ng_run's output
    said = [line for line in stack.run.lines if text in line]
    assert len(said) == 1, stack.run.output[-5000:]
    assert "does not stream" in said[0]
