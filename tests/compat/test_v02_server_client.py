"""Servers written the v0.2 way call each other through `ServerClient` and read aiohttp-style responses:
`await resp.json()`, `await resp.read()`, `await resp.text()`, `resp.status`, `resp.ok`, `raise_for_status`,
`get_response_json`. Real servers on real sockets; the only fake is the LLM behind the model server."""

from __future__ import annotations

import json
from typing import Iterator

import aiohttp
import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import (
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient, get_response_json, raise_for_status
from nemo_gym.testing.fake_openai_server import build_app as build_fake_llm
from nemo_gym.testing.live_server import live_server, live_servers
from nemo_gym.testing.servers import server_config
from responses_api_models.openai_model.app import SimpleModelServer

SERVE = {"stop_timeout": 15, "timeout_graceful_shutdown": 1}


# ------------------------------------------------------------------------------------------------------------
# A "backend" resources server that another server's tool calls (a search index, a SQL engine, a judge...).


class LookupConfig(BaseResourcesServerConfig):
    pass


class LookupRequest(BaseModel):
    question: str


class LookupServer(SimpleResourcesServer):
    config: LookupConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/lookup")(self.lookup)
        app.post("/plain")(self.plain)
        app.post("/broken")(self.broken)
        app.get("/whoami")(self.whoami)
        return app

    async def lookup(self, body: LookupRequest) -> dict:
        return {"answer": f"answer to {body.question}", "sources": 2}

    async def plain(self) -> PlainTextResponse:
        return PlainTextResponse("plain text, é")

    async def broken(self) -> dict:
        raise RuntimeError("index is corrupt")

    async def whoami(self, request: Request) -> dict:
        return {"session_id": request.session[SESSION_ID_KEY]}

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


# ------------------------------------------------------------------------------------------------------------
# The v0.2-style environment: its tool asks the lookup server, the way public v0.2 servers call their backends.


class AskConfig(BaseResourcesServerConfig):
    lookup_server_name: str = "lookup_env"


class AskRequest(BaseModel):
    question: str


class AskVerifyRequest(BaseVerifyRequest):
    expected: str


class AskVerifyResponse(AskVerifyRequest, BaseVerifyResponse):
    pass


class AskServer(SimpleResourcesServer):
    config: AskConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/ask")(self.ask)
        app.post("/ask_every_way")(self.ask_every_way)
        app.post("/ask_broken")(self.ask_broken)
        return app

    async def ask(self, body: AskRequest) -> dict:
        resp = await self.server_client.post(
            server_name=self.config.lookup_server_name, url_path="/lookup", json={"question": body.question}
        )
        await raise_for_status(resp)
        data = await resp.json()
        return {"answer": data["answer"]}

    async def ask_every_way(self, body: AskRequest) -> dict:
        resp = await self.server_client.post(
            server_name=self.config.lookup_server_name, url_path="/lookup", json=LookupRequest(question=body.question)
        )
        await raise_for_status(resp)
        plain = await self.server_client.post(server_name=self.config.lookup_server_name, url_path="/plain")
        missing = await self.server_client.post(server_name=self.config.lookup_server_name, url_path="/no_such_route")
        got = await self.server_client.get(server_name=self.config.lookup_server_name, url_path="/whoami")
        return {
            "status": resp.status,
            "ok": resp.ok,
            "json": await resp.json(),
            "read": json.loads(await resp.read()),
            "text": await resp.text(),
            "get_response_json": await get_response_json(resp),
            "content_type": resp.content_type,
            "plain_text": await plain.text(),
            "plain_read": (await plain.read()).decode("utf-8"),
            "missing_status": missing.status,
            "missing_ok": missing.ok,
            "get_status": got.status,
            "get_json": await got.json(),
            "cookie_names": sorted(got.cookies.keys()),
        }

    async def ask_broken(self, body: AskRequest) -> dict:
        resp = await self.server_client.post(server_name=self.config.lookup_server_name, url_path="/broken", json={})
        await raise_for_status(resp)  # raises; the exception middleware relays the inner body
        return {}

    async def verify(self, body: AskVerifyRequest) -> AskVerifyResponse:
        outputs = [o for o in body.response.output if o.type == "function_call_output"]
        reward = 1.0 if any(body.expected in o.output for o in outputs) else 0.0
        return AskVerifyResponse(**body.model_dump(), reward=reward)


# ------------------------------------------------------------------------------------------------------------
# A v0.2-style agent: it calls the model server and the resources server itself and reads their responses.


class V02AgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef


class V02RunRequest(BaseRunRequest):
    model_config = {"extra": "allow"}


class V02Agent(SimpleResponsesAPIAgent):
    config: V02AgentConfig

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        body = body.model_copy(deep=True)
        if isinstance(body.input, str):
            body.input = [NeMoGymEasyInputMessage(role="user", content=body.input)]
        new_outputs: list = []
        model_response = None
        for _ in range(4):
            params = body.model_copy(update={"input": body.input + new_outputs})
            model_resp = await self.server_client.post(
                server_name=self.config.model_server.name, url_path="/v1/responses", json=params,
                cookies=request.cookies,
            )
            await raise_for_status(model_resp)
            assert model_resp.status == 200 and model_resp.ok
            model_response = NeMoGymResponse.model_validate(await model_resp.json())
            new_outputs.extend(model_response.output)
            calls = [o for o in model_response.output if o.type == "function_call"]
            if not calls:
                break
            for call in calls:
                tool_resp = await self.server_client.post(
                    server_name=self.config.resources_server.name, url_path=f"/{call.name}",
                    json=json.loads(call.arguments), cookies=request.cookies,
                )
                # v0.2's SDK-based item types required `type`; written out, as v0.2 code does.
                new_outputs.append(
                    NeMoGymFunctionCallOutput(
                        type="function_call_output", call_id=call.call_id, output=(await tool_resp.read()).decode()
                    )
                )
        model_response.output = new_outputs
        return model_response

    async def run(self, request: Request, body: V02RunRequest) -> AskVerifyResponse:
        cookies = request.cookies
        seed = await self.server_client.post(
            server_name=self.config.resources_server.name, url_path="/seed_session", json=body.model_dump(),
            cookies=cookies,
        )
        await raise_for_status(seed)
        cookies = seed.cookies
        resp = await self.server_client.post(
            server_name=self.config.name, url_path="/v1/responses", json=body.responses_create_params, cookies=cookies
        )
        await raise_for_status(resp)
        verify = await self.server_client.post(
            server_name=self.config.resources_server.name, url_path="/verify",
            json=body.model_dump() | {"response": await get_response_json(resp)}, cookies=resp.cookies,
        )
        await raise_for_status(verify)
        return AskVerifyResponse.model_validate(await verify.json())


# ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack() -> Iterator[dict]:
    global_config: dict = {}
    client = ServerClient(head_server_config=None, global_config_dict=global_config)
    with live_server(build_fake_llm(tool_args='{"question": "the capital of France"}'), **SERVE) as llm:
        servers = {
            "lookup_env": LookupServer(config=server_config(LookupConfig, "lookup_env", domain="other"), server_client=client),
            "ask_env": AskServer(config=server_config(AskConfig, "ask_env", domain="knowledge"), server_client=client),
            "policy_model": SimpleModelServer(
                config=server_config(
                    SimpleModelServer.model_fields["config"].annotation, "policy_model",
                    openai_base_url=llm + "/v1", openai_api_key="dummy", openai_model="fake-model",
                ),
                server_client=client,
            ),
            "v02_agent": V02Agent(
                config=server_config(
                    V02AgentConfig, "v02_agent",
                    resources_server={"type": "resources_servers", "name": "ask_env"},
                    model_server={"type": "responses_api_models", "name": "policy_model"},
                ),
                server_client=client,
            ),
        }
        with live_servers(servers, global_config, **SERVE) as urls:
            yield urls


def test_tool_that_calls_another_server_reads_json(stack):
    r = httpx.post(stack["ask_env"] + "/ask", json={"question": "q1"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"answer": "answer to q1"}


def test_every_aiohttp_style_accessor(stack):
    r = httpx.post(stack["ask_env"] + "/ask_every_way", json={"question": "q2"}, timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    expected = {"answer": "answer to q2", "sources": 2}
    assert got["status"] == 200 and got["ok"] is True
    assert got["json"] == got["read"] == got["get_response_json"] == expected
    assert json.loads(got["text"]) == expected
    assert got["content_type"] == "application/json"
    assert got["plain_text"] == got["plain_read"] == "plain text, é"
    assert got["missing_status"] == 404 and got["missing_ok"] is False
    assert got["get_status"] == 200 and got["get_json"]["session_id"]
    assert got["cookie_names"] == ["LookupServer___lookup_env"]


def test_inner_error_is_relayed_by_the_exception_middleware(stack):
    r = httpx.post(stack["ask_env"] + "/ask_broken", json={"question": "q3"}, timeout=30)
    assert r.status_code == 500
    body = r.json()
    assert isinstance(body, str)
    assert body.startswith("Hit an exception in AskServer___ask_env calling an inner server:")
    assert "RuntimeError" in body and "index is corrupt" in body


def test_agent_runs_a_rollout_against_the_model_server(stack):
    row = {
        "responses_create_params": {
            "input": "What is the capital of France?",
            "tools": [
                {
                    "type": "function", "name": "ask", "description": "ask the index",
                    "parameters": {"type": "object", "properties": {"question": {"type": "string"}}},
                    "strict": False,
                }
            ],
        },
        "expected": "answer to the capital of France",
    }
    r = httpx.post(stack["v02_agent"] + "/run", json=row, timeout=60)
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["reward"] == 1.0
    kinds = [o["type"] for o in result["response"]["output"]]
    assert kinds == ["function_call", "function_call_output", "message"]


async def test_client_response_contract_directly(stack):
    config = {"lookup_env": {"resources_servers": {"impl": {"host": "127.0.0.1", "port": int(stack["lookup_env"].rsplit(":", 1)[1])}}}}
    client = ServerClient(head_server_config=None, global_config_dict=config)
    resp = await client.post(server_name="lookup_env", url_path="/lookup", json={"question": "x"})
    assert (resp.status, resp.ok, resp.reason) == (200, True, "OK")
    assert resp.headers["Content-Type"] == "application/json"
    assert await resp.json() == {"answer": "answer to x", "sources": 2}
    assert await resp.read() == await resp.read()  # the body can be read again
    resp.raise_for_status()
    resp.release()
    async with resp as same:
        assert same is resp

    bad = await client.post(server_name="lookup_env", url_path="/lookup", json={"wrong": 1})
    assert bad.status == 422 and not bad.ok
    with pytest.raises(aiohttp.ClientResponseError) as caught:
        await raise_for_status(bad)
    assert caught.value.status == 422
    assert "question" in caught.value.response_content
    with pytest.raises(aiohttp.ClientResponseError):
        bad.raise_for_status()

    # the session cookie round trip: the same cookie, the same session
    first = await client.get(server_name="lookup_env", url_path="/whoami")
    again = await client.get(server_name="lookup_env", url_path="/whoami", cookies=first.cookies)
    assert (await again.json())["session_id"] == (await first.json())["session_id"]
    fresh = await client.get(server_name="lookup_env", url_path="/whoami")
    assert (await fresh.json())["session_id"] != (await first.json())["session_id"]


async def test_helpers_take_aiohttp_and_httpx_responses(stack):
    url = stack["lookup_env"] + "/lookup"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json={"question": "y"}) as resp:
            await raise_for_status(resp)
            assert await get_response_json(resp) == {"answer": "answer to y", "sources": 2}
        async with session.post(url, json={}) as resp:
            with pytest.raises(aiohttp.ClientResponseError) as caught:
                await raise_for_status(resp)
            assert caught.value.status == 422 and "question" in caught.value.response_content

    async with httpx.AsyncClient() as http:
        resp = await http.post(url, json={"question": "z"})
        await raise_for_status(resp)
        assert await get_response_json(resp) == {"answer": "answer to z", "sources": 2}
        resp = await http.post(url, json={})
        with pytest.raises(httpx.HTTPStatusError) as caught:
            await raise_for_status(resp)
        assert caught.value.status == 422
