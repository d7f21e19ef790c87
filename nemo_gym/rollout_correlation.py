"""NeMo Gym v0.5 import path for the rollout id carried as a `/ng-rollout/<id>` path prefix.

The code lives in `nemo_gym.servers.rollout_context`.
"""

from nemo_gym.servers.rollout_context import *  # noqa: F401,F403
from nemo_gym.servers import rollout_context as _rollout_context

__all__ = [*_rollout_context.__all__]
