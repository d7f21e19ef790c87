"""NeMo Gym v0.2/v0.5 import path for rollout collection; the code lives in `nemo_gym.rollouts.collection`
(and `collection_helper`, `failure_routing`)."""

from nemo_gym.rollouts.collection import *  # noqa: F401,F403
from nemo_gym.rollouts import collection as _collection
from nemo_gym.rollouts.aggregation import RolloutAggregationConfig
from nemo_gym.rollouts.collection_helper import RolloutCollectionHelper
from nemo_gym.rollouts.e2e import E2ERolloutCollectionConfig
from nemo_gym.rollouts.failure_routing import get_max_rollout_attempts as _get_max_rollout_attempts  # noqa: F401

__all__ = [*_collection.__all__, "RolloutCollectionHelper", "RolloutAggregationConfig", "E2ERolloutCollectionConfig"]
