"""Test support that is real, not mocked: e.g. a fake LLM backend that is a genuine OpenAI-compatible server."""
