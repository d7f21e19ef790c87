"""NeMo Gym v0.2 import path for building and reading the global config.

The code lives in `nemo_gym.config.global_config`.
"""

from nemo_gym.config.global_config import *  # noqa: F401,F403
from nemo_gym.config import global_config as _global_config

from nemo_gym.rollouts.failure_routing import ATTEMPT_INDEX_KEY_NAME  # noqa: E402

SKILLS_REF_KEY_NAME = "skills_ref"  # v0.5: the run-level skills a row carries to its agent

__all__ = [*_global_config.__all__, "ATTEMPT_INDEX_KEY_NAME", "SKILLS_REF_KEY_NAME"]
