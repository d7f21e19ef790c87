"""The v0.2 compatibility suite: environment code written against NeMo Gym v0.2's documented API runs unchanged.

Everything here is written the v0.2 way (imports from `nemo_gym.server_utils`, `nemo_gym.openai_utils`,
`nemo_gym.base_*`, aiohttp-style responses), against real servers: `live_server` / `live_servers` for our servers,
the fake OpenAI-compatible server for the one LLM. It must pass on the newest dependencies and on the lowest ones
pyproject.toml allows (`uv pip install --resolution lowest-direct`), so it uses nothing newer than those.
"""
