"""NeMo Gym v0.5 import path for judge calls and their failure marker.

The code lives in `nemo_gym.verifiers.judge`.
"""

from nemo_gym.verifiers.judge import *  # noqa: F401,F403
from nemo_gym.verifiers import judge as _judge

__all__ = [*_judge.__all__]
