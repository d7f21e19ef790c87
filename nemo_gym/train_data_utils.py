"""NeMo Gym v0.2 import path for `ng_prepare_data`; the code lives in `nemo_gym.rollouts.data_prep`."""

from nemo_gym.rollouts.data_prep import *  # noqa: F401,F403
from nemo_gym.rollouts import data_prep as _data_prep

__all__ = [*_data_prep.__all__]
