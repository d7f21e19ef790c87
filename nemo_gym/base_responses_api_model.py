"""NeMo Gym v0.2 import path for `SimpleResponsesAPIModel`; the code lives in `nemo_gym.servers.model_server`."""

from nemo_gym.servers.model_server import *  # noqa: F401,F403
from nemo_gym.servers import model_server as _model_server

__all__ = [*_model_server.__all__]
