"""Shared test helpers. Integration tests start real processes; the only fake is the LLM backend (a real HTTP
server from nemo_gym.testing.fake_openai_server)."""

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nemo_gym.testing.stack import free_port  # noqa: F401  (re-exported for the tests)

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_STACK = Path(__file__).resolve().parent / "fixtures" / "stack"


def wait_http_ok(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer 200 within {timeout} s")


@pytest.fixture
def fake_backend():
    """A fake OpenAI-compatible LLM server (real HTTP) that calls increment_counter with count=2, then answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.testing.fake_openai_server", "--port", str(port), "--tool-args", '{"count": 2}'],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
