"""A streaming backend's deltas passed through the model servers as they come, with the official SDKs.

`vllm_model` (Chat Completions backend) and `openai_model` (Responses backend) run for real in front of the fake
LLM, which streams its answers in several chunks and records each stream (`app.state.streams`). Incremental
arrival is shown without clocks: the fake pauses its stream after a few events until the test releases it, and the
client must have received a delta while the backend is paused. Cancellation: a client that closes its stream
mid-way makes the fake backend see its own stream cancelled.
"""

from __future__ import annotations

import contextlib
import json
from typing import Iterator

import anthropic
import openai
import pytest

from nemo_gym.servers.base import serving_app
from nemo_gym.testing.fake_openai_server import build_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server
from responses_api_models.openai_model.app import SimpleModelServer
from responses_api_models.vllm_model.app import VLLMModel

LONG_ANSWER = "one two three four five six seven eight nine ten"
SCRIPT = [
    {"name": "pause", "match": {"last_user_contains": "Count slowly"}, "output": [LONG_ANSWER],
     "pause_after_chunks": 5},
    {"name": "think", "match": {"last_user_contains": "Think first"},
     "output": ["<think>The user wants a plan.</think>Here is the plan: rest."]},
    {"name": "fail", "match": {"last_user_contains": "Break"}, "status": 500, "error_message": "backend broke"},
    {"name": "dies", "match": {"last_user_contains": "Die midway"}, "output": [LONG_ANSWER], "break_after_chunks": 6},
    {"name": "call", "match": {"has_tools": True, "tool_outputs": 0},
     "output": [{"type": "function_call", "name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]},
    {"name": "after the call", "match": {"tool_outputs": {"min": 1}},
     "output": ["It is {{last_tool_output}} in Oslo today, take a coat."]},
    {"name": "echo", "output": ["You said: {{last_user}}"]},
]

CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}}}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": CHAT_TOOL["function"]["parameters"],
                  "strict": False}
MESSAGES_TOOL = {"name": "get_weather", "input_schema": CHAT_TOOL["function"]["parameters"]}


def _vllm(upstream: str):
    return make_server(VLLMModel, name="policy_model", base_url=upstream, api_key="k", model="served-model",
                       return_token_id_information=False, uses_reasoning_parser=False, max_attempts=1)


def _openai(upstream: str):
    return make_server(SimpleModelServer, name="policy_model", openai_base_url=upstream, openai_api_key="k",
                       openai_model="served-model", max_attempts=1)


SERVERS = {"vllm_model": _vllm, "openai_model": _openai}


class Stack:
    def __init__(self, backend, url: str) -> None:
        self.backend = backend
        self.streams = backend.state.streams
        self.openai = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30)
        self.anthropic = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=30)


@contextlib.contextmanager
def stack(kind: str) -> Iterator[Stack]:
    backend = build_app(script=SCRIPT)
    with live_server(backend) as upstream:
        with live_server(serving_app(SERVERS[kind](f"{upstream}/v1").build_app())) as url:
            try:
                yield Stack(backend, url)
            finally:
                backend.state.streams.release()  # never leave a paused stream behind


@pytest.fixture(scope="module", params=list(SERVERS))
def shared(request):
    with stack(request.param) as s:
        yield s


@pytest.fixture(params=list(SERVERS))
def fresh(request):
    with stack(request.param) as s:
        yield s


def test_chat_chunks_come_as_the_backend_sent_them(shared):
    chunks = list(shared.openai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather?"}], tools=[CHAT_TOOL], stream=True,
        stream_options={"include_usage": True}))
    pieces = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    assert pieces[0].function.name == "get_weather" and pieces[0].id
    arguments = [p.function.arguments for p in pieces if p.function.arguments]
    assert len(arguments) > 1  # split across chunks by the backend, and not re-joined on the way
    assert json.loads("".join(arguments)) == {"city": "Oslo", "unit": "celsius"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 15
    assert shared.streams.records[-1]["endpoint"] == "chat_completions"
    assert shared.streams.records[-1]["state"] == "completed"

    texts = [c.choices[0].delta.content for c in shared.openai.chat.completions.create(
        model="m", stream=True, tools=[CHAT_TOOL], messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": pieces[0].id, "type": "function", "function": {
                "name": "get_weather", "arguments": "".join(arguments)}}]},
            {"role": "tool", "tool_call_id": pieces[0].id, "content": "cold"},
        ]) if c.choices and c.choices[0].delta.content]
    assert len(texts) > 3 and "".join(texts) == "It is cold in Oslo today, take a coat."


def test_responses_stream_round_trip(shared):
    with shared.openai.responses.stream(model="m", input="Weather?", tools=[RESPONSES_TOOL]) as stream:
        events = list(stream)
        first = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.function_call_arguments.delta") > 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    call = first.output[0]
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Oslo", "unit": "celsius"}

    request = dict(model="m", tools=[RESPONSES_TOOL], input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "cold"},
    ])
    with shared.openai.responses.stream(**request) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 3 and "".join(deltas) == final.output_text == "It is cold in Oslo today, take a coat."
    unstreamed = shared.openai.responses.create(**request)
    assert unstreamed.output_text == final.output_text
    assert [item.type for item in unstreamed.output] == [item.type for item in final.output]


def test_messages_stream_round_trip(shared):
    request = dict(model="claude-like", max_tokens=64, tools=[MESSAGES_TOOL],
                   messages=[{"role": "user", "content": "Weather?"}])
    with shared.anthropic.messages.stream(**request) as stream:
        events = list(stream)
        first = stream.get_final_message()
    json_deltas = [e for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(json_deltas) > 1
    assert first.stop_reason == "tool_use" and first.content[-1].input == {"city": "Oslo", "unit": "celsius"}
    unstreamed = shared.anthropic.messages.create(**request)
    blocks = [b.model_dump(exclude={"id"}) for b in first.content]
    assert blocks == [b.model_dump(exclude={"id"}) for b in unstreamed.content]

    tool_use = first.content[-1]
    with shared.anthropic.messages.stream(model="claude-like", max_tokens=64, tools=[MESSAGES_TOOL], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "cold"}]},
    ]) as stream:
        texts = [e.delta.text for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta"]
        final = stream.get_final_message()
    assert len(texts) > 3 and "".join(texts) == "It is cold in Oslo today, take a coat."
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 5


def test_think_blocks_stream_as_reasoning_like_the_unstreamed_answer():
    with stack("vllm_model") as s:
        request = dict(model="m", input="Think first, then answer.")
        with s.openai.responses.stream(**request) as stream:
            kinds = [e.type for e in stream]
            final = stream.get_final_response()
        unstreamed = s.openai.responses.create(**request)
        assert "response.reasoning_summary_text.delta" in kinds and "response.output_text.delta" in kinds
        kinds = [item.type for item in final.output]
        assert kinds == [item.type for item in unstreamed.output] == ["reasoning", "message"]
        assert final.output[0].summary[0].text == unstreamed.output[0].summary[0].text == "The user wants a plan."
        assert final.output_text == unstreamed.output_text == "Here is the plan: rest."

        with s.anthropic.messages.stream(model="m", max_tokens=64,
                                         messages=[{"role": "user", "content": "Think first."}]) as stream:
            message = stream.get_final_message()
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == "The user wants a plan."
        assert message.content[1].text == "Here is the plan: rest."


def _first_text_then_rest(dialect: str, s: Stack) -> tuple[str, dict, str]:
    """Open a stream of `dialect`, read up to the first text delta, note the backend's stream state then, release
    the backend and read the rest: (first delta, backend record at that moment, whole text)."""
    ask = "Count slowly please"
    if dialect == "chat":
        stream = s.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": ask}], stream=True)
        texts = (c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content)
    elif dialect == "responses":
        stream = s.openai.responses.create(model="m", input=ask, stream=True)
        texts = (e.delta for e in stream if e.type == "response.output_text.delta")
    else:
        manager = s.anthropic.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": ask}])
        stream = manager.__enter__()
        texts = (e.delta.text for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta")
    with contextlib.closing(stream):
        first = next(texts)
        record = dict(s.streams.wait_for(lambda r: r["rule"] == "pause"))
        s.streams.release()
        return first, record, first + "".join(texts)


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_the_first_delta_arrives_while_the_backend_is_still_streaming(fresh, dialect):
    first, record, text = _first_text_then_rest(dialect, fresh)
    assert first == "one "
    assert record["state"] != "completed" and record["sent"] <= 5  # the backend had not finished its answer
    assert text == LONG_ANSWER
    assert fresh.streams.wait_for(lambda r: r["rule"] == "pause")["state"] == "completed"


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_client_closing_its_stream_cancels_the_backend_stream(fresh, dialect):
    ask = "Count slowly please"
    if dialect == "chat":
        stream = fresh.openai.chat.completions.create(model="m", stream=True,
                                                      messages=[{"role": "user", "content": ask}])
        next(c for c in stream if c.choices and c.choices[0].delta.content)
    elif dialect == "responses":
        stream = fresh.openai.responses.create(model="m", input=ask, stream=True)
        next(e for e in stream if e.type == "response.output_text.delta")
    else:
        stream = fresh.anthropic.messages.create(model="m", max_tokens=64, stream=True,
                                                 messages=[{"role": "user", "content": ask}])
        next(e for e in stream if e.type == "content_block_delta")
    assert fresh.streams.wait_for(lambda r: r["rule"] == "pause")["state"] in ("streaming", "paused")
    stream.close()
    assert fresh.streams.wait_for(lambda r: r["state"] == "cancelled")["rule"] == "pause"


def test_a_backend_error_before_the_stream_is_each_sdks_typed_error(shared):
    with pytest.raises(openai.InternalServerError, match="backend broke"):
        list(shared.openai.responses.create(model="m", input="Break it", stream=True))
    with pytest.raises(openai.InternalServerError, match="backend broke"):
        list(shared.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": "Break"}],
                                                   stream=True))
    with pytest.raises(anthropic.InternalServerError, match="backend broke") as caught:
        with shared.anthropic.messages.stream(model="m", max_tokens=8,
                                              messages=[{"role": "user", "content": "Break"}]) as stream:
            stream.get_final_message()
    assert caught.value.body["error"]["type"] == "api_error"


def test_training_token_data_survives_streaming():
    """vllm_model in training mode: the token ids and logprobs of a streamed answer are those of the non-streamed
    one (the fake backend makes one token per word and `/tokenize` gives one prompt token per message)."""
    backend = build_app(script=SCRIPT)
    with live_server(backend) as upstream:
        server = make_server(VLLMModel, name="policy_model", base_url=f"{upstream}/v1", api_key="k", model="served",
                             return_token_id_information=True, uses_reasoning_parser=False, max_attempts=1)
        with live_server(serving_app(server.build_app())) as url:
            s = Stack(backend, url)
            words = len("You said: Hello there friend".split())
            expected = {"prompt_token_ids": [100], "generation_token_ids": list(range(1000, 1000 + words)),
                        "generation_log_probs": [-0.5] * words}

            unstreamed = s.openai.responses.create(model="m", input="Hello there friend")
            assert {k: unstreamed.output[-1].model_extra[k] for k in expected} == expected
            with s.openai.responses.stream(model="m", input="Hello there friend") as stream:
                done = [e.item for e in stream if e.type == "response.output_item.done"]
                final = stream.get_final_response()
            assert final.output_text == "You said: Hello there friend"
            assert {k: done[-1].model_extra[k] for k in expected} == expected
            assert {k: final.output[-1].model_extra[k] for k in expected} == expected

            chunks = list(s.openai.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Hello there friend"}], stream=True))
            deltas = [c.choices[0].delta.model_extra or {} for c in chunks if c.choices]
            assert [i for d in deltas for i in d.get("generation_token_ids", ())] == expected["generation_token_ids"]
            assert [p for d in deltas for p in d.get("generation_log_probs", ())] == expected["generation_log_probs"]
            assert [d["prompt_token_ids"] for d in deltas if "prompt_token_ids" in d] == [[100]]
            assert all(c.choices[0].logprobs is None for c in chunks if c.choices)

            events = s.anthropic.messages.create(model="m", max_tokens=64, stream=True,
                                                 messages=[{"role": "user", "content": "Hello there friend"}])
            stops = [e for e in events if e.type == "content_block_stop"]  # the raw events keep extra fields
            assert {k: stops[-1].model_extra[k] for k in expected} == expected


def test_vllm_model_responses_native_passes_the_backends_responses_events_through():
    backend = build_app(script=SCRIPT)
    with live_server(backend) as upstream:
        server = make_server(VLLMModel, name="policy_model", base_url=f"{upstream}/v1", api_key="k", model="served",
                             return_token_id_information=False, uses_reasoning_parser=False, is_responses_native=True)
        with live_server(serving_app(server.build_app())) as url:
            s = Stack(backend, url)
            with s.openai.responses.stream(model="m", input="Hello there friend") as stream:
                deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
                final = stream.get_final_response()
            assert len(deltas) == 5 and "".join(deltas) == final.output_text == "You said: Hello there friend"
            assert backend.state.streams.records[-1]["endpoint"] == "responses"
            with s.anthropic.messages.stream(model="m", max_tokens=64,
                                             messages=[{"role": "user", "content": "Hello"}]) as stream:
                assert stream.get_final_text() == "You said: Hello"


def test_a_backend_that_does_not_stream_is_answered_from_its_whole_answer():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def whole(request):  # ignores `stream: true`
        return JSONResponse({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}]})

    with live_server(Starlette(routes=[Route("/v1/chat/completions", whole, methods=["POST"])])) as upstream:
        with live_server(serving_app(_vllm(f"{upstream}/v1").build_app())) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=30)
            chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                         stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "whole"
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
            assert client.chat.completions.create(model="m", messages=[
                {"role": "user", "content": "hi"}]).choices[0].message.content == "whole"


def test_output_text_logprobs_come_with_the_streamed_text():
    """vllm_model: logprobs asked with `include` come with the text deltas and on the final text part."""
    with stack("vllm_model") as s:
        request = dict(model="m", input="Hello there", include=["message.output_text.logprobs"])
        unstreamed = s.openai.responses.create(**request)
        with s.openai.responses.stream(**request) as stream:
            deltas = [e for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    expected = [entry.token for entry in unstreamed.output[0].content[0].logprobs]
    assert expected == ["You ", "said: ", "Hello ", "there"]  # the fake backend's tokens: one per word
    assert [entry.token for d in deltas for entry in d.logprobs] == expected
    assert [entry.token for entry in final.output[0].content[0].logprobs] == expected


def test_a_backend_dying_mid_stream_ends_the_stream_with_the_dialects_error_event(shared):
    ask = "Die midway please"
    with pytest.raises(openai.APIError, match="stream broke off") as caught:
        list(shared.openai.chat.completions.create(model="m", messages=[{"role": "user", "content": ask}], stream=True))
    assert not isinstance(caught.value, openai.APIStatusError)  # the stream had started: an error event, not a status
    with pytest.raises(openai.APIError, match="stream broke off"):
        list(shared.openai.responses.create(model="m", input=ask, stream=True))
    with pytest.raises(anthropic.APIStatusError, match="stream broke off") as caught:
        with shared.anthropic.messages.stream(model="m", max_tokens=64,
                                              messages=[{"role": "user", "content": ask}]) as stream:
            stream.get_final_message()
    assert caught.value.body["error"]["type"] == "api_error"
    assert [r["state"] for r in shared.streams.records if r["rule"] == "dies"] == ["broken"] * 3


def test_streamed_messages_name_the_dropped_fields(shared, capfd):
    with shared.anthropic.messages.stream(model="m", max_tokens=16, stop_sequences=["END"], extra_body={"top_k": 3},
                                          messages=[{"role": "user", "content": "hi"}]) as stream:
        assert stream.response.headers["x-nemo-gym-dropped-fields"] == "stop_sequences,top_k"
        assert stream.get_final_text() == "You said: hi"
    assert "dropped request fields with no Responses equivalent: stop_sequences, top_k" in capfd.readouterr().err
