"""local_llama_model with the real model: the packaged SmolLM2-135M GGUF is loaded and generates.

The model is tiny, so these tests check the shape of answers (types, ids, usage, JSON validity against the tool
schemas), not their wisdom. Token limits stay small to keep the module fast (~25 s on an idle 2-core machine).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import jsonschema
import pytest

pytest.importorskip(
    "llama_cpp",
    reason='llama-cpp-python is not installed; install the local-model extra with `pip install -e ".[local]"`',
)

from openai import AsyncOpenAI  # noqa: E402

from nemo_gym.testing.live_server import live_server  # noqa: E402
from nemo_gym.testing.servers import make_server  # noqa: E402
from responses_api_models.local_llama_model.app import LocalLlamaModel, default_model_path, load_llama  # noqa: E402

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name."}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
ADD_TOOL = {
    "type": "function",
    "name": "add_numbers",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
SCHEMAS = {t["name"]: t["parameters"] for t in (WEATHER_TOOL, ADD_TOOL)}


def chat_tool(tool: dict) -> dict:
    return {
        "type": "function",
        "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool},
    }


def new_server(**overrides) -> LocalLlamaModel:
    return make_server(LocalLlamaModel, name="policy_model", **overrides)


@pytest.fixture(scope="module")
def server() -> LocalLlamaModel:
    return new_server(temperature=0.0, seed=1234)


@pytest.fixture(scope="module")
def base_url(server):
    """The app exactly as served (`build_app()`), under uvicorn on 127.0.0.1 in a thread."""
    with live_server(server.build_app(), backlog=64, start_timeout=20, access_log=True) as url:
        yield url


@pytest.fixture(scope="module")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as client:
        yield client


def post_ok(http: httpx.Client, path: str, body: dict) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def assert_usage(usage: dict, prompt_key: str, completion_key: str) -> None:
    assert usage[prompt_key] > 0 and usage[completion_key] > 0
    assert usage["total_tokens"] == usage[prompt_key] + usage[completion_key]


def function_calls(response: dict) -> list[dict]:
    return [item for item in response["output"] if item["type"] == "function_call"]


def assert_valid_call(call: dict, allowed: set[str]) -> dict:
    assert call["name"] in allowed
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    arguments = json.loads(call["arguments"])
    jsonschema.validate(arguments, SCHEMAS[call["name"]])
    return arguments


# ----------------------------------------------------------------------------------------------------------
# Loading


def test_default_weights_come_from_the_installed_package():
    path = default_model_path()
    assert path.suffix == ".gguf" and path.is_file()
    assert "smollm2" in str(path).lower()
    assert path.stat().st_size > 50_000_000  # the real weights, not a pointer file


def test_model_is_loaded_once_per_process(server):
    again = load_llama(None, n_ctx=server.config.n_ctx, n_threads=server.config.n_threads,
                       n_batch=server.config.n_batch, chat_format=server.config.chat_format)
    assert again is server.loaded
    assert new_server().loaded is server.loaded  # a second server instance shares the model
    assert server.model_name.lower().startswith("smollm2")


def test_missing_model_path_is_a_clear_error():
    from nemo_gym.errors import NeMoGymConfigError

    with pytest.raises(NeMoGymConfigError, match="not a file"):
        new_server(model_path="/nonexistent/model.gguf").build_app()


# ----------------------------------------------------------------------------------------------------------
# Chat Completions


def test_chat_completion(http):
    body = post_ok(
        http,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Say hello in one short sentence."}], "max_tokens": 24},
    )
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl_")
    choice = body["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"].strip()
    assert choice["message"]["role"] == "assistant"
    assert_usage(body["usage"], "prompt_tokens", "completion_tokens")
    assert body["usage"]["completion_tokens"] <= 24


def test_chat_completion_required_tool_call(http):
    body = post_ok(
        http,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "What is 2 plus 3?"}],
            "tools": [chat_tool(WEATHER_TOOL), chat_tool(ADD_TOOL)],
            "tool_choice": {"type": "function", "function": {"name": "add_numbers"}},
            "max_tokens": 32,
        },
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "add_numbers"
    jsonschema.validate(json.loads(call["function"]["arguments"]), ADD_TOOL["parameters"])


def test_chat_completion_json_schema_response_format(http):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 40}, "confident": {"type": "boolean"}},
        "required": ["answer", "confident"],
        "additionalProperties": False,
    }
    body = post_ok(
        http,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "What color is the sky? Answer in JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
            "max_tokens": 48,
        },
    )
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)


# ----------------------------------------------------------------------------------------------------------
# Responses


def test_responses_string_input(http):
    body = post_ok(http, "/v1/responses", {"input": "Name a fruit.", "max_output_tokens": 16})
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["model"].lower().startswith("smollm2")
    (message,) = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["id"].startswith("msg_")
    (part,) = message["content"]
    assert part["type"] == "output_text" and isinstance(part["text"], str) and part["text"].strip()
    assert body["status"] in ("completed", "incomplete")
    if body["status"] == "incomplete":
        assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert_usage(body["usage"], "input_tokens", "output_tokens")
    assert body["usage"]["output_tokens"] <= 16


def test_responses_token_limit_marks_incomplete(http):
    body = post_ok(http, "/v1/responses", {"input": "Write a long story about a dragon.", "max_output_tokens": 4})
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["output_tokens"] == 4
    assert body["output"][0]["status"] == "incomplete"


@pytest.mark.parametrize("tools", [[WEATHER_TOOL], [WEATHER_TOOL, ADD_TOOL]], ids=["one_tool", "two_tools"])
def test_responses_tool_choice_required(http, tools):
    body = post_ok(
        http,
        "/v1/responses",
        {
            "input": "What's the weather like in Paris today?",
            "tools": tools,
            "tool_choice": "required",
            "max_output_tokens": 32,
        },
    )
    (call,) = function_calls(body)
    assert_valid_call(call, {t["name"] for t in tools})
    assert body["status"] == "completed"
    assert body["tool_choice"] == "required" and [t["name"] for t in body["tools"]] == [t["name"] for t in tools]


def test_responses_named_tool_choice(http):
    body = post_ok(
        http,
        "/v1/responses",
        {
            "input": "Please add 7 and 5.",
            "tools": [WEATHER_TOOL, ADD_TOOL],
            "tool_choice": {"type": "function", "name": "add_numbers"},
            "max_output_tokens": 32,
        },
    )
    (call,) = function_calls(body)
    arguments = assert_valid_call(call, {"add_numbers"})
    assert isinstance(arguments["a"], int) and isinstance(arguments["b"], int)


def test_responses_auto_gives_a_message_or_a_valid_call(http):
    body = post_ok(
        http,
        "/v1/responses",
        {"input": "What's the weather in Oslo?", "tools": [WEATHER_TOOL], "max_output_tokens": 48},
    )
    assert len(body["output"]) == 1
    item = body["output"][0]
    if item["type"] == "function_call":
        assert_valid_call(item, {"get_weather"})
    else:
        assert item["type"] == "message" and isinstance(item["content"][0]["text"], str)


def test_responses_tool_choice_none_never_calls(http):
    body = post_ok(
        http,
        "/v1/responses",
        {"input": "What's the weather in Oslo?", "tools": [WEATHER_TOOL], "tool_choice": "none",
         "max_output_tokens": 16},
    )
    assert [item["type"] for item in body["output"]] == ["message"]


def test_responses_tool_result_round_trip(http):
    first = post_ok(
        http,
        "/v1/responses",
        {
            "input": "What's the weather in Paris?",
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "max_output_tokens": 32,
        },
    )
    (call,) = function_calls(first)
    history = [
        {"role": "user", "content": "What's the weather in Paris?"},
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": json.dumps({"weather": "cold, 3 C"})},
    ]
    second = post_ok(
        http,
        "/v1/responses",
        {"input": history, "tools": [WEATHER_TOOL], "max_output_tokens": 48},
    )
    kinds = [item["type"] for item in second["output"]]
    assert kinds == ["message"], second["output"]
    assert second["output"][0]["content"][0]["text"].strip()
    # The conversation (call + result) is in the prompt: it is longer than the first request's.
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]


def test_every_dialect_streams_with_the_official_sdks(base_url):
    """One streamed call per dialect on the real model (the whole answer, sent as each API's events)."""
    import anthropic
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="not-checked", max_retries=0, timeout=120)
    events = list(client.responses.create(model="local", input="Say hi.", max_output_tokens=8, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    chat = dict(model="local", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)
    chunks = list(client.chat.completions.create(**chat, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    unstreamed = client.chat.completions.create(**chat)  # temperature 0: the same text, whole
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == unstreamed.choices[0].message.content
    messages = anthropic.Anthropic(base_url=base_url, api_key="not-checked", max_retries=0, timeout=120)
    with messages.messages.stream(model="local", max_tokens=8, messages=[{"role": "user", "content": "Say hi."}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0


def test_unsupported_inputs_are_400(http):
    response = http.post("/v1/responses", json={"input": "hi", "tools": [{"type": "web_search"}]})
    assert response.status_code == 400 and "function tools only" in response.text
    response = http.post(
        "/v1/responses",
        json={"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
    )
    assert response.status_code == 400 and "nope" in response.text


async def test_prompt_longer_than_the_context_window_is_a_400():
    small = new_server(n_ctx=128)
    transport = httpx.ASGITransport(app=small.build_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
        response = await client.post("/v1/responses", json={"input": "word " * 400, "max_output_tokens": 8})
    assert response.status_code == 400
    assert "n_ctx" in response.text and "context window" in response.text


def test_health_stays_responsive_during_generation(base_url, http):
    """Generation runs off the event loop: /health answers while a long generation is in progress."""
    done = threading.Event()
    result: dict = {}

    def generate():
        result["response"] = http.post(
            "/v1/responses", json={"input": "Tell me a long story.", "max_output_tokens": 96}
        )
        done.set()

    worker = threading.Thread(target=generate)
    worker.start()
    time.sleep(0.2)
    latencies = []
    with httpx.Client(base_url=base_url, timeout=10) as probe:
        while not done.is_set() and len(latencies) < 10:
            start = time.perf_counter()
            assert probe.get("/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.05)
    worker.join(timeout=120)
    assert result["response"].status_code == 200
    assert latencies, "the generation finished before /health was probed"
    assert max(latencies) < 0.5, latencies


async def test_concurrent_requests_are_served_one_at_a_time(base_url):
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        bodies = [{"input": f"Count to {n}.", "max_output_tokens": 8} for n in (3, 4, 5)]
        responses = await asyncio.gather(*(client.post("/v1/responses", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert len({r.json()["id"] for r in responses}) == 3


# ----------------------------------------------------------------------------------------------------------
# The official openai client


async def test_openai_client_responses_and_chat(base_url):
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    try:
        response = await client.responses.create(model="anything", input="Say hi.", max_output_tokens=16)
        assert response.object == "response"
        assert isinstance(response.output_text, str) and response.output_text.strip()
        assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0

        completion = await client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "Say hi."}], max_tokens=16
        )
        assert completion.choices[0].message.content.strip()
        assert completion.usage.completion_tokens > 0
    finally:
        await client.close()


async def test_openai_client_function_call_round_trip(base_url):
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    try:
        question = "What's the weather in Berlin?"
        first = await client.responses.create(
            model="anything", input=question, tools=[WEATHER_TOOL], tool_choice="required", max_output_tokens=32
        )
        (call,) = [item for item in first.output if item.type == "function_call"]
        assert call.name == "get_weather"
        jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["parameters"])

        second = await client.responses.create(
            model="anything",
            input=[
                {"role": "user", "content": question},
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": '{"weather": "sunny"}'},
            ],
            tools=[WEATHER_TOOL],
            max_output_tokens=48,
        )
        # tool_choice auto: repeating the answered call is not allowed (repeat guard), so this is a message
        assert [item.type for item in second.output] == ["message"]
        assert second.output_text.strip()

        # The same round trip through Chat Completions.
        chat_first = await client.chat.completions.create(
            model="anything",
            messages=[{"role": "user", "content": question}],
            tools=[chat_tool(WEATHER_TOOL)],
            tool_choice="required",
            max_tokens=32,
        )
        (tool_call,) = chat_first.choices[0].message.tool_calls
        jsonschema.validate(json.loads(tool_call.function.arguments), WEATHER_TOOL["parameters"])
        chat_second = await client.chat.completions.create(
            model="anything",
            messages=[
                {"role": "user", "content": question},
                chat_first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": tool_call.id, "content": '{"weather": "sunny"}'},
            ],
            tools=[chat_tool(WEATHER_TOOL)],
            tool_choice="none",
            max_tokens=32,
        )
        assert chat_second.choices[0].message.content.strip()
        assert not chat_second.choices[0].message.tool_calls
    finally:
        await client.close()


# ----------------------------------------------------------------------------------------------------------
# Anthropic Messages (the shared model-server route) with the official SDK, on the real local model


def test_messages_with_the_anthropic_sdk(base_url):
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="not-checked", max_retries=0, timeout=120)
    add = {"name": ADD_TOOL["name"], "description": ADD_TOOL["description"], "input_schema": ADD_TOOL["parameters"]}
    called = client.messages.create(
        model="local", max_tokens=32, tools=[add], tool_choice={"type": "tool", "name": "add_numbers"},
        messages=[{"role": "user", "content": "Please add 7 and 5."}],
    )
    assert called.stop_reason == "tool_use"
    (tool_use,) = [block for block in called.content if block.type == "tool_use"]
    jsonschema.validate(tool_use.input, SCHEMAS["add_numbers"])

    answered = client.messages.create(
        model="local", max_tokens=16, tools=[add],
        messages=[
            {"role": "user", "content": "Please add 7 and 5."},
            {"role": "assistant", "content": [block.model_dump() for block in called.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "12"}]},
        ],
    )
    assert answered.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answered.usage.input_tokens > 0 and answered.usage.output_tokens > 0
    assert answered.content
