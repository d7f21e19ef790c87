"""Gymnasium's FrozenLake-v1 (not slippery) as a text game: the map drawn as letters, moves read from words.

The dynamics and the reward are gymnasium's own (`gymnasium.make("FrozenLake-v1", is_slippery=False)`): a move
goes one square left, down, right or up (into the edge: no move), stepping on a hole `H` ends the episode with
reward 0, reaching the goal `G` ends it with reward 1, and gymnasium's time limit truncates it. The map comes from
gymnasium's `generate_random_map(size, seed=map_seed)`, which only makes maps with a path from `S` to `G`, so the
same seed is always the same game and a player who follows `shortest_path` always wins.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Optional

import gymnasium
from gymnasium.envs.toy_text.frozen_lake import generate_random_map

__all__ = ["DIRECTIONS", "FrozenLakeGame", "last_direction", "shortest_path"]

# Gymnasium's FrozenLake action numbers.
DIRECTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}
_OFFSETS = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_DIRECTION_WORD = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)

PLAYING = "playing"
WON = "won"
LOST = "lost"
OUT_OF_MOVES = "out of moves"


def shortest_path(desc: list[str]) -> list[str]:
    """The fewest moves from `S` to `G` avoiding holes (breadth-first search): what a correct player plays."""
    rows, cols = len(desc), len(desc[0])
    start = next((r, c) for r in range(rows) for c in range(cols) if desc[r][c] == "S")
    previous: dict[tuple[int, int], Optional[tuple[tuple[int, int], str]]] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if desc[r][c] == "G":
            path: list[str] = []
            at = (r, c)
            while previous[at] is not None:
                at, move = previous[at]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in _OFFSETS.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and (nr, nc) not in previous and desc[nr][nc] != "H":
                previous[(nr, nc)] = ((r, c), move)
                queue.append((nr, nc))
    raise ValueError(f"no path from S to G on this map: {desc}")


def last_direction(text: str) -> Optional[str]:
    """The last of the words left / down / right / up in `text` (any case), or None."""
    found = _DIRECTION_WORD.findall(text or "")
    return found[-1].lower() if found else None


class FrozenLakeGame:
    """One episode: a gymnasium FrozenLake env, reset with the map seed, plus what the text rendering needs."""

    def __init__(self, map_seed: int, map_size: int = 4, max_moves: Optional[int] = None):
        self.map_seed = map_seed
        self.desc = generate_random_map(size=map_size, seed=map_seed)
        options: dict[str, Any] = {} if max_moves is None else {"max_episode_steps": max_moves}
        self.env = gymnasium.make("FrozenLake-v1", desc=self.desc, is_slippery=False, **options)
        self.state, _ = self.env.reset(seed=map_seed)
        self.moves = 0
        self.status = PLAYING

    @property
    def size(self) -> int:
        return len(self.desc)

    @property
    def position(self) -> tuple[int, int]:
        return divmod(int(self.state), self.size)

    @property
    def over(self) -> bool:
        return self.status != PLAYING

    def move(self, direction: str) -> tuple[float, bool, bool]:
        """Play one move through gymnasium; returns (reward, terminated, truncated)."""
        if self.over:
            raise RuntimeError("the game is over")
        self.state, reward, terminated, truncated, _ = self.env.step(DIRECTIONS[direction])
        self.moves += 1
        if terminated:
            self.status = WON if reward > 0 else LOST
        elif truncated:
            self.status = OUT_OF_MOVES
        return float(reward), bool(terminated), bool(truncated)

    def board(self) -> list[str]:
        """The map, one string per row, letters separated by spaces, the player drawn as `P`."""
        row, col = self.position
        lines = []
        for r, line in enumerate(self.desc):
            cells = list(line)
            if r == row:
                cells[col] = "P"
            lines.append(" ".join(cells))
        return lines

    def where(self) -> str:
        row, col = self.position
        return f"You are at row {row}, column {col}. Moves made: {self.moves}."

    def outcome(self) -> str:
        return {
            PLAYING: "The game goes on.",
            WON: "You reached the goal. You win!",
            LOST: "You fell into a hole. You lose.",
            OUT_OF_MOVES: "You are out of moves. You lose.",
        }[self.status]

    def describe(self) -> str:
        """The whole state as text (the first observation, and the answer to a move written as text)."""
        size = self.size
        return "\n".join(
            [
                f"Frozen lake {size}x{size}, map seed {self.map_seed}. P is you, S the start, F frozen ice (safe), "
                "H a hole, G the goal. Row 0 is the top row, column 0 the left column.",
                *self.board(),
                self.where(),
            ]
        )

    def close(self) -> None:
        self.env.close()
