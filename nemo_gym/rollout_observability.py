"""NeMo Gym v0.5 import path for agent observations (`ng_agent_observations`) and their join with captured calls.

The code lives in `nemo_gym.rollouts.agent_observations`.
"""

from nemo_gym.rollouts.agent_observations import *  # noqa: F401,F403
from nemo_gym.rollouts import agent_observations as _agent_observations

__all__ = [*_agent_observations.__all__]
