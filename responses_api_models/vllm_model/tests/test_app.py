"""vllm_model as a real server in front of a fake Chat Completions server (real HTTP), called with the official
`openai` client and with plain httpx.

The fake upstream records every request it gets and answers from a script: text, `<think>` content, reasoning
parser fields, tool calls, logprobs with `token_id:N` tokens (when asked for), a `/tokenize` route, a `/v1/responses`
route (for `is_responses_native`) and errors on demand.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from typing import Any, Iterator, Optional

import httpx
import openai
import orjson
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from openai.types.responses import Response as OpenAIResponse
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nemo_gym.openai_utils import NeMoGymChatCompletion, NeMoGymResponse
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server, server_config
from nemo_gym.testing.stack import free_port
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig

# ------------------------------------------------------------------------------------------------------------
# Fake upstream


class FakeChatServer:
    """A scripted OpenAI-compatible Chat Completions server. `reply(...)` queues one answer; with an empty queue it
    answers `"<name> says hi"`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.chat_requests: list[dict] = []
        self.tokenize_requests: list[dict] = []
        self.responses_requests: list[dict] = []
        self.headers: list[dict] = []
        self.script: deque = deque()
        self.tokenize_error: Optional[int] = None  # e.g. 404: an upstream without vLLM's /tokenize
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/health", lambda r: Response(b"ok"), methods=["GET"]),
            ]
        )

    def reset(self) -> None:
        self.chat_requests.clear()
        self.tokenize_requests.clear()
        self.responses_requests.clear()
        self.headers.clear()
        self.script.clear()
        self.tokenize_error = None

    def reply(
        self,
        content: Optional[str] = None,
        *,
        tool_calls: Optional[list[tuple[str, str, str]]] = None,
        reasoning_content: Optional[str] = None,
        finish_reason: Optional[str] = None,
        token_ids: Optional[list[int]] = None,
        error: Optional[tuple[int, str]] = None,
    ) -> None:
        self.script.append(
            dict(content=content, tool_calls=tool_calls, reasoning_content=reasoning_content,
                 finish_reason=finish_reason, token_ids=token_ids, error=error)
        )

    async def _chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.chat_requests.append(body)
        self.headers.append(dict(request.headers))
        step = self.script.popleft() if self.script else {"content": f"{self.name} says hi"}
        if step.get("error"):
            status, message = step["error"]
            return _json({"object": "error", "message": message, "type": "BadRequestError", "code": status}, status)
        message: dict[str, Any] = {"role": "assistant", "content": step.get("content")}
        if step.get("reasoning_content") is not None:
            message["reasoning_content"] = step["reasoning_content"]
            message["reasoning"] = step["reasoning_content"]
        if step.get("tool_calls"):
            message["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in step["tool_calls"]
            ]
        finish = step.get("finish_reason") or ("tool_calls" if step.get("tool_calls") else "stop")
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        ids = step.get("token_ids") or [500 + i for i in range(3)]
        if body.get("logprobs"):
            as_ids = body.get("return_tokens_as_token_ids")
            choice["logprobs"] = {
                "content": [
                    {"token": f"token_id:{t}" if as_ids else f"t{t}", "logprob": -0.125 * (i + 1), "bytes": None,
                     "top_logprobs": []}
                    for i, t in enumerate(ids)
                ]
            }
        n_prompt = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        return _json_with_cookie(
            {
                "id": f"chatcmpl-{len(self.chat_requests)}",
                "object": "chat.completion",
                "created": 1700000000,
                "model": body.get("model"),
                "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(ids),
                          "total_tokens": n_prompt + len(ids)},
            }
        )

    async def _tokenize(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.tokenize_requests.append(body)
        if self.tokenize_error:
            return _json({"detail": "Not Found"}, self.tokenize_error)
        tokens = [100 + i for i in range(len(body.get("messages", [])))]
        return _json({"tokens": tokens, "count": len(tokens), "max_model_len": 4096})

    async def _responses(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.responses_requests.append(body)
        return _json(
            {
                "id": "resp_native", "object": "response", "created_at": 1700000000, "model": body.get("model"),
                "status": "completed", "output": [
                    {"id": "msg_native", "type": "message", "role": "assistant", "status": "completed",
                     "content": [{"type": "output_text", "text": f"{self.name} native", "annotations": []}]}
                ],
                "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            }
        )


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _json_with_cookie(data: Any) -> Response:
    """Like a backend behind a sticky load balancer: every answer sets a cookie (that vllm_model must not keep)."""
    response = _json(data)
    response.set_cookie("upstream_session", f"s{data['id']}")
    return response


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[FakeChatServer, str, FakeChatServer, str]]:
    a, b = FakeChatServer("upstream-a"), FakeChatServer("upstream-b")
    with live_server(a.app) as url_a, live_server(b.app) as url_b:
        yield a, f"{url_a}/v1", b, f"{url_b}/v1"


@pytest.fixture
def up(upstreams) -> FakeChatServer:
    a, _, b, _ = upstreams
    a.reset()
    b.reset()
    return a


@pytest.fixture
def up_url(upstreams) -> str:
    return upstreams[1]


@contextlib.contextmanager
def vllm_model(base_url: Any, **fields: Any) -> Iterator[str]:
    fields.setdefault("return_token_id_information", False)
    fields.setdefault("uses_reasoning_parser", False)
    server = make_server(
        VLLMModel, name="policy_model", base_url=base_url, api_key="up-key", model="served-model", **fields
    )
    with live_server(server.build_app()) as url:
        yield url


def client_for(url: str, **kw: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="x", **kw)


WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER_TOOL = {
    "type": "function",
    "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"},
}


# ------------------------------------------------------------------------------------------------------------
# The official openai client: Responses


async def test_openai_client_responses_function_call_and_tool_result_round_trip(up, up_url):
    up.reply(None, tool_calls=[("call_w1", "get_weather", '{"city": "Paris"}')])
    up.reply("It is 21 degrees in Paris.")
    with vllm_model(up_url) as url:
        client = client_for(url)
        question = {"role": "user", "content": "Weather in Paris?"}
        first = await client.responses.create(
            model="whatever", input=[question], tools=[WEATHER_TOOL], instructions="Be brief.",
            max_output_tokens=100, temperature=0.3,
        )
        assert isinstance(first, OpenAIResponse)
        assert first.model == "served-model" and first.id.startswith("resp_") and first.status == "completed"
        assert first.tool_choice == "auto" and first.instructions == "Be brief."
        (call,) = first.output
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id == "call_w1"
        assert call.arguments == '{"city": "Paris"}'
        assert first.usage.output_tokens == 3

        second = await client.responses.create(
            model="whatever",
            input=[question, call.model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}],
            tools=[WEATHER_TOOL], tool_choice="required", instructions="Be brief.",
        )
        assert second.output_text == "It is 21 degrees in Paris."
        assert second.tool_choice == "required"  # the request's own, not always "auto"
        NeMoGymResponse.model_validate(second.model_dump())

    sent_first, sent_second = up.chat_requests
    assert sent_first == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
        "temperature": 0.3,
        "max_tokens": 100,
        "tools": [CHAT_WEATHER_TOOL],
        "model": "served-model",
    }
    assert sent_second["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_w1", "content": '{"temp": 21}'},
    ]
    assert sent_second["tool_choice"] == "required"
    assert up.headers[0]["authorization"] == "Bearer up-key"
    # The upstream's cookies are not kept (they would tie unrelated rollouts together).
    assert all("cookie" not in headers for headers in up.headers)


async def test_openai_client_chat_completions_tool_call_round_trip(up, up_url):
    up.reply(None, tool_calls=[("call_c1", "get_weather", '{"city": "Rome"}')])
    up.reply("Rome: 25 degrees.")
    with vllm_model(up_url, replace_developer_role_with_system=True) as url:
        client = client_for(url)
        messages: list[dict] = [{"role": "developer", "content": "Use tools."},
                                {"role": "user", "content": "Weather in Rome?"}]
        first = await client.chat.completions.create(model="x", messages=messages, tools=[CHAT_WEATHER_TOOL])
        assert isinstance(first, ChatCompletion)
        tool_call = first.choices[0].message.tool_calls[0]
        assert tool_call.function.name == "get_weather" and tool_call.id == "call_c1"
        assert first.choices[0].finish_reason == "tool_calls"
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": tool_call.id, "content": '{"temp": 25}'}]
        second = await client.chat.completions.create(model="x", messages=messages, tools=[CHAT_WEATHER_TOOL])
        assert second.choices[0].message.content == "Rome: 25 degrees."
        NeMoGymChatCompletion.model_validate(second.model_dump())
    assert up.chat_requests[0]["messages"][0] == {"role": "system", "content": "Use tools."}
    assert up.chat_requests[0]["model"] == "served-model"
    assert [m["role"] for m in up.chat_requests[1]["messages"]] == ["system", "user", "assistant", "tool"]
    assert up.chat_requests[1]["messages"][2]["tool_calls"][0]["id"] == "call_c1"


# ------------------------------------------------------------------------------------------------------------
# Reasoning


async def test_think_tags_without_reasoning_parser(up, up_url):
    up.reply("<think>2+2 is 4.</think>Four.")
    with vllm_model(up_url) as url:
        client = client_for(url)
        first = await client.responses.create(model="m", input="What is 2+2?")
        reasoning, message = first.output
        assert reasoning.type == "reasoning" and reasoning.summary[0].text == "2+2 is 4."
        assert message.content[0].text == "Four."
        await client.responses.create(
            model="m", input=[{"role": "user", "content": "What is 2+2?"},
                              *[item.model_dump(exclude_none=True) for item in first.output],
                              {"role": "user", "content": "And 3+3?"}],
        )
    assert up.chat_requests[1]["messages"][1] == {"role": "assistant", "content": "<think>2+2 is 4.</think>Four."}


async def test_reasoning_parser_fields_both_directions(up, up_url):
    up.reply("Four.", reasoning_content="Adding.")
    up.reply("Six.", reasoning_content="Again.")
    up.reply("Ok.", reasoning_content="Chat path.")
    with vllm_model(up_url, uses_reasoning_parser=True) as url:
        client = client_for(url)
        first = await client.responses.create(model="m", input="What is 2+2?")
        assert [item.type for item in first.output] == ["reasoning", "message"]
        assert first.output[0].summary[0].text == "Adding." and first.output_text == "Four."
        await client.responses.create(
            model="m", input=[{"role": "user", "content": "What is 2+2?"},
                              *[item.model_dump(exclude_none=True) for item in first.output],
                              {"role": "user", "content": "And 3+3?"}],
        )
        chat = await client.chat.completions.create(
            model="m", messages=[{"role": "assistant", "content": "<think>old</think>prev"},
                                 {"role": "user", "content": "hi"}])
        message = chat.choices[0].message
        assert message.content == "<think>Chat path.</think>Ok."
        assert "reasoning_content" not in message.model_dump()
    assert up.chat_requests[1]["messages"][1] == {
        "role": "assistant", "content": "Four.", "reasoning_content": "Adding.", "reasoning": "Adding."}
    assert up.chat_requests[2]["messages"][0] == {
        "role": "assistant", "content": "prev", "reasoning_content": "old", "reasoning": "old"}


async def test_sequential_reasoning_not_allowed_short_circuits(up, up_url):
    after_reasoning_only = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
    ]
    with vllm_model(up_url, uses_reasoning_parser=True, sequential_reasoning_allowed=False) as url:
        r = httpx.post(f"{url}/v1/responses", json={"input": after_reasoning_only})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["incomplete_details"] == {"reason": "content_filter"}
        assert [i["type"] for i in body["output"]] == ["message"] and body["output"][0]["content"][0]["text"] == ""
        assert up.chat_requests == []
        # A normal conversation still reaches the upstream.
        assert httpx.post(f"{url}/v1/responses", json={"input": "q"}).status_code == 200
        assert len(up.chat_requests) == 1
    with vllm_model(up_url, uses_reasoning_parser=True) as url:
        assert httpx.post(f"{url}/v1/responses", json={"input": after_reasoning_only}).json()["status"] == "completed"
        assert len(up.chat_requests) == 2


# ------------------------------------------------------------------------------------------------------------
# Training token data


async def test_training_mode_token_ids_logprobs_and_tokenize(up, up_url):
    up.reply(None, tool_calls=[("call_t1", "get_weather", '{"city": "Oslo"}')], reasoning_content="Need data.",
             token_ids=[11, 12, 13])
    up.reply("Cold.", token_ids=[21, 22])
    up.reply("Chat.", token_ids=[31])
    with vllm_model(up_url, return_token_id_information=True, uses_reasoning_parser=True) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            r1 = (await http.post("/v1/responses", json={"input": "Weather in Oslo?", "tools": [WEATHER_TOOL]})).json()
            reasoning, call = r1["output"]
            assert "prompt_token_ids" not in reasoning
            assert call["prompt_token_ids"] == [100]  # one message rendered by the fake /tokenize
            assert call["generation_token_ids"] == [11, 12, 13]
            assert call["generation_log_probs"] == [-0.125, -0.25, -0.375]
            parsed = NeMoGymResponse.model_validate(r1)
            assert type(parsed.output[-1]).__name__ == "NeMoGymResponseFunctionToolCallForTraining"

            r2 = (await http.post("/v1/responses", json={
                "input": [{"role": "user", "content": "Weather in Oslo?"}, *r1["output"],
                          {"type": "function_call_output", "call_id": "call_t1", "output": "-5C"}],
                "tools": [WEATHER_TOOL]})).json()
            assert r2["output"][-1]["generation_token_ids"] == [21, 22]
            assert r2["output"][-1]["prompt_token_ids"] == [100, 101, 102]

            chat = (await http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}]})).json()
            choice = chat["choices"][0]
            assert choice["message"]["generation_token_ids"] == [31]
            assert choice["message"]["prompt_token_ids"] == [100]
            assert choice.get("logprobs") is None
            NeMoGymChatCompletion.model_validate(chat)

    first, second, _ = up.chat_requests
    assert first["logprobs"] is True and first["return_tokens_as_token_ids"] is True
    assert up.tokenize_requests[0] == {"model": "served-model", "messages": first["messages"],
                                       "tools": first["tools"]}
    # The previous step's exact tokens ride on the replayed assistant message.
    assert second["messages"][1] == {
        "role": "assistant", "content": "",
        "tool_calls": [{"id": "call_t1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
        "prompt_token_ids": [100], "generation_token_ids": [11, 12, 13],
        "generation_log_probs": [-0.125, -0.25, -0.375],
        "reasoning_content": "Need data.", "reasoning": "Need data.",
    }


def test_training_mode_needs_tokenize(up, up_url):
    up.tokenize_error = 404
    with vllm_model(up_url, return_token_id_information=True) as url:
        r = httpx.post(f"{url}/v1/responses", json={"input": "x"})
    assert r.status_code == 500 and "POST /tokenize" in r.text and "HTTP 404" in r.text


# ------------------------------------------------------------------------------------------------------------
# Limits and errors


async def test_finish_reason_length_and_context_length_error(up, up_url):
    up.reply("Partial ans", finish_reason="length")
    up.reply(error=(400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."))
    up.reply(error=(400, "max_tokens must be at least 1, got -12."))
    with vllm_model(up_url, return_token_id_information=True) as url:
        client = client_for(url)
        truncated = await client.responses.create(model="m", input="long", max_output_tokens=3)
        assert truncated.status == "incomplete" and truncated.incomplete_details.reason == "max_output_tokens"
        assert truncated.output_text == "Partial ans"
        assert up.chat_requests[0]["max_tokens"] == 3

        overflow = await client.responses.create(model="m", input="way too long")
        assert [item.type for item in overflow.output] == ["message"] and overflow.output_text == ""
        assert overflow.incomplete_details.reason == "max_output_tokens"

        chat = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "long"}])
        assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.content is None


async def test_other_upstream_errors_keep_status_and_message(up, up_url):
    up.reply(error=(400, "tool_choice 'required' is not supported"))
    up.reply(error=(404, "The model `served-model` does not exist."))
    with vllm_model(up_url) as url:
        client = client_for(url, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="not supported"):
            await client.responses.create(model="m", input="x")
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_unreachable_upstream_is_502():
    with vllm_model(f"http://127.0.0.1:{free_port()}/v1", max_attempts=1) as url:
        r = httpx.post(f"{url}/v1/responses", json={"input": "x"})
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]


def test_bad_requests(up, up_url):
    with vllm_model(up_url) as url:
        unknown = httpx.post(f"{url}/v1/responses", json={"input": "x", "no_such_field": 1})
        assert unknown.status_code == 422 and "no_such_field" in unknown.text
        bad_meta = httpx.post(f"{url}/v1/responses", json={"input": "x", "metadata": {"extra_body": "{oops"}})
        assert bad_meta.status_code == 400 and "metadata.extra_body" in bad_meta.json()["error"]["message"]
        image_by_id = httpx.post(f"{url}/v1/responses", json={
            "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]})
        assert image_by_id.status_code == 400 and "file_id" in image_by_id.json()["error"]["message"]
    assert up.chat_requests == []


# ------------------------------------------------------------------------------------------------------------
# Per-request overrides, unmapped fields, native mode


def test_metadata_overrides_seed_and_extra_body(up, up_url):
    with vllm_model(up_url, chat_template_kwargs={"enable_thinking": False, "keep": 1},
                    extra_body={"top_k": 20, "repetition_penalty": 1.1, "temperature": 0.9}) as url:
        metadata = {"chat_template_kwargs": '{"enable_thinking": true}', "extra_body": '{"top_k": 5}', "tag": "t"}
        r = httpx.post(f"{url}/v1/responses",
                       json={"input": "x", "seed": 42, "temperature": 0.1, "metadata": metadata})
        assert r.status_code == 200, r.text
        assert r.json()["metadata"] == metadata and r.json()["seed"] == 42
        chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "y"}]})
        assert chat.status_code == 200
    sent, sent_chat = up.chat_requests
    assert sent["chat_template_kwargs"] == {"enable_thinking": True, "keep": 1}
    assert sent["top_k"] == 5 and sent["repetition_penalty"] == 1.1
    assert sent["temperature"] == 0.1  # the request's own keys win over extra_body
    assert sent["seed"] == 42
    assert sent["metadata"] == {"tag": "t"}
    assert sent_chat["chat_template_kwargs"] == {"enable_thinking": False, "keep": 1}
    assert sent_chat["top_k"] == 20 and sent_chat["temperature"] == 0.9


def test_unmapped_fields_are_logged_once(up, up_url, caplog):
    caplog.set_level(logging.WARNING, logger="nemo_gym.vllm_model")
    with vllm_model(up_url) as url:
        for _ in range(2):
            r = httpx.post(f"{url}/v1/responses", json={"input": "x", "previous_response_id": "resp_0",
                                                        "max_tool_calls": 3})
            assert r.status_code == 200
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "nemo_gym.vllm_model"]
    assert sum("'previous_response_id'" in w for w in warnings) == 1
    assert sum("'max_tool_calls'" in w for w in warnings) == 1


def test_sticky_round_robin_across_two_upstreams(upstreams):
    a, url_a, b, url_b = upstreams
    a.reset()
    b.reset()
    with vllm_model([url_a, url_b]) as url:
        sessions = [httpx.Client(base_url=url) for _ in range(3)]
        try:
            def ask(client: httpx.Client) -> str:
                r = client.post("/v1/responses", json={"input": "who?"})
                assert r.status_code == 200, r.text
                return r.json()["output"][0]["content"][0]["text"]

            first = [ask(s) for s in sessions]
            assert first == ["upstream-a says hi", "upstream-b says hi", "upstream-a says hi"]
            again = [ask(s) for s in reversed(sessions)] + [ask(sessions[1])]
            assert again == ["upstream-a says hi", "upstream-b says hi", "upstream-a says hi", "upstream-b says hi"]
        finally:
            for s in sessions:
                s.close()
        # Without a cookie every call is a new session: round robin continues (b, a).
        texts = [httpx.post(f"{url}/v1/responses", json={"input": "x"}).json()["output"][0]["content"][0]["text"]
                 for _ in range(2)]
        assert texts == ["upstream-b says hi", "upstream-a says hi"]
    assert len(a.chat_requests) == 5 and len(b.chat_requests) == 4


def test_is_responses_native_forwards_to_upstream_responses(up, up_url):
    with vllm_model(up_url, is_responses_native=True, replace_developer_role_with_system=True,
                    extra_body={"top_k": 3}, chat_template_kwargs={"enable_thinking": False}) as url:
        r = httpx.post(f"{url}/v1/responses", json={
            "model": "caller-model",
            "input": [{"role": "developer", "content": "d"}, {"role": "user", "content": "u"}]})
        assert r.status_code == 200, r.text
        assert r.json()["output"][0]["content"][0]["text"] == "upstream-a native"
    (sent,) = up.responses_requests
    assert sent["model"] == "served-model" and sent["top_k"] == 3
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    assert sent["input"][0]["role"] == "system"
    assert up.chat_requests == []


def test_config_fields_and_validation():
    base = dict(host="127.0.0.1", port=1, entrypoint="app.py", name="m", api_key="k", model="x",
                return_token_id_information=False, uses_reasoning_parser=True)
    cfg = VLLMModelConfig(base_url="http://h/v1", **base)
    assert cfg.base_urls == ["http://h/v1"]
    assert (cfg.replace_developer_role_with_system, cfg.sequential_reasoning_allowed, cfg.is_responses_native,
            cfg.chat_template_kwargs, cfg.extra_body) == (False, True, False, None, None)
    assert VLLMModelConfig(base_url=["http://a/v1", "http://b/v1"], **base).base_urls == ["http://a/v1", "http://b/v1"]
    with pytest.raises(ValidationError, match="return_token_id_information"):
        VLLMModelConfig(base_url="http://h/v1", **{**base, "return_token_id_information": True},
                        is_responses_native=True)
    with pytest.raises(ValidationError, match="at least one"):
        VLLMModelConfig(base_url=[], **base)
    with pytest.raises(ValidationError):
        VLLMModelConfig(base_url="http://h/v1", host="127.0.0.1", port=1, entrypoint="app.py", name="m", model="x")


async def test_sticky_sessions_are_bounded(monkeypatch):
    from responses_api_models.vllm_model import app as app_module

    monkeypatch.setattr(app_module, "MAX_STICKY_SESSIONS", 2)
    config = server_config(
        VLLMModelConfig, "m", base_url=["http://a/v1", "http://b/v1", "http://c/v1"], model="x",
        return_token_id_information=False, uses_reasoning_parser=False,
    )
    model = VLLMModel(config=config, server_client=None)
    urls = [(await model._client_for(s)).base_url for s in ("s1", "s2", "s1", "s3", "s4")]
    assert urls == ["http://a/v1", "http://b/v1", "http://a/v1", "http://c/v1", "http://a/v1"]
    # Only the 2 most recently used sessions are remembered; a forgotten one is assigned anew (round robin goes on).
    assert list(model._session_client) == ["s3", "s4"]
    assert (await model._client_for("s2")).base_url == "http://b/v1"
