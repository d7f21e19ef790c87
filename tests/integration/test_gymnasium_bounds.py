"""A gymnasium server under a careless or hostile client (issue 37, item 7), through real processes: `ng_run` with
two frozen_lake servers, each with limits of its own in its config block, called over HTTP.

1. Client mistakes are 4xx with a reason, never 500: a `/step` before `/reset`, after the episode ended, after a
   `/reset` that failed (409); a row without its seed or with a negative one (422).
2. The bounds: a response of 200,000 moves is refused with a small 413 naming `max_step_output_items` and the game
   is as it was; an answer over `max_env_answer_bytes` is a 413 that ends the episode.
3. Abandoned games do not pile up: over `max_live_games` the longest unplayed is dropped (its next step is a 410
   naming the key) and 3,000 abandoned games leave the server's memory bounded; a game unplayed for
   `game_idle_timeout_s` is dropped without further traffic and its step is a 410 naming that key.
"""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.testing.responses import function_call, make_response
from nemo_gym.testing.servers import example_rows
from nemo_gym.testing.stack import NgRunStack, free_port, server_instances

ROWS = example_rows(PARENT_DIR / "resources_servers" / "frozen_lake" / "tests" / "test_e2e.py")
ROW = ROWS[0]  # map seed 1: SHFH / FFHF / FFFF / FFFG
CAPPED, IDLE = "lake_capped", "lake_idle"
MAX_LIVE_GAMES = 100
WAIT_S = 120  # an upper bound for the server to drop an idle game, never a measured time
CONFIG = f"""
{CAPPED}:
  resources_servers:
    frozen_lake:
      entrypoint: app.py
      domain: games
      max_live_games: {MAX_LIVE_GAMES}
      max_env_answer_bytes: 20000
{IDLE}:
  resources_servers:
    frozen_lake:
      entrypoint: app.py
      domain: games
      game_idle_timeout_s: 1
"""


def move(*directions: str) -> dict:
    calls = [function_call("move", {"direction": d}, call_id=f"call_{i}") for i, d in enumerate(directions)]
    return make_response(*calls).model_dump(mode="json")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{server id: (url, pid)} of the two frozen_lake servers of one `ng_run`."""
    config = tmp_path_factory.mktemp("gymnasium_bounds") / "lakes.yaml"
    config.write_text(CONFIG)
    head_port = free_port()
    stack = NgRunStack([f"+config_paths=[{config}]", f"+head_server.port={head_port}"], cwd=PARENT_DIR)
    try:
        stack.wait_for("All 2 / 2 servers ready!", timeout=180)
        yield {i["process_name"]: (i["url"], i["pid"]) for i in server_instances(head_port)}
    finally:
        assert stack.stop(timeout=60) == 0, stack.tail(80)


def client(servers, name: str) -> httpx.Client:
    """A client of one rollout: its cookie jar is its session."""
    return httpx.Client(base_url=servers[name][0], timeout=120)


def detail(answer: httpx.Response) -> str:
    return answer.json()["detail"]


# ------------------------------------------------------------------------------------------------------------
# 1. Client mistakes


def test_a_step_out_of_order_is_409_with_what_to_do(servers):
    with client(servers, CAPPED) as game:
        before = game.post("/step", json={**ROW, "response": move("down")})
        assert before.status_code == 409, before.text
        assert "this session has no episode" in detail(before) and "POST /reset" in detail(before)

        assert game.post("/reset", json=ROW).status_code == 200
        assert game.post("/step", json={**ROW, "response": move("right")}).json()["terminated"]  # the hole
        after = game.post("/step", json={**ROW, "response": move("down")})
        assert after.status_code == 409, after.text
        assert "ended at step 1 (terminated)" in detail(after) and "POST /reset" in detail(after)

        assert game.post("/reset", json=ROW).status_code == 200  # a new episode in the same session
        assert game.post("/step", json={**ROW, "response": move("down")}).json()["info"]["position"] == [1, 0]


@pytest.mark.parametrize(
    "row, field",
    [
        ({k: v for k, v in ROW.items() if k != "map_seed"}, "map_seed"),  # a row without its seed
        ({**ROW, "map_seed": -1}, "map_seed"),
        ({**ROW, "map_size": 40}, "map_size"),
    ],
    ids=["no seed", "negative seed", "map too large"],
)
def test_a_bad_row_is_422_naming_the_field_and_leaves_no_game(servers, row, field):
    with client(servers, CAPPED) as game:
        assert game.post("/reset", json=ROW).status_code == 200
        answer = game.post("/reset", json=row)
        assert answer.status_code == 422, answer.text
        assert f"`{field}`" in detail(answer) and "README" in detail(answer)
        step = game.post("/step", json={**ROW, "response": move("down")})
        assert step.status_code == 409 and "no episode" in detail(step)  # the failed reset left no game


# ------------------------------------------------------------------------------------------------------------
# 2. The bounds


def test_an_action_of_200000_moves_is_refused_with_a_small_413_and_the_game_goes_on(servers):
    huge = move(*["down"] * 200_000)
    with client(servers, CAPPED) as game:
        assert game.post("/reset", json=ROW).status_code == 200
        started = time.monotonic()
        answer = game.post("/step", json={**ROW, "response": huge})
        print(f"200,000 moves refused in {time.monotonic() - started:.2f} s (request body included)")
        assert answer.status_code == 413, answer.text[:500]
        assert len(answer.content) < 1000
        assert "200000 output items" in detail(answer) and "`max_step_output_items`" in detail(answer)
        played = game.post("/step", json={**ROW, "response": move("down")})
        assert played.status_code == 200 and played.json()["info"]["moves"] == 1  # nothing of the big one was played


def test_an_answer_over_max_env_answer_bytes_is_413_and_ends_the_episode(servers):
    row = {**ROW, "max_moves": 1000}
    with client(servers, CAPPED) as game:
        assert game.post("/reset", json=row).status_code == 200
        ok = game.post("/step", json={**row, "response": move(*["up"] * 10)})  # into the top edge: no move
        assert ok.status_code == 200 and len(ok.content) < 20_000
        answer = game.post("/step", json={**row, "response": move(*["up"] * 200)})
        assert answer.status_code == 413, answer.text[:500]
        assert "`max_env_answer_bytes`" in detail(answer) and "the episode was ended" in detail(answer)
        after = game.post("/step", json={**row, "response": move("down")})
        assert after.status_code == 409 and "max_env_answer_bytes" in detail(after)


# ------------------------------------------------------------------------------------------------------------
# 3. Abandoned games


def rss_mb(servers, name: str) -> float:
    return psutil.Process(servers[name][1]).memory_info().rss / 2**20


def abandon(servers, name: str, count: int) -> list[str]:
    """`count` games reset and never played, each in a session of its own; returns their session cookies."""
    cookies = []
    with client(servers, name) as http:
        for _ in range(count):
            http.cookies.clear()
            answer = http.post("/reset", json=ROW)
            assert answer.status_code == 200, answer.text
            cookies.append(dict(answer.cookies))
    return cookies


def test_over_max_live_games_the_longest_unplayed_is_dropped_and_memory_stays_bounded(servers):
    abandon(servers, CAPPED, 200)  # the server's memory warmed up by as many games as it may hold, and more
    before = rss_mb(servers, CAPPED)
    cookies = abandon(servers, CAPPED, 3000)
    grown = rss_mb(servers, CAPPED) - before
    print(f"RSS grew {grown:.1f} MB over 3,000 abandoned games (max_live_games={MAX_LIVE_GAMES})")
    assert grown < 20, f"3,000 abandoned games grew the server by {grown:.1f} MB (unbounded: about 60 MB)"

    def step(cookies: dict) -> httpx.Response:
        return httpx.post(servers[CAPPED][0] + "/step", json={**ROW, "response": move("down")}, cookies=cookies)

    dropped = step(cookies[-MAX_LIVE_GAMES - 1])  # the last one dropped to make room
    assert dropped.status_code == 410, dropped.text
    assert f"at most {MAX_LIVE_GAMES} games (max_live_games)" in detail(dropped) and "POST /reset" in detail(dropped)
    assert step(cookies[0]).status_code in (409, 410)  # why is remembered for as many sessions as games are held
    kept = step(cookies[-MAX_LIVE_GAMES])
    assert kept.status_code == 200 and kept.json()["info"]["position"] == [1, 0]


def test_a_game_unplayed_for_game_idle_timeout_s_is_dropped(servers):
    url = servers[IDLE][0]
    played, left = abandon(servers, IDLE, 2)
    step = {**ROW, "response": move("up")}  # into the top edge: the game goes on
    assert httpx.post(url + "/step", json=step, cookies=played, timeout=60).status_code == 200
    for _ in range(4):  # played every half timeout: kept
        time.sleep(0.5)
        assert httpx.post(url + "/step", json=step, cookies=played, timeout=60).status_code == 200
    answer = httpx.post(url + "/step", json=step, cookies=left, timeout=60)  # 2 s and more unplayed
    assert answer.status_code == 410, answer.text
    assert "unplayed for 1 s (game_idle_timeout_s)" in detail(answer) and "POST /reset" in detail(answer)


def test_3000_abandoned_games_are_dropped_when_idle_and_their_memory_is_reused(servers):
    abandon(servers, IDLE, 1000)  # warm-up: the memory a live set of games takes at this pace
    time.sleep(2)  # every game unplayed for over game_idle_timeout_s: dropped by the server on its own
    before = rss_mb(servers, IDLE)
    cookies = abandon(servers, IDLE, 3000)
    grown = rss_mb(servers, IDLE) - before
    print(f"RSS grew {grown:.1f} MB over 3,000 abandoned games (game_idle_timeout_s=1)")
    assert grown < 20, f"3,000 abandoned games grew the server by {grown:.1f} MB (unbounded: about 60 MB)"
    time.sleep(1.5)
    last = httpx.post(servers[IDLE][0] + "/step", json={**ROW, "response": move("down")}, cookies=cookies[-1])
    assert last.status_code == 410 and "game_idle_timeout_s" in detail(last)
