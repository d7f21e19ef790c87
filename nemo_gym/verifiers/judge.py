"""Judge calls that can fail without being scored as wrong answers (NeMo Gym v0.5 `nemo_gym.judge`).

A verifier that asks a judge model for a verdict has two different bad outcomes: the judge said "wrong" (reward
0, a real score) and the judge call itself failed (timeout, HTTP error, a body that is not the expected schema).
The second is not a score. `call_judge` turns every such failure into `JudgeError`; `judge_failsafe` (which
`SimpleResourcesServer` wraps around `/verify`) turns a `JudgeError` into a verify answer tagged
`_ng_failure_class: "judge_failed"`, which the collector records as a failed, retryable rollout instead of a
zero reward.

A reply that arrives and parses but holds no verdict is *not* a `JudgeError` of `call_judge` (it cannot read
verdicts); the verifier decides with `no_verdict` and its server's `judge_unparseable_verdict` setting:
`failure` (our default) raises `JudgeError`, since a judge that wrote no verdict said nothing about the answer and
a zero would be scored as a wrong answer; `zero` scores it 0 as NeMo Gym v0.5's servers do.
Wrap the judge call, not the whole verify, so a bug in your own scoring code still surfaces as a 500.

A judge call that does not answer within `judge_timeout_s` (the server's setting, else the global key, else 300 s;
v0.5 has no bound) is a `JudgeError` too: a hung judge must end its rollout as a judge failure, not stall the
collection. The expiry cancels the call, which closes its connection, so the judge's model server stops working
on it as well.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Literal, Optional, TypeVar

import orjson
from pydantic import BaseModel, Field

from nemo_gym.config.values import config_get

from nemo_gym.http.client import raise_for_status
from nemo_gym.serving.endpoint_wrapping import wraps_endpoint
from nemo_gym.rollouts.failure_routing import (
    JUDGE_FAILED_CLASS,
    NG_FAILURE_CLASS_KEY,
    NG_FAILURE_JUDGE_ERROR_KEY,
)

__all__ = [
    "JudgeError",
    "reraise_judge_errors",
    "call_judge",
    "judge_failsafe",
    "JUDGE_FAILED_CLASS",
    "JUDGE_ERROR_KEY",
    "JudgeSettings",
    "judge_timeout_s",
    "no_verdict",
    "JUDGE_TIMEOUT_KEY",
    "DEFAULT_JUDGE_TIMEOUT_S",
    "UNPARSEABLE_VERDICT_KEY",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=BaseModel)

# The failure class and message keys a judge failure adds to a verify answer are the collector's failure keys.
JUDGE_ERROR_KEY = NG_FAILURE_JUDGE_ERROR_KEY


JUDGE_TIMEOUT_KEY = "judge_timeout_s"
DEFAULT_JUDGE_TIMEOUT_S = 300.0
UNPARSEABLE_VERDICT_KEY = "judge_unparseable_verdict"


class JudgeError(Exception):
    """The judge call failed: no verdict was obtained, so the rollout cannot be scored."""


class JudgeSettings(BaseModel):
    """The judge settings of a resources server's config (mixed into the config classes of our judge servers)."""

    # Seconds one judge call may take; null: the global `judge_timeout_s`, else DEFAULT_JUDGE_TIMEOUT_S.
    judge_timeout_s: Optional[float] = Field(default=None, gt=0)
    # A judge reply without a readable verdict: `failure` -> judge_failed (rerun, then the failures file);
    # `zero` -> reward 0 (NeMo Gym v0.5's servers).
    judge_unparseable_verdict: Literal["failure", "zero"] = "failure"


def judge_timeout_s(server_client: Any, own: Optional[float] = None) -> float:
    """The bound of one judge call: `own` (the server block's `judge_timeout_s`), else the global config's
    `judge_timeout_s` (as `server_client` holds it), else DEFAULT_JUDGE_TIMEOUT_S."""
    if own is not None:
        return float(own)
    try:  # a stub client, or no global config in this process: the default
        value = float(config_get(getattr(server_client, "global_config_dict", None), JUDGE_TIMEOUT_KEY, 0))
    except Exception:
        value = 0.0
    return value if value > 0 else DEFAULT_JUDGE_TIMEOUT_S


def no_verdict(policy: str, server_name: str, expected: str) -> None:
    """A judge reply held no verdict (`expected` says what was looked for): with `policy` `failure` raise
    `JudgeError`; with `zero` return (the caller scores 0)."""
    if policy != "zero":
        raise JudgeError(
            f"the reply of judge server `{server_name}` holds no verdict ({expected}); counted as a judge failure "
            f"({UNPARSEABLE_VERDICT_KEY}: failure; set it to zero to score such replies 0)"
        )


async def reraise_judge_errors(awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; any exception but a `JudgeError` comes out as `JudgeError("<Type>: <message>")`,
    chained to the original."""
    try:
        return await awaitable
    except JudgeError:
        raise
    except Exception as exc:
        raise JudgeError(f"{type(exc).__name__}: {exc}") from exc


async def _post_and_parse(
    server_client: Any, server_name: str, url_path: str, json: Any, response_model: type[ModelT]
) -> ModelT:
    # A pydantic body goes to the client as the model, as v0.5 hands it: our ServerClient serializes it once
    # (`exclude_unset`, pydantic's serializer), and tests that stub `post` read `kwargs["json"].input[...]`.
    response = await server_client.post(server_name=server_name, url_path=url_path, json=json)
    # The status first: a 401 or 500 must report as an HTTP error, not as a body that failed validation.
    await raise_for_status(response)
    if hasattr(response, "json") and not hasattr(response, "read"):  # httpx-like
        data = response.json()
    else:
        data = orjson.loads(await response.read())
    return response_model.model_validate(data)


async def bounded_judge_call(awaitable: Awaitable[T], server_name: str, timeout_s: float) -> T:
    """Await one judge call for at most `timeout_s`; its expiry cancels the call (closing its connection) and
    raises `JudgeError` naming the judge server and the key; every other failure is a `JudgeError` too."""
    try:
        async with asyncio.timeout(timeout_s):
            return await reraise_judge_errors(awaitable)
    except TimeoutError:
        raise JudgeError(
            f"judge server `{server_name}` gave no answer within {timeout_s:g} s ({JUDGE_TIMEOUT_KEY}; set it in "
            f"the resources server block or globally, e.g. +{JUDGE_TIMEOUT_KEY}=600)"
        ) from None


async def call_judge(
    server_client: Any,
    *,
    server_name: str,
    url_path: str,
    json: Any,
    response_model: type[ModelT],
    timeout_s: Optional[float] = None,
) -> ModelT:
    """POST `json` to the judge model server `server_name` at `url_path` (`/v1/responses` with
    `NeMoGymResponse`, or `/v1/chat/completions` with `NeMoGymChatCompletion`) and return the parsed reply.

    Every failure (connection, timeout, HTTP status, non-JSON body, schema mismatch) raises `JudgeError`, and so
    does a call that takes longer than `timeout_s` (None: `judge_timeout_s(server_client)`). No retries here: the
    client retries connection errors and the judge's model server retries its backend."""
    bound = judge_timeout_s(server_client, timeout_s)
    return await bounded_judge_call(
        _post_and_parse(server_client, server_name, url_path, json, response_model), server_name, bound
    )


def _find_body(args: tuple, kwargs: dict) -> Any:
    body = kwargs.get("body")
    if body is not None:
        return body
    for arg in args:
        if hasattr(arg, "model_dump") and hasattr(arg, "response"):
            return arg
    raise RuntimeError(
        "judge_failsafe: the verify function's arguments hold no request body (a `body` argument, or a pydantic "
        "model with a `response` field); cannot build the judge_failed answer"
    )


def judge_failed_answer(body: Any, error: JudgeError) -> dict:
    """The verify answer for a failed judge call: the request's fields, reward 0.0, the failure class and the
    judge's error message (no `_ng_failure_terminal`: the rollout may be retried)."""
    answer = body.model_dump(mode="json") if hasattr(body, "model_dump") else dict(body)
    answer["reward"] = 0.0
    answer[NG_FAILURE_CLASS_KEY] = JUDGE_FAILED_CLASS
    answer[JUDGE_ERROR_KEY] = str(error)
    return answer


def judge_failsafe(verify_fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap a verify function so a `JudgeError` becomes an HTTP 200 answer tagged `judge_failed` (see
    `judge_failed_answer`) instead of a 500. The signature is kept, so FastAPI injects the same parameters."""
    if getattr(verify_fn, "__nemo_gym_judge_failsafe__", False):
        return verify_fn

    @wraps_endpoint(verify_fn)
    async def verify(*args: Any, **kwargs: Any) -> Any:
        try:
            return await verify_fn(*args, **kwargs)
        except JudgeError as error:
            from fastapi.responses import JSONResponse

            # One line per failed rollout: it is rerun, then recorded in the failures file, never scored.
            logger.warning("/verify: judge failed, answered %s: %s", JUDGE_FAILED_CLASS, error)
            return JSONResponse(judge_failed_answer(_find_body(args, kwargs), error))

    verify.__nemo_gym_judge_failsafe__ = True  # type: ignore[attr-defined]
    return verify
