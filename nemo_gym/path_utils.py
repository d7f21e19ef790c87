"""NeMo Gym v0.5 import path for where a collection's side files go (`failures_path_for`)."""

from pathlib import Path
from typing import Union

from nemo_gym.rollouts.collection import CollectionPaths

__all__ = ["failures_path_for"]


def failures_path_for(path: Union[str, Path]) -> Path:
    """`<stem>_failures.jsonl` beside a rollouts file."""
    return CollectionPaths(Path(path)).failures
