"""The one module that uses uvicorn's, FastAPI's and starlette's private names (nemo_gym/serving/private_api.py).

If a release of one of them drops or changes what we use, these tests fail and say what: that is the point of
confining it to one module. Also the pure-ASGI pieces that hold bodies to a limit without our protocol."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

import httpx
import pytest
from fastapi import BackgroundTasks, Depends, FastAPI, Header, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel

import nemo_gym
from nemo_gym.serving.body import BodyLimit
from nemo_gym.serving.errors import INPUT_EXCERPT_CHARS, MAX_VALIDATION_ERRORS, validation_error_content
from nemo_gym.serving.private_api import check_compatibility, request_with_body, route_shape, typed_signature

PACKAGE = Path(nemo_gym.__file__).parent


def test_the_installed_uvicorn_fastapi_and_starlette_have_everything_the_adapter_uses():
    assert check_compatibility() == []


def test_no_module_but_the_adapter_uses_their_private_names():
    """`route.dependant`, `DefaultPlaceholder`, `get_typed_signature`, uvicorn's protocol internals, a request's
    `_body`, httpx's `response._request`, and any `from <library>._private import`: only in private_api.py."""
    private = ("dependant", "DefaultPlaceholder", "get_typed_signature", "httptools_impl", "uvicorn.supervisors",
               "server_state", "RequestResponseCycle")
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "private_api.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            # Setting `_body` is starlette's cached request body (reading our own ServerResponse's is fine); `_request`
            # is httpx.Response's (ours on `self` are fine).
            if not isinstance(node, ast.Attribute):
                library_private = False
            elif node.attr == "_body":
                library_private = isinstance(node.ctx, ast.Store)
            else:
                library_private = node.attr in private or node.attr == "_request"
            if library_private:
                if ast.unparse(node.value) == "self":
                    continue  # our own classes' attributes
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = node.module.split(".")
                if parts[0] != "nemo_gym" and any(p.startswith("_") for p in parts[1:]):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} from {node.module}")
                if any(alias.name in private for alias in node.names) or any(p in node.module for p in private):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} from {node.module} import ...")
    assert offenders == []


class Item(BaseModel):
    count: int


def test_route_shape_reads_a_plain_post_route():
    async def endpoint(request: Request, body: Item) -> dict:
        return {}

    shape = route_shape(APIRoute("/x", endpoint, methods=["POST"]))
    assert shape.endpoint is endpoint
    assert shape.request_param_name == "request"
    assert [(p.name, p.annotation, p.required, p.embed) for p in shape.body_params] == [("body", Item, True, False)]
    assert shape.default_response_class
    assert not (shape.path_params or shape.query_params or shape.header_params or shape.dependencies)


def test_route_shape_names_what_fastapi_injects():
    def dep() -> int:
        return 1

    async def endpoint(
        tasks: BackgroundTasks, q: Optional[int] = None, x_token: str = Header(""), d: int = Depends(dep)
    ) -> dict:
        return {}

    shape = route_shape(APIRoute("/y/{name}", endpoint, methods=["POST"]))
    assert shape.injected == {"BackgroundTasks": "tasks"}
    assert [p.name for p in shape.query_params] == ["q"] and not shape.query_params[0].required
    assert [p.name for p in shape.header_params] == ["x_token"]
    assert shape.dependencies == ("dep",)


def test_typed_signature_resolves_string_annotations():
    async def endpoint(body: "Item") -> dict:
        return {}

    assert typed_signature(endpoint).parameters["body"].annotation is Item


async def test_request_with_body_serves_the_given_bytes_without_reading_the_stream():
    async def receive():
        raise AssertionError("the stream must not be read")

    request = request_with_body({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, b'{"a":1}')
    assert await request.body() == b'{"a":1}'
    assert await request.json() == {"a": 1}


def _echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"size": len(await request.body())}

    return app


async def test_body_limit_refuses_a_declared_length_over_the_limit_and_passes_the_rest():
    transport = httpx.ASGITransport(app=BodyLimit(_echo_app(), 1000))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        small = await client.post("/echo", content=b"a" * 1000)
        big = await client.post("/echo", content=b"a" * 1001)
    assert small.json() == {"size": 1000}
    assert big.status_code == 413
    assert "1001 bytes" in big.json()["detail"] and "max_request_body_bytes" in big.json()["detail"]


async def test_body_limit_refuses_a_stream_that_grows_past_the_limit():
    async def chunks():
        for _ in range(10):
            yield b"b" * 300

    transport = httpx.ASGITransport(app=BodyLimit(_echo_app(), 1000))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.post("/echo", content=chunks())
    assert answer.status_code == 413
    assert "more than 1000 bytes" in answer.json()["detail"]


@pytest.mark.parametrize(
    "value, kept",
    [(5, True), ("short", True), (None, True), ("z" * 10_000, False), ({"k": "v" * 10_000}, False), ([1, 2], True)],
)
def test_a_422_keeps_small_inputs_and_cuts_large_ones(value, kept):
    detail = validation_error_content([{"type": "x", "loc": ("body",), "msg": "m", "input": value}])["detail"]
    if kept:
        assert detail[0]["input"] == value
    else:
        assert isinstance(detail[0]["input"], str) and len(detail[0]["input"]) < INPUT_EXCERPT_CHARS + 40


def test_a_422_lists_at_most_max_validation_errors_and_counts_the_rest():
    errors = [{"type": "int_parsing", "loc": ("body", "x", i), "msg": "m", "input": "a"} for i in range(5000)]
    detail = validation_error_content(errors)["detail"]
    assert len(detail) == MAX_VALIDATION_ERRORS + 1
    assert [d["loc"][-1] for d in detail[:MAX_VALIDATION_ERRORS]] == list(range(MAX_VALIDATION_ERRORS))
    last = detail[-1]  # the same shape as the others, so clients that read "detail" still can
    assert last["type"] == "too_many_errors" and set(last) == {"type", "loc", "msg", "input"}
    assert f"{5000 - MAX_VALIDATION_ERRORS} more validation errors" in last["msg"]
    assert len(validation_error_content(errors[:MAX_VALIDATION_ERRORS])["detail"]) == MAX_VALIDATION_ERRORS
