"""example_mcp_tools: the verifier called directly, the tools over HTTP, and the same tools over MCP with the
official `mcp` client against the server running for real (uvicorn, the app as `ng_run` serves it)."""

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient
from starlette.requests import Request

from nemo_gym.mcp_auto_exposure import NEMO_GYM_MCP_METADATA_KEY, TOKEN_HEADER
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.servers.base import serving_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.responses import function_call, function_call_output, make_response, message
from nemo_gym.testing.servers import Verifier, example_rows, make_server
from nemo_gym.testing.mcp_client import mcp_session, wire
from resources_servers.example_mcp_tools.app import (
    TOOL_NAMES,
    CheckStockRequest,
    ExampleMCPToolsResourcesServer,
    MoveRequest,
    WarehouseSeedSessionRequest,
    WarehouseVerifyRequest,
)

NAME = "example_mcp_tools"
PARAMS = {"input": [{"role": "user", "content": "Ship 4 apples, then tell me how many apples are left."}]}


def new_server(**config: Any) -> ExampleMCPToolsResourcesServer:
    return make_server(ExampleMCPToolsResourcesServer, name=NAME, domain="agent", **config)


VERIFY = Verifier(
    new_server, WarehouseVerifyRequest, PARAMS, expected_stock={"apples": 8, "pears": 5}, report_item="apples"
)


def session_request(session_id: str) -> Request:
    """A bare request carrying the session the middleware would have decoded from the cookie."""
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "session": {SESSION_ID_KEY: session_id}}
    return Request(scope)


SHIP_4 = [
    function_call("ship", {"item": "apples", "quantity": 4}, call_id="c1"),
    function_call_output({"item": "apples", "shipped": 4, "remaining": 8}, call_id="c1"),
]


def seeded(server: ExampleMCPToolsResourcesServer, session_id: str) -> Request:
    request = session_request(session_id)
    asyncio.run(server.seed_session(request, WarehouseSeedSessionRequest(initial_stock={"Apples": 12, "pears": 5})))
    return request


# ----------------------------------------------------------------------------------------------- direct calls


def test_the_right_calls_and_an_answer_from_their_output_get_reward_one():
    server = new_server()
    request = seeded(server, "rollout-a")
    shipped = asyncio.run(server.ship(request, MoveRequest(item="apples", quantity=4)))
    assert (shipped.remaining, shipped.shipped) == (8, 4)
    result = asyncio.run(server.verify(request, VERIFY.request(*SHIP_4, "There are 8 apples left.")))
    assert result.reward == 1.0
    assert result.stock_ok and result.answer_ok
    assert result.final_stock == {"apples": 8, "pears": 5}
    assert result.tool_calls == ["ship"] and result.reported_quantity == 8


def test_an_answer_that_does_not_state_the_tool_output_gets_reward_zero():
    server = new_server()
    request = seeded(server, "rollout-b")
    asyncio.run(server.ship(request, MoveRequest(item="apples", quantity=4)))
    result = asyncio.run(server.verify(request, VERIFY.request(*SHIP_4, "There are 18 apples left.")))
    assert result.reward == 0.0 and result.stock_ok and not result.answer_ok


def test_a_right_number_no_tool_reported_gets_reward_zero():
    # The stock is right and the text says 8, but no tool output gave the number: the answer is a guess.
    server = new_server()
    request = seeded(server, "rollout-c")
    asyncio.run(server.ship(request, MoveRequest(item="apples", quantity=4)))
    transcript = [function_call("ship", {"item": "apples", "quantity": 4}, call_id="c1"), "8 apples are left."]
    result = asyncio.run(server.verify(request, VERIFY.request(*transcript)))
    assert result.reward == 0.0 and result.reported_quantity is None


def test_a_wrong_final_stock_gets_reward_zero_even_with_a_consistent_answer():
    server = new_server()
    request = seeded(server, "rollout-d")
    asyncio.run(server.ship(request, MoveRequest(item="apples", quantity=3)))
    transcript = [
        function_call("ship", {"item": "apples", "quantity": 3}, call_id="c1"),
        function_call_output({"item": "apples", "shipped": 3, "remaining": 9}, call_id="c1"),
        "9 apples are left.",
    ]
    result = asyncio.run(server.verify(request, VERIFY.request(*transcript)))
    assert result.reward == 0.0 and result.answer_ok and not result.stock_ok


def test_tool_errors_change_nothing():
    server = new_server()
    request = seeded(server, "rollout-e")
    with pytest.raises(HTTPException) as unknown:
        asyncio.run(server.check_stock(request, CheckStockRequest(item="kiwis")))
    assert unknown.value.status_code == 404 and "apples, pears" in unknown.value.detail
    with pytest.raises(HTTPException) as too_many:
        asyncio.run(server.ship(request, MoveRequest(item="pears", quantity=6)))
    assert too_many.value.status_code == 409 and "only 5 pears" in too_many.value.detail
    assert server.stock_by_session["rollout-e"] == {"apples": 12, "pears": 5}


def test_verify_frees_the_rollouts_state():
    server = new_server()
    request = seeded(server, "rollout-f")
    asyncio.run(server.verify(request, VERIFY.request("nothing")))
    second = asyncio.run(server.verify(request, VERIFY.request("nothing")))
    assert second.final_stock is None and second.reward == 0.0
    assert server.stock_by_session == {}


def test_the_session_allow_list_comes_from_the_row():
    server = new_server()
    assert server.mcp_allowed_tools_for_session({"allowed_tools": ["check_stock", "no_such_tool"]}) == ["check_stock"]
    assert server.mcp_allowed_tools_for_session({"initial_stock": {}}) is None


# ----------------------------------------------------------------------------------------------- over HTTP


def test_http_seed_answer_carries_the_mcp_metadata_and_tools_keep_rollouts_apart():
    app = new_server(expose_tools_over_mcp=True).build_app()
    with TestClient(app) as rollout_a, TestClient(app) as rollout_b:
        seed = rollout_a.post("/seed_session", json={"initial_stock": {"apples": 12}})
        metadata = seed.json()[NEMO_GYM_MCP_METADATA_KEY]
        assert metadata["server_name"] == NAME and metadata["url_path"] == "/mcp" and metadata["transport"] == "http"
        assert metadata["headers"][TOKEN_HEADER]
        rollout_b.post("/seed_session", json={"initial_stock": {"apples": 1}})

        assert rollout_a.post("/ship", json={"item": "apples", "quantity": 4}).json()["remaining"] == 8
        refused = rollout_b.post("/ship", json={"item": "apples", "quantity": 4})
        assert refused.status_code == 409 and "only 1 apples" in refused.json()["detail"]
        assert rollout_b.post("/ship", json={"item": "apples", "quantity": 0}).status_code == 422
        assert rollout_a.post("/list_items", json={}).json() == {"items": {"apples": 8}}
        assert rollout_b.post("/check_stock", json={"item": "apples"}).json() == {"item": "apples", "quantity": 1}


def test_without_the_flag_the_seed_answer_has_no_mcp_entry():
    app = new_server().build_app()
    with TestClient(app) as client:
        assert client.post("/seed_session", json={"initial_stock": {}}).json() == {}
        assert client.post("/mcp", json={}).status_code in (404, 405)


# ----------------------------------------------------------------------------------------------- over MCP


# What a model would call for each example row (in the rows' order), and the answer it would give.
SOLUTIONS = [
    ([("ship", {"item": "apples", "quantity": 4})], "There are {} apples left."),
    ([("check_stock", {"item": "pears"})], "We have {} pears."),
    (
        [("restock", {"item": "bananas", "quantity": 10}), ("ship", {"item": "bananas", "quantity": 6})],
        "{} bananas remain.",
    ),
    ([("ship", {"item": "plums", "quantity": 5}), ("ship", {"item": "plums", "quantity": 3})], "{} plums are left."),
    (
        [("ship", {"item": "cherries", "quantity": 2}), ("restock", {"item": "lemons", "quantity": 3})],
        "We now have {} lemons.",
    ),
]


@pytest.fixture(scope="module")
def running_server():
    """The server with its tools exposed over MCP, served by uvicorn with its lifespan (where /mcp runs)."""
    app = new_server(expose_tools_over_mcp=True).build_app()
    with live_server(serving_app(app), lifespan="on") as url:
        yield url


async def solve_over_mcp(url: str, row: dict, calls: list, answer: str) -> tuple[dict, list[dict]]:
    """Seed the row over HTTP, make `calls` over MCP, verify over HTTP with MCP-style call names; returns the verify
    answer and the MCP tool results."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:  # keeps the rollout's session cookie
        seed = await http.post("/seed_session", json=row)
        token = seed.json()[NEMO_GYM_MCP_METADATA_KEY]["headers"][TOKEN_HEADER]
        transcript, results = [], []
        async with mcp_session(url + "/mcp", token) as session:
            for index, (tool, arguments) in enumerate(calls):
                result = wire(await session.call_tool(tool, arguments))
                results.append(result)
                call_id = f"call_{index}"
                transcript.append(function_call(f"mcp__{NAME}__{tool}", arguments, call_id=call_id))
                transcript.append(function_call_output(result["content"][0]["text"], call_id=call_id))
        last = results[-1].get("structuredContent") or {}
        text = answer.format(last.get("remaining", last.get("quantity")))
        body = {**row, "response": make_response(*transcript, text).model_dump(mode="json")}
        verified = await http.post("/verify", json=body)
        assert verified.status_code == 200, verified.text
        return verified.json(), results


def test_every_example_row_is_solved_over_mcp(running_server):
    rows = example_rows(__file__)
    for row, (calls, answer) in zip(rows, SOLUTIONS):
        verified, results = asyncio.run(solve_over_mcp(running_server, row, calls, answer))
        assert verified["reward"] == 1.0, (row["responses_create_params"]["input"][1]["content"], verified, results)
        # /verify scored the bare names and gave the emitted names back.
        assert verified["tool_calls"] == [tool for tool, _ in calls]
        emitted = [item["name"] for item in verified["response"]["output"] if item["type"] == "function_call"]
        assert emitted == [f"mcp__{NAME}__{tool}" for tool, _ in calls]
        for result in results:
            if not result["isError"]:
                assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    plums = asyncio.run(solve_over_mcp(running_server, rows[3], SOLUTIONS[3][0], SOLUTIONS[3][1]))[1]
    assert plums[0]["isError"] and plums[0]["content"][0]["text"] == (
        "HTTP 409 from POST /ship: only 3 plums in stock; ship at most 3"
    )


def test_a_read_only_row_lists_and_calls_only_its_tools_over_mcp(running_server):
    row = example_rows(__file__)[1]
    assert row["allowed_tools"] == ["list_items", "check_stock"]

    async def scenario():
        async with httpx.AsyncClient(base_url=running_server, timeout=30) as http:
            token = (await http.post("/seed_session", json=row)).json()["mcp"]["headers"][TOKEN_HEADER]
        async with mcp_session(running_server + "/mcp", token) as session:
            listed = sorted(tool.name for tool in (await session.list_tools()).tools)
            ship = wire(await session.call_tool("ship", {"item": "pears", "quantity": 1}))
            check = wire(await session.call_tool("check_stock", {"item": "pears"}))
        async with mcp_session(running_server + "/mcp") as session:  # no token: every tool is listed
            everything = sorted(tool.name for tool in (await session.list_tools()).tools)
        return listed, ship, check, everything

    listed, ship, check, everything = asyncio.run(scenario())
    assert listed == ["check_stock", "list_items"]
    assert everything == sorted(TOOL_NAMES)
    assert ship["isError"] and "Unknown tool 'ship' for this session" in ship["content"][0]["text"]
    assert check["structuredContent"] == {"item": "pears", "quantity": 7}


def test_http_and_mcp_calls_of_one_rollout_share_its_stock(running_server):
    async def scenario():
        async with httpx.AsyncClient(base_url=running_server, timeout=30) as http:
            seed = await http.post("/seed_session", json={"initial_stock": {"apples": 10}})
            token = seed.json()["mcp"]["headers"][TOKEN_HEADER]
            await http.post("/ship", json={"item": "apples", "quantity": 1})
            async with mcp_session(running_server + "/mcp", token) as session:
                over_mcp = wire(await session.call_tool("ship", {"item": "apples", "quantity": 2}))
            over_http = (await http.post("/check_stock", json={"item": "apples"})).json()
        return over_mcp, over_http

    over_mcp, over_http = asyncio.run(scenario())
    assert over_mcp["structuredContent"] == {"item": "apples", "shipped": 2, "remaining": 7}
    assert over_http == {"item": "apples", "quantity": 7}


# ----------------------------------------------------------------------------------------------- data


def test_example_rows_validate_and_match_the_tools():
    rows = example_rows(__file__)
    assert len(rows) == 5
    schemas = {
        "list_items": {},
        "check_stock": CheckStockRequest.model_json_schema()["properties"],
        "ship": MoveRequest.model_json_schema()["properties"],
        "restock": MoveRequest.model_json_schema()["properties"],
    }
    for row in rows:
        VERIFY.row_request(row, message("placeholder"))
        WarehouseSeedSessionRequest.model_validate(row)
        for tool in row["responses_create_params"]["tools"]:
            assert set(tool["parameters"]["properties"]) == set(schemas[tool["name"]]), tool["name"]
        assert row["report_item"] in row["expected_stock"]
