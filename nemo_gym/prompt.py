"""NeMo Gym v0.5 import path for prompt templates (`PromptConfig`, `load_prompt_config`, `fill_prompt`, ...).

The code lives in `nemo_gym.rollouts.prompts`.
"""

from nemo_gym.rollouts.prompts import *  # noqa: F401,F403
from nemo_gym.rollouts import prompts as _prompts

__all__ = [*_prompts.__all__]
