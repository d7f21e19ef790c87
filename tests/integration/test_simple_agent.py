"""simple_agent under `ng_run`: openai_model in front of the scripted fake backend (`--script`), a resources server
whose tools keep per-session state, and simple_agent; rollouts through `/run` (with a malformed tool call and an
unknown tool), concurrent rollouts, `/v1/responses` directly, and the backend's Chat Completions side."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from nemo_gym.testing.stack import NgRunStack, server_instances
from tests.conftest import FIXTURE_STACK, free_port, wait_http_ok

SCRIPT = FIXTURE_STACK / "scripts" / "simple_agent.jsonl"

TOOLS = [
    {"type": "function", "name": "append_item", "description": "add an item to the shopping list", "strict": False,
     "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}},
    {"type": "function", "name": "read_items", "description": "read the shopping list", "strict": False,
     "parameters": {"type": "object", "properties": {}}},
]


@pytest.fixture(scope="module")
def stack():
    backend_port, head_port = free_port(), free_port()
    backend = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.testing.fake_openai_server", "--port", str(backend_port), "--script", str(SCRIPT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = None
    try:
        wait_http_ok(f"http://127.0.0.1:{backend_port}/health", timeout=60)
        run = NgRunStack([
            "+config_paths=[configs/simple_agent.yaml]",
            f"+policy_base_url=http://127.0.0.1:{backend_port}/v1",
            "+policy_api_key=dummy-key",
            "+policy_model_name=fake-model",
            f"+head_server.port={head_port}",
        ], cwd=FIXTURE_STACK)
        run.wait_for("All 3 / 3 servers ready!", timeout=120)
        urls = {i["process_name"]: i["url"] for i in server_instances(head_port)}
        assert set(urls) == {"policy_model", "shopping_list_resources_server", "shopping_simple_agent"}
        yield urls
        assert run.stop() == 0, run.output
        run = None
    finally:
        if run is not None:
            run.stop()
        backend.terminate()
        backend.wait(timeout=10)


def shopping_row(initial: list[str], **extra) -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Please fix my shopping list: add milk and eggs."}],
            "tools": TOOLS,
            "temperature": 0.0,
        },
        "initial_items": initial,
        "expected_items": [*initial, "milk", "eggs"],
        **extra,
    }


def test_rollout_with_a_malformed_call_and_an_unknown_tool(stack):
    row = shopping_row(["bread"], uuid="row-1", agent_ref={"type": "responses_api_agents", "name": "shopping_simple_agent"})
    answer = httpx.post(stack["shopping_simple_agent"] + "/run", json=row, timeout=60)
    assert answer.status_code == 200, answer.text
    result = answer.json()

    assert result["reward"] == 1.0
    assert result["final_items"] == ["bread", "milk", "eggs"]
    assert result["num_tool_errors"] == 2
    assert result["uuid"] == "row-1" and result["agent_ref"]["name"] == "shopping_simple_agent"
    assert result["initial_items"] == ["bread"]  # not a verifier field: merged back from the row

    output = result["response"]["output"]
    assert [o["type"] for o in output] == [
        "reasoning", "function_call", "function_call_output",
        "function_call", "function_call_output",
        "function_call", "function_call", "function_call_output", "function_call_output",
        "function_call", "function_call_output",
        "message",
    ]
    malformed = json.loads(output[2]["output"])
    assert malformed["tool"] == "append_item" and "not valid JSON" in malformed["error"]
    assert json.loads(output[4]["output"]) == {
        "error": "unknown tool 'buy_everything': the resources server has no such tool", "tool": "buy_everything", "status": 404,
    }
    assert output[-1]["content"][0]["text"] == 'Your list: {"items":["bread","milk","eggs"]}'
    # four model calls at 10/5 plus the last at 100/9/109
    usage = result["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (140, 29, 169)


def test_concurrent_rollouts_have_separate_state(stack):
    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(
                *(client.post(stack["shopping_simple_agent"] + "/run", json=shopping_row([f"item{i}"], n=i)) for i in range(8))
            )

    for answer in asyncio.run(go()):
        assert answer.status_code == 200, answer.text
        result = answer.json()
        i = result["n"]
        assert result["reward"] == 1.0, result
        assert result["final_items"] == [f"item{i}", "milk", "eggs"]


def test_v1_responses_directly(stack):
    body = {"input": "hello agent", "metadata": {"scenario": "quick"}}
    answer = httpx.post(stack["shopping_simple_agent"] + "/v1/responses", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    response = answer.json()
    assert [o["type"] for o in response["output"]] == ["message"]
    assert response["output"][0]["content"][0]["text"] == "hi there, hello agent"
    assert "SimpleModelServer___policy_model" in answer.cookies


def test_a_reasoning_only_reply_is_not_the_end_of_the_episode(stack):
    """As v0.5's loop: the episode ends on a reply with an assistant message and no function call; a reply holding
    only reasoning gets the model called again, with that reasoning in its input."""
    body = {"input": "what is two plus two", "metadata": {"scenario": "think-first"}}
    answer = httpx.post(stack["shopping_simple_agent"] + "/v1/responses", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    output = answer.json()["output"]
    assert [o["type"] for o in output] == ["reasoning", "message"]
    assert output[1]["content"][0]["text"] == "thought it over: what is two plus two"


def test_the_agent_answers_the_sdks_dialects_too(stack):
    """A harness pointed at the agent: Anthropic Messages and streamed Responses, with the official SDKs."""
    import anthropic
    import openai

    url = stack["shopping_simple_agent"]
    message = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0).messages.create(
        model="agent", max_tokens=64, messages=[{"role": "user", "content": "hello from a harness"}]
    )
    assert message.stop_reason == "end_turn" and message.content[0].text == "harness says: hello from a harness"
    events = list(openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).responses.create(
        model="agent", input="hello from a harness", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == "harness says: hello from a harness"


def test_scripted_backend_chat_completions_through_the_model_server(stack):
    url = stack["policy_model"] + "/v1/chat/completions"
    tools = [{"type": "function", "function": {"name": "append_item", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "add tea"}]
    first = httpx.post(url, json={"messages": messages, "tools": tools}, timeout=60)
    assert first.status_code == 200, first.text
    choice = first.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {"id": "call_tea", "type": "function", "function": {"name": "append_item", "arguments": '{"item":"tea"}'}}
    ]
    messages += [choice["message"], {"role": "tool", "tool_call_id": "call_tea", "content": '{"items":["tea"]}'}]
    second = httpx.post(url, json={"messages": messages, "tools": tools}, timeout=60)
    assert second.status_code == 200, second.text
    message = second.json()["choices"][0]["message"]
    assert message["content"] == 'noted: {"items":["tea"]}'
    assert message["reasoning_content"] == "the tool answered"
