"""Scripted players for the fake LLM (`nemo_gym.testing.fake_openai_server` rules), one game each.

A game is told apart by its map seed, which every frozen_lake observation names (`map seed 7.`). A tool player's
turn is told by how many tool results the conversation holds; a text player's by the `Moves made: k.` of the last
observation (its moves come back as user messages, not tool results).
"""

from __future__ import annotations

from nemo_gym.testing.script import rule, tool_call

from resources_servers.frozen_lake.game import FrozenLakeGame, shortest_path


def winning_moves(row: dict) -> list[str]:
    """What a correct player plays on this row's map."""
    return shortest_path(FrozenLakeGame(row["map_seed"], row.get("map_size", 4)).desc)


def _game(row: dict) -> str:
    return f"map seed {row['map_seed']}."


def tool_player(row: dict, moves: list[str], per_turn: int = 1) -> list[dict]:
    """Calls `move` for `moves`, `per_turn` calls in each turn."""
    turns = [moves[i : i + per_turn] for i in range(0, len(moves), per_turn)]
    return [
        rule(*(tool_call("move", {"direction": d}) for d in turn), name=f"{_game(row)} turn {k}",
             input_contains=_game(row), tool_outputs=k * per_turn)
        for k, turn in enumerate(turns)
    ]


def text_player(row: dict, moves: list[str]) -> list[dict]:
    """Writes each move as a sentence instead of calling the tool."""
    return [
        rule(f"Next I go {d}.", name=f"{_game(row)} text move {k}",
             input_contains=_game(row), last_user_contains=f"Moves made: {k}.")
        for k, d in enumerate(moves)
    ]


def stubborn_player(row: dict, direction: str) -> list[dict]:
    """Calls `move` with the same direction every turn."""
    return [rule(tool_call("move", {"direction": direction}), name=f"{_game(row)} always {direction}",
                 input_contains=_game(row))]
