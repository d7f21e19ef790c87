"""RSS of a stack's servers before and after bursts of large bodies and large relayed answers (issue 37, item 1).

A real `ng_run` stack (tests/fixtures/stack's collect.yaml) in front of the scripted fake LLM. Bursts, each request on
its own connection (a fresh TCP connection, `Connection: close`):

- `verify`: N x M MB `/verify` bodies to the resources server (answered 200);
- `small`: N x 1 MB `/verify` bodies to the resources server;
- `relay`: N model calls through the model server whose backend answers M MB of text each;
- `agent`: N x M MB `/run` bodies to the agent (the agent relays them to the model and the resources server).

After each burst the servers are left alone for `--settle` seconds; the RSS printed is then. Run from the repo root:

    python perf/memory_bursts.py [--bursts verify,small,relay,agent] [--settle 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemo_gym.testing.responses import make_response  # noqa: E402
from nemo_gym.testing.script import answer_rule  # noqa: E402
from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides, free_port, server_instances  # noqa: E402

FIXTURE_STACK = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "stack"
MB = 1024 * 1024
NAMES = {"verify": "gated_counter_resources_server", "small": "gated_counter_resources_server",
         "relay": "policy_model", "agent": "counter_simple_agent"}


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / MB


def verify_body(size: int) -> bytes:
    response = make_response("ok").model_dump(mode="json")
    return json.dumps({"responses_create_params": {"input": "w" * size}, "response": response}).encode()


def post_alone(url: str, body: bytes, timeout: float = 120.0) -> int:
    """One POST on its own connection (closed after)."""
    with httpx.Client(timeout=timeout) as client:
        answer = client.post(url, content=body, headers={"content-type": "application/json", "connection": "close"})
        return answer.status_code


def burst(kind: str, servers: dict, count: int, size_mb: int, parallel: int = 1) -> list[int]:
    if kind in ("verify", "small"):
        url = servers[NAMES[kind]]["url"].rstrip("/") + "/verify"
        body = verify_body((1 if kind == "small" else size_mb) * MB)
    elif kind == "relay":
        url = servers["policy_model"]["url"].rstrip("/") + "/v1/responses"
        body = json.dumps({"input": "big answer please"}).encode()
    else:
        url = servers["counter_simple_agent"]["url"].rstrip("/") + "/run"
        body = json.dumps({"responses_create_params": {"input": "w" * (size_mb * MB)}}).encode()
    if parallel <= 1:
        return [post_alone(url, body) for _ in range(count)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda _: post_alone(url, body), range(count)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bursts", default="verify,small,relay")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--verify-count", type=int, default=30)
    parser.add_argument("--verify-mb", type=int, default=30)
    parser.add_argument("--small-count", type=int, default=400)
    parser.add_argument("--relay-count", type=int, default=14)
    parser.add_argument("--relay-mb", type=int, default=20)
    parser.add_argument("--override", action="append", default=[], help="an extra ng_run override (repeatable)")
    parser.add_argument("--parallel", type=int, default=1, help="requests at once (each on its own connection)")
    parser.add_argument("--probe", default="", help="after each burst run this shell command with {pid} filled in")
    args = parser.parse_args()
    head_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.jsonl"
        script.write_text(json.dumps(answer_rule("big answer", "a" * (args.relay_mb * MB))) + "\n"
                          + json.dumps({"output": ["fine"]}) + "\n")
        with FakeLLMBackend("--script", str(script)) as backend:
            overrides = fake_llm_overrides(["configs/collect.yaml"], backend.base_url, head_port)
            with NgRunStack([*overrides, *args.override], cwd=FIXTURE_STACK) as run:
                run.wait_for("servers ready", timeout=180)
                servers = {s["process_name"]: s for s in server_instances(head_port)}
                pids = {name: servers[name]["pid"] for name in set(NAMES.values())}
                for kind in args.bursts.split(","):
                    name = NAMES[kind]
                    count = {"verify": args.verify_count, "small": args.small_count, "relay": args.relay_count,
                             "agent": 10}[kind]
                    size = {"verify": args.verify_mb, "small": 1, "relay": args.relay_mb, "agent": 20}[kind]
                    before = rss_mb(pids[name])
                    started = time.monotonic()
                    statuses = burst(kind, servers, count, size, args.parallel)
                    took = time.monotonic() - started
                    peak = rss_mb(pids[name])
                    time.sleep(args.settle)
                    after = rss_mb(pids[name])
                    if args.probe:
                        import subprocess

                        subprocess.run(args.probe.format(pid=pids[name]), shell=True, check=False)
                    print(f"{kind:7s} {count} x {size} MB on {name}: {before:7.0f} -> {peak:7.0f} (right after, "
                          f"{took:.1f} s) -> {after:7.0f} MB after {args.settle:g} s; statuses "
                          f"{sorted(set(statuses))}", flush=True)
                run.stop()


if __name__ == "__main__":
    main()
