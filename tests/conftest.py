"""Shared test helpers. Integration tests start real processes; the only fake is the LLM backend (a real HTTP
server from nemo_gym.testing.fake_openai_server)."""

import signal
from pathlib import Path

import pytest

from nemo_gym.testing.stack import FakeLLMBackend, free_port, wait_http_ok  # noqa: F401  (re-exported for the tests)

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_STACK = Path(__file__).resolve().parent / "fixtures" / "stack"

# Tests stop child processes with Ctrl-C (SIGINT), as a user would. A suite started with SIGINT ignored (a background
# job of a non-interactive shell, `nohup ... &`) would hand that on to every child, which then never sees the
# Ctrl-C and runs until a timeout. With a handler here, children start with the default again (exec resets a
# handled signal, not an ignored one).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def fake_backend():
    """A fake OpenAI-compatible LLM server (real HTTP) that calls increment_counter with count=2, then answers."""
    with FakeLLMBackend("--tool-args", '{"count": 2}') as backend:
        yield backend.base_url


def read_until_closed(sock) -> bytes:
    """Everything a server sends on a raw socket until it closes (or resets) the connection."""
    answer = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return answer
        if not data:
            return answer
        answer += data
