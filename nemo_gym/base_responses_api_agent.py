"""NeMo Gym v0.2 import path for `SimpleResponsesAPIAgent` and its request/response models (and, as v0.5 agents
expect, fastapi's `Body`, `FastAPI` and `Request`).

The code lives in `nemo_gym.servers.agent_server`.
"""

from fastapi import Body, FastAPI, Request  # noqa: F401  (v0.5 agents import `Body` from here)

from nemo_gym.servers.agent_server import *  # noqa: F401,F403
from nemo_gym.servers import agent_server as _agent_server

__all__ = [*_agent_server.__all__]
