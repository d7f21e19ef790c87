"""frozen_lake through its real app (FastAPI's TestClient: sessions, routes, errors) and its game on gymnasium."""

from __future__ import annotations

import json

import gymnasium
import pytest
from fastapi.testclient import TestClient

from nemo_gym.testing.responses import function_call, make_response, message
from nemo_gym.testing.servers import example_rows, make_server
from resources_servers.frozen_lake.app import FrozenLakeResourcesServer
from resources_servers.frozen_lake.game import FrozenLakeGame, last_direction, shortest_path

ROWS = example_rows(__file__)


def new_client() -> tuple[FrozenLakeResourcesServer, TestClient]:
    server = make_server(FrozenLakeResourcesServer, name="frozen_lake", domain="games")
    return server, TestClient(server.build_app())


def move(*directions: str) -> dict:
    """A model response calling `move` once per direction."""
    calls = [function_call("move", {"direction": d}, call_id=f"call_{i}") for i, d in enumerate(directions)]
    return make_response(*calls).model_dump()


def text(words: str) -> dict:
    return make_response(message(words)).model_dump()


def step(client: TestClient, row: dict, response: dict) -> dict:
    answer = client.post("/step", json={**row, "response": response})
    assert answer.status_code == 200, answer.text
    return answer.json()


def outputs(stepped: dict) -> list[dict]:
    return [json.loads(o["output"]) for o in stepped["info"]["tool_outputs"]]


# ------------------------------------------------------------------------------------------------------------
# The game


def test_the_map_is_gymnasiums_and_the_same_seed_is_the_same_game():
    game = FrozenLakeGame(map_seed=1, map_size=4)
    assert game.desc == gymnasium.envs.toy_text.frozen_lake.generate_random_map(size=4, seed=1)
    assert game.desc == FrozenLakeGame(map_seed=1, map_size=4).desc
    assert game.desc != FrozenLakeGame(map_seed=2, map_size=4).desc
    assert game.board()[0].startswith("P ") and game.position == (0, 0)


@pytest.mark.parametrize("seed,size", [(row["map_seed"], row["map_size"]) for row in ROWS] + [(5, 6), (21, 8)])
def test_the_shortest_path_always_wins(seed, size):
    game = FrozenLakeGame(seed, size)
    path = shortest_path(game.desc)
    results = [game.move(d) for d in path]
    assert results[-1] == (1.0, True, False) and game.status == "won"
    assert all(r == (0.0, False, False) for r in results[:-1])


def test_a_hole_ends_the_game_with_nothing():
    game = FrozenLakeGame(7, 4)  # SHFF: the hole is right of the start
    assert game.desc[0][1] == "H"
    assert game.move("right") == (0.0, True, False)
    assert game.status == "lost"
    with pytest.raises(RuntimeError, match="over"):
        game.move("down")


def test_gymnasiums_time_limit_truncates():
    game = FrozenLakeGame(1, 4, max_moves=2)
    assert game.move("up") == (0.0, False, False)  # into the edge: no move, but it counts
    assert game.move("left") == (0.0, False, True)
    assert game.status == "out of moves" and game.moves == 2


def test_last_direction_reads_the_last_direction_word():
    assert last_direction("I go Left, no wait: DOWN.") == "down"
    assert last_direction("upward leftovers") is None  # whole words only
    assert last_direction("") is None


# ------------------------------------------------------------------------------------------------------------
# The routes


def test_a_winning_episode_through_the_routes():
    server, client = new_client()
    row = ROWS[0]
    reset = client.post("/reset", json=row)
    assert reset.status_code == 200, reset.text
    observation = reset.json()["observation"]
    assert "map seed 1." in observation and "P H F H" in observation and "Moves made: 0." in observation
    assert reset.json()["info"] == {"map": ["SHFH", "FFHF", "FFFF", "FFFG"]}

    path = shortest_path(reset.json()["info"]["map"])
    total = 0.0
    for i, direction in enumerate(path):
        stepped = step(client, row, move(direction))
        total += stepped["reward"]
        assert stepped["observation"] is None  # a tool call is answered by its tool output
        assert outputs(stepped)[0]["moved"] == direction and outputs(stepped)[0]["moves"] == i + 1
        assert stepped["terminated"] == (i == len(path) - 1)
    assert total == 1.0 and stepped["info"]["status"] == "won"
    assert outputs(stepped)[0]["result"] == "You reached the goal. You win!"
    assert server.session_state == {}  # closed after the terminating step

    # the session's game is over: a further step is a clear error
    after = client.post("/step", json={**row, "response": move("up")})
    assert after.status_code == 409, after.text
    assert "ended at step 6 (terminated)" in after.json()["detail"] and "POST /reset" in after.json()["detail"]


def test_several_moves_in_one_turn_are_played_in_order_until_the_game_ends():
    _, client = new_client()
    row = ROWS[2]  # seed 7: SHFF / FHFH / FFFF / FFFG
    client.post("/reset", json=row)
    stepped = step(client, row, move("down", "right", "up"))  # (1,0), then the hole at (1,1)
    assert (stepped["reward"], stepped["terminated"]) == (0.0, True)
    first, second, third = outputs(stepped)
    assert first["position"] == [1, 0] and second["result"] == "You fell into a hole. You lose."
    assert third == {"error": "the game is over (lost); this call was not played"}
    assert [o["call_id"] for o in stepped["info"]["tool_outputs"]] == ["call_0", "call_1", "call_2"]


def test_bad_calls_are_answered_and_change_nothing():
    _, client = new_client()
    row = ROWS[0]
    client.post("/reset", json=row)
    bad = make_response(
        function_call("jump", {}, call_id="a"),
        function_call("move", '{"direction": ', call_id="b"),
        function_call("move", {"direction": "north"}, call_id="c"),
        function_call("move", {"direction": " Down "}, call_id="d"),
    ).model_dump()
    stepped = step(client, row, bad)
    unknown, not_json, wrong, ok = outputs(stepped)
    assert "unknown tool 'jump'" in unknown["error"]
    assert "not valid JSON" in not_json["error"]
    assert "got 'north'" in wrong["error"]
    assert ok["moved"] == "down" and ok["moves"] == 1  # only the good call moved
    assert not stepped["terminated"] and stepped["info"]["moves"] == 1


def test_a_move_written_as_text_is_played_and_answered_with_an_observation():
    _, client = new_client()
    row = ROWS[3]  # 5x5, seed 3
    client.post("/reset", json=row)
    stepped = step(client, row, text("I think I should go down."))
    assert stepped["observation"].startswith("You moved down. The game goes on.\n")
    assert "Moves made: 1." in stepped["observation"] and stepped["info"]["tool_outputs"] == []
    idle = step(client, row, text("Hmm, let me think."))
    assert idle["observation"].startswith("No move was made. Call the move tool")
    assert idle["info"]["moves"] == 1 and not idle["terminated"]


def test_sessions_are_separate_games():
    server, client_a = new_client()
    client_b = TestClient(client_a.app)
    client_a.post("/reset", json=ROWS[0])
    client_b.post("/reset", json=ROWS[2])
    assert step(client_a, ROWS[0], move("down"))["info"]["position"] == [1, 0]
    assert step(client_b, ROWS[2], move("right"))["terminated"]  # seed 7's hole; game A goes on
    assert step(client_a, ROWS[0], move("down"))["info"]["position"] == [2, 0]
    assert len(server.session_state) == 1


def test_a_row_without_a_game_is_a_clear_error():
    _, client = new_client()
    row = {k: v for k, v in ROWS[0].items() if k != "map_seed"}
    answer = client.post("/reset", json=row)
    assert answer.status_code == 422
    assert "`map_seed`" in answer.json()["detail"] and "README" in answer.json()["detail"]
    answer = client.post("/reset", json={**ROWS[0], "map_size": 1})
    assert answer.status_code == 422 and "`map_size`" in answer.json()["detail"]
    answer = client.post("/reset", json={**ROWS[0], "map_seed": -1})
    assert answer.status_code == 422 and "`map_seed`" in answer.json()["detail"]


def test_only_the_gymnasium_routes_are_served():
    _, client = new_client()
    for path in ("/verify", "/seed_session"):
        assert client.post(path, json={}).status_code == 404
    assert client.get("/reverify_mode").status_code == 404


def test_the_example_rows():
    assert len(ROWS) == 5
    for row in ROWS:
        game = FrozenLakeGame(row["map_seed"], row["map_size"], row.get("max_moves"))
        assert len(shortest_path(game.desc)) <= (row.get("max_moves") or 100)
        assert [t["name"] for t in row["responses_create_params"]["tools"]] == ["move"]
