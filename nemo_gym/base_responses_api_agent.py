"""NeMo Gym v0.2 import path for `SimpleResponsesAPIAgent` and its request/response models.

The code lives in `nemo_gym.servers.agent_server`.
"""

from nemo_gym.servers.agent_server import *  # noqa: F401,F403
from nemo_gym.servers import agent_server as _agent_server

__all__ = [*_agent_server.__all__]
