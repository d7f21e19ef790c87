"""frozen_lake: gymnasium's FrozenLake-v1 (not slippery) as a multi-turn text game for gymnasium_agent.

Each row names a map by `map_seed` (and `map_size`, default 4; optional `max_moves`, gymnasium's time limit).
`/reset` builds the game (`game.py`) and shows the map. The model moves with the `move` tool
(`{"direction": "left" | "down" | "right" | "up"}`, several calls in one turn are played in order), or by writing
a direction: then the last of those words in its text is the move. The reward is gymnasium's: 1 for reaching the
goal, 0 for a hole or running out of moves; the episode ends there. A turn without a move changes nothing and
says how to move.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from fastapi import HTTPException
from pydantic import BaseModel, Field, ValidationError

from nemo_gym.base_resources_server import BaseResourcesServerConfig
from nemo_gym.openai_utils import NeMoGymResponse
from resources_servers.frozen_lake.game import DIRECTIONS, FrozenLakeGame, last_direction
from resources_servers.gymnasium import GymnasiumServer, extract_text, tool_output

__all__ = ["FrozenLakeConfig", "FrozenLakeTask", "FrozenLakeResourcesServer"]

MOVE_TOOL = "move"
_HOW_TO_MOVE = "Call the move tool with direction left, down, right or up (or write one of those words)."


class FrozenLakeConfig(BaseResourcesServerConfig):
    pass


class FrozenLakeTask(BaseModel):
    """The row fields that pick the game."""

    map_seed: int = Field(ge=0, description="seed of gymnasium's generate_random_map: the same seed is the same map")
    map_size: int = Field(default=4, ge=2, le=12, description="the map is map_size x map_size")
    max_moves: Optional[int] = Field(default=None, ge=1, description="gymnasium's time limit (default: its own)")


class FrozenLakeResourcesServer(GymnasiumServer):
    config: FrozenLakeConfig

    async def reset(self, metadata: dict[str, Any], session_id: str) -> tuple[Optional[str], dict[str, Any]]:
        task = self._task(metadata)
        game = FrozenLakeGame(task.map_seed, task.map_size, task.max_moves)
        await self.close_session(session_id)  # a second reset in one session starts over
        self.session_state[session_id] = game
        return game.describe(), {"map": game.desc}

    async def step(
        self, action: NeMoGymResponse, metadata: dict[str, Any], session_id: str
    ) -> tuple[Optional[str], float, bool, bool, dict[str, Any]]:
        game = self.session_state[session_id]  # GymnasiumServer answers a step without a live game with a 4xx
        calls = [item for item in action.output if getattr(item, "type", None) == "function_call"]
        reward, terminated, truncated = 0.0, False, False
        outputs: list[dict[str, str]] = []
        observation: Optional[str] = None
        if calls:
            for call in calls:
                result, played = self._play_call(game, call.name, call.arguments)
                if played is not None:
                    reward += played[0]
                    terminated, truncated = played[1], played[2]
                outputs.append(tool_output(call, result))
        else:
            direction = last_direction(extract_text(action))
            if direction is None:
                observation = f"No move was made. {_HOW_TO_MOVE}\n{game.describe()}"
            else:
                reward, terminated, truncated = game.move(direction)
                observation = f"You moved {direction}. {game.outcome()}\n{game.describe()}"
        info = {"tool_outputs": outputs, "position": list(game.position), "moves": game.moves, "status": game.status}
        return observation, reward, terminated, truncated, info

    async def close_session(self, session_id: str) -> None:
        game = self.session_state.get(session_id)
        if game is not None:
            game.close()
        await super().close_session(session_id)

    def _play_call(
        self, game: FrozenLakeGame, name: str, arguments: str
    ) -> tuple[dict[str, Any], Optional[tuple[float, bool, bool]]]:
        """One function call: (what the model reads, gymnasium's (reward, terminated, truncated) or None when the
        call was not a move that could be played)."""
        if game.over:
            return {"error": f"the game is over ({game.status}); this call was not played"}, None
        if name != MOVE_TOOL:
            return {"error": f"unknown tool {name!r}: the only tool is {MOVE_TOOL!r}. {_HOW_TO_MOVE}"}, None
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return {"error": f"the arguments are not valid JSON ({exc.msg}). {_HOW_TO_MOVE}"}, None
        direction = args.get("direction") if isinstance(args, dict) else None
        if not isinstance(direction, str) or direction.strip().lower() not in DIRECTIONS:
            return {"error": f"direction must be one of left, down, right, up; got {direction!r}"}, None
        direction = direction.strip().lower()
        played = game.move(direction)
        result = {
            "moved": direction,
            "board": game.board(),
            "position": list(game.position),
            "moves": game.moves,
            "result": game.outcome(),
        }
        return result, played

    @staticmethod
    def _task(metadata: dict[str, Any]) -> FrozenLakeTask:
        try:
            return FrozenLakeTask.model_validate(metadata)
        except ValidationError as exc:
            problems = "; ".join(
                f"`{'.'.join(str(p) for p in error['loc'])}`: {error['msg']}" for error in exc.errors()
            )
            raise HTTPException(
                422,
                f"frozen_lake: the row does not name a game ({problems}). A row needs `map_seed` (a whole number "
                ">= 0) and may set `map_size` (2-12, default 4) and `max_moves` (>= 1); see "
                "resources_servers/frozen_lake/README.md.",
            ) from None


if __name__ == "__main__":
    FrozenLakeResourcesServer.run_webserver()
