"""Drive command-line entry points (`ng_run`, `ng_collect_rollouts`, ...) as real child processes in tests.

    with FakeLLMBackend("--tool-args", '{"count": 2}') as backend:
        stack = NgRunStack(["+config_paths=[configs/stack.yaml]", f"+policy_base_url={backend.base_url}",
                            f"+head_server.port={head_port}"], cwd=config_dir)
        try:
            stack.wait_for("All 3 / 3 servers ready!")
            servers = {i["process_name"]: i for i in server_instances(head_port)}
            ...
        finally:
            assert stack.stop() == 0, stack.output

The child's stdout and stderr are read line by line by a thread, so `lines` / `output` can be inspected while it
runs and failure messages carry everything it printed. Benchmarks use the same helpers (and `process_tree` /
`cpu_seconds` to measure a stack).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import httpx

NG_RUN = [sys.executable, "-c", "from nemo_gym.cli import run; run()"]
FAKE_LLM = [sys.executable, "-m", "nemo_gym.testing.fake_openai_server"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for servers a test starts itself; `ng_run` reserves its own)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_block(span: int, low: int = 21000, high: int = 32000) -> int:
    """A base port with `[base, base + span)` all free right now, between `low` and `high` (below the ephemeral
    range, 32768+, so outgoing connections of concurrent test runs cannot take them meanwhile)."""
    for _ in range(200):
        base = random.randint(low, high - span)
        socks = []
        try:
            for port in range(base, base + span):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free port block")


def _poll(condition: Callable[[], bool], timeout: float, give_up: Callable[[], bool] = lambda: False,
          sleep: Callable[[float], Any] = time.sleep) -> bool:
    """True once `condition()` holds within `timeout` s; once `give_up()` does, `condition()` decides at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if give_up():
            return condition()
        sleep(0.05)
    return False


def http_ok(url: str) -> bool:
    """Whether `url` answers GET with 200 right now."""
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_http_ok(url: str, timeout: float = 60.0) -> None:
    """Return once `url` answers 200; TimeoutError after `timeout` s."""
    if not _poll(lambda: http_ok(url), timeout):
        raise TimeoutError(f"{url} did not answer 200 within {timeout} s")


def process_tree(pid: int) -> list:
    """The process `pid` and all its descendants that are still running (`psutil.Process` objects)."""
    import psutil

    parent = psutil.Process(pid)
    return [p for p in [parent, *parent.children(recursive=True)] if p.is_running()]


def cpu_seconds(process: Any) -> float:
    """User plus system CPU seconds a `psutil.Process` has used so far."""
    times = process.cpu_times()
    return times.user + times.system


class ChildProcess:
    """A child process whose output (stdout and stderr merged) is collected line by line.

    `env` is added on top of this process's environment (plus `PYTHONUNBUFFERED=1`, so lines arrive as printed);
    `name` is only used in failure messages."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        cwd: Union[str, Path, None] = None,
        env: Optional[Mapping[str, str]] = None,
        name: str = "process",
    ):
        self.name = name
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            list(args),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self._new_line = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new_line.set()
        self._new_line.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def output(self) -> str:
        """Everything the child printed so far."""
        return "\n".join(self.lines)

    def tail(self, n: int = 60) -> str:
        """The last `n` lines the child printed."""
        return "\n".join(self.lines[-n:])

    def _exited(self) -> bool:
        if self.proc.poll() is None:
            return False
        self._reader.join(timeout=5)
        return True

    def _next_line(self, timeout: float) -> None:
        self._new_line.wait(timeout)
        self._new_line.clear()

    def wait_http_ok(self, url: str, timeout: float = 60.0) -> None:
        """Return once `url` answers 200; AssertionError (with the output) if the child exits first or on
        timeout."""
        if _poll(lambda: http_ok(url), timeout, self._exited):
            return
        if self._exited():
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {url} was up:\n{self.tail()}")
        raise AssertionError(f"{url} not healthy after {timeout} s:\n{self.tail()}")

    def _seen(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Return once a line contains `text`; AssertionError (with the output) if the child exits first or on
        timeout."""
        if _poll(lambda: self._seen(text), timeout, self._exited, self._next_line):
            return
        if self._exited():
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {text!r}:\n{self.output}")
        raise AssertionError(f"timed out waiting for {text!r}:\n{self.output}")

    def wait(self, timeout: float = 60.0) -> int:
        """Wait for the child to exit and its output to be read; returns the exit code."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        """Send `sig` (Ctrl-C by default) unless the child has already exited, then `wait`; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout=timeout)


class FakeLLMBackend(ChildProcess):
    """The fake LLM (`nemo_gym.testing.fake_openai_server`, a real HTTP server) as a child process on a free
    port; `args` are its flags (`--script`, `--tool-args`, `--latency-ms`, ...). As a context manager it waits
    until the backend is up and stops it (SIGTERM) on exit."""

    def __init__(self, *args: str, port: Optional[int] = None, host: str = "127.0.0.1"):
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        super().__init__([*FAKE_LLM, "--host", host, "--port", str(self.port), *args], name="fake LLM")

    @property
    def base_url(self) -> str:
        """The OpenAI base URL to point a model server at (`.../v1`)."""
        return f"{self.url}/v1"

    def wait_ready(self, timeout: float = 60.0) -> "FakeLLMBackend":
        """Return (self) once `/health` answers; AssertionError with its output otherwise."""
        self.wait_http_ok(f"{self.url}/health", timeout=timeout)
        return self

    def __enter__(self) -> "FakeLLMBackend":
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        return super().stop(sig, timeout)


def terminate_all(procs: Sequence[subprocess.Popen], timeout: float = 10.0) -> None:
    """SIGTERM every process, then wait for each; one still alive after `timeout` is killed (benchmarks' servers)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fake_llm_overrides(
    config_paths: Sequence[str], backend_url: str, head_port: int, model_name: str = "fake-model"
) -> list[str]:
    """`ng_run` overrides for a stack of `config_paths` whose policy model (`${policy_base_url}` and friends in
    the configs) is the fake LLM at `backend_url` (`.../v1`), with its head server on `head_port`."""
    return [
        f"+config_paths=[{','.join(config_paths)}]",
        f"+policy_base_url={backend_url}",
        "+policy_api_key=dummy",
        f"+policy_model_name={model_name}",
        f"+head_server.port={head_port}",
    ]


class NgRunStack(ChildProcess):
    """`ng_run` with the given Hydra overrides, run from `cwd` (where relative config paths resolve)."""

    def __init__(
        self,
        overrides: Sequence[str],
        *,
        cwd: Union[str, Path, None] = None,
        env: Optional[Mapping[str, str]] = None,
    ):
        super().__init__([*NG_RUN, *overrides], cwd=cwd, env=env, name="ng_run")


def server_instances(head_port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> list[dict]:
    """The running servers as the head server lists them (`process_name`, `url`, `port`, `pid`, ...)."""
    return httpx.get(f"http://{host}:{head_port}/server_instances", timeout=timeout).json()
