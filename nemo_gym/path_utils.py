"""NeMo Gym v0.5 import path for where a collection's side files go (`failures_path_for`)."""

from nemo_gym.rollouts.outcome import failures_path_for

__all__ = ["failures_path_for"]
