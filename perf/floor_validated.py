"""The validated floor: `perf/floor_stack.py` plus exactly the pydantic work the stack's contract asks for.

Why: the lean floor does no validation, so a stack/floor ratio mixes two costs: what the API contract costs (every
server validates its request body against the model its route declares, FastAPI-style; the environment's own code
runs as written; a route's return value is validated against its declared response model and dumped) and what our
framework adds on top (HTTP parsing and routing, session cookies, the client, retries, logs). This floor pays the
first and nothing else, so `stack / validated floor` is the framework's own overhead, and `validated floor / lean
floor` is what the contract costs by itself in this interpreter.

Per rollout, the same pydantic calls the stack makes, with the stack's own models:

- agent `/run`: the row validated as `SimpleAgentRunRequest` (the answer is plain JSON, as the stack's);
- model proxy `/v1/responses` (twice): the body validated as `NeMoGymResponseCreateParamsNonStreaming`, then
  `model_dump(exclude_unset=True)` for the upstream call (the LLM's answer goes back as it came, as the stack's);
- resources `/seed_session`, `/get_weather`, `/verify`: each body validated as its route's request model
  (`BaseSeedSessionRequest`, `GetWeatherRequest`, `BaseVerifyRequest`), the handler of example_single_tool_call
  as written (verify: `ExampleSingleToolCallVerifyResponse(**body.model_dump(), reward=..., ...)`), and the
  return value validated against the route's response model and dumped by alias (what FastAPI does).

Bodies arrive as memoryviews (the lean floor slices them out without a copy); pydantic takes bytes, so each
is copied once, as the stack's are. Everything else is the lean floor's (HTTP, orjson, the client pool). `floor_stack.py --validate` serves these
routes; `floor_vs_stack.py --validated-floor` measures them beside the lean floor and the stack.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: the environment's own modules

from floor_stack import Pool  # noqa: E402
from floor_stack import agent_routes as lean_agent_routes  # noqa: E402
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming  # noqa: E402
from nemo_gym.servers.resources_server import (  # noqa: E402
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
)
from nemo_gym.serving.hot_routes import _serializer as _answer  # noqa: E402  (the stack's own: what FastAPI answers)
from resources_servers.example_single_tool_call.app import (  # noqa: E402
    ExampleSingleToolCallVerifyResponse,
    GetWeatherRequest,
    GetWeatherResponse,
)
from responses_api_agents.simple_agent.app import SimpleAgentRunRequest  # noqa: E402


def resources_routes() -> dict:
    seed_answer = _answer(BaseSeedSessionResponse)
    weather_answer = _answer(GetWeatherResponse)
    verify_answer = _answer(ExampleSingleToolCallVerifyResponse)

    def seed_session(body) -> bytes:
        BaseSeedSessionRequest.model_validate_json(bytes(body))
        return seed_answer(BaseSeedSessionResponse())

    def get_weather(body) -> bytes:
        request = GetWeatherRequest.model_validate_json(bytes(body))
        return weather_answer(
            GetWeatherResponse(city=request.city, weather_description=f"The weather in {request.city} is cold.")
        )

    def verify(body) -> bytes:
        request = BaseVerifyRequest.model_validate_json(bytes(body))
        called = any(item.type == "function_call" and item.name == "get_weather" for item in request.response.output)
        return verify_answer(
            ExampleSingleToolCallVerifyResponse(**request.model_dump(), reward=1.0, called_get_weather=called)
        )

    return {b"/seed_session": seed_session, b"/get_weather": get_weather, b"/verify": verify}


def model_routes(upstream: str, model_name: str, pool: int) -> tuple[dict, Pool]:
    llm = Pool(upstream, pool, b"Authorization: Bearer dummy\r\n")

    async def responses(body) -> bytes:
        params = NeMoGymResponseCreateParamsNonStreaming.model_validate_json(bytes(body)).model_dump(exclude_unset=True)
        params["model"] = model_name
        return await llm.post(b"/v1/responses", orjson.dumps(params))

    return {b"/v1/responses": responses}, llm


def agent_routes(model_url: str, resources_url: str, pool: int) -> dict:
    lean_run = lean_agent_routes(model_url, resources_url, pool)[b"/run"]

    async def run(body) -> bytes:
        SimpleAgentRunRequest.model_validate_json(bytes(body))
        return await lean_run(body)

    return {b"/run": run}
