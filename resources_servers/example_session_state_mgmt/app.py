"""example_session_state_mgmt: tools that share state within one rollout, and only within it.

Each rollout has a counter. `/seed_session` sets it to the row's `initial_count` before the model starts; the model
changes it with `increment_counter` and reads it with `get_counter_value`; `verify` gives reward 1.0 iff the counter
ends at the row's `expected_count`.

How per-rollout state works. Many rollouts run against one server at the same time, so state cannot live in plain
attributes. Every request carries a signed session cookie; the session middleware turns it into
`request.session`, whose `SESSION_ID_KEY` entry is a random id for that rollout. The agent sends the cookie it got
from `/seed_session` with every tool call and with `/verify`, so all of them see the same id. Key your state by it
(here: a dict from session id to counter) and free it in `verify`, the last call of a rollout.

Handlers that need the session take FastAPI's `Request` as their first argument.
"""

from typing import Optional

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY


class ExampleSessionStateMgmtResourcesServerConfig(BaseResourcesServerConfig):
    pass


# ------------------------------------------------------------------------------------------------ seed + tools


class CounterSeedSessionRequest(BaseSeedSessionRequest):
    """`/seed_session` receives the whole dataset row; declare the fields you need (the rest is ignored)."""

    initial_count: int = 0


class IncrementCounterRequest(BaseModel):
    count: int


class IncrementCounterResponse(BaseModel):
    success: bool


class GetCounterValueResponse(BaseModel):
    count: int


# ------------------------------------------------------------------------------------------------------ verify


class CounterVerifyRequest(BaseVerifyRequest):
    expected_count: int


class CounterVerifyResponse(CounterVerifyRequest, BaseVerifyResponse):
    final_count: Optional[int]  # the counter at verify time; None if this rollout never touched the counter


class ExampleSessionStateMgmtResourcesServer(SimpleResourcesServer):
    config: ExampleSessionStateMgmtResourcesServerConfig
    # session id -> counter. A pydantic field, because the server is a pydantic model.
    session_id_to_counter: dict[str, int] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment_counter")(self.increment_counter)
        app.post("/get_counter_value")(self.get_counter_value)
        return app

    async def seed_session(self, request: Request, body: CounterSeedSessionRequest) -> BaseSeedSessionResponse:
        self.session_id_to_counter[request.session[SESSION_ID_KEY]] = body.initial_count
        return BaseSeedSessionResponse()

    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> IncrementCounterResponse:
        session_id = request.session[SESSION_ID_KEY]
        # A rollout that was never seeded starts from 0.
        self.session_id_to_counter[session_id] = self.session_id_to_counter.get(session_id, 0) + body.count
        return IncrementCounterResponse(success=True)

    async def get_counter_value(self, request: Request) -> GetCounterValueResponse:
        return GetCounterValueResponse(count=self.session_id_to_counter.get(request.session[SESSION_ID_KEY], 0))

    async def verify(self, request: Request, body: CounterVerifyRequest) -> CounterVerifyResponse:
        # The rollout is over: take its state out so the dict does not grow with every rollout ever run.
        final_count = self.session_id_to_counter.pop(request.session[SESSION_ID_KEY], None)
        reward = 1.0 if final_count is not None and final_count == body.expected_count else 0.0
        return CounterVerifyResponse(**body.model_dump(), reward=reward, final_count=final_count)


if __name__ == "__main__":
    ExampleSessionStateMgmtResourcesServer.run_webserver()
