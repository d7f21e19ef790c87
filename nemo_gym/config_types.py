"""NeMo Gym v0.2 import path for the pydantic config models (server refs, instance configs, datasets).

The code lives in `nemo_gym.config.types`.
"""

from nemo_gym.config.types import *  # noqa: F401,F403
from nemo_gym.config import types as _types

__all__ = [*_types.__all__]
