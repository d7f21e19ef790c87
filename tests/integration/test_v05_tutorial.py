"""NeMo Gym v0.5's "build a single-step environment" tutorial, walked step by step as real processes in a fresh
project folder: `gym env init`, the tutorial's own files in place of the scaffold's (a weather tool, a verify that
rewards calling it, five weather rows, tests written v0.5's way), `ng_test`, `ng_run` + the tutorial's spot check
`python responses_api_agents/simple_agent/client.py`, `ng_collect_rollouts` with the tutorial's flags, then
`gym eval reverify` with a config that holds the resources server alone. Only the LLM is fake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nemo_gym.testing.stack import FakeLLMBackend, NgRunStack, fake_llm_overrides
from tests.conftest import REPO_ROOT, free_port

GYM = [sys.executable, "-c", "from nemo_gym.cli.main import main; main()"]
CLIENT = REPO_ROOT / "responses_api_agents" / "simple_agent" / "client.py"
NAME = "my_weather_tool"
MODEL_CONFIG = "responses_api_models/openai_model/configs/openai_model.yaml"

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
QUESTIONS = ["Weather in Oslo?", "Is it raining in Lima", "How warm is Cairo today?", "Rome: sunny?", "Weather, Kyiv"]

APP = '''
from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class MyWeatherToolResourcesServerConfig(BaseResourcesServerConfig):
    pass


class GetWeatherRequest(BaseModel):
    city: str


class GetWeatherResponse(BaseModel):
    city: str
    weather_description: str


class MyWeatherToolResourcesServer(SimpleResourcesServer):
    config: MyWeatherToolResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/get_weather")(self.get_weather)
        return app

    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        return GetWeatherResponse(city=body.city, weather_description=f"{body.city}: cold")

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        called = any(o.type == "function_call" and o.name == "get_weather" for o in body.response.output)
        return BaseVerifyResponse(**body.model_dump(), reward=1.0 if called else 0.0)


if __name__ == "__main__":
    MyWeatherToolResourcesServer.run_webserver()
'''

TESTS = '''
from unittest.mock import MagicMock

import pytest

from nemo_gym.server_utils import ServerClient
from resources_servers.my_weather_tool.app import (
    GetWeatherRequest,
    MyWeatherToolResourcesServer,
    MyWeatherToolResourcesServerConfig,
)


@pytest.fixture
def server():
    config = MyWeatherToolResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="my_weather_tool")
    return MyWeatherToolResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


@pytest.mark.asyncio
async def test_get_weather(server):
    answer = await server.get_weather(GetWeatherRequest(city="Oslo"))
    assert answer.city == "Oslo" and "cold" in answer.weather_description
'''

CONFIG = f"""
{NAME}_resources_server:
  resources_servers:
    {NAME}:
      entrypoint: app.py
      domain: agent
      verified: false
      description: Single-step weather tool calling
{NAME}_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: {NAME}_resources_server
      model_server:
        type: responses_api_models
        name: policy_model
      datasets:
      - name: example
        type: example
        jsonl_fpath: resources_servers/{NAME}/data/example.jsonl
"""


def run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A command as a user types it: without pytest's PYTEST_CURRENT_TEST, which makes a script ignore its argv."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def make_it_the_tutorials_server(server: Path) -> None:
    """Step 2 to 5 of the tutorial: its data, app.py, config and tests replace the scaffold's."""
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": q}], "tools": [WEATHER_TOOL]}}
            for q in QUESTIONS]
    (server / "data" / "example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (server / "app.py").write_text(APP)
    (server / "configs" / f"{NAME}.yaml").write_text(CONFIG)
    (server / "tests" / "test_app.py").write_text(TESTS)


def test_single_step_environment_tutorial(tmp_path):
    init = run([*GYM, "env", "init", "--resources-server", NAME], tmp_path)
    assert init.returncode == 0, init.stdout + init.stderr
    server = tmp_path / "resources_servers" / NAME
    make_it_the_tutorials_server(server)

    # The scaffold's end-to-end test keeps working on the tutorial's task and data (it ran on the placeholder's).
    tested = run([sys.executable, "-c", "from nemo_gym.cli import test; test()", f"+entrypoint=resources_servers/{NAME}"],
                 tmp_path, timeout=600)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "2 passed" in tested.stdout and "skipped" not in tested.stdout, tested.stdout

    head_port = free_port()
    head = f"+head_server.port={head_port}"
    output = tmp_path / "resources_servers" / NAME / "data" / "example_rollouts.jsonl"
    with FakeLLMBackend("--tool-args", '{"city": "Oslo"}') as backend:
        stack = NgRunStack(fake_llm_overrides([MODEL_CONFIG, f"resources_servers/{NAME}/configs/{NAME}.yaml"],
                                              backend.base_url, head_port), cwd=tmp_path)
        try:
            stack.wait_for("servers ready!", timeout=180)

            # The spot check: the client asks the agent once and prints the episode's output items.
            asked = run([sys.executable, str(CLIENT), f"+agent_name={NAME}_simple_agent", head], tmp_path)
            assert asked.returncode == 0, asked.stdout + asked.stderr
            items = json.loads(asked.stdout)
            assert [i["type"] for i in items] == ["function_call", "function_call_output", "message"]
            assert items[0]["name"] == "get_weather" and "cold" in items[1]["output"]
            # Unedited, the client asks v0.5's default agent; a stack without it has one agent, which is asked.
            default = run([sys.executable, str(CLIENT), head], tmp_path)
            assert default.returncode == 0 and json.loads(default.stdout)[0]["name"] == "get_weather", default.stderr
            assert f"asking its only agent, `{NAME}_simple_agent`" in default.stderr
            wrong = run([sys.executable, str(CLIENT), f"+agent_name={NAME}_agent", head], tmp_path)
            assert wrong.returncode == 2 and f"Did you mean `{NAME}_simple_agent`" in wrong.stderr, wrong.stderr

            collected = run([sys.executable, "-c", "from nemo_gym.cli import collect_rollouts; collect_rollouts()",
                             f"+agent_name={NAME}_simple_agent",
                             f"+input_jsonl_fpath=resources_servers/{NAME}/data/example.jsonl",
                             f"+output_jsonl_fpath={output}", "+limit=null", "+num_repeats=null",
                             "+num_samples_in_parallel=null", "+progress_bar=false", head], tmp_path)
            assert collected.returncode == 0, collected.stdout + collected.stderr
        finally:
            stack.stop(timeout=60)
    rollouts = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["reward"] for r in rollouts] == [1.0] * 5

    # Re-score with a config of the resources server alone: every row goes to it, no +resources_server_name.
    only_server = tmp_path / "reverify.yaml"
    only_server.write_text(CONFIG.split(f"{NAME}_simple_agent:")[0])
    inputs = output.with_name("example_rollouts_materialized_inputs.jsonl")
    reverified = run([*GYM, "eval", "reverify", "--config", str(only_server), "--rollouts", str(output),
                      "--inputs", str(inputs), "--output", str(tmp_path / "reverified.jsonl")], tmp_path)
    assert reverified.returncode == 0, reverified.stdout + reverified.stderr
    again = [json.loads(line) for line in (tmp_path / "reverified.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in again] == [1.0] * 5
