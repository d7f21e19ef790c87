"""NeMo Gym v0.2 import path for building and reading the global config.

The code lives in `nemo_gym.config.global_config`.
"""

from nemo_gym.config.global_config import *  # noqa: F401,F403
from nemo_gym.config import global_config as _global_config

__all__ = [*_global_config.__all__]
