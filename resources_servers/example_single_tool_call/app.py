"""example_single_tool_call: the smallest complete resources server.

It shows the three things every resources server has:

1. a config class (here with no fields of its own),
2. tool routes: one `POST /<tool_name>` per tool the model may call (`/get_weather`),
3. `verify`: the score of a finished rollout.

During a rollout the agent sends every `function_call` the model makes to `POST /<name>` on this server with the
call's JSON arguments as the body, and feeds the answer back to the model as the tool output. At the end it sends
the whole rollout (the dataset row plus the model's final `response`) to `POST /verify`.

The weather is always cold and `verify` always answers reward 1.0: this server demonstrates the plumbing, not a
task. It also reports a metric, `called_get_weather`, which shows how to add your own fields to the verify
response (numbers and booleans there are averaged by reward profiling).
"""

from fastapi import FastAPI
from pydantic import BaseModel

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class ExampleSingleToolCallResourcesServerConfig(BaseResourcesServerConfig):
    """Fields added here are read from this server's block in the YAML config."""


# ---------------------------------------------------------------------------------------------------------------
# The tool: its request model is the JSON the model writes as the call's arguments; its response model is what
# the model reads back. Keep them in step with the tool's JSON schema in the dataset rows (`parameters`).


class GetWeatherRequest(BaseModel):
    city: str


class GetWeatherResponse(BaseModel):
    city: str
    weather_description: str


# ---------------------------------------------------------------------------------------------------------------
# Verify: this task has no dataset fields of its own, so the request is the base model. The response adds a metric.


class ExampleSingleToolCallVerifyResponse(BaseVerifyResponse):
    called_get_weather: bool


class ExampleSingleToolCallResourcesServer(SimpleResourcesServer):
    config: ExampleSingleToolCallResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()  # /seed_session and /verify
        app.post("/get_weather")(self.get_weather)  # one line per tool
        return app

    async def get_weather(self, body: GetWeatherRequest) -> GetWeatherResponse:
        return GetWeatherResponse(city=body.city, weather_description=f"The weather in {body.city} is cold.")

    async def verify(self, body: BaseVerifyRequest) -> ExampleSingleToolCallVerifyResponse:
        # `response.output` holds everything the model produced during the rollout, tool calls included.
        called = any(
            item.type == "function_call" and item.name == "get_weather" for item in body.response.output
        )
        # Echo the request back (`**body.model_dump()`) and add the reward and the metrics.
        return ExampleSingleToolCallVerifyResponse(**body.model_dump(), reward=1.0, called_get_weather=called)


if __name__ == "__main__":
    ExampleSingleToolCallResourcesServer.run_webserver()
