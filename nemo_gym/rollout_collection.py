"""NeMo Gym v0.2/v0.5 import path for rollout collection; the code lives in `nemo_gym.rollouts.collection`
(and `collection_helper`, `failure_routing`, `aggregation`, `outcome`; v0.5's other names in `v05_collection`)."""

from nemo_gym.rollouts.collection import *  # noqa: F401,F403
from nemo_gym.rollouts import collection as _collection
from nemo_gym.config.global_config import AGENT_REF_KEY_NAME, RESPONSES_CREATE_PARAMS_KEY_NAME  # noqa: F401
from nemo_gym.rollouts.aggregation import RolloutAggregationConfig
from nemo_gym.rollouts.collection import SKILLS_REF_KEY_NAME  # noqa: F401
from nemo_gym.rollouts.collection_helper import RolloutCollectionHelper
from nemo_gym.rollouts.e2e import E2ERolloutCollectionConfig
from nemo_gym.rollouts.failure_routing import DEFAULT_MAX_ROLLOUT_ATTEMPTS as _DEFAULT_MAX_ROLLOUT_ATTEMPTS  # noqa: F401
from nemo_gym.rollouts.failure_routing import get_max_rollout_attempts as _get_max_rollout_attempts  # noqa: F401
from nemo_gym.rollouts.outcome import failures_path_for as _failures_path_for  # noqa: F401
from nemo_gym.rollouts.v05_collection import (
    RolloutAggregationHelper,
    SharedRolloutCollectionConfig,
    loads_jsonl_line,
    moved_to_cli as _moved_to_cli,
)

__all__ = [
    *_collection.__all__,
    "RolloutCollectionHelper",
    "RolloutAggregationConfig",
    "RolloutAggregationHelper",
    "E2ERolloutCollectionConfig",
    "SharedRolloutCollectionConfig",
    "loads_jsonl_line",
]


def __getattr__(name: str):
    """v0.5's entry points that moved to the CLI (`collect_rollouts`, `aggregate_rollouts`), deprecated there too."""
    if name in ("collect_rollouts", "aggregate_rollouts"):
        return _moved_to_cli(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
