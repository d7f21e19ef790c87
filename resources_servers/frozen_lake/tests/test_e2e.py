"""The 5 examples through a real stack (ng_run + ng_collect_rollouts), gymnasium_agent and a scripted fake LLM.

Row 0 is won one move per turn, row 1 two moves per turn, row 3 with moves written as text; row 2 walks into a
hole; row 4 bumps into the top edge until gymnasium's time limit (`max_moves: 10`) ends the game. The rewards are
the game's: gymnasium's FrozenLake pays 1 at the goal and nothing else.
"""

from nemo_gym.testing.e2e import collect_examples_e2e
from nemo_gym.testing.servers import example_rows

from resources_servers.frozen_lake.tests.player import stubborn_player, text_player, tool_player, winning_moves

ROWS = example_rows(__file__)
SCRIPT = [
    *tool_player(ROWS[0], winning_moves(ROWS[0])),
    *tool_player(ROWS[1], winning_moves(ROWS[1]), per_turn=2),
    *tool_player(ROWS[2], ["right"]),
    *text_player(ROWS[3], winning_moves(ROWS[3])),
    *stubborn_player(ROWS[4], "up"),
]


def test_examples_end_to_end(tmp_path):
    rows = collect_examples_e2e("frozen_lake", tmp_path, script=SCRIPT, agent_name="frozen_lake_gymnasium_agent")
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert [r["info"]["status"] for r in rows] == ["won", "won", "lost", "won", "out of moves"]
    assert [(r["terminated"], r["truncated"]) for r in rows] == [(True, False)] * 4 + [(False, True)]
    assert [r["info"]["moves"] for r in rows] == [6, 6, 1, 8, 10]
    assert [r["map_seed"] for r in rows] == [row["map_seed"] for row in ROWS]  # row fields kept

    # Row 0: the reset observation, then a call and its tool output per turn; the winning move ends the episode.
    output = rows[0]["response"]["output"]
    assert output[0]["role"] == "user" and "map seed 1." in output[0]["content"]
    assert [o["type"] for o in output[1:]] == ["function_call", "function_call_output"] * 5 + ["function_call"]
    # Row 3: the moves went back and forth as messages.
    assert [o["role"] for o in rows[3]["response"]["output"]] == ["user"] + ["assistant", "user"] * 7 + ["assistant"]
