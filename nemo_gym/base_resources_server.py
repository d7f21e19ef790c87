"""NeMo Gym v0.2 import path for `SimpleResourcesServer` and its request/response models.

The code lives in `nemo_gym.servers.resources_server`.
"""

from nemo_gym.servers.resources_server import *  # noqa: F401,F403
from nemo_gym.servers import resources_server as _resources_server

__all__ = [*_resources_server.__all__]
