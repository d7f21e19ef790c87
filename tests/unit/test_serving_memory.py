"""`serving/memory.py`: large traffic gives memory back once, after the burst, when no request is in flight (or
after `MAX_WAIT_S` at most); on a clock the test moves, nothing timed."""

from __future__ import annotations

import pytest

from nemo_gym.serving import memory


class _Clock:
    """`call_later` and `time`, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay, callback, *args):
        timer = [self.now + delay, callback, args]
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        until = self.now + seconds
        while True:
            due = sorted((t for t in self.timers if t[0] <= until), key=lambda t: t[0])
            if not due:
                break
            timer = due[0]
            self.timers.remove(timer)
            self.now = timer[0]
            timer[1](*timer[2])
        self.now = until


@pytest.fixture
def gave_back(monkeypatch):
    calls: list[float] = []
    monkeypatch.setattr(memory, "_timer", None)
    clock = _Clock()
    monkeypatch.setattr(memory, "give_back", lambda: calls.append(clock.now))
    return clock, calls


def test_a_burst_gives_back_once_after_it(gave_back):
    clock, calls = gave_back
    tasks: set = set()
    for _ in range(5):  # a burst: one large request every 0.5 s
        memory.large_traffic(clock, tasks)
        clock.advance(0.5)
    assert len(clock.timers) == 1 and calls == []  # one timer for the whole burst, nothing yet
    clock.advance(5)
    assert calls == [pytest.approx(2.0 + memory.IDLE_DELAY_S)]  # once, a quiet second after the last
    clock.advance(60)
    assert len(calls) == 1 and clock.timers == []


def test_it_waits_for_the_requests_in_flight_but_not_for_ever(gave_back):
    clock, calls = gave_back
    tasks = {"a request"}
    memory.large_traffic(clock, tasks)
    clock.advance(3)
    assert calls == []
    tasks.clear()
    clock.advance(1)
    assert len(calls) == 1

    tasks.add("a stream that never ends")
    memory.large_traffic(clock, tasks)
    clock.advance(memory.MAX_WAIT_S + 1)
    assert len(calls) == 2


def test_malloc_trim_is_safe_to_call():
    assert memory.malloc_trim() in (True, False)
    memory.give_back()
