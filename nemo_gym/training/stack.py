"""`ng_run` as a child process of a trainer: started from config paths, waited for until every server is ready,
stopped on exit (`RolloutClient.start` uses it).

The child dies with the trainer however the trainer dies (`runtime/parent_death.py`; its servers follow it). Its
output goes to a log file (`log_path`, default a temporary file), named in every error."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence, Union

from nemo_gym.errors import NeMoGymStackError

__all__ = ["LocalStack", "DEFAULT_READY_TIMEOUT_S"]

NG_RUN = [sys.executable, "-c", "from nemo_gym.cli import run; run()"]
DEFAULT_READY_TIMEOUT_S = 900.0
_READY = re.compile(r"All (\d+) / \1 servers ready!")
_HEAD_PORT = re.compile(r"^\+*head_server\.port=(\d+)$")
_HEAD_HOST = re.compile(r"^\+*head_server\.host=(\S+)$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalStack:
    """One `ng_run` child: `+config_paths=[...]` plus `overrides` (Hydra syntax, as on the command line), run from
    `cwd` (where relative config paths resolve). The head server listens on the port an override gives
    (`+head_server.port=N`), else on a free port chosen here. `head_server` is its URL."""

    def __init__(
        self,
        config_paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        overrides: Sequence[str] = (),
        *,
        cwd: Union[str, os.PathLike, None] = None,
        log_path: Union[str, os.PathLike, None] = None,
        env: Optional[dict] = None,
    ) -> None:
        if isinstance(config_paths, (str, os.PathLike)):
            config_paths = [config_paths]
        paths = [str(p) for p in config_paths]
        if not paths:
            raise ValueError("RolloutClient.start: give at least one config path (the stack's YAML files)")
        self.overrides = list(overrides)
        port = host = None
        for item in self.overrides:
            found = _HEAD_PORT.match(item.strip())
            if found:
                port = int(found.group(1))
            found = _HEAD_HOST.match(item.strip())
            if found:
                host = found.group(1)
        if port is None:
            port = _free_port()
            self.overrides.append(f"+head_server.port={port}")
        if host in (None, "0.0.0.0", "::"):
            host = "127.0.0.1"
        self.head_server = f"http://{host}:{port}"
        self.args = [*NG_RUN, f"+config_paths=[{','.join(paths)}]", *self.overrides]
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"ng_run_{port}_", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self.env = env
        self.proc: Optional[subprocess.Popen] = None

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def _ready(self) -> bool:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        return _READY.search(text) is not None

    def start(self) -> None:
        from nemo_gym.runtime.parent_death import popen_dying_with_parent

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = popen_dying_with_parent(
                self.args,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})},
            )
        finally:
            log.close()

    async def wait_ready(self, timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> None:
        """Return once ng_run says every server is ready; `NeMoGymStackError` (with its last lines) when it exits
        first or `timeout_s` passes (the stack is then stopped)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            code = self.proc.poll()
            if code is not None:
                raise NeMoGymStackError(
                    f"ng_run (started by RolloutClient.start from {self.cwd}) exited with code {code} before its "
                    f"servers were ready; its log is {self.log_path}. Last lines:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                await asyncio.to_thread(self.stop)
                raise NeMoGymStackError(
                    f"ng_run (started by RolloutClient.start) did not get every server ready within {timeout_s:.0f} s "
                    f"(ready_timeout_s); it was stopped. Its log is {self.log_path}. Last lines:\n{self.tail()}"
                )
            await asyncio.sleep(0.2)

    def stop(self, timeout_s: float = 60.0) -> Optional[int]:
        """Stop ng_run as Ctrl-C would (it stops its servers), harder if it does not exit in time; its exit code."""
        proc = self.proc
        if proc is None:
            return None
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=timeout_s if sig != signal.SIGKILL else 10)
            except subprocess.TimeoutExpired:
                continue
        return proc.poll()
