"""A resources server with per-session state, for tests of the framework's agents, sessions and launchers.

Each rollout (session) has a counter: `/seed_session` sets it to the row's `initial_count`, the tool
`POST /increment_counter {"count": n}` adds `n` (default 1) and answers `{"count": <new value>}`, and `/verify`
rewards 1.0 when the final count equals the row's `expected_count`, reporting it as `final_count` (-1 when the
session was never seeded or incremented) and forgetting the session's counter. Subclass it to add tools or
change the seeding (`initial_count`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.server_utils import SESSION_ID_KEY

__all__ = [
    "CounterResourcesServer",
    "CounterRunRequest",
    "CounterSeedSessionRequest",
    "CounterVerifyRequest",
    "CounterVerifyResponse",
    "IncrementCounterRequest",
]


class CounterSeedSessionRequest(BaseSeedSessionRequest):
    initial_count: int = 0


class IncrementCounterRequest(BaseModel):
    count: int = 1


class CounterRunRequest(BaseRunRequest):
    expected_count: int = 0


class CounterVerifyRequest(CounterRunRequest, BaseVerifyRequest):
    pass


class CounterVerifyResponse(CounterVerifyRequest, BaseVerifyResponse):
    final_count: int


class CounterResourcesServer(SimpleResourcesServer):
    """The counter server (see the module docstring); `counters` maps session ids to their counts."""

    config: BaseResourcesServerConfig
    counters: dict[str, int] = Field(default_factory=dict)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment_counter")(self.increment_counter)
        return app

    def initial_count(self, body: CounterSeedSessionRequest) -> int:
        """The count a session starts at."""
        return body.initial_count

    async def seed_session(self, request: Request, body: CounterSeedSessionRequest) -> BaseSeedSessionResponse:
        self.counters[request.session[SESSION_ID_KEY]] = self.initial_count(body)
        return BaseSeedSessionResponse()

    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> dict:
        session_id = request.session[SESSION_ID_KEY]
        self.counters[session_id] = self.counters.get(session_id, 0) + body.count
        return {"count": self.counters[session_id]}

    async def verify(self, request: Request, body: CounterVerifyRequest) -> CounterVerifyResponse:
        final = self.counters.pop(request.session[SESSION_ID_KEY], -1)
        return CounterVerifyResponse(**body.model_dump(), reward=float(final == body.expected_count), final_count=final)
