"""DNS rebinding against a real stack: `ng_run` of example_mcp_tools (tools also over MCP at `/mcp`), its
simple_agent and openai_model in front of the fake LLM, with `+allowed_hosts=[trusted.example]`.

A request that names another host (`Host: evil.example`, as a browser sends it once a page's name points at
127.0.0.1) is refused 421 by every server, the head server and `/mcp`; one from another site's page (`Origin`) is
refused 403; requests without `Origin` (the SDKs, our collector, `ng_status`) are served, and so is the host the
allow-list names."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from importlib.metadata import version

import httpx
import pytest

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances
from tests.conftest import REPO_ROOT

pytest.importorskip("mcp")

CONFIGS = [
    "resources_servers/example_mcp_tools/configs/example_mcp_tools.yaml",
    "responses_api_models/openai_model/configs/openai_model.yaml",
]
REBINDING = {"Host": "evil.example", "Origin": "http://evil.example"}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


@pytest.fixture(scope="module")
def stack():
    head_port = free_port()
    with FakeLLMBackend() as backend:
        overrides = fake_llm_overrides(CONFIGS, backend.base_url, head_port)
        with NgRunStack([*overrides, "+allowed_hosts=[trusted.example]"], cwd=REPO_ROOT) as run:
            run.wait_for("servers ready", timeout=240)
            urls = {s["process_name"]: s["url"].rstrip("/") for s in server_instances(head_port)}
            urls["head_server"] = f"http://127.0.0.1:{head_port}"
            yield head_port, urls, run


# (server, method, path, body): one route of each server kind, the hot path and FastAPI's own, and /mcp.
TARGETS = [
    ("policy_model", "POST", "/v1/responses", {"input": "hi"}),
    ("policy_model", "GET", "/health", None),
    ("example_mcp_tools", "POST", "/seed_session", {}),
    ("example_mcp_tools", "POST", "/mcp", TOOLS_LIST),
    ("example_mcp_tools_simple_agent", "GET", "/health", None),
    ("example_mcp_tools_simple_agent", "POST", "/v1/responses", {"input": "hi"}),
    ("head_server", "GET", "/global_config_dict_yaml", None),
    ("head_server", "GET", "/server_instances", None),
]


def _send(urls: dict, target: tuple, headers: dict) -> httpx.Response:
    server, method, path, body = target
    extra = MCP_HEADERS if path == "/mcp" else {}
    return httpx.request(method, urls[server] + path, json=body, headers={**extra, **headers}, timeout=60)


@pytest.mark.parametrize("target", TARGETS, ids=[f"{t[0]}{t[2]}" for t in TARGETS])
def test_a_rebinding_request_is_refused_and_the_same_request_served_otherwise(stack, target):
    _, urls, _ = stack
    rebound = _send(urls, target, REBINDING)
    assert rebound.status_code == 421, rebound.text
    detail = rebound.json()["detail"]
    assert "\n" not in detail and '"evil.example"' in detail and "allowed_hosts" in detail
    other_site = _send(urls, target, {"Origin": "http://evil.example"})
    assert other_site.status_code == 403 and "http://evil.example" in other_site.json()["detail"], other_site.text
    assert _send(urls, target, {}).status_code == 200
    assert _send(urls, target, {"Host": "trusted.example", "Origin": "http://trusted.example:3000"}).status_code == 200


def test_the_servers_log_a_refused_name_once(stack):
    _, urls, run = stack
    for _ in range(3):
        assert _send(urls, TARGETS[0], {"Host": "once.example"}).status_code == 421
    run.wait_for('Refusing requests with Host "once.example"', timeout=30)
    assert run.output.count('Host "once.example"') == 1, run.output[-3000:]


def _mcp_transport(url: str, headers: dict, statuses: list):
    """The official client's streamable-HTTP transport (mcp 1.x or 2.x), sending `headers`; the status of each
    answer it gets is added to `statuses` where the SDK takes our HTTP client."""
    from mcp.client import streamable_http

    if not hasattr(streamable_http, "streamable_http_client"):
        return streamable_http.streamablehttp_client(url, headers=headers)
    http = __import__("httpx2" if int(version("mcp").split(".")[0]) >= 2 else "httpx")

    async def seen(response) -> None:
        statuses.append(response.status_code)

    client = http.AsyncClient(headers=headers, timeout=30, event_hooks={"response": [seen]})
    return streamable_http.streamable_http_client(url, http_client=client)


async def _list_tools(url: str, headers: dict, statuses: list) -> list[str]:
    from mcp import ClientSession

    async with _mcp_transport(url, headers, statuses) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            return sorted(tool.name for tool in (await session.list_tools()).tools)


def test_the_mcp_client_lists_tools_but_not_through_another_name(stack):
    _, urls, _ = stack
    url = urls["example_mcp_tools"] + "/mcp"
    statuses: list[int] = []
    assert asyncio.run(_list_tools(url, {}, statuses)) == ["check_stock", "list_items", "restock", "ship"]
    statuses.clear()
    with pytest.raises(BaseException) as refused:  # the SDK raises its error inside exception groups
        asyncio.run(asyncio.wait_for(_list_tools(url, REBINDING, statuses), timeout=60))
    assert not isinstance(refused.value, (asyncio.TimeoutError, KeyboardInterrupt))
    if statuses:  # mcp 2.x: our client saw the answers
        assert set(statuses) == {421}, statuses
    else:  # mcp 1.x names the status in its error
        assert "421" in repr(refused.value), repr(refused.value)


def test_the_openai_sdk_is_served_and_refused_under_another_name(stack):
    import openai

    _, urls, _ = stack
    client = openai.OpenAI(base_url=urls["policy_model"] + "/v1", api_key="unused", max_retries=0)
    answer = client.responses.create(model="fake-model", input="hello there")
    assert answer.output_text
    rebound = openai.OpenAI(base_url=urls["policy_model"] + "/v1", api_key="unused", max_retries=0,
                            default_headers=REBINDING)
    with pytest.raises(openai.APIStatusError) as refused:
        rebound.responses.create(model="fake-model", input="hello there")
    assert refused.value.status_code == 421


def test_ng_status_and_the_collector_still_work(stack, tmp_path):
    head_port, _, _ = stack
    status = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.cli import status; status()", f"+head_server.port={head_port}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert "example_mcp_tools" in status.stdout
    out = tmp_path / "rollouts.jsonl"
    collect = subprocess.run(
        [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()",
         f"+head_server.port={head_port}", "+agent_name=example_mcp_tools_simple_agent",
         f"+input_jsonl_fpath={REPO_ROOT / 'resources_servers/example_mcp_tools/data/example.jsonl'}",
         f"+output_jsonl_fpath={out}", "+limit=2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert collect.returncode == 0, collect.stdout + collect.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all("reward" in row for row in rows), rows


def test_a_server_of_several_uvicorn_workers_checks_in_every_worker(tmp_path):
    """The workers build their app in fresh processes: the policy reaches them through the environment."""
    import signal

    from tests.integration.test_serving_runner import ChildProcess

    child = ChildProcess(tmp_path, num_workers=2, top={"allowed_hosts": ["trusted.example"]})
    try:
        child.wait_ready(timeout=90)
        for _ in range(20):  # new connections land on either worker
            with httpx.Client(base_url=child.url, timeout=30) as client:
                assert client.post("/hello", json={}, headers=REBINDING).status_code == 421
                assert client.get("/health", headers={"Origin": "http://evil.example"}).status_code == 403
                assert client.post("/hello", json={}, headers={"Host": "trusted.example"}).status_code == 200
        assert child.stop(signal.SIGINT, group=True) == 0, child.output
    finally:
        if child.proc.poll() is None:
            child.stop(signal.SIGKILL, group=True)
