"""The live-game registry of gymnasium servers (`resources_servers/gymnasium/episodes.py`) and the limits read from a
server's config block (`limits.py`), on a clock the test moves."""

from __future__ import annotations

import pytest
from fastapi import HTTPException

from nemo_gym.base_resources_server import BaseResourcesServerConfig
from nemo_gym.errors import NeMoGymConfigError
from resources_servers.gymnasium.episodes import GONE_STATUS, NO_EPISODE_STATUS, Episodes
from resources_servers.gymnasium.limits import EnvLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def episodes(**limits) -> tuple[Episodes, Clock]:
    clock = Clock()
    return Episodes(EnvLimits(**limits), clock=clock), clock


def play(registry: Episodes, session: str, *, ended=None) -> None:
    registry.begin_step(session)
    registry.finish(session, ended=ended)


def refusal(registry: Episodes, session: str) -> HTTPException:
    with pytest.raises(HTTPException) as caught:
        registry.begin_step(session)
    return caught.value


def test_a_step_without_a_game_says_why():
    registry, _ = episodes()
    assert refusal(registry, "s").status_code == NO_EPISODE_STATUS
    assert registry.begin_reset("s") == []
    registry.finish("s")
    play(registry, "s")
    play(registry, "s", ended="at step 2 (terminated)")
    gone = refusal(registry, "s")
    assert gone.status_code == NO_EPISODE_STATUS and "ended at step 2 (terminated)" in gone.detail
    registry.begin_reset("s")  # a new episode in the same session
    registry.finish("s")
    play(registry, "s")
    assert len(registry) == 1


def test_idle_games_are_dropped_but_not_while_played_and_not_when_played_since():
    registry, clock = episodes(game_idle_timeout_s=10)
    for session in ("a", "b", "c"):
        registry.begin_reset(session)
        registry.finish(session)
    clock.now += 6
    play(registry, "b")  # played since
    registry.begin_step("c")  # being played
    clock.now += 6
    assert registry.idle() == ["a"]
    registry.finish("c")
    assert registry.idle() == []
    clock.now += 10
    assert sorted(registry.idle()) == ["b", "c"] and len(registry) == 0
    gone = refusal(registry, "a")
    assert gone.status_code == GONE_STATUS and "unplayed for 10 s (game_idle_timeout_s)" in gone.detail


def test_over_max_live_games_the_longest_unplayed_goes_and_what_is_remembered_is_bounded():
    registry, clock = episodes(max_live_games=2)
    registry.begin_reset("a")
    registry.finish("a")
    clock.now += 1
    registry.begin_reset("b")
    registry.finish("b")
    clock.now += 1
    play(registry, "a")  # b is now the longest unplayed
    assert registry.begin_reset("c") == ["b"]
    registry.finish("c")
    assert refusal(registry, "b").status_code == GONE_STATUS
    registry.begin_step("a")  # a and c being played: nothing can go, the cap gives way to requests in flight
    registry.begin_step("c")
    assert registry.begin_reset("d") == [] and len(registry) == 3
    registry.finish("d")
    assert registry.begin_reset("e") == ["d"]  # the only one not being played
    registry.finish("e")
    registry.finish("a")
    registry.finish("c")
    assert registry.begin_reset("f") == ["e", "a"] and len(registry) == 2  # back within the cap
    assert refusal(registry, "b").status_code == NO_EPISODE_STATUS  # forgotten: only 2 reasons are kept


def test_a_failed_reset_leaves_no_game():
    registry, _ = episodes()
    registry.begin_reset("s")
    registry.forget("s")
    assert refusal(registry, "s").status_code == NO_EPISODE_STATUS and len(registry) == 0


def test_the_limits_come_from_the_server_block_and_bad_values_name_the_key():
    defaults = EnvLimits.from_config(BaseResourcesServerConfig(host="h", port=1, entrypoint="app.py", name="x"))
    assert defaults == EnvLimits()
    block = dict(host="h", port=1, entrypoint="app.py", name="x")
    set_ = EnvLimits.from_config(
        BaseResourcesServerConfig(**block, max_live_games="50", game_idle_timeout_s=2.5, max_step_output_items=8,
                                  max_env_answer_bytes=1000)  # fmt: skip
    )
    assert set_ == EnvLimits(max_step_output_items=8, max_env_answer_bytes=1000, game_idle_timeout_s=2.5,
                             max_live_games=50)  # fmt: skip
    for key, value in [("max_live_games", 0), ("max_step_output_items", -3), ("game_idle_timeout_s", "soon"),
                       ("max_env_answer_bytes", True), ("max_live_games", 2.5)]:  # fmt: skip
        with pytest.raises(NeMoGymConfigError, match=f"`{key}` must be a positive"):
            EnvLimits.from_config(BaseResourcesServerConfig(**block, **{key: value}))
