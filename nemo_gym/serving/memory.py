"""Memory that comes back: after a large request body or answer, the freed memory is returned to the operating
system once the server is idle.

Why: glibc's allocator keeps what a process frees for reuse. A large body arrives in many socket reads of up to
a few hundred KB each, is joined, parsed into Python objects and serialized again; once all of that is freed, most
of it sits in free chunks between live ones (and glibc raises its mmap threshold after freeing a large mapping, so
the next large buffers come from the heap too). Measured on a resources server: 30 bodies of 30 MB on separate
connections left it at 1,003 MB with everything freed; `malloc_trim(0)`, which since glibc 2.8 hands back the
whole free pages of every arena, brought it to 89 MB (the baseline).

How: the protocol (`serving/private_api.py`) calls `large_traffic(loop, tasks)` when a request body or an answer
of at least `LARGE_BYTES` went through: one size comparison per request, nothing else on the hot path. That arms
one timer; when it fires and no request is in flight (`tasks`, uvicorn's set of request tasks, is empty),
`give_back()` runs once: a full garbage collection (cycles an environment made may hold a large body) and
`malloc_trim(0)`. While requests are in flight it waits, but not longer than `MAX_WAIT_S`: memory freed under
steady load is reused, but a server that always has some request open (a long stream, a held row) still gives
back. Off glibc (macOS, musl) only the collection runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from typing import Any, Callable, Optional

__all__ = ["LARGE_BYTES", "IDLE_DELAY_S", "MAX_WAIT_S", "large_traffic", "give_back", "malloc_trim"]

# A request body or an answer at least this large arms the give-back (glibc serves allocations under 128 KiB from
# the heap anyway; a body of 1 MiB leaves a megabyte of chunks behind).
LARGE_BYTES = 1024 * 1024
# Seconds between the last large request and the give-back (a burst gives back once, after it).
IDLE_DELAY_S = 1.0
# The longest the give-back waits for the server to be idle.
MAX_WAIT_S = 30.0

_timer: Optional[asyncio.TimerHandle] = None
_armed_at = 0.0
_last_large = 0.0


def large_traffic(loop: asyncio.AbstractEventLoop, tasks: Any) -> None:
    """A large body or answer went through this process: give the memory back once it is idle (`tasks`: the
    requests in flight)."""
    global _timer, _armed_at, _last_large
    now = _last_large = loop.time()
    if _timer is None:
        _armed_at = now
        _timer = loop.call_later(IDLE_DELAY_S, _due, loop, tasks)


def _due(loop: asyncio.AbstractEventLoop, tasks: Any) -> None:
    global _timer
    now = loop.time()
    quiet_for = now - _last_large
    waited = now - _armed_at
    if waited < MAX_WAIT_S and (quiet_for < IDLE_DELAY_S or tasks):
        _timer = loop.call_later(max(IDLE_DELAY_S - quiet_for, IDLE_DELAY_S / 2), _due, loop, tasks)
        return
    _timer = None
    give_back()


def give_back() -> None:
    """Collect cyclic garbage, then return the allocator's free pages to the operating system (glibc only)."""
    gc.collect()
    malloc_trim()


def malloc_trim() -> bool:
    """`malloc_trim(0)` where the C library has it (glibc); whether it released anything."""
    trim = _malloc_trim_function()
    return bool(trim(0)) if trim is not None else False


_TRIM: list = []


def _malloc_trim_function() -> Optional[Callable[[int], int]]:
    if not _TRIM:
        function = None
        try:
            function = ctypes.CDLL(None).malloc_trim
            function.argtypes = [ctypes.c_size_t]
            function.restype = ctypes.c_int
        except (OSError, AttributeError):  # not glibc: no such function
            function = None
        _TRIM.append(function)
    return _TRIM[0]
