"""NeMo Gym v0.2 import path for the `NeMoGym*` schema models and `NeMoGymAsyncOpenAI`.

The code lives in `nemo_gym.api.schemas` and `nemo_gym.http.openai_client`.
"""

from nemo_gym.api.schemas import *  # noqa: F401,F403
from nemo_gym.http.openai_client import *  # noqa: F401,F403
from nemo_gym.api import schemas as _schemas
from nemo_gym.http import openai_client as _openai_client

__all__ = [*_schemas.__all__, *_openai_client.__all__]
