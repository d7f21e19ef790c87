"""Tools over MCP (`expose_tools_over_mcp`, NeMo Gym v0.5 spec section 8), with the official `mcp` client against
running server processes: the example environment under `ng_run`, and a probe server (its handler shapes, hooks
and failures) served by its own `serve()` in a child process. The start-up refusals are checked on the app.

Runs with mcp 1.x and 2.x alike (only the client's transport is built differently, in `mcp_session`)."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version
from typing import Any, Optional

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.mcp_auto_exposure import (
    NEMO_GYM_MCP_METADATA_KEY,
    TOKEN_HEADER,
    install_auto_exposure,
    maybe_auto_expose,
)
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.testing.responses import function_call, function_call_output, make_response
from nemo_gym.testing.servers import make_server, make_server_client, server_config
from nemo_gym.testing.stack import ChildProcess, NgRunStack, server_instances
from nemo_gym.testing.mcp_client import mcp_session, wire
from tests.conftest import REPO_ROOT, free_port

pytest.importorskip("mcp")

# -------------------------------------------------------------------------------------------------------------
# The official client, for either SDK major version


def text_of(result: dict) -> str:
    return result["content"][0]["text"]


async def seed(base_url: str, row: dict) -> tuple[httpx.AsyncClient, str]:
    """An HTTP client holding a freshly seeded rollout's session cookie, and that rollout's MCP token."""
    http = httpx.AsyncClient(base_url=base_url, timeout=30)
    answer = await http.post("/seed_session", json=row)
    assert answer.status_code == 200, answer.text
    metadata = answer.json()[NEMO_GYM_MCP_METADATA_KEY]
    return http, metadata["headers"][TOKEN_HEADER]


# -------------------------------------------------------------------------------------------------------------
# The probe server: one handler of each shape direct dispatch takes, a catch-all, and the hooks


class NoteBody(BaseModel):
    text: str = Field(min_length=1, description="The note.")


class ProbeVerifyRequest(BaseVerifyRequest):
    expected_calls: list[str]


class ProbeVerifyResponse(ProbeVerifyRequest, BaseVerifyResponse):
    seen_calls: list[str]


SHOUT_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


class ProbeServer(SimpleResourcesServer):
    config: BaseResourcesServerConfig
    notes: dict = Field(default_factory=dict)
    counts: dict = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/append")(self.append)
        app.post("/read")(self.read)
        app.post("/count")(self.count)
        app.post("/echo_dict")(self.echo_dict)
        app.post("/missing")(self.missing)
        app.post("/boom")(self.boom)
        app.post("/{tool_name}")(self.dispatch)
        return app

    def mcp_tools(self, harvested: list, catchall: Any) -> list:
        return [*harvested, catchall.tool("shout", SHOUT_SCHEMA, "Upper-case the text.")]

    def mcp_allowed_tools_for_session(self, seed_body: dict) -> Optional[list[str]]:
        return seed_body.get("allowed_tools")

    async def append(self, request: Request, body: NoteBody) -> dict:
        """Append a note to this rollout's notes."""
        notes = self.notes.setdefault(request.session[SESSION_ID_KEY], [])
        notes.append(body.text)
        return {"notes": list(notes)}

    async def read(self, request: Request) -> list:
        return list(self.notes.get(request.session[SESSION_ID_KEY], []))

    def count(self, request: Request) -> dict:  # a plain def: FastAPI runs it in a thread, so does MCP dispatch
        session_id = request.session[SESSION_ID_KEY]
        self.counts[session_id] = self.counts.get(session_id, 0) + 1
        return {"count": self.counts[session_id]}

    async def echo_dict(self, body: dict) -> dict:
        return {"got": body}

    async def missing(self, body: NoteBody) -> dict:
        raise HTTPException(404, f"no note {body.text!r}")

    async def boom(self, body: NoteBody) -> dict:
        raise RuntimeError("the probe broke")

    async def dispatch(self, tool_name: str, request: Request) -> dict:
        body = await request.json()
        return {"tool": tool_name, "text": str(body.get("text", "")).upper()}

    async def verify(self, body: ProbeVerifyRequest) -> ProbeVerifyResponse:
        seen = [item.name for item in body.response.output if item.type == "function_call"]
        return ProbeVerifyResponse(**body.model_dump(), reward=float(seen == body.expected_calls), seen_calls=seen)


def serve_probe(port: int) -> None:
    """Run the probe as a server process does (`serve`: uvicorn, hot routes, lifespan), until SIGINT/SIGTERM."""
    config = BaseResourcesServerConfig(
        host="127.0.0.1", port=port, entrypoint="app.py", name="probe", expose_tools_over_mcp=True
    )
    server = ProbeServer(config=config, server_client=make_server_client())
    server.serve(server.build_app())


@pytest.fixture(scope="module")
def probe():
    port = free_port()
    process = ChildProcess(
        [sys.executable, "-c", f"from tests.integration.test_mcp_exposure import serve_probe; serve_probe({port})"],
        cwd=REPO_ROOT,
        name="probe server",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        process.wait_http_ok(url + "/health", timeout=120)
        yield url
    finally:
        assert process.stop() == 0, process.output


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_tools_list_serves_the_tool_routes_with_their_schemas(probe):
    async def scenario():
        async with mcp_session(probe + "/mcp") as session:
            return [wire(tool) for tool in (await session.list_tools()).tools]

    tools = {tool["name"]: tool for tool in run(scenario())}
    assert set(tools) == {"append", "read", "count", "echo_dict", "missing", "boom", "shout"}
    assert tools["append"]["inputSchema"] == NoteBody.model_json_schema()
    assert tools["append"]["description"] == "Append a note to this rollout's notes."
    assert tools["read"]["inputSchema"] == {"type": "object", "additionalProperties": True}
    assert tools["shout"]["inputSchema"] == SHOUT_SCHEMA and tools["shout"]["description"] == "Upper-case the text."


def test_a_call_needs_a_valid_token(probe):
    async def scenario():
        http, token = await seed(probe, {})
        await http.aclose()
        results = []
        for sent in (None, "not-a-token", token[:-2] + ("AA" if not token.endswith("AA") else "BB"), token):
            async with mcp_session(probe + "/mcp", sent) as session:
                results.append(wire(await session.call_tool("append", {"text": "x"})))
        return results

    missing, garbage, tampered, good = run(scenario())
    assert missing["isError"] and TOKEN_HEADER in text_of(missing) and "/seed_session" in text_of(missing)
    assert garbage["isError"] and "does not hold a session token" in text_of(garbage)
    assert tampered["isError"] and "does not hold a session token" in text_of(tampered)
    assert not good["isError"] and good["structuredContent"] == {"notes": ["x"]}


def test_http_and_mcp_calls_of_one_rollout_share_its_state_and_rollouts_stay_apart(probe):
    async def scenario():
        first, first_token = await seed(probe, {})
        second, second_token = await seed(probe, {})
        await first.post("/append", json={"text": "one"})
        async with mcp_session(probe + "/mcp", first_token) as session:
            over_mcp = wire(await session.call_tool("append", {"text": "two"}))
            counted = wire(await session.call_tool("count", {}))
            read_mcp = wire(await session.call_tool("read", {}))
        async with mcp_session(probe + "/ng-rollout/7-0/mcp", second_token) as session:  # the rollout prefix too
            other = wire(await session.call_tool("append", {"text": "elsewhere"}))
        read_http = (await first.post("/read", json={})).json()
        count_http = (await first.post("/count", json={})).json()
        other_http = (await second.post("/read", json={})).json()
        await first.aclose()
        await second.aclose()
        return over_mcp, counted, read_mcp, other, read_http, count_http, other_http

    over_mcp, counted, read_mcp, other, read_http, count_http, other_http = run(scenario())
    assert over_mcp["structuredContent"] == {"notes": ["one", "two"]}
    assert read_http == ["one", "two"]  # the MCP call ran the handler exactly once, in this rollout's session
    assert counted["structuredContent"] == {"count": 1} and count_http == {"count": 2}
    assert json.loads(text_of(read_mcp)) == ["one", "two"] and "structuredContent" not in read_mcp
    assert other["structuredContent"] == {"notes": ["elsewhere"]} and other_http == ["elsewhere"]


def test_a_sessions_allow_list_limits_what_it_lists_and_calls(probe):
    async def scenario():
        http, token = await seed(probe, {"allowed_tools": ["read", "shout"]})
        await http.aclose()
        async with mcp_session(probe + "/mcp", token) as session:
            listed = sorted(tool.name for tool in (await session.list_tools()).tools)
            refused = wire(await session.call_tool("append", {"text": "x"}))
            allowed = wire(await session.call_tool("shout", {"text": "quiet"}))
        async with mcp_session(probe + "/mcp", "garbage") as session:  # a bad token lists like no token
            unrestricted = sorted(tool.name for tool in (await session.list_tools()).tools)
        return listed, refused, allowed, unrestricted

    listed, refused, allowed, unrestricted = run(scenario())
    assert listed == ["read", "shout"]
    assert refused["isError"]
    assert text_of(refused) == "Unknown tool 'append' for this session; the tools are: read, shout."
    assert allowed["structuredContent"] == {"tool": "shout", "text": "QUIET"}
    assert len(unrestricted) == 7


def test_failures_come_back_as_tool_errors_with_the_http_status(probe):
    async def scenario():
        http, token = await seed(probe, {})
        await http.aclose()
        async with mcp_session(probe + "/mcp", token) as session:
            return [
                wire(await session.call_tool(name, arguments))
                for name, arguments in (
                    ("missing", {"text": "n1"}),
                    ("boom", {"text": "x"}),
                    ("append", {"text": ""}),
                    ("append", {}),
                    ("no_such_tool", {}),
                    ("echo_dict", {"a": [1, 2]}),
                )
            ]

    missing, boom, empty, absent, unknown, echoed = run(scenario())
    assert missing["isError"] and text_of(missing) == "HTTP 404 from POST /missing: no note 'n1'"
    assert boom["isError"] and text_of(boom) == "HTTP 500 from POST /boom: RuntimeError: the probe broke"
    assert empty["isError"] and text_of(empty).startswith("HTTP 422 from POST /append: ")
    assert json.loads(text_of(empty).split(": ", 1)[1])[0]["loc"] == ["body", "text"]
    assert absent["isError"] and '"missing"' in text_of(absent)
    assert unknown["isError"] and text_of(unknown).startswith("Unknown tool 'no_such_tool'")
    assert not echoed["isError"] and echoed["structuredContent"] == {"got": {"a": [1, 2]}}


@pytest.mark.skipif(int(version("mcp").split(".")[0]) < 2, reason="mcp 2.x's Client (newer protocol era)")
def test_the_mcp_2_client_in_its_default_mode(probe):
    """mcp 2.x's `Client` probes `server/discover` and speaks the newer protocol era, a different path through the
    SDK's server than `ClientSession`'s initialize handshake."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def scenario():
        http, token = await seed(probe, {"allowed_tools": ["append", "read"]})
        client = httpx2.AsyncClient(headers={TOKEN_HEADER: token})
        transport = streamable_http_client(probe + "/mcp", http_client=client)
        async with Client(transport) as client:
            listed = sorted(tool.name for tool in (await client.list_tools()).tools)
            appended = wire(await client.call_tool("append", {"text": "modern"}))
            refused = wire(await client.call_tool("count", {}))
            era = client.protocol_version
        read = (await http.post("/read", json={})).json()
        await http.aclose()
        return listed, appended, refused, era, read

    listed, appended, refused, era, read = run(scenario())
    assert era > "2025-12-31"
    assert listed == ["append", "read"]
    assert appended["structuredContent"] == {"notes": ["modern"]} and read == ["modern"]
    assert refused["isError"] and "Unknown tool 'count'" in text_of(refused)


def test_verify_scores_bare_names_and_answers_the_emitted_ones(probe):
    output = [
        function_call("mcp__probe__append", {"text": "a"}, call_id="c1"),
        function_call_output({"notes": ["a"]}, call_id="c1"),
        function_call("mcp__some_client_name__read", {}, call_id="c2"),
        function_call("count", {}, call_id="c3"),
    ]
    body = {
        "responses_create_params": {"input": [{"role": "user", "content": "hi"}]},
        "response": make_response(*output, "done").model_dump(mode="json"),
        "expected_calls": ["append", "read", "count"],
    }
    answer = httpx.post(probe + "/verify", json=body, timeout=30).json()
    assert answer["reward"] == 1.0 and answer["seen_calls"] == ["append", "read", "count"]
    emitted = [item["name"] for item in answer["response"]["output"] if item["type"] == "function_call"]
    assert emitted == ["mcp__probe__append", "mcp__some_client_name__read", "count"]


# -------------------------------------------------------------------------------------------------------------
# The example environment as ng_run starts it


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    config = tmp_path_factory.mktemp("mcp_stack") / "stack.yaml"
    config.write_text(
        "example_mcp_tools:\n"
        "  resources_servers:\n"
        "    example_mcp_tools:\n"
        "      entrypoint: app.py\n"
        "      domain: agent\n"
        "      expose_tools_over_mcp: true\n"
    )
    head_port = free_port()
    stack = NgRunStack([f"+config_paths=[{config}]", f"+head_server.port={head_port}"], cwd=REPO_ROOT)
    try:
        stack.wait_for("servers ready!", timeout=180)
        (instance,) = server_instances(head_port)
        yield instance["url"]
    finally:
        assert stack.stop(timeout=60) == 0, stack.output


def test_a_rollout_over_mcp_against_the_environment_under_ng_run(warehouse):
    row = json.loads((REPO_ROOT / "resources_servers/example_mcp_tools/data/example.jsonl").read_text().splitlines()[0])
    name = "example_mcp_tools"

    async def scenario():
        http, token = await seed(warehouse, row)
        async with mcp_session(warehouse + "/mcp", token) as session:
            listed = sorted(tool.name for tool in (await session.list_tools()).tools)
            shipped = wire(await session.call_tool("ship", {"item": "apples", "quantity": 4}))
        checked = (await http.post("/check_stock", json={"item": "apples"})).json()
        output = [
            function_call(f"mcp__{name}__ship", {"item": "apples", "quantity": 4}, call_id="c1"),
            function_call_output(text_of(shipped), call_id="c1"),
            f"{shipped['structuredContent']['remaining']} apples are left.",
        ]
        verified = await http.post("/verify", json={**row, "response": make_response(*output).model_dump(mode="json")})
        await http.aclose()
        return listed, shipped, checked, verified.json()

    listed, shipped, checked, verified = run(scenario())
    assert listed == ["check_stock", "list_items", "restock", "ship"]
    assert shipped["structuredContent"] == {"item": "apples", "shipped": 4, "remaining": 8}
    assert checked == {"item": "apples", "quantity": 8}  # the MCP call changed this rollout's stock
    assert verified["reward"] == 1.0 and verified["tool_calls"] == ["ship"]
    assert verified["response"]["output"][0]["name"] == f"mcp__{name}__ship"


# -------------------------------------------------------------------------------------------------------------
# Start-up: what cannot be served as it is over HTTP is refused, naming the route and the fix


class Body(BaseModel):
    value: int


class OtherBody(BaseModel):
    other: int


def build(setup: Any, **hooks: Any) -> FastAPI:
    """The app of a resources server whose `setup_webserver` adds routes with `setup(server, app)`, exposed."""

    def setup_webserver(self) -> FastAPI:
        app = SimpleResourcesServer.setup_webserver(self)
        setup(self, app)
        return app

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        return BaseVerifyResponse(**body.model_dump(), reward=0.0)

    cls = type("Shaped", (SimpleResourcesServer,), {"setup_webserver": setup_webserver, "verify": verify, **hooks})
    cls.__annotations__ = {"config": BaseResourcesServerConfig}
    server = make_server(cls, name="shaped", expose_tools_over_mcp=True)
    return server.build_app()


async def good(body: Body) -> dict:
    return {"value": body.value}


def refusal(setup: Any, **hooks: Any) -> str:
    with pytest.raises(ValueError) as error:
        build(setup, **hooks)
    return str(error.value)


def test_middleware_of_the_servers_own_is_refused():
    class Timing:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await self.app(scope, receive, send)

    message = refusal(lambda server, app: app.add_middleware(Timing))
    assert "Timing" in message and "skip it" in message and "expose_tools_over_mcp: false" in message


def test_an_existing_mcp_route_is_refused():
    message = refusal(lambda server, app: app.post("/mcp")(good))
    assert "already serves /mcp" in message


def test_two_catch_all_routes_are_refused():
    async def first(tool: str) -> dict:
        return {}

    async def second(name: str) -> dict:
        return {}

    message = refusal(lambda server, app: (app.post("/{tool}")(first), app.post("/{name}")(second)))
    assert "2 catch-all routes (POST /{tool}, POST /{name})" in message


def test_bad_reserved_and_duplicate_names_are_refused():
    nested = refusal(lambda server, app: app.post("/a/b")(good))
    assert "POST /a/b" in nested and "letters, digits" in nested and "/a_b" in nested

    async def catch_all(tool: str, request: Request) -> dict:
        return {}

    def with_catch_all(server: Any, app: FastAPI) -> None:
        app.post("/good")(good)
        app.post("/{tool}")(catch_all)

    reserved = refusal(with_catch_all, mcp_tools=lambda self, harvested, catchall: [catchall.tool("verify")])
    assert "'verify', a reserved name" in reserved
    duplicate = refusal(with_catch_all, mcp_tools=lambda self, harvested, catchall: [*harvested, catchall.tool("good")])
    assert "two MCP tools are named 'good'" in duplicate and "POST /good" in duplicate


def test_handlers_a_direct_call_cannot_reproduce_are_refused():
    def dependency() -> int:
        return 1

    async def injected(body: Body, extra: int = Depends(dependency)) -> dict:
        return {}

    async def two_bodies(body: Body, other: OtherBody) -> dict:
        return {}

    async def optional_body(body: Optional[Body] = None) -> dict:
        return {}

    async def defaulted_query(body: Body, limit: int = 3) -> dict:
        return {}

    async def int_path(tool: int) -> dict:
        return {}

    cases = {
        "/injected": (injected, "dependency injection (dependency 'dependency')"),
        "/two_bodies": (two_bodies, "several body parameters ('body', 'other')"),
        "/optional_body": (optional_body, "body parameter 'body' is optional"),
        "/defaulted_query": (defaulted_query, "defaulted query parameter 'limit'"),
    }
    for path, (handler, reason) in cases.items():
        message = refusal(lambda server, app, path=path, handler=handler: app.post(path)(handler))
        assert f"POST {path}" in message and reason in message and "leave it out in mcp_tools()" in message, message

    message = refusal(
        lambda server, app: app.post("/{tool}")(int_path),
        mcp_tools=lambda self, harvested, catchall: [catchall.tool("lookup")],
    )
    assert "POST /{tool} (catch-all, as tool 'lookup')" in message and "path parameter 'tool' is not a `str`" in message


def test_a_handler_left_out_by_the_hook_is_not_checked():
    async def two_bodies(body: Body, other: OtherBody) -> dict:
        return {}

    def setup(server: Any, app: FastAPI) -> None:
        app.post("/good")(good)
        app.post("/two_bodies")(two_bodies)

    app = build(setup, mcp_tools=lambda self, harvested, catchall: [t for t in harvested if t.name != "two_bodies"])
    assert any(getattr(route, "path", None) == "/mcp" for route in app.router.routes)


def test_maybe_auto_expose_is_a_no_op_without_the_flag():
    server = make_server(ProbeServer, name="probe")
    app = server.setup_webserver()
    routes = list(app.router.routes)
    assert maybe_auto_expose(server, app) is None
    assert app.router.routes == routes
    tools = install_auto_exposure(server, server.setup_webserver(), allowed_tools=["read"])
    assert set(tools) == {"append", "read", "count", "echo_dict", "missing", "boom", "shout"}
    assert server_config(BaseResourcesServerConfig, "x").expose_tools_over_mcp is False
