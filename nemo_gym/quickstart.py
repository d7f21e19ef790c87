"""`python -m nemo_gym.quickstart`: see the whole loop work on this machine, no API key needed.

Starts a scripted OpenAI-compatible fake LLM, launches a 3-server stack with `ng_run`, runs five rollouts through the
agent's `/run`, prints their rewards, and stops everything. Until the embedded local model lands, the fake LLM
stands in for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from nemo_gym import PARENT_DIR

STACK_DIR = PARENT_DIR / "tests" / "fixtures" / "stack"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"quickstart: a process exited early (code {proc.returncode}); see its output above.")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"quickstart: {url} did not become healthy in {timeout} s")


def main() -> int:
    if not STACK_DIR.is_dir():
        print(f"quickstart needs a source checkout (missing {STACK_DIR}).", file=sys.stderr)
        return 2
    backend_port, head_port = _free_port(), _free_port()
    backend = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.testing.fake_openai_server", "--port", str(backend_port),
         "--tool-args", '{"count": 2}'],
    )
    stack = None
    try:
        _wait(f"http://127.0.0.1:{backend_port}/health", backend)
        print(f"fake LLM backend on http://127.0.0.1:{backend_port}/v1")
        stack = subprocess.Popen(
            [sys.executable, "-c", "from nemo_gym.cli import run; run()",
             "+config_paths=[configs/stack.yaml]",
             f"+policy_base_url=http://127.0.0.1:{backend_port}/v1",
             "+policy_api_key=dummy", "+policy_model_name=fake-model",
             f"+head_server.port={head_port}"],
            cwd=STACK_DIR,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        _wait(f"http://127.0.0.1:{head_port}/health", stack)
        deadline = time.monotonic() + 120
        while True:
            instances = httpx.get(f"http://127.0.0.1:{head_port}/server_instances", timeout=5).json()
            healthy = []
            for inst in instances:
                try:
                    healthy.append(httpx.get(inst["url"] + "/health", timeout=1).status_code == 200)
                except httpx.HTTPError:
                    healthy.append(False)
            if instances and all(healthy):
                break
            if stack.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("quickstart: the stack did not become ready; see the output above.")
            time.sleep(0.1)
        agent = next(i for i in instances if i["process_name"] == "counter_agent")
        tool = {
            "type": "function", "name": "increment_counter", "description": "Add to the counter.",
            "parameters": {"type": "object", "properties": {"count": {"type": "integer"}}}, "strict": False,
        }
        rewards = []
        for initial, expected in [(0, 2), (1, 3), (5, 7), (2, 9), (10, 12)]:
            row = {
                "responses_create_params": {"input": f"Add 2 to the counter (it starts at {initial}).", "tools": [tool]},
                "initial_count": initial,
                "expected_count": expected,
            }
            result = httpx.post(agent["url"] + "/run", json=row, timeout=60).json()
            rewards.append(result["reward"])
            print(json.dumps({"initial_count": initial, "expected_count": expected,
                              "final_count": result["final_count"], "reward": result["reward"]}))
        print(f"mean reward over {len(rewards)} rollouts: {sum(rewards) / len(rewards):.2f} "
              f"(one task expects a wrong count on purpose, so 0.80 is right)")
        return 0
    finally:
        if stack is not None and stack.poll() is None:
            stack.send_signal(signal.SIGINT)
            stack.wait(timeout=60)
        backend.terminate()
        backend.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
