"""Which sessions of a gymnasium server have a game going, and why a session's game is gone.

Why it exists: the server must answer a `/step` that comes out of order (before any `/reset`, after the episode
ended, after the server dropped the game) with a 4xx saying which it was, instead of whatever the environment's
code raises; and it must drop games nobody plays any more (`game_idle_timeout_s`) and hold at most
`max_live_games` (the longest idle goes first), or abandoned games keep their memory for ever. The environment's
own state stays where v0.5 code keeps it (`session_state`); this registry only says which sessions are live, and the
server calls the environment's `close_session` for those it drops.

Live games are kept least recently played first, so finding the idle ones reads only those. A game whose request
is being answered is never dropped. What happened to a session's last game is remembered for as many sessions as
`max_live_games`, for the message; after that a step of a long-gone session reads as one that never reset.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Optional

from fastapi import HTTPException

from resources_servers.gymnasium.limits import GAME_IDLE_TIMEOUT_KEY, MAX_LIVE_GAMES_KEY, EnvLimits

__all__ = ["Episodes", "NO_EPISODE_STATUS", "GONE_STATUS"]

NO_EPISODE_STATUS = 409  # a step out of order: no /reset yet, or the episode already ended
GONE_STATUS = 410  # the server dropped the game: idle too long, or room was needed

_HOW_TO_START = "POST /reset with the row to start an episode, and send its session cookie with every /step."


class _Game:
    __slots__ = ("last_played", "steps", "busy")

    def __init__(self, now: float) -> None:
        self.last_played = now
        self.steps = 0
        self.busy = 0  # requests of this game being answered


class Episodes:
    """The live games by session id; `begin_*` / `finish` bracket every request that plays one."""

    def __init__(self, limits: EnvLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._live: OrderedDict[str, _Game] = OrderedDict()
        self._gone: OrderedDict[str, tuple[int, str]] = OrderedDict()  # session -> (status, why)
        # The reasons shared by every dropped game (one string each, not one per game).
        self._idle_why = (
            f"the server dropped this session's game: it went unplayed for {limits.game_idle_timeout_s:g} s "
            f"({GAME_IDLE_TIMEOUT_KEY})"
        )
        self._room_why = (
            f"the server dropped this session's game: it holds at most {limits.max_live_games} games "
            f"({MAX_LIVE_GAMES_KEY}) and this one was the longest unplayed when another /reset needed room"
        )

    def __len__(self) -> int:
        return len(self._live)

    def begin_reset(self, session_id: str) -> list[str]:
        """A `/reset` of this session starts: its game is (re)started and busy. Returns the sessions dropped to
        stay within `max_live_games` (the longest idle ones), whose state the caller must close."""
        self._gone.pop(session_id, None)
        game = self._live.pop(session_id, None)
        dropped = []
        if game is None:
            game = _Game(self._clock())
            while len(self._live) >= self.limits.max_live_games:
                victim = next((sid for sid, g in self._live.items() if not g.busy), None)
                if victim is None:  # all in flight: over the cap by at most the requests being answered
                    break
                self._drop(victim, self._room_why)
                dropped.append(victim)
        game.steps = 0
        game.busy += 1
        self._live[session_id] = game
        return dropped

    def begin_step(self, session_id: str) -> None:
        """A `/step` of this session starts; raises the 4xx that says why there is no game to play."""
        game = self._live.get(session_id)
        if game is None:
            status, why = self._gone.get(session_id) or (NO_EPISODE_STATUS, "this session has no episode")
            raise HTTPException(status, f"/step refused: {why}. {_HOW_TO_START}")
        game.busy += 1
        game.steps += 1
        self._live.move_to_end(session_id)

    def finish(self, session_id: str, *, ended: Optional[str] = None) -> None:
        """A request of this session was answered. `ended`: why the episode is over (it is no longer live);
        None: the game goes on, played just now."""
        game = self._live.get(session_id)
        if game is None:
            return
        game.busy = max(0, game.busy - 1)
        if ended is not None:
            del self._live[session_id]
            self._remember(session_id, NO_EPISODE_STATUS, f"the episode of this session ended {ended}")
            return
        game.last_played = self._clock()
        self._live.move_to_end(session_id)

    def forget(self, session_id: str) -> None:
        """A `/reset` that failed: the session has no game."""
        self._live.pop(session_id, None)

    def steps(self, session_id: str) -> int:
        game = self._live.get(session_id)
        return game.steps if game is not None else 0

    def idle(self) -> list[str]:
        """Drop the games unplayed for `game_idle_timeout_s`; returns their sessions, whose state the caller must
        close."""
        cutoff = self._clock() - self.limits.game_idle_timeout_s
        idle = []
        for session_id, game in self._live.items():
            if game.last_played > cutoff:
                break  # the rest were played later (a game being played may sit later with an older time: kept)
            if not game.busy:
                idle.append(session_id)
        for session_id in idle:
            self._drop(session_id, self._idle_why)
        return idle

    def _drop(self, session_id: str, why: str) -> None:
        del self._live[session_id]
        self._remember(session_id, GONE_STATUS, why)

    def _remember(self, session_id: str, status: int, why: str) -> None:
        self._gone[session_id] = (status, why)
        self._gone.move_to_end(session_id)
        while len(self._gone) > self.limits.max_live_games:
            self._gone.popitem(last=False)
