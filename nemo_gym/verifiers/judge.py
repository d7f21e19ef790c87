"""Judge calls that can fail without being scored as wrong answers (NeMo Gym v0.5 `nemo_gym.judge`).

A verifier that asks a judge model for a verdict has two different bad outcomes: the judge said "wrong" (reward
0, a real score) and the judge call itself failed (timeout, HTTP error, a body that is not the expected schema).
The second is not a score. `call_judge` turns every such failure into `JudgeError`; `judge_failsafe` (which
`SimpleResourcesServer` wraps around `/verify`) turns a `JudgeError` into a verify answer tagged
`_ng_failure_class: "judge_failed"`, which the collector records as a failed, retryable rollout instead of a
zero reward.

A reply that arrives and parses but holds no verdict is *not* a `JudgeError`: the verifier scores it (usually 0).
Wrap the judge call, not the whole verify, so a bug in your own scoring code still surfaces as a 500.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

import orjson
from pydantic import BaseModel

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
]

T = TypeVar("T")
ModelT = TypeVar("ModelT", bound=BaseModel)

# The failure class and message keys a judge failure adds to a verify answer are the collector's failure keys.
JUDGE_ERROR_KEY = NG_FAILURE_JUDGE_ERROR_KEY


class JudgeError(Exception):
    """The judge call failed: no verdict was obtained, so the rollout cannot be scored."""


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


async def call_judge(
    server_client: Any,
    *,
    server_name: str,
    url_path: str,
    json: Any,
    response_model: type[ModelT],
) -> ModelT:
    """POST `json` to the judge model server `server_name` at `url_path` (`/v1/responses` with
    `NeMoGymResponse`, or `/v1/chat/completions` with `NeMoGymChatCompletion`) and return the parsed reply.

    Every failure (connection, timeout, HTTP status, non-JSON body, schema mismatch) raises `JudgeError`. No
    retries here: the client retries connection errors and the judge's model server retries its backend."""
    return await reraise_judge_errors(_post_and_parse(server_client, server_name, url_path, json, response_model))


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

            return JSONResponse(judge_failed_answer(_find_body(args, kwargs), error))

    verify.__nemo_gym_judge_failsafe__ = True  # type: ignore[attr-defined]
    return verify
