"""NeMo Gym v0.2 import path for `ng_collect_rollouts`; the code lives in `nemo_gym.rollouts.collection`."""

from nemo_gym.rollouts.collection import *  # noqa: F401,F403
from nemo_gym.rollouts import collection as _collection

__all__ = [*_collection.__all__]
