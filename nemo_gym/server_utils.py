"""NeMo Gym v0.2 import path for `BaseServer` / `SimpleServer`, `SESSION_ID_KEY` and the client helpers.

The code lives in `nemo_gym.servers.base`.
"""

from nemo_gym.servers.base import *  # noqa: F401,F403
from nemo_gym.servers import base as _base

__all__ = [*_base.__all__]
