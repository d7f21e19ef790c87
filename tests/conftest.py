"""Shared test helpers. Integration tests start real processes; the only fake is the LLM backend (a real HTTP
server from nemo_gym.testing.fake_openai_server)."""

from pathlib import Path

import pytest

from nemo_gym.testing.stack import FakeLLMBackend, free_port, wait_http_ok  # noqa: F401  (re-exported for the tests)

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_STACK = Path(__file__).resolve().parent / "fixtures" / "stack"


@pytest.fixture
def fake_backend():
    """A fake OpenAI-compatible LLM server (real HTTP) that calls increment_counter with count=2, then answers."""
    with FakeLLMBackend("--tool-args", '{"count": 2}') as backend:
        yield backend.base_url
