"""Rollout correlation and model-call capture (NeMo Gym v0.5 §7.1, §7.2), piece by piece.

- which calls `ServerClient` prefixes with `/ng-rollout/<id>` (the rule, then a real client against a real server
  that reports the path it got);
- model servers: a prefixed call is served (observability off too), captured per rollout when on, in all three
  dialects, streamed or not, with the bytes the client got; unprefixed calls keep the hot routes;
- the capture files (`CaptureStore`) and the collector's summary (`merge_model_call_capture_into_record`, its gaps,
  `clear_capture`); the config check. Whole lines from concurrent writer processes:
  tests/integration/test_rollout_context_processes.py.

Servers run for real (uvicorn) in front of the fake LLM (a real OpenAI-compatible HTTP server).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from nemo_gym.base_responses_api_model import (
    CaptureStore,
    ModelCallCaptureConfig,
    ModelCallRecord,
    clear_capture,
    merge_model_call_capture_into_record,
)
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.http.client import ServerClient
from nemo_gym.rollout_correlation import prefixed_url_path, rollout_context
from nemo_gym.servers.base import serving_app
from nemo_gym.servers.model_call_capture import _SSEReassembler
from nemo_gym.servers.rollout_context import strip_raw_prefix
from nemo_gym.testing.fake_openai_server import build_app
from nemo_gym.testing.live_server import live_server
from nemo_gym.testing.servers import make_server, make_server_client
from responses_api_models.openai_model.app import SimpleModelServer

RS, MODEL, AGENT = "resources_servers", "responses_api_models", "responses_api_agents"


# --------------------------------------------------------------------------------------------------------
# The prefix rule


@pytest.mark.parametrize(
    "server_type, path, body, rollout_id, expected",
    [
        (RS, "/seed_session", None, "4-2", "/ng-rollout/4-2/seed_session"),
        (RS, "append_item", None, "4-2", "/ng-rollout/4-2/append_item"),
        (RS, "/seed_session", None, None, "/seed_session"),
        (RS, "/verify", {"_ng_task_index": 7, "_ng_rollout_index": 0}, None, "/ng-rollout/7-0/verify"),
        (RS, "/verify", {"_ng_task_index": 7, "_ng_rollout_index": 0, "_ng_attempt_index": 2}, None, "/ng-rollout/7-0-a2/verify"),
        (RS, "/verify", {"_ng_task_index": 7, "_ng_rollout_index": 0}, "1-1", "/ng-rollout/1-1/verify"),  # context first
        (RS, "/verify", {"_ng_task_index": 7}, None, "/verify"),  # an index missing
        (RS, "/seed_session", {"_ng_task_index": 7, "_ng_rollout_index": 0}, None, "/seed_session"),  # body: /verify only
        (MODEL, "/v1/responses", None, "0-3", "/ng-rollout/0-3/v1/responses"),
        (MODEL, "/v1/chat/completions", None, "0-3", "/ng-rollout/0-3/v1/chat/completions"),
        (MODEL, "/v1/messages", None, "0-3", "/ng-rollout/0-3/v1/messages"),
        (MODEL, "/tokenize", None, "0-3", "/tokenize"),
        (MODEL, "/v1/responses", None, None, "/v1/responses"),
        (MODEL, "/v1/responses", {"_ng_task_index": 1, "_ng_rollout_index": 1}, None, "/v1/responses"),
        (AGENT, "/run", {"_ng_task_index": 1, "_ng_rollout_index": 1}, "1-1", "/run"),
        (AGENT, "/v1/responses", None, "1-1", "/v1/responses"),
        (None, "/v1/responses", None, "1-1", "/v1/responses"),
        (MODEL, "/ng-rollout/9-9/v1/responses", None, "0-3", "/ng-rollout/9-9/v1/responses"),  # never twice
        (RS, "/ng-rollout/9-9/verify", {"_ng_task_index": 7, "_ng_rollout_index": 0}, None, "/ng-rollout/9-9/verify"),
    ],
)
def test_which_calls_carry_the_rollout_id(server_type, path, body, rollout_id, expected):
    with rollout_context(rollout_id):
        assert prefixed_url_path(server_type, path, body) == expected


# --------------------------------------------------------------------------------------------------------
# ServerClient against a real server that reports the path it was asked for


async def _echo_path(request):
    return JSONResponse({"path": request.url.path})


ECHO_APP = Starlette(routes=[Route("/{rest:path}", _echo_path, methods=["GET", "POST"])])


@pytest.fixture(scope="module")
def echo_url():
    with live_server(ECHO_APP) as url:
        yield url


def stack_config(url: str, **top: object) -> dict:
    port = int(url.rsplit(":", 1)[1])
    block = {"host": "127.0.0.1", "port": port}
    return {
        "rs": {RS: {"counter": dict(block)}},
        "policy": {MODEL: {"openai_model": dict(block)}},
        "agent": {AGENT: {"simple_agent": dict(block)}},
        **top,
    }


async def _paths(client: ServerClient, rollout_id) -> dict:
    calls = {
        "rs_tool": ("rs", "/append_item", {"item": "milk"}),
        "rs_verify": ("rs", "/verify", {"_ng_task_index": 5, "_ng_rollout_index": 1}),
        "model_responses": ("policy", "/v1/responses", {"input": "hi"}),
        "model_chat": ("policy", "/v1/chat/completions", {"messages": []}),
        "model_other": ("policy", "/tokenize", {}),
        "agent_run": ("agent", "/run", {"_ng_task_index": 5, "_ng_rollout_index": 1}),
        "prefixed": ("policy", "/ng-rollout/8-8/v1/responses", {}),
    }
    with rollout_context(rollout_id):
        answers = {name: await client.post(server, path, json=body) for name, (server, path, body) in calls.items()}
    return {name: (await answer.json())["path"] for name, answer in answers.items()}


def test_server_client_prefixes_only_with_observability_on(echo_url):
    on = ServerClient(global_config_dict=stack_config(echo_url, observability_enabled=True))
    assert asyncio.run(_paths(on, "2-0")) == {
        "rs_tool": "/ng-rollout/2-0/append_item",
        "rs_verify": "/ng-rollout/2-0/verify",
        "model_responses": "/ng-rollout/2-0/v1/responses",
        "model_chat": "/ng-rollout/2-0/v1/chat/completions",
        "model_other": "/tokenize",
        "agent_run": "/run",
        "prefixed": "/ng-rollout/8-8/v1/responses",
    }
    outside = asyncio.run(_paths(on, None))
    assert outside["rs_verify"] == "/ng-rollout/5-1/verify"  # from the body's indices
    assert outside["rs_tool"] == "/append_item" and outside["model_responses"] == "/v1/responses"

    off = ServerClient(global_config_dict=stack_config(echo_url))
    assert asyncio.run(_paths(off, "2-0")) == {
        "rs_tool": "/append_item",
        "rs_verify": "/verify",
        "model_responses": "/v1/responses",
        "model_chat": "/v1/chat/completions",
        "model_other": "/tokenize",
        "agent_run": "/run",
        "prefixed": "/ng-rollout/8-8/v1/responses",
    }
    # A new config is read again (the flag is cached per config).
    off.global_config_dict = stack_config(echo_url, observability_enabled="true")
    assert asyncio.run(_paths(off, "2-0"))["model_responses"] == "/ng-rollout/2-0/v1/responses"


# --------------------------------------------------------------------------------------------------------
# Model servers


@pytest.fixture(scope="module")
def upstream():
    with live_server(build_app(tool_args='{"city": "Oslo"}')) as url:
        yield f"{url}/v1"


RELEASE_STREAM = threading.Event()


class SlowToCloseModel(SimpleModelServer):
    """openai_model whose streamed Responses stay open after their last event until the test has looked (or 2 s):
    a client that saw the terminal event before its capture line was written would find the line missing."""

    async def stream_responses(self, body, request):
        async for payload in super().stream_responses(body, request):
            yield payload
        await asyncio.to_thread(RELEASE_STREAM.wait, 2.0)
        RELEASE_STREAM.clear()


def model_server(upstream_url: str, **global_config: object) -> SimpleModelServer:
    return make_server(
        SlowToCloseModel, name="policy_model", openai_base_url=upstream_url, openai_api_key="k",
        openai_model="served-model", server_client=make_server_client(dict(global_config)),
    )


def test_prefixed_calls_are_served_with_observability_off_and_nothing_is_written(upstream, tmp_path):
    server = model_server(upstream, model_call_capture_dir=str(tmp_path))
    with live_server(serving_app(server.build_app())) as url:
        answer = httpx.post(f"{url}/ng-rollout/3-1/v1/responses", json={"input": "hello"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"][-1]["content"][0]["text"] == "echo: hello"
        sdk = openai.OpenAI(base_url=f"{url}/ng-rollout/3-1/v1", api_key="x", max_retries=0)
        chat = sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hey"}])
        assert chat.choices[0].message.content == "echo: hey"
    assert list(tmp_path.iterdir()) == []


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_capture_of_every_dialect_streamed_or_not(upstream, tmp_path):
    server = model_server(upstream, observability_enabled=True, model_call_capture_dir=str(tmp_path))
    capture = tmp_path / "6-2.capture.jsonl"
    with live_server(serving_app(server.build_app())) as url:
        sdk = openai.OpenAI(base_url=f"{url}/ng-rollout/6-2/v1", api_key="x", max_retries=0)
        plain = sdk.responses.create(model="m", input="one")
        events = []
        for event in sdk.responses.create(model="m", input="two", stream=True):
            events.append(event)
            if event.type == "response.completed":
                # The terminal event reaches the client only once its call is on disk (the server holds it while
                # the stream stays open, up to the hook's wait).
                assert len(read_lines(capture)) == 2
                RELEASE_STREAM.set()
        chunks = list(sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "weather?"}], stream=True,
            stream_options={"include_usage": True},
            tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        ))
        messages = anthropic.Anthropic(base_url=f"{url}/ng-rollout/6-2", api_key="x", max_retries=0)
        with messages.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "four"}]) as stream:
            message = stream.get_final_message()
        invalid = httpx.post(f"{url}/ng-rollout/6-2/v1/chat/completions", json={"no": "messages"}, timeout=30)
        unprefixed = httpx.post(f"{url}/v1/responses", json={"input": "not captured"}, timeout=30)
        health = httpx.get(f"{url}/ng-rollout/6-2/health", timeout=30)
    assert invalid.status_code == 422 and unprefixed.status_code == 200 and health.status_code == 200
    assert [p.name for p in tmp_path.iterdir()] == ["6-2.capture.jsonl"]

    lines = read_lines(capture)
    assert [(e["dialect"], e["stream"], e["status_code"], e["error_category"]) for e in lines] == [
        ("responses", False, 200, None),
        ("responses", True, 200, None),
        ("chat", True, 200, None),
        ("messages", True, 200, None),
        ("chat", False, 422, "client_error"),
    ]
    assert all(e["rollout_id"] == "6-2" and e["model_ref"] == "policy_model" for e in lines)
    assert len({e["model_call_id"] for e in lines}) == 5
    assert lines[0]["request"] == {"model": "m", "input": "one"}
    assert lines[0]["response"] == plain.model_dump(mode="json", exclude_unset=True)
    # Streams are put back together: what the SDK assembled from the events the client got.
    assert lines[1]["response"] == events[-1].response.model_dump(mode="json", exclude_unset=True)
    chat = lines[2]["response"]
    call = chat["choices"][0]["message"]["tool_calls"][0]
    streamed_call = next(c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    assert call["id"] == streamed_call.id and call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert chat["usage"] == chunks[-1].usage.model_dump(mode="json", exclude_unset=True)
    assert lines[3]["response"]["content"] == [b.model_dump(mode="json", exclude_unset=True) for b in message.content]
    assert lines[3]["response"]["usage"]["output_tokens"] == message.usage.output_tokens
    assert lines[4]["request"] == {"no": "messages"} and lines[4]["response"]["detail"][0]["loc"] == ["body", "messages"]
    assert all(e["latency_ttft_ms"] is not None for e in lines if e["stream"])

    records = [ModelCallRecord.from_exchange(e, i) for i, e in enumerate(lines)]
    assert [(r.finish_reason, r.tokens_in, r.tokens_out, r.tokens_total) for r in records] == [
        ("stop", 10, 5, 15),
        ("stop", 10, 5, 15),
        ("tool_calls", 10, 5, 15),
        ("stop", 10, 5, 15),
        (None, None, None, None),
    ]
    assert records[2].tool_calls == [{"call_id": call["id"], "name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    assert records[0].model == "served-model"


def test_unprefixed_calls_keep_the_hot_routes(upstream, tmp_path):
    app = model_server(upstream, observability_enabled=True, model_call_capture_dir=str(tmp_path)).build_app()
    served = serving_app(app)
    assert {"/v1/responses", "/v1/chat/completions"} <= set(served.routes)
    assert served.direct is not None  # the capture layer is not part of the fast path


def test_sse_reassembly_reports_a_stream_cut_short():
    stream = _SSEReassembler("responses")
    stream.feed(b'event: response.created\ndata: {"type": "response.created", "response": {"id": "r", "status": "in_progress"}}\n\n')
    stream.feed(b'event: response.output_text.delta\ndata: {"type": "response.output_text.de')
    assert not stream.terminal_seen
    assert stream.result() == ({"id": "r", "status": "in_progress"}, "stream_truncated")
    chat = _SSEReassembler("chat")
    chat.feed(b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}\r\n\r\n')
    chat.feed(b"data: [DONE]\r\n\r\n")
    completion, category = chat.result()
    assert chat.terminal_seen and category is None and completion["choices"][0]["message"]["content"] == "hi"


def test_the_prefix_comes_off_the_raw_path_with_its_escapes_kept():
    scope = {"path": "/ng-rollout/1-0/v1/a b", "raw_path": b"/ng-rollout/1-0/v1/a%20b"}
    assert strip_raw_prefix(scope, "/v1/a b") == b"/v1/a%20b"
    assert strip_raw_prefix({"path": "/ng-rollout/1-0/v1/x"}, "/v1/x") == b"/v1/x"


# --------------------------------------------------------------------------------------------------------
# Config


def test_capture_config_needs_an_absolute_dir_when_enabled(tmp_path):
    assert not ModelCallCaptureConfig.from_global_config({}).capturing
    assert not ModelCallCaptureConfig.from_global_config({"model_call_capture_dir": "relative/ok/when/off"}).capturing
    on = ModelCallCaptureConfig.from_global_config({"observability_enabled": "true", "model_call_capture_dir": str(tmp_path)})
    assert on.capturing and on.model_call_capture_dir == str(tmp_path)
    with pytest.raises(NeMoGymConfigError, match=r"needs `model_call_capture_dir`.*\+model_call_capture_dir=/absolute/path"):
        ModelCallCaptureConfig.from_global_config({"observability_enabled": True})
    with pytest.raises(NeMoGymConfigError, match=r"`model_call_capture_dir` must be an absolute path.*'captures'"):
        ModelCallCaptureConfig.from_global_config({"observability_enabled": True, "model_call_capture_dir": "captures"})


# --------------------------------------------------------------------------------------------------------
# The files and the collector's summary


def exchange(call_id: str, started: str, dialect: str, response: dict, latency: float, **extra) -> dict:
    return {"model_call_id": call_id, "rollout_id": "2-1", "dialect": dialect, "model_ref": "policy", "stream": False,
            "started_at": started, "completed_at": started, "latency_ms": latency, "latency_ttft_ms": None,
            "status_code": 200, "error_category": None, "request": {"model": "asked"}, "response": response, **extra}


RESPONSES_ANSWER = {
    "model": "m1", "status": "completed",
    "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
               {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}],
    "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120,
              "output_tokens_details": {"reasoning_tokens": 7}, "input_tokens_details": {"cached_tokens": 64}},
}
MESSAGES_ANSWER = {"model": "m2", "stop_reason": "max_tokens", "content": [{"type": "text", "text": "cut"}],
                   "usage": {"input_tokens": 30, "output_tokens": 4, "cache_read_input_tokens": 3}}


def test_merge_adds_the_summary_and_leaves_the_result_alone(tmp_path):
    store = CaptureStore(tmp_path)
    # Appended out of order (concurrent calls finish in any order): calls come back in start order.
    store.append("2-1", exchange("b", "2025-01-01T00:00:02+00:00", "messages", MESSAGES_ANSWER, 5.5))
    store.append("2-1", exchange("a", "2025-01-01T00:00:01+00:00", "responses", RESPONSES_ANSWER, 10.25))
    record = {"_ng_task_index": 2, "_ng_rollout_index": 1, "reward": 0.5, "response": {"output": []}}
    merged = merge_model_call_capture_into_record(record, str(tmp_path))
    assert merged is record and record["reward"] == 0.5 and record["response"] == {"output": []}
    summary = record["ng_model_call_capture"]
    assert summary["rollout_id"] == "2-1" and "gaps" not in summary
    assert summary["metrics"] == {"tokens_in": 130, "tokens_out": 24, "tokens_reasoning": 7, "tokens_total": 154,
                                  "latency_total_ms": 15.75, "num_calls": 2}
    first, second = summary["calls"]
    assert (first["model_call_id"], first["call_index"], second["model_call_id"], second["call_index"]) == ("a", 0, "b", 1)
    assert not {"request", "response", "request_raw", "response_raw"} & set(first)
    assert (first["finish_reason"], first["tool_calls"], first["reasoning_content"], first["tokens_cache_read"]) == (
        "tool_calls", [{"call_id": "c1", "name": "f", "arguments": "{}"}], "think", 64)
    assert (second["finish_reason"], second["model"], second["tokens_total"], second["tokens_cache_read"]) == ("length", "m2", 34, 3)


def test_merge_reports_gaps(tmp_path):
    def summary(record: dict) -> dict:
        return merge_model_call_capture_into_record(record, tmp_path)["ng_model_call_capture"]

    missing = summary({"_ng_task_index": 0, "_ng_rollout_index": 0})
    assert missing["gaps"] == [{"code": "model_call_capture_no_records"}] and missing["metrics"]["num_calls"] == 0

    store = CaptureStore(tmp_path)
    store.append("1-0", exchange("a", "2025-01-01T00:00:01+00:00", "responses", RESPONSES_ANSWER, 1.0))
    with open(store.path("1-0"), "ab") as f:
        f.write(b'{"cut off\n')
    damaged = summary({"_ng_task_index": 1, "_ng_rollout_index": 0})
    assert damaged["metrics"]["num_calls"] == 1
    assert damaged["gaps"] == [{"code": "model_call_capture_records_unreadable", "detail": "1 unreadable line(s)"}]

    (tmp_path / "4-0.capture.jsonl").mkdir()  # a write that cannot happen, a file that cannot be read
    assert store.append("4-0", {"model_call_id": "x"}) is False
    blocked = summary({"_ng_task_index": 4, "_ng_rollout_index": 0})
    assert [gap["code"] for gap in blocked["gaps"]] == ["model_call_capture_unreadable", "model_call_capture_incomplete"]
    (tmp_path / "4-0.capture.jsonl").rmdir()
    gaps = summary({"_ng_task_index": 4, "_ng_rollout_index": 0})["gaps"]
    assert [gap["code"] for gap in gaps] == ["model_call_capture_incomplete"]
    assert "IsADirectoryError" in gaps[0]["detail"]

    store.append("3-0-a1", exchange("r", "2025-01-01T00:00:01+00:00", "responses", RESPONSES_ANSWER, 1.0))
    retried = summary({"_ng_task_index": 3, "_ng_rollout_index": 0, "_ng_attempt_index": 1})
    assert retried["rollout_id"] == "3-0-a1" and retried["metrics"]["num_calls"] == 1

    untouched = {"reward": 1.0}
    assert merge_model_call_capture_into_record(untouched, tmp_path) == {"reward": 1.0}  # no indices
    assert merge_model_call_capture_into_record({"_ng_task_index": 1, "_ng_rollout_index": 0}, None) == {
        "_ng_task_index": 1, "_ng_rollout_index": 0}

    clear_capture(tmp_path, "1-0")
    clear_capture(tmp_path, "4-0")
    clear_capture(tmp_path, "9-9")  # nothing there: fine
    assert not store.path("1-0").exists() and not store.incomplete_marker("4-0").exists()
    with pytest.raises(ValueError, match="not a rollout id"):
        store.path("../escape")
