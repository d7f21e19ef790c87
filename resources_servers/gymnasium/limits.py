"""What a gymnasium server lets one client take of it: the output items of one action, the size of one answer,
how long a game may sit unplayed and how many games may be live at once.

Why: an environment's `step` does work per item of the model's response and answers per item, so one action of
200,000 moves held frozen_lake's event loop for 5.4 s and answered 98 MB; and a game that was reset and never
finished stayed in memory for ever (3,000 of them: 115 MB). Each bound is a key of the server's config block, read
once when the app is built; a value that is not a positive number stops the server at start with the key named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nemo_gym.config.values import byte_count, seconds
from nemo_gym.errors import NeMoGymConfigError

__all__ = [
    "EnvLimits",
    "MAX_STEP_OUTPUT_ITEMS_KEY",
    "MAX_ENV_ANSWER_BYTES_KEY",
    "GAME_IDLE_TIMEOUT_KEY",
    "MAX_LIVE_GAMES_KEY",
]

MAX_STEP_OUTPUT_ITEMS_KEY = "max_step_output_items"
MAX_ENV_ANSWER_BYTES_KEY = "max_env_answer_bytes"
GAME_IDLE_TIMEOUT_KEY = "game_idle_timeout_s"
MAX_LIVE_GAMES_KEY = "max_live_games"

# A model turn is a few items (reasoning, a message, some function calls); 256 leaves room for parallel tool calls
# and bounds one step's work to milliseconds.
DEFAULT_MAX_STEP_OUTPUT_ITEMS = 256
# Text observations are kilobytes; an image as base64 a few MB.
DEFAULT_MAX_ENV_ANSWER_BYTES = 8 * 1024 * 1024
# Between two steps of one game the agent waits for one model call; an hour is far longer than any of those.
DEFAULT_GAME_IDLE_TIMEOUT_S = 3600.0
# Above NeMo RL's largest usual batch in flight (512 prompts x 32 generations = 16,384) on one server process.
DEFAULT_MAX_LIVE_GAMES = 20_000


@dataclass(frozen=True)
class EnvLimits:
    max_step_output_items: int = DEFAULT_MAX_STEP_OUTPUT_ITEMS
    max_env_answer_bytes: int = DEFAULT_MAX_ENV_ANSWER_BYTES
    game_idle_timeout_s: float = DEFAULT_GAME_IDLE_TIMEOUT_S
    max_live_games: int = DEFAULT_MAX_LIVE_GAMES

    @classmethod
    def from_config(cls, config: Any) -> "EnvLimits":
        """The limits of a server's config block (its pydantic config model: the keys are extra fields, or fields a
        subclass declares); absent or null keys take the defaults."""
        keys = (MAX_STEP_OUTPUT_ITEMS_KEY, MAX_ENV_ANSWER_BYTES_KEY, GAME_IDLE_TIMEOUT_KEY, MAX_LIVE_GAMES_KEY)
        block = {key: getattr(config, key, None) for key in keys}
        return cls(
            max_step_output_items=_count(
                block, MAX_STEP_OUTPUT_ITEMS_KEY, DEFAULT_MAX_STEP_OUTPUT_ITEMS, "output items of one /step's response"
            ),
            max_env_answer_bytes=byte_count(
                block, MAX_ENV_ANSWER_BYTES_KEY, DEFAULT_MAX_ENV_ANSWER_BYTES, limits="one /reset or /step answer"
            ),
            game_idle_timeout_s=seconds(
                block, GAME_IDLE_TIMEOUT_KEY, DEFAULT_GAME_IDLE_TIMEOUT_S, limits="how long a game may go unplayed"
            ),
            max_live_games=_count(block, MAX_LIVE_GAMES_KEY, DEFAULT_MAX_LIVE_GAMES, "games held at once"),
        )


def _count(block: dict, key: str, default: int, limits: str) -> int:
    value = block.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if type(value) is not int or value < 1:
        raise NeMoGymConfigError(
            f"`{key}` must be a positive whole number ({limits}), got {block.get(key)!r}. "
            f"Remove it for the default ({default})."
        )
    return value
