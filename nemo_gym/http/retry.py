"""The one retry policy for HTTP calls: `ServerClient` (server to server), `NeMoGymAsyncOpenAI` (model server to
its LLM backend) and the rollout collector's `/run`. Change what is retried, and how long to wait, here.

A failure is retried when repeating the request cannot do harm:

- **Never processed**: the request did not reach a handler, so any request may be sent again.
  Statuses `UNPROCESSED_STATUSES` = 408 (the server gave up waiting for the request), 429 (rate limited before any
  work), 503 (overloaded or not ready: uvicorn's `limit_concurrency`, a vLLM still loading). Exceptions
  `UNSENT_EXCEPTIONS` = the connection could not be made or no pooled connection came free (httpx `ConnectError`,
  `ConnectTimeout`, `PoolTimeout`; aiohttp `ClientConnectorError`, `ConnectionTimeoutError`).
- **Maybe processed**: the request may have run, in part or whole, so it is retried only when the request is
  idempotent. Statuses `MAYBE_PROCESSED_STATUSES` = 500 (the handler raised), 502 and 504 (a gateway lost or
  waited out the upstream, which may still be working), Cloudflare's 520-524 and 529 "overloaded" (in front of
  hosted LLM APIs). Exceptions `MAYBE_PROCESSED_EXCEPTIONS` = the connection broke or timed out after the
  request was sent (httpx `ReadError`, `WriteError`, `RemoteProtocolError`, `ReadTimeout`, `WriteTimeout`; aiohttp
  `ServerDisconnectedError`, `ClientOSError`, `ClientPayloadError`, `ServerTimeoutError`; a caller's deadline,
  `TimeoutError`). A disconnect is here, not above: we cannot tell a stale keep-alive connection from a server
  that died mid-request (aiohttp and urllib3 retry it for idempotent methods only, too).

Anything else (4xx, 501, 505, TLS/protocol misuse, our own bugs) is permanent and returned or raised at once.

Idempotent: model calls to an LLM backend (sampling again is harmless); a collector `/run` (a failed rollout is
rerun whole on a fresh session); requests whose HTTP method is idempotent (`IDEMPOTENT_METHODS`). Not idempotent:
any other `ServerClient` call, e.g. a tool call (a tool that raised must not run three times) - the caller may
say otherwise per call.

Waiting: attempt k sleeps uniform(0, min(backoff_max, backoff_base * 2**(k-1))) ("full jitter", so that
many clients failing together do not retry together); a `Retry-After` (seconds or an HTTP date) raises that to
what the server asked, capped at `max_retry_after`.
"""

from __future__ import annotations

import asyncio
import time
import email.utils
import logging
import math
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Generic, Mapping, Optional, TypeVar, Union

import aiohttp
import httpx

logger = logging.getLogger(__name__)

__all__ = [
    "UNPROCESSED_STATUSES",
    "MAYBE_PROCESSED_STATUSES",
    "RETRY_STATUSES",
    "UNSENT_EXCEPTIONS",
    "MAYBE_PROCESSED_EXCEPTIONS",
    "RETRY_EXCEPTIONS",
    "IDEMPOTENT_METHODS",
    "is_idempotent_method",
    "is_retryable_status",
    "is_retryable_error",
    "retry_after_seconds",
    "RetryPolicy",
    "RetryingClient",
    "Outcome",
]

UNPROCESSED_STATUSES = frozenset({408, 429, 503})
MAYBE_PROCESSED_STATUSES = frozenset({500, 502, 504, 520, 521, 522, 523, 524, 529})
RETRY_STATUSES = UNPROCESSED_STATUSES | MAYBE_PROCESSED_STATUSES  # what an idempotent request retries

UNSENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
)
MAYBE_PROCESSED_EXCEPTIONS: tuple[type[BaseException], ...] = (
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientOSError,
    aiohttp.ClientPayloadError,
    aiohttp.ServerTimeoutError,
    TimeoutError,
)
RETRY_EXCEPTIONS = UNSENT_EXCEPTIONS + MAYBE_PROCESSED_EXCEPTIONS

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_BACKOFF_BASE = 0.5
DEFAULT_BACKOFF_MAX = 8.0
DEFAULT_MAX_RETRY_AFTER = 60.0

_sleep = asyncio.sleep  # tests swap this to record delays without waiting

T = TypeVar("T")


def is_idempotent_method(method: str) -> bool:
    return method.upper() in IDEMPOTENT_METHODS


def is_retryable_status(status: int, idempotent: bool) -> bool:
    return status in UNPROCESSED_STATUSES or (idempotent and status in MAYBE_PROCESSED_STATUSES)


def is_retryable_error(exc: BaseException, idempotent: bool) -> bool:
    # Checked in this order: aiohttp's connect timeout is also a (maybe-processed) TimeoutError.
    return isinstance(exc, UNSENT_EXCEPTIONS) or (idempotent and isinstance(exc, MAYBE_PROCESSED_EXCEPTIONS))


def retry_after_seconds(headers: Optional[Mapping[str, str]], now: Optional[datetime] = None) -> Optional[float]:
    """Seconds a `Retry-After` header asks to wait (delay-seconds or an HTTP date; past dates are 0), else None."""
    value = headers.get("retry-after") if headers is not None else None
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _body_preview(response: Any, limit: int = 200) -> str:
    try:
        text = response.text
    except Exception:  # not read, not text, or not an httpx response at all
        return ""
    if not isinstance(text, str) or not text:
        return ""
    return ": " + (text if len(text) <= limit else text[:limit] + "...")


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """The last attempt: its `result` or the `error` it raised, and how many attempts were made."""

    result: Optional[T]
    error: Optional[Exception]
    attempts: int


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts, and how long to wait between them (see the module docstring)."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base: float = DEFAULT_BACKOFF_BASE
    backoff_max: float = DEFAULT_BACKOFF_MAX
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")

    def backoff(self, attempt: int) -> float:
        """Full-jitter sleep after failed attempt `attempt` (1-based)."""
        return random.uniform(0.0, min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt - 1, 60)))

    def delay(self, attempt: int, headers: Optional[Mapping[str, str]] = None) -> float:
        """The backoff, raised to the response's `Retry-After` (capped at `max_retry_after`)."""
        delay = self.backoff(attempt)
        asked = retry_after_seconds(headers)
        if asked is not None:
            delay = max(delay, min(asked, self.max_retry_after))
        return delay

    async def run(
        self,
        send: Callable[[], Awaitable[T]],
        *,
        idempotent: bool,
        label: Union[str, Callable[[], str]],
        max_attempts: Optional[int] = None,
        before_retry: Optional[Callable[[], Awaitable[None]]] = None,
    ) -> Outcome[T]:
        """Call `send()` until it returns a response whose `status_code` is not retried, raises an exception that
        is not retried, or the attempts run out; return the last outcome. `label` (e.g. "POST http://h/run", or a
        function making it, called only when a line is logged) names the request in the retry log lines.
        `max_attempts` overrides the policy's bound for this call. `before_retry`, awaited before each retry, may
        raise to end the call at once with that error (e.g. the server is known to be down for good)."""
        limit = self.max_attempts if max_attempts is None else max(1, int(max_attempts))
        attempt = 0
        while True:
            attempt += 1
            try:
                result = await send()
            except Exception as exc:
                if attempt >= limit or not is_retryable_error(exc, idempotent):
                    return Outcome(None, exc, attempt)
                delay = self.delay(attempt)
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                status = getattr(result, "status_code", None)
                if attempt >= limit or status is None or not is_retryable_status(status, idempotent):
                    return Outcome(result, None, attempt)
                delay = self.delay(attempt, getattr(result, "headers", None))
                reason = f"HTTP {status}{_body_preview(result)}"
            if before_retry is not None:
                try:
                    await before_retry()
                except Exception as stop:
                    return Outcome(None, stop, attempt)
            _log_retry(label() if callable(label) else label, reason, attempt, limit, delay)
            await _sleep(delay)


# Retry lines of one kind (the same request label failing the same way) are written at most once per this many
# seconds; the next line says how many were left out. With a backend down and 64 rollouts in flight, a line per
# attempt was 200 lines saying one thing.
RETRY_LOG_INTERVAL_S = 5.0
_retry_log_seen: dict[tuple[str, str], list] = {}


def _log_retry(label: str, reason: str, attempt: int, limit: int, delay: float) -> None:
    kind = reason.split(":", 1)[0] if not reason.startswith("HTTP ") else reason[:8]
    key = (label, kind)
    now = time.monotonic()
    seen = _retry_log_seen.get(key)
    if seen is not None and now - seen[0] < RETRY_LOG_INTERVAL_S:
        seen[1] += 1
        return
    left_out = seen[1] if seen is not None else 0
    if len(_retry_log_seen) > 1024:  # bounded: forget old kinds
        _retry_log_seen.clear()
    _retry_log_seen[key] = [now, 0]
    note = f"; {left_out} more like it in the last {RETRY_LOG_INTERVAL_S:.0f} s not shown" if left_out else ""
    logger.warning(
        "%s: %s (attempt %d/%d, retrying in %.2fs)%s", label, reason, attempt, limit, delay, note,
        extra={"retry_attempt": attempt, "retry_delay": delay},
    )


class RetryingClient:
    """Base of the clients that retry: their `max_attempts`, `backoff_base`, `backoff_max` and `max_retry_after`
    are those of their `retry_policy`, so there is one source of truth."""

    retry_policy: RetryPolicy

    @property
    def max_attempts(self) -> int:
        return self.retry_policy.max_attempts

    @property
    def backoff_base(self) -> float:
        return self.retry_policy.backoff_base

    @property
    def backoff_max(self) -> float:
        return self.retry_policy.backoff_max

    @property
    def max_retry_after(self) -> float:
        return self.retry_policy.max_retry_after
