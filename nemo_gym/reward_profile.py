"""NeMo Gym import path for reward profiling (v0.2) and the metric helpers of v0.5 (`compute_pass_majority_metrics`,
`highest_k_metrics`, `/aggregate_metrics`, ...); the code lives in `nemo_gym.rollouts.reward_profile` and
`nemo_gym.rollouts.metrics`."""

from nemo_gym.rollouts.reward_profile import *  # noqa: F401,F403
from nemo_gym.rollouts.metrics import *  # noqa: F401,F403
from nemo_gym.rollouts import metrics as _metrics
from nemo_gym.rollouts import reward_profile as _reward_profile

__all__ = [*_reward_profile.__all__, *_metrics.__all__]
