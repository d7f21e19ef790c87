"""Drive command-line entry points (`ng_run`, `ng_collect_rollouts`, ...) as real child processes in tests.

    stack = NgRunStack(["+config_paths=[configs/stack.yaml]", f"+head_server.port={head_port}"], cwd=config_dir)
    try:
        stack.wait_for("All 3 / 3 servers ready!")
        servers = {i["process_name"]: i for i in server_instances(head_port)}
        ...
    finally:
        assert stack.stop() == 0, stack.output

The child's stdout and stderr are read line by line by a thread, so `lines` / `output` can be inspected while it
runs and failure messages carry everything it printed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import httpx

NG_RUN = [sys.executable, "-c", "from nemo_gym.cli import run; run()"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for servers a test starts itself; `ng_run` reserves its own)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def wait_http_ok(self, url: str, timeout: float = 60.0) -> None:
        """Return once `url` answers 200; AssertionError (with the output) if the child exits first or on
        timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {url} was up:\n{self.tail()}")
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"{url} not healthy after {timeout} s:\n{self.tail()}")

    def _seen(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Return once a line contains `text`; AssertionError (with the output) if the child exits first or on
        timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._seen(text):
                return
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                if self._seen(text):
                    return
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {text!r}:\n{self.output}")
            time.sleep(0.05)
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
