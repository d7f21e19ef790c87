"""NeMo Gym v0.2 import path for reward profiling; the code lives in `nemo_gym.rollouts.reward_profile`."""

from nemo_gym.rollouts.reward_profile import *  # noqa: F401,F403
from nemo_gym.rollouts import reward_profile as _reward_profile

__all__ = [*_reward_profile.__all__]
