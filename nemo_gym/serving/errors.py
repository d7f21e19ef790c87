"""The errors layer of every server: what a client gets, and what the log says, when a request goes wrong.

* An exception carrying `response_content` (a `NeMoGymHTTPError` from `raise_for_status` on an inner server
  call) -> HTTP 500, JSON string body `"Hit an exception in <ClassName>___<server_id> calling an inner
  server: <inner body>"` (the reference's text), and one log line.
* A failed call to another server or a backend (connection refused or reset, a timeout) -> HTTP 500 with
  `"<ExceptionType>: <message>"` and ONE log line: with a backend down, a traceback per in-flight request buried
  the one fact that matters.
* Any other `Exception` -> HTTP 500, JSON string body `"<ExceptionType>: <message>"`. This is richer than
  the reference's `repr(exc)`: the type name always leads, then `str(exc)`. The traceback is printed once,
  with the server named. An agent that calls a tool which raises feeds this string back to the model as the
  tool output, so catch expected errors in the handler and return a normal response instead.
* Request validation errors (422) are printed (errors and body, truncated) and answered in FastAPI's shape,
  but every `input` in the answer is cut to a short excerpt: FastAPI echoes the offending input whole, so a
  50 MB body that failed validation came back as a 50 MB answer.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import sys
import traceback
from typing import Any, Callable, ClassVar, Optional

import aiohttp
import httpx
import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from nemo_gym.http.stack_health import StackServerFailed
from nemo_gym.serving.logs import log_access

__all__ = [
    "NeMoGymExceptionMiddleware",
    "validation_error_handler",
    "validation_error_content",
    "eprint",
    "truncate",
    "INPUT_EXCERPT_CHARS",
    "MAX_VALIDATION_ERRORS",
]

# What a 422 answer keeps of each offending input (its repr, for anything that is not a short string or number).
INPUT_EXCERPT_CHARS = 200
# The errors a 422 answer lists at most; one more entry says how many were left out. pydantic reports one error per
# bad item, so a 2 MB body of a million bad list items made a 332 MB answer (10 s of the server's event loop).
MAX_VALIDATION_ERRORS = 50
# Upstream failures worth one log line, not a traceback: the peer is down, refused, reset or too slow.
_UPSTREAM_ERRORS = (
    httpx.TransportError, aiohttp.ClientError, ConnectionError, asyncio.TimeoutError, StackServerFailed,
)
_LOG_BODY_CHARS = 2000


def truncate(text: str, limit: int = _LOG_BODY_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def eprint(text: str) -> None:
    stream = sys.stderr
    try:
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()
    except Exception:  # pragma: no cover - a closed stream must not turn into a second error
        pass


class NeMoGymExceptionMiddleware:
    """Outermost pure-ASGI middleware: turn an escaped exception into HTTP 500 with a JSON string body.

    See the module docstring for the bodies. `asyncio.CancelledError` (shutdown, a cancelled task) and other
    `BaseException`s that are not `Exception` propagate untouched, so cancellation keeps its meaning.
    """

    # Set by `serve` when only non-200 access lines are shown: they are then written here (uvicorn's handlers and
    # format, see `_access_log_by_middleware`), and the 200s cost no log record at all.
    log_non_200: ClassVar[bool] = False
    direct_role: ClassVar[str] = "errors"  # HotRoutes.answer does this layer's work itself (serving/hot_routes.py)

    def __init__(self, app: Any, server_key: str) -> None:
        self.app = app
        self.server_key = server_key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.guard(self.app, scope, receive, send)

    async def guard(self, app: Any, scope: dict, receive: Any, send: Any) -> None:
        """Run the ASGI `app` for an HTTP request as this layer does: non-200 access lines, and an exception
        turned into the 500 (or, once the response has started, only logged)."""
        started = False

        async def send_tracking(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.log_status(scope, message["status"])
            await send(message)

        try:
            await app(scope, receive, send_tracking)
        except Exception as exc:
            answer = self.error_answer(exc, scope, response_started=started)
            if answer is None:
                return  # nothing we can send any more; the error is logged
            status, headers, content = answer
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": content})

    def log_status(self, scope: dict, status: int) -> None:
        """The access line of a response that is not a 200, when those are shown (see `log_non_200`)."""
        if self.log_non_200 and status != 200:
            log_access(scope, status)

    def error_answer(self, exc: Exception, scope: dict, *, response_started: bool) -> Optional[tuple[int, list, bytes]]:
        """(status, headers, body) of the 500 for `exc`, its access line written; None once the response has
        started (then only the log tells)."""
        body = self.describe(exc, scope, response_started=response_started)
        if response_started:
            return None
        content = orjson.dumps(body)
        if self.log_non_200:
            log_access(scope, 500)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode("latin-1"))]
        return 500, headers, content

    def describe(self, exc: Exception, scope: dict, *, response_started: bool = False) -> str:
        """The 500 body for `exc`; logs the error once."""
        where = f"{scope.get('method', '')} {scope.get('path', '')}".strip()
        inner = getattr(exc, "response_content", None)
        if inner is not None:
            if isinstance(inner, (bytes, bytearray)):
                inner = bytes(inner).decode("utf-8", errors="replace")
            body = f"Hit an exception in {self.server_key} calling an inner server: {inner}"
            status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
            eprint(
                f"{self.server_key} {where}: an inner server call failed"
                + (f" with HTTP {status}" if status else "")
                + f"; answering HTTP 500. {truncate(str(exc))}"
            )
            return body
        message = str(exc)
        body = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        if isinstance(exc, _UPSTREAM_ERRORS) and not response_started:
            eprint(f"{self.server_key} {where}: a call to another server failed ({truncate(body, 300)}); answering HTTP 500.")
            return body
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        note = (
            "the response had already started, so the client gets a broken response"
            if response_started
            else f"answering HTTP 500 with {truncate(body, 500)!r}"
        )
        eprint(
            f"Unhandled exception in {self.server_key} while serving {where}; {note}. "
            f"If the caller should get something else (e.g. a tool error the model can read), catch it in the "
            f"handler and return a normal response.\n{tb.rstrip()}"
        )
        return body



def _excerpt(value: Any) -> Any:
    """A short stand-in for an offending input in a 422 answer: small scalars as they are, the rest cut."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # NaN / inf: not JSON, so not echoed as a number
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= INPUT_EXCERPT_CHARS else truncate(value, INPUT_EXCERPT_CHARS)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: INPUT_EXCERPT_CHARS + 1]).decode("utf-8", errors="replace")
        return truncate(value, INPUT_EXCERPT_CHARS)
    try:
        text = orjson.dumps(value, default=repr).decode()
    except (TypeError, orjson.JSONEncodeError):  # pragma: no cover - repr of anything
        text = repr(value)
    if len(text) <= INPUT_EXCERPT_CHARS:
        return value
    return truncate(text, INPUT_EXCERPT_CHARS)


def validation_error_content(errors: Any) -> dict:
    """FastAPI's 422 body (`{"detail": [...]}`) with every `input` cut to an excerpt and `ctx` values made JSON; past
    `MAX_VALIDATION_ERRORS` errors, one last entry of the same shape counts the rest."""
    detail = []
    errors = list(errors)
    for error in errors[:MAX_VALIDATION_ERRORS]:
        error = dict(error)
        if "input" in error:
            error["input"] = _excerpt(error["input"])
        if "ctx" in error:
            error["ctx"] = {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v) for k, v in error["ctx"].items()}
        detail.append(error)
    left_out = len(errors) - MAX_VALIDATION_ERRORS
    if left_out > 0:
        detail.append({
            "type": "too_many_errors",
            "loc": ["body"],
            "msg": f"{left_out} more validation errors are not listed (the first {MAX_VALIDATION_ERRORS} are above)",
            "input": None,
        })
    return {"detail": detail}


# A refused body this large may be held by reference cycles (the validation error, its traceback's frames) that the
# serving GC settings (a rare young-generation collection, see runner.tune_gc_for_serving) would keep for long: such
# a 422 schedules one collection soon after it is answered, at most once a second.
LARGE_BODY_CHARS = 1024 * 1024
_collect_state = {"last": 0.0, "pending": False}


def _collect_soon() -> None:
    """One collection shortly after this request is answered, or one second after the last, whichever is later (a
    burst gets a collection after its end, not one per request)."""
    if _collect_state["pending"]:
        return
    loop = asyncio.get_running_loop()
    _collect_state["pending"] = True
    loop.call_later(max(0.05, _collect_state["last"] + 1.0 - loop.time()), _collect_and_trim, loop)


def _collect_and_trim(loop: asyncio.AbstractEventLoop) -> None:
    """Collect cycles, then hand freed heap pages back to the OS (glibc keeps them otherwise; a no-op elsewhere)."""
    _collect_state["pending"] = False
    _collect_state["last"] = loop.time()
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def validation_error_handler(server_key: str) -> Callable[[Request, RequestValidationError], Any]:
    """The exception handler for `RequestValidationError`: one log entry (errors and body, truncated) and the 422."""

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        content = validation_error_content(exc.errors())
        try:
            errors = json.dumps(content["detail"], default=repr)
        except Exception:  # pragma: no cover
            errors = repr(content["detail"])
        body = exc.body
        if isinstance(body, (bytes, bytearray)):
            body_text = bytes(body[: _LOG_BODY_CHARS + 1]).decode("utf-8", errors="replace")
        else:
            try:
                body_text = json.dumps(body, default=repr)
            except Exception:  # pragma: no cover
                body_text = repr(body)
        eprint(
            f"{server_key} {request.method} {request.url.path}: request validation failed (HTTP 422).\n"
            f"Errors: {truncate(errors)}\nBody: {truncate(body_text)}"
        )
        if len(body_text) > LARGE_BODY_CHARS:
            _collect_soon()
        return JSONResponse(status_code=422, content=content)

    return on_validation_error
