"""non_executing_simple_agent: one model call per episode, its tool calls handed back unexecuted (NeMo Gym v0.5
`non_executing_simple_agent`).

For environments whose verifier scores the tool calls themselves (which function, which arguments) rather than
what running them would do: the model is called once and its answer is the episode, function calls and all; nothing
is sent to the resources server's tool routes and no argument is parsed, so malformed arguments reach `/verify` as
the model wrote them.

Everything else is simple_agent's (the subclass changes only the episode): `/run` seeds the session, runs the
episode, and sends the row plus `response` to `/verify`; session cookies of the resources server and the model
server travel from `/seed_session` to `/verify` and back on `/v1/responses`; `/aggregate_metrics` is the
resources server's.
"""

from __future__ import annotations

from pydantic import ConfigDict

from nemo_gym.base_resources_server import BaseVerifyRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig
from nemo_gym.config_types import ModelServerRef, ResourcesServerRef
from responses_api_agents.simple_agent.app import (
    SimpleAgent,
    SimpleAgentRunRequest,
    SimpleAgentVerifyResponse,
    input_items,
)

__all__ = [
    "ModelServerRef",
    "ResourcesServerRef",
    "NonExecutingSimpleAgentConfig",
    "NonExecutingSimpleAgentRunRequest",
    "NonExecutingSimpleAgentVerifyRequest",
    "NonExecutingSimpleAgentVerifyResponse",
    "NonExecutingSimpleAgent",
]


class NonExecutingSimpleAgentConfig(BaseResponsesAPIAgentConfig):
    """`resources_server` seeds and verifies (its tools are never called); `model_server` is the policy."""

    resources_server: ResourcesServerRef
    model_server: ModelServerRef


class NonExecutingSimpleAgentRunRequest(SimpleAgentRunRequest):
    """A `/run` body: `responses_create_params` plus every other field of the dataset row (all kept)."""


class NonExecutingSimpleAgentVerifyRequest(BaseVerifyRequest):
    """What `/verify` gets: the row (every field kept) plus `response`, the model's answer."""

    model_config = ConfigDict(extra="allow")


class NonExecutingSimpleAgentVerifyResponse(SimpleAgentVerifyResponse):
    """A `/run` answer: the verifier's fields plus the row's fields the verifier did not echo."""


class NonExecutingSimpleAgent(SimpleAgent):
    config: NonExecutingSimpleAgentConfig  # type: ignore[assignment]

    async def run_episode(self, params: dict, cookies: dict[str, str]) -> dict:
        """The model's one answer, unchanged: its function calls are the episode's result, not work to do."""
        return await self.call_model({**params, "input": input_items(params)}, cookies)


if __name__ == "__main__":
    NonExecutingSimpleAgent.run_webserver()
