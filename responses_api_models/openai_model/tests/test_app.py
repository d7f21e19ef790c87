"""openai_model against a real OpenAI-compatible upstream (the fake LLM server), called with the official client."""

import contextlib
import json

import httpx
import pytest
from openai import AsyncOpenAI

from nemo_gym.testing.fake_openai_server import build_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server
from responses_api_models.openai_model.app import SimpleModelServer

WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "Weather of a city", "strict": False,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def upstream():
    with live_server(build_app(tool_args='{"city": "Oslo"}')) as url:
        yield f"{url}/v1"


@contextlib.contextmanager
def openai_model(upstream_url: str, **fields):
    server = make_server(
        SimpleModelServer, name="policy_model",
        openai_base_url=upstream_url, openai_api_key="sk-upstream", openai_model="served-model", **fields,
    )
    with live_server(server.build_app()) as url:
        yield url


async def test_official_client_responses_function_call_and_tool_result_round_trip(upstream):
    with openai_model(upstream) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
        first = await client.responses.create(model="ignored", input="Weather in Oslo?", tools=[WEATHER_TOOL])
        assert first.model == "served-model"  # the configured model replaces the request's
        call = first.output[0]
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Oslo"}

        second = await client.responses.create(
            model="ignored",
            tools=[WEATHER_TOOL],
            input=[
                {"role": "user", "content": "Weather in Oslo?"},
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "cold"},
            ],
        )
        assert second.output[0].type == "message"
        assert second.output_text == "echo: Weather in Oslo?"
        assert second.usage.total_tokens == 15


async def test_official_client_chat_completions_with_tool_round_trip(upstream):
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k not in ("type", "strict")}}
    with openai_model(upstream) as url:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
        first = await client.chat.completions.create(
            model="ignored", messages=[{"role": "user", "content": "Weather?"}], tools=[chat_tool]
        )
        tool_call = first.choices[0].message.tool_calls[0]
        assert tool_call.function.name == "get_weather"
        second = await client.chat.completions.create(
            model="ignored",
            tools=[chat_tool],
            messages=[
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [tool_call.model_dump()]},
                {"role": "tool", "tool_call_id": tool_call.id, "content": "cold"},
            ],
        )
        assert second.choices[0].message.content == "echo: Weather?"


async def test_unknown_responses_key_is_rejected_with_the_key_named(upstream):
    with openai_model(upstream) as url:
        r = httpx.post(f"{url}/v1/responses", json={"input": "hi", "not_a_param": 1})
        assert r.status_code == 422
        assert "not_a_param" in r.text


def test_upstream_errors_keep_their_status_and_message():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def refuse(request):
        return JSONResponse({"error": {"message": "model overloaded, try later"}}, status_code=400)

    with live_server(Starlette(routes=[Route("/v1/responses", refuse, methods=["POST"])])) as up:
        with openai_model(f"{up}/v1") as url:
            r = httpx.post(f"{url}/v1/responses", json={"input": "hi"})
    assert r.status_code == 400
    assert "model overloaded" in r.text


async def test_extra_body_is_merged_under_the_request(upstream):
    seen = []
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def record(request):
        seen.append(await request.json())
        return JSONResponse({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "ok"}}]})

    with live_server(Starlette(routes=[Route("/v1/chat/completions", record, methods=["POST"])])) as up:
        with openai_model(f"{up}/v1", extra_body={"top_k": 5, "temperature": 0.1}) as url:
            client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x")
            await client.chat.completions.create(
                model="ignored", messages=[{"role": "user", "content": "x"}], temperature=0.7
            )
    assert seen[0]["top_k"] == 5 and seen[0]["temperature"] == 0.7 and seen[0]["model"] == "served-model"


@pytest.mark.parametrize("extra_body, sent", [({}, None), ({"seed": 0}, 3)])
async def test_a_responses_seed_goes_upstream_only_when_extra_body_names_seed(extra_body, sent):
    seen = []
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def record(request):
        seen.append(await request.json())
        return JSONResponse({"id": "r", "object": "response", "created_at": 0, "model": "m", "status": "completed",
                             "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []})

    with live_server(Starlette(routes=[Route("/v1/responses", record, methods=["POST"])])) as up:
        with openai_model(f"{up}/v1", extra_body=extra_body) as url:
            async with httpx.AsyncClient() as client:
                r = await client.post(f"{url}/v1/responses", json={"input": "hi", "seed": 3})
                assert r.status_code == 200, r.text
                r = await client.post(f"{url}/v1/responses", json={"input": "hi"})
                assert r.status_code == 200, r.text
    assert seen[0].get("seed") == sent
    assert seen[1].get("seed") == extra_body.get("seed")  # no seed in the request: extra_body's, if any
