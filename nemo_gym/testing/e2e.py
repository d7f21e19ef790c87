"""End-to-end harness for environment tests: a real `ng_run` stack + `ng_collect_rollouts` over a server's examples.

The stack is the server's own config (its resources server and `<name>_simple_agent`) plus `openai_model` pointed
at the scripted fake LLM backend; only the LLM is fake. Typical use in `resources_servers/<name>/tests/test_e2e.py`:

    from nemo_gym.testing.e2e import collect_examples_e2e

    def test_examples_end_to_end(tmp_path):
        rows = collect_examples_e2e("mcqa", tmp_path, script=[{"match": {...}, "output": ["\\\\boxed{B}"]}, ...])
        assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 1.0]

`script` is a list of fake-backend rules (see `nemo_gym.testing.fake_openai_server`) or a path to a rules file;
`backend_args` passes other fake-backend flags instead (e.g. `["--tool-args", '{"city": "Oslo"}']`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import httpx

from nemo_gym import PARENT_DIR

OPENAI_MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ok(url: str, proc: subprocess.Popen, timeout: float, output: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}) before {url} was up:\n" + "\n".join(output[-60:]))
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not healthy after {timeout} s:\n" + "\n".join(output[-60:]))


def _drain(proc: subprocess.Popen, sink: list[str]) -> threading.Thread:
    def read() -> None:
        for line in proc.stdout:
            sink.append(line.rstrip("\n"))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def collect_examples_e2e(
    server_name: str,
    tmp_path: Path,
    *,
    script: Union[None, str, Path, list] = None,
    backend_args: Sequence[str] = (),
    config_paths: Optional[Sequence[str]] = None,
    agent_name: Optional[str] = None,
    input_jsonl: Optional[str] = None,
    extra_overrides: Sequence[str] = (),
    collect_overrides: Sequence[str] = (),
    ready_timeout: float = 180.0,
) -> list[dict]:
    """Run the server's example dataset through a real stack and return the rollout rows in task order.

    Raises AssertionError with the stack's output if collection exits non-zero."""
    tmp_path = Path(tmp_path)
    args = list(backend_args)
    if script is not None:
        if isinstance(script, (list, tuple)):
            script_path = tmp_path / "fake_llm_script.json"
            script_path.write_text(json.dumps(list(script)))
        else:
            script_path = Path(script)
        args += ["--script", str(script_path)]
    backend_port, head_port = free_port(), free_port()
    configs = list(config_paths or [f"resources_servers/{server_name}/configs/{server_name}.yaml", OPENAI_MODEL_CONFIG])
    agent = agent_name or f"{server_name}_simple_agent"
    input_path = input_jsonl or str(PARENT_DIR / "resources_servers" / server_name / "data" / "example.jsonl")
    output_path = tmp_path / "rollouts.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    backend_out: list[str] = []
    stack_out: list[str] = []
    backend = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.testing.fake_openai_server", "--port", str(backend_port), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    _drain(backend, backend_out)
    stack = None
    try:
        _wait_ok(f"http://127.0.0.1:{backend_port}/health", backend, 60, backend_out)
        stack = subprocess.Popen(
            [sys.executable, "-c", "from nemo_gym.cli import run; run()",
             f"+config_paths=[{','.join(configs)}]",
             f"+policy_base_url=http://127.0.0.1:{backend_port}/v1", "+policy_api_key=dummy",
             "+policy_model_name=fake-model", f"+head_server.port={head_port}", *extra_overrides],
            cwd=PARENT_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        _drain(stack, stack_out)
        deadline = time.monotonic() + ready_timeout
        while not any("servers ready!" in line for line in stack_out):
            if stack.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("ng_run did not become ready:\n" + "\n".join(stack_out[-80:]))
            time.sleep(0.05)
        collect = subprocess.run(
            [sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()",
             f"+agent_name={agent}", f"+input_jsonl_fpath={input_path}", f"+output_jsonl_fpath={output_path}",
             f"+head_server.port={head_port}", "+progress_bar=false", *collect_overrides],
            cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600,
        )
        if collect.returncode != 0:
            raise AssertionError(
                f"ng_collect_rollouts exited {collect.returncode}\n--- stdout\n{collect.stdout}\n--- stderr\n"
                f"{collect.stderr}\n--- stack\n" + "\n".join(stack_out[-80:]) + "\n--- fake LLM\n" + "\n".join(backend_out[-40:])
            )
    finally:
        if stack is not None and stack.poll() is None:
            stack.send_signal(signal.SIGINT)
            stack.wait(timeout=60)
        backend.terminate()
        backend.wait(timeout=10)
    rows = [json.loads(line) for line in output_path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))
