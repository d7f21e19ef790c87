"""Memory that comes back (issue 37): a real `ng_run` stack (collect.yaml in front of the scripted fake LLM) takes
bursts of large requests, each on its own connection, a few at a time, and every server's RSS returns near its
baseline afterwards.

Before: 30 bodies of 30 MB to a resources server's `/verify` held 2.7 GB (each closed connection's last request,
body and parsed body, lived in a reference cycle only the cyclic collector frees); a model server relaying 14
answers of 20 MB kept 560 MB (every pooled backend connection held its last answer; the allocator kept the rest);
an agent given 10 inputs of 20 MB kept 840 MB. The margins are generous (the fixes bring each back to within a few
MB); waits are bounded polls, nothing is timed.
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from nemo_gym.testing.responses import make_response
from nemo_gym.testing.script import answer_rule
from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances
from tests.conftest import FIXTURE_STACK

MB = 1024 * 1024
MARGIN = 150 * MB  # what may stay above the baseline after a burst
AT_ONCE = 6  # requests in flight during a burst (each on its own connection)
BIG_ANSWER = "big answer"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    script = tmp_path_factory.mktemp("memory") / "script.jsonl"
    script.write_text(json.dumps(answer_rule(BIG_ANSWER, "a" * (20 * MB))) + "\n" + json.dumps({"output": ["fine"]})
                      + "\n")
    head_port = free_port()
    with FakeLLMBackend("--script", str(script)) as backend:
        overrides = fake_llm_overrides(["configs/collect.yaml"], backend.base_url, head_port)
        with NgRunStack(overrides, cwd=FIXTURE_STACK) as run:
            run.wait_for("servers ready", timeout=180)
            yield {s["process_name"]: s for s in server_instances(head_port)}


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def _post_alone(url: str, path: str, body: bytes) -> bytes:
    """One POST on its own connection (`Connection: close`); the status line of the answer."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=300) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n" % (path.encode(), host.encode(), port.encode(), len(body)))
        sock.sendall(body)
        answer = bytearray()
        while chunk := sock.recv(1 << 20):
            answer += chunk
    return bytes(answer.split(b"\r\n", 1)[0])


def _burst_then_settle(server: dict, path: str, body: bytes, count: int, small: bytes) -> tuple[int, int]:
    """RSS before and (once it settled, or after 60 s) after `count` POSTs of `body`, `AT_ONCE` at a time (the
    baseline is taken after one `small` request of the same kind: first-use allocations are not the burst's)."""
    url, pid = server["url"], server["pid"]
    assert _post_alone(url, path, small).endswith(b" 200 OK")
    time.sleep(2)
    baseline = _rss(pid)
    with ThreadPoolExecutor(AT_ONCE) as pool:
        statuses = list(pool.map(lambda _: _post_alone(url, path, body), range(count)))
    assert all(status.endswith(b" 200 OK") for status in statuses), set(statuses)
    deadline = time.monotonic() + 60
    while _rss(pid) - baseline > MARGIN // 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    return baseline, _rss(pid)


def _check(name: str, baseline: int, after: int) -> None:
    assert after - baseline < MARGIN, (
        f"{name}: RSS {baseline / MB:.0f} MB before the burst, {after / MB:.0f} MB after it settled")


def test_a_resources_server_gives_back_30_bodies_of_30_mb_on_separate_connections(stack):
    response = make_response("ok").model_dump(mode="json")

    def body(size: int) -> bytes:
        return json.dumps({"responses_create_params": {"input": "w" * size}, "response": response}).encode()

    baseline, after = _burst_then_settle(stack["gated_counter_resources_server"], "/verify", body(30 * MB), 30,
                                         body(10))
    _check("resources server", baseline, after)


def test_a_model_server_gives_back_14_relayed_answers_of_20_mb(stack):
    body = json.dumps({"input": f"a {BIG_ANSWER} please"}).encode()
    small = json.dumps({"input": "a small answer please"}).encode()
    baseline, after = _burst_then_settle(stack["policy_model"], "/v1/responses", body, 14, small)
    _check("model server", baseline, after)


def test_an_agent_gives_back_10_inputs_of_20_mb(stack):
    body = json.dumps({"responses_create_params": {"input": "w" * (20 * MB)}}).encode()
    small = json.dumps({"responses_create_params": {"input": "hello"}}).encode()
    baseline, after = _burst_then_settle(stack["counter_simple_agent"], "/run", body, 10, small)
    _check("agent", baseline, after)
