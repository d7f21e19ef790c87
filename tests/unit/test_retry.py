"""The retry policy itself: delays, Retry-After, which failures retry for idempotent and other requests, and the
retry loop's counts. Nothing here waits: `slept` records the delays the policy asks for instead of sleeping."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import aiohttp
import httpx
import pytest

from nemo_gym.http import retry
from nemo_gym.http.client import NeMoGymHTTPError
from nemo_gym.http.retry import (
    MAYBE_PROCESSED_STATUSES,
    RETRY_STATUSES,
    UNPROCESSED_STATUSES,
    RetryPolicy,
    is_idempotent_method,
    is_retryable_error,
    is_retryable_status,
    retry_after_seconds,
)


@pytest.fixture(autouse=True)
def _fresh_retry_log(monkeypatch):
    """Each test starts with no retry lines remembered (lines of one kind are written once per interval)."""
    monkeypatch.setattr(retry, "_retry_log_seen", {})


@pytest.fixture
def slept(monkeypatch) -> list[float]:
    """The delays the retry loop asked to sleep, in order (it does not actually sleep)."""
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr(retry, "_sleep", record)
    return delays


def _retry_lines(caplog) -> list[logging.LogRecord]:
    """The retry policy's own log records. caplog also holds every other logger's warnings, e.g. asyncio's
    "Unclosed client session" when an earlier test's event loop is garbage-collected during this one."""
    return [r for r in caplog.records if r.name == retry.logger.name]


# ------------------------------------------------------------------------------------------ delays


@pytest.mark.parametrize("attempt, bound", [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (6, 8.0), (50, 8.0)])
def test_backoff_is_full_jitter_under_the_exponential_bound(attempt, bound):
    policy = RetryPolicy(backoff_base=0.5, backoff_max=8.0)
    samples = [policy.backoff(attempt) for _ in range(300)]
    assert all(0.0 <= s <= bound for s in samples)
    assert max(samples) > bound / 2 and min(samples) < bound / 2  # spread over the range, not a constant


def test_backoff_of_a_huge_attempt_number_does_not_overflow():
    assert 0.0 <= RetryPolicy(backoff_base=1.0, backoff_max=3.0).backoff(10_000) <= 3.0


NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("7", 7.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("1.5", 1.5),  # not RFC, but servers send it
        ("-3", 0.0),
        (format_datetime(NOW + timedelta(seconds=30), usegmt=True), 30.0),
        ("Thu, 02 Jan 2025 03:05:05 GMT", 60.0),
        (format_datetime(NOW - timedelta(seconds=30), usegmt=True), 0.0),  # already past: go now
        ("soon", None),
        ("inf", None),
        ("nan", None),
        ("", None),
    ],
)
def test_retry_after_in_seconds_and_as_an_http_date(value, expected):
    assert retry_after_seconds(httpx.Headers({"Retry-After": value}), now=NOW) == expected


def test_retry_after_missing():
    assert retry_after_seconds(httpx.Headers()) is None
    assert retry_after_seconds(None) is None


def test_delay_is_raised_to_retry_after_and_capped():
    policy = RetryPolicy(backoff_base=0.01, backoff_max=0.02, max_retry_after=10.0)
    assert policy.delay(1, httpx.Headers({"Retry-After": "3"})) == 3.0
    assert policy.delay(1, httpx.Headers({"Retry-After": "3600"})) == 10.0
    future = format_datetime(datetime.now(timezone.utc) + timedelta(hours=1), usegmt=True)
    assert policy.delay(1, httpx.Headers({"Retry-After": future})) == 10.0
    assert 0.0 <= policy.delay(1, httpx.Headers({"Retry-After": "bogus"})) <= 0.01
    # A Retry-After shorter than the backoff does not shorten it.
    slow = RetryPolicy(backoff_base=100.0, backoff_max=100.0)
    assert all(slow.delay(3, httpx.Headers({"Retry-After": "0"})) <= 100.0 for _ in range(20))


def test_policy_rejects_zero_attempts():
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


# ------------------------------------------------------------------------------------------ what retries


def test_the_status_sets():
    assert UNPROCESSED_STATUSES == {408, 429, 503}
    assert {500, 502, 504} <= MAYBE_PROCESSED_STATUSES
    assert not UNPROCESSED_STATUSES & MAYBE_PROCESSED_STATUSES
    assert RETRY_STATUSES == UNPROCESSED_STATUSES | MAYBE_PROCESSED_STATUSES
    assert not {400, 401, 403, 404, 409, 422, 501, 505} & RETRY_STATUSES


@pytest.mark.parametrize(
    "status, idempotent, retried",
    [
        (429, False, True), (503, False, True), (408, False, True),
        (500, False, False), (502, False, False), (504, False, False),
        (500, True, True), (502, True, True), (504, True, True), (520, True, True), (429, True, True),
        (400, True, False), (404, True, False), (422, True, False), (501, True, False), (200, True, False),
    ],
)
def test_which_statuses_retry(status, idempotent, retried):
    assert is_retryable_status(status, idempotent) is retried


def _conn_key():
    from aiohttp.client_reqrep import ConnectionKey

    return ConnectionKey("h", 1, False, True, None, None, None)


REQUEST = httpx.Request("POST", "http://127.0.0.1:1/run")

NEVER_SENT = [
    httpx.ConnectError("refused", request=REQUEST),
    httpx.ConnectTimeout("connect", request=REQUEST),
    httpx.PoolTimeout("pool", request=REQUEST),
    aiohttp.ClientConnectorError(_conn_key(), OSError(111, "refused")),
    aiohttp.ConnectionTimeoutError("connect"),  # also a TimeoutError: the unsent check wins
]
MAYBE_PROCESSED = [
    httpx.ReadError("reset", request=REQUEST),
    httpx.WriteError("broken pipe", request=REQUEST),
    httpx.RemoteProtocolError("Server disconnected without sending a response.", request=REQUEST),
    httpx.ReadTimeout("read", request=REQUEST),
    httpx.WriteTimeout("write", request=REQUEST),
    aiohttp.ServerDisconnectedError(),
    aiohttp.ClientOSError(104, "reset"),
    aiohttp.ClientPayloadError("truncated"),
    aiohttp.SocketTimeoutError("read"),
    TimeoutError(),  # a caller's deadline (asyncio.timeout)
]
PERMANENT = [
    httpx.UnsupportedProtocol("ftp://", request=REQUEST),
    httpx.LocalProtocolError("bad header", request=REQUEST),
    NeMoGymHTTPError("HTTP 500"),  # an aiohttp.ClientResponseError too: a status, not a broken connection
    ValueError("Unknown server `x`"),
    KeyError("x"),
]


@pytest.mark.parametrize("exc", NEVER_SENT, ids=lambda e: type(e).__name__)
def test_errors_before_the_request_was_sent_retry_for_every_request(exc):
    assert is_retryable_error(exc, idempotent=False) and is_retryable_error(exc, idempotent=True)


@pytest.mark.parametrize("exc", MAYBE_PROCESSED, ids=lambda e: type(e).__name__)
def test_errors_after_the_request_may_have_run_retry_only_idempotent_requests(exc):
    assert not is_retryable_error(exc, idempotent=False) and is_retryable_error(exc, idempotent=True)


@pytest.mark.parametrize("exc", PERMANENT, ids=lambda e: type(e).__name__)
def test_other_errors_never_retry(exc):
    assert not is_retryable_error(exc, idempotent=False) and not is_retryable_error(exc, idempotent=True)


def test_idempotent_methods():
    assert all(is_idempotent_method(m) for m in ("GET", "get", "HEAD", "PUT", "DELETE", "OPTIONS"))
    assert not any(is_idempotent_method(m) for m in ("POST", "PATCH"))


# ------------------------------------------------------------------------------------------ the loop


class _Script:
    """`send` for RetryPolicy.run: answers (or raises) the next scripted item, counting calls."""

    def __init__(self, *items):
        self.items = list(items)
        self.calls = 0

    async def __call__(self):
        self.calls += 1
        item = self.items.pop(0) if len(self.items) > 1 else self.items[0]
        if isinstance(item, BaseException):
            raise item
        status, headers = item if isinstance(item, tuple) else (item, {})
        return httpx.Response(status, headers=headers, text=f"body {status}")


async def test_run_retries_until_success_and_counts_attempts(slept, caplog):
    send = _Script(httpx.ConnectError("refused"), (503, {"Retry-After": "2"}), 200)
    policy = RetryPolicy(max_attempts=5, backoff_base=0.001, backoff_max=0.001)
    with caplog.at_level(logging.WARNING, logger=retry.logger.name):
        outcome = await policy.run(send, idempotent=False, label="POST http://h/verify (server `x`)")
    assert outcome.result.status_code == 200 and outcome.error is None and outcome.attempts == 3 == send.calls
    assert len(slept) == 2 and slept[0] <= 0.001 and slept[1] == 2.0
    first, second = (r.getMessage() for r in _retry_lines(caplog))
    assert first.startswith("POST http://h/verify (server `x`): ConnectError: refused (attempt 1/5, retrying in")
    assert second == "POST http://h/verify (server `x`): HTTP 503: body 503 (attempt 2/5, retrying in 2.00s)"
    assert [r.retry_delay for r in _retry_lines(caplog)] == slept


async def test_run_returns_the_last_response_or_error_when_attempts_run_out(slept):
    send = _Script(503)
    outcome = await RetryPolicy(max_attempts=3).run(send, idempotent=False, label="x")
    assert outcome.result.status_code == 503 and outcome.attempts == 3 == send.calls and len(slept) == 2

    send = _Script(httpx.ConnectError("refused"))
    outcome = await RetryPolicy(max_attempts=3).run(send, idempotent=True, label="x", max_attempts=2)
    assert isinstance(outcome.error, httpx.ConnectError) and outcome.attempts == 2 == send.calls


async def test_run_does_not_retry_what_may_have_run_unless_idempotent(slept):
    for item in (500, httpx.ReadTimeout("read"), httpx.RemoteProtocolError("disconnected")):
        send = _Script(item, 200)
        outcome = await RetryPolicy().run(send, idempotent=False, label="x")
        assert outcome.attempts == 1 == send.calls
        send = _Script(item, 200)
        outcome = await RetryPolicy().run(send, idempotent=True, label="x")
        assert outcome.attempts == 2 == send.calls and outcome.result.status_code == 200
    assert len(slept) == 3


async def test_run_stops_at_once_on_permanent_failures(slept):
    for item in (404, 422, 501, ValueError("bug")):
        send = _Script(item, 200)
        outcome = await RetryPolicy().run(send, idempotent=True, label="x")
        assert outcome.attempts == 1 == send.calls
    assert slept == []


async def test_many_calls_failing_the_same_way_make_one_retry_line_per_interval(slept, caplog, monkeypatch):
    """64 calls to a dead server: one line, not one per attempt; the next line after the interval counts the rest."""
    policy = RetryPolicy(max_attempts=3, backoff_base=0.001, backoff_max=0.001)
    label = "POST http://h/v1/responses (server `policy_model`)"
    with caplog.at_level(logging.WARNING, logger=retry.logger.name):
        for _ in range(64):
            await policy.run(_Script(httpx.ConnectError("refused")), idempotent=True, label=label)
        assert len(_retry_lines(caplog)) == 1
        clock = retry.time.monotonic() + retry.RETRY_LOG_INTERVAL_S + 1
        monkeypatch.setattr(retry.time, "monotonic", lambda: clock)
        await policy.run(_Script(httpx.ConnectError("refused")), idempotent=True, label=label)
        # another kind of failure of the same call is its own line at once
        await policy.run(_Script(503, 200), idempotent=True, label=label)
    lines = [r.getMessage() for r in _retry_lines(caplog)]
    assert len(lines) == 3
    assert lines[1].endswith("; 127 more like it in the last 5 s not shown")
    assert "HTTP 503" in lines[2]
