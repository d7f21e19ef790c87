"""Hostile request bodies against a real stack (`ng_run` of the collection fixture in front of the fake LLM).

A body over a server's limit is answered 413 with a one-line reason before it is buffered, whether it declares its
length or comes chunked, on hot routes and on FastAPI's own; a 422 never echoes more than an excerpt of the input;
and a server's memory comes back near where it was after a burst of large bodies it did accept. A head (request line
and headers) is held to its own limits: an endless header is cut off soon after the global default of 64 KiB
without growing the server, one over a server block's own limit is answered 431, and one that stops arriving
408 after the configured timeout; so is a body that stops arriving. A client that pipelines requests without
reading the answers is cut off without growing the server, and a body of a million bad list items gets a short 422.
A client that stops reading a streamed answer is dropped after the configured send timeout.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import psutil
import pytest

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances
from tests.conftest import FIXTURE_STACK, read_until_closed

LIMIT = 8 * 1024 * 1024  # the stack's max_request_body_bytes
BIG = 50 * 1024 * 1024
AGENT_HEAD_LIMIT = 4096  # the agent block's own max_request_head_bytes (the others keep the 64 KiB default)


@pytest.fixture(scope="module")
def stack():
    head_port = free_port()
    with FakeLLMBackend() as backend:
        overrides = fake_llm_overrides(["configs/collect.yaml"], backend.base_url, head_port)
        limits = [f"+max_request_body_bytes={LIMIT}", "+request_head_timeout_s=1", "+request_body_timeout_s=1",
                  "+response_send_timeout_s=1",
                  f"++counter_simple_agent.responses_api_agents.simple_agent.max_request_head_bytes={AGENT_HEAD_LIMIT}"]
        with NgRunStack([*overrides, *limits], cwd=FIXTURE_STACK) as run:
            run.wait_for("servers ready", timeout=120)
            servers = {s["process_name"]: s for s in server_instances(head_port)}
            yield servers, run


def _url(servers: dict, name: str) -> str:
    return servers[name]["url"].rstrip("/")


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def _raw_post(url: str, path: str, head: bytes, chunks, timeout: float = 60.0) -> bytes:
    """Send a request by hand (headers, then `chunks`) and read until the server closes or answers whole."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + head + b"\r\n")
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed in the middle of the body: what we test for
        answer = read_until_closed(sock)
        return answer


@pytest.mark.parametrize("path", ["/verify", "/seed_session", "/openapi.json"])
def test_a_body_over_the_limit_with_its_length_is_answered_413_with_one_line(stack, path):
    servers, _ = stack
    url = _url(servers, "gated_counter_resources_server")
    before = _rss(servers["gated_counter_resources_server"]["pid"])
    body = b"x" * BIG
    answer = httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"}, timeout=120)
    assert answer.status_code == 413, answer.text[:500]
    detail = answer.json()["detail"]
    assert "\n" not in detail and str(BIG) in detail and str(LIMIT) in detail and "max_request_body_bytes" in detail
    assert answer.headers["connection"] == "close"
    # Nothing of the 50 MB was kept.
    assert _rss(servers["gated_counter_resources_server"]["pid"]) - before < 20 * 1024 * 1024


def test_a_chunked_body_growing_past_the_limit_is_answered_413_and_the_connection_closed(stack):
    servers, _ = stack
    url = _url(servers, "gated_counter_resources_server")
    piece = b"y" * (1024 * 1024)
    chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
    answer = _raw_post(url, "/verify", b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n",
                       (chunk for _ in range(BIG // len(piece))))
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert b"max_request_body_bytes" in answer


def test_the_server_still_serves_after_refusing(stack):
    servers, _ = stack
    url = _url(servers, "gated_counter_resources_server")
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    seeded = httpx.post(f"{url}/seed_session", json={}, timeout=10)
    assert seeded.status_code == 200, seeded.text


def test_a_422_shows_only_an_excerpt_of_the_input(stack):
    servers, _ = stack
    url = _url(servers, "gated_counter_resources_server")
    body = {"responses_create_params": {"input": "z" * (6 * 1024 * 1024)}, "response": "not a response"}
    answer = httpx.post(f"{url}/verify", json=body, timeout=60)
    assert answer.status_code == 422
    assert len(answer.content) < 20_000, len(answer.content)
    assert any(error["loc"][-1] == "response" or "response" in error["loc"] for error in answer.json()["detail"])


@pytest.mark.parametrize("name, path, body", [
    ("gated_counter_resources_server", "/verify", {"responses_create_params": {"input": [1] * 1_000_000}, "response": {}}),
    ("policy_model", "/v1/responses", {"input": [{"type": "not_a_thing"}] * 200_000}),
    ("policy_model", "/v1/chat/completions", {"messages": [1] * 1_000_000}),
    ("gated_counter_resources_server", "/verify", {"responses_create_params": {"input": "hi", "include": [1] * 1_000_000},
                                                   "response": {}}),
])
def test_a_body_of_a_million_bad_items_gets_a_short_422(stack, name, path, body):
    """pydantic reports every bad item: this took 10 s of the server's event loop and answered 332 MB before
    (request lists stop at their first bad item, and a 422 lists at most 50 errors)."""
    servers, _ = stack
    answer = httpx.post(f"{_url(servers, name)}{path}", json=body, timeout=120)
    assert answer.status_code == 422, answer.text[:300]
    assert len(answer.content) < 20_000, len(answer.content)
    assert len(answer.json()["detail"]) <= 51


def test_memory_returns_near_its_baseline_after_a_burst_of_large_bodies(stack):
    servers, _ = stack
    name = "gated_counter_resources_server"
    url, pid = _url(servers, name), servers[name]["pid"]
    payload = {"responses_create_params": {"input": "w" * (7 * 1024 * 1024)}, "response": "not a response"}
    with httpx.Client(timeout=60) as client:
        client.post(f"{url}/verify", json=payload)  # first touch: allocator arenas, caches
        time.sleep(0.5)
        baseline = _rss(pid)
        for _ in range(20):
            assert client.post(f"{url}/verify", json=payload).status_code == 422
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _rss(pid) - baseline > 32 * 1024 * 1024:
        time.sleep(0.2)
    grown = _rss(pid) - baseline
    # 20 bodies of 7 MB went through (140 MB); what stays is allocator slack, not the bodies.
    assert grown < 32 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MB"


def test_an_endless_header_is_cut_off_without_growing_the_server(stack):
    servers, _ = stack
    name = "gated_counter_resources_server"
    url, pid = _url(servers, name), servers[name]["pid"]
    host, port = url.removeprefix("http://").split(":")
    before = _rss(pid)
    sent = 0
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Endless: ")
        with pytest.raises(OSError):  # reset or broken pipe: the server closed long before 200 MB went out
            for _ in range(200):
                sock.sendall(b"h" * (1024 * 1024))
                sent += 1024 * 1024
    assert sent < 64 * 1024 * 1024, sent
    assert _rss(pid) - before < 20 * 1024 * 1024
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_a_head_over_a_server_blocks_own_limit_is_answered_431(stack):
    servers, _ = stack
    url = _url(servers, "counter_simple_agent")
    answer = httpx.post(f"{url}/run", json={}, headers={"x-pad": "p" * AGENT_HEAD_LIMIT}, timeout=30)
    assert answer.status_code == 431, answer.text[:300]
    assert str(AGENT_HEAD_LIMIT) in answer.json()["detail"] and "max_request_head_bytes" in answer.json()["detail"]
    # The same head is well under the default limit of the resources server.
    other = httpx.post(f"{_url(servers, 'gated_counter_resources_server')}/seed_session", json={},
                       headers={"x-pad": "p" * AGENT_HEAD_LIMIT}, timeout=30)
    assert other.status_code == 200, other.text[:300]


def test_a_head_that_stops_arriving_is_answered_408_after_the_configured_timeout(stack):
    servers, _ = stack
    host, port = _url(servers, "policy_model").removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert b"within 1 s" in answer and b"request_head_timeout_s" in answer


def test_a_body_that_stops_arriving_is_answered_408_after_the_configured_timeout(stack):
    servers, _ = stack
    host, port = _url(servers, "gated_counter_resources_server").removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5000\r\n\r\n{\"responses_create_params\": ")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert b"for 1 s" in answer and b"request_body_timeout_s" in answer


def test_pipelining_without_reading_the_answers_does_not_grow_the_server(stack):
    """uvicorn queued every pipelined request it read; 8 such connections grew a server to 1.2 GB before the limit
    (`NeMoGymHttpProtocol.max_pipelined`)."""
    servers, _ = stack
    name = "gated_counter_resources_server"
    url, pid = _url(servers, name), servers[name]["pid"]
    host, port = url.removeprefix("http://").split(":")
    request = (b"POST /seed_session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: 2\r\n\r\n{}")
    before = _rss(pid)
    sent = []
    for _ in range(4):
        with socket.create_connection((host, int(port)), timeout=2) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never read
            count = 0
            deadline = time.monotonic() + 10
            try:
                while time.monotonic() < deadline:
                    sock.sendall(request * 100)
                    count += 100
            except OSError:  # closed by the server (reset), or it stopped reading (timeout)
                pass
            sent.append(count)
    assert all(count < 1_000_000 for count in sent), sent  # the server did not read on for 10 s
    grown = _rss(pid) - before
    assert grown < 20 * 1024 * 1024, f"RSS grew by {grown / 2**20:.1f} MB after {sum(sent)} pipelined requests"
    assert httpx.post(f"{url}/seed_session", json={}, timeout=10).status_code == 200


def test_a_client_that_stops_reading_a_stream_is_dropped_after_the_send_timeout(stack):
    """uvicorn waited for such a client for ever, and the model server kept its call to the backend open."""
    servers, run = stack
    url = _url(servers, "policy_model")
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"input": "word " * 50_000, "stream": True}).encode()  # echoed back: megabytes of events
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.connect((host, int(port)))
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(4)  # reads nothing: the buffers fill, then 1 s without progress
        answer = read_until_closed(sock)  # what was buffered, then the end (a socket timeout fails the test)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in answer[:1000]
    assert b"event: response.completed" not in answer  # cut off, not finished
    assert httpx.post(f"{url}/v1/responses", json={"input": "hi"}, timeout=30).status_code == 200
    deadline = time.monotonic() + 10
    while "read nothing of the answer" not in run.output and time.monotonic() < deadline:
        time.sleep(0.2)
    assert 'read nothing of the answer to "POST /v1/responses" for 1 s (response_send_timeout_s)' in run.output
