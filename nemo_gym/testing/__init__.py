"""Test support that is real, not mocked: e.g. a fake LLM backend that is a genuine OpenAI-compatible server.

- `responses`: Responses items (`message`, `function_call`, `function_call_output`, `reasoning`) and `make_response`;
- `servers`: `make_server` (a server class with a minimal config), `Verifier` (call a server's `verify` with its
  own request class), `example_rows`;
- `judge`: `FakeJudge`, the scripted judge model of judge-based resources servers;
- `counter_server`: a resources server with per-session state, for framework tests;
- `live_server`: serve apps for real in-process (`live_server`, `live_servers`);
- `stack`: child processes (`NgRunStack`, `FakeLLMBackend`), ports and process measurements;
- `script`: rules for the fake LLM's script; `e2e`: a server's examples through a real stack;
- `fake_openai_server`: the fake LLM backend itself; `sandbox`, `asserts`: smaller checks.
"""
