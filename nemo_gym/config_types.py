"""NeMo Gym v0.2/v0.5 import path for the pydantic config models (server refs, instance configs, datasets) and,
as in v0.5, for the user-facing config errors (`ConfigError` and its subclasses).

The models live in `nemo_gym.config.types`, the errors in `nemo_gym.errors`.
"""

from nemo_gym.config.types import *  # noqa: F401,F403
from nemo_gym.config import types as _types
from nemo_gym.errors import (
    AlmostServerError,
    ConfigError,
    ConfigInterpolationError,
    ConfigMissingValuesError,
    ConfigPathNotFoundError,
    InheritPathNotFoundError,
    MalformedConfigPathsError,
    NoServerInstancesError,
    ServerRefNotFoundError,
)

__all__ = [
    *_types.__all__,
    "ConfigError",
    "ConfigPathNotFoundError",
    "MalformedConfigPathsError",
    "NoServerInstancesError",
    "ConfigInterpolationError",
    "ServerRefNotFoundError",
    "AlmostServerError",
    "ConfigMissingValuesError",
    "InheritPathNotFoundError",
]
